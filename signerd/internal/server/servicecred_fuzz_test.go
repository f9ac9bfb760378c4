package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// svcFuzzNow is the fixed clock FuzzParseServiceCredential validates against.
var svcFuzzNow = time.Unix(1_800_000_000, 250_000_000)

// FuzzParseServiceCredential feeds arbitrary bytes, decoded as a SignServiceCredentialRequest, to
// the validation every SignServiceCredential goes through first. It must never panic, and
// whatever it accepts must be well formed: every coordinate fits its grammar, iat is now,
// 1 s <= exp - iat <= the kind's cap, exp is not past not_after, and the claims encode to a JSON
// object the keystore will sign, with exactly the kind's keys.
func FuzzParseServiceCredential(f *testing.F) {
	w := "w_" + strings.Repeat("a", 52)
	r := "r_" + strings.Repeat("a", 26)
	for _, req := range []*signerv1.SignServiceCredentialRequest{
		{Space: "alpha", Kind: signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, Owner: "u_abcdefghijklmnopqrstuvwxyz",
			Witness: w, Endpoint: "billing.api", InstanceId: strings.Repeat("s", 26), Root: r, Ttl: durationpb.New(time.Minute),
			NotAfter: timestamppb.New(svcFuzzNow.Add(time.Hour))},
		{Space: "a<b>&\u2028\"\\", Kind: signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL, Owner: "u_abcdefghijklmnopqrstuvwxyz",
			Witness: w, Endpoint: "a", InstanceId: strings.Repeat("9", 32), Root: r, Ttl: durationpb.New(48 * time.Hour),
			NotAfter: timestamppb.New(svcFuzzNow.Add(90 * time.Second))},
		{Space: "alpha", Kind: 7, Owner: "alice", Witness: "w_", Endpoint: "a..b", InstanceId: "x", Root: "r_b",
			Ttl: durationpb.New(-time.Second), NotAfter: &timestamppb.Timestamp{Nanos: -1}},
		{Space: "alpha", Kind: signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, Owner: "u_abcdefghijklmnopqrstuvwxyz",
			Witness: w, Endpoint: "billing.api", InstanceId: strings.Repeat("s", 26), Root: r, Ttl: durationpb.New(time.Minute),
			NotAfter: timestamppb.New(svcFuzzNow.Add(500 * time.Millisecond))},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req signerv1.SignServiceCredentialRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		in, err := parseServiceCredential(&req, svcFuzzNow)
		if err != nil {
			if in != nil {
				t.Fatal("parseServiceCredential returned input with an error")
			}
			return
		}
		if space.ValidateName(in.space) != nil || space.ValidateDerivedOwner(in.owner) != nil || space.ValidateUID(in.iid) != nil {
			t.Fatalf("accepted malformed coordinates: %+v", in)
		}
		if _, err := lifecycle.EndpointToken(in.endpoint); err != nil {
			t.Fatalf("accepted endpoint %q", in.endpoint)
		}
		if !validServiceID(in.witness, witnessPrefix, witnessBytes) || len(in.witness) != 54 ||
			!validServiceID(in.root, rootPrefix, rootBytes) || len(in.root) != 28 {
			t.Fatalf("accepted witness %q root %q", in.witness, in.root)
		}
		limit := int64(MaxServiceAccessTTL / time.Second)
		if in.kind == signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL {
			limit = int64(MaxServiceRenewalTTL / time.Second)
		} else if in.kind != signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS {
			t.Fatalf("accepted kind %v", in.kind)
		}
		if in.iat != svcFuzzNow.Unix() || in.exp-in.iat < 1 || in.exp-in.iat > limit || in.exp > req.GetNotAfter().AsTime().Unix() {
			t.Fatalf("accepted iat %d exp %d (not_after %v, cap %d s)", in.iat, in.exp, req.GetNotAfter().AsTime(), limit)
		}
		typ, claims, err := in.serviceClaims("jti")
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) > keystore.MaxBearerClaimsBytes || !json.Valid(claims) || claims[0] != '{' {
			t.Fatalf("claims the keystore would refuse: %d bytes", len(claims))
		}
		var got map[string]any
		if err := json.Unmarshal(claims, &got); err != nil {
			t.Fatal(err)
		}
		want := []string{"iss", "aud", "sub", "duty", "wit", "ep", "iid", "root", "ver", "iat", "nbf", "exp", "jti"}
		if typ == keystore.TypServiceRenewal {
			want[3] = "use"
		} else if typ != keystore.TypServiceAccess {
			t.Fatalf("typ %q", typ)
		}
		if len(got) != len(want) {
			t.Fatalf("claims %s: %d keys, want %v", claims, len(got), want)
		}
		for _, k := range want {
			if _, ok := got[k]; !ok {
				t.Fatalf("claims %s lack %s", claims, k)
			}
		}
		if got["sub"] != in.owner || got["iss"] != "urn:cotal:service-access:"+in.space {
			t.Fatalf("claims %s: sub or iss is not the server's", claims)
		}
	})
}
