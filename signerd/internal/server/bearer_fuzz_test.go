package server

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// FuzzParseSignBearer feeds arbitrary bytes, decoded as a SignBearerRequest, to the validation
// every SignBearer goes through first. It must never panic, and whatever it accepts must be well
// formed: grammars hold, the lifetime is whole seconds within its cap, and the claims encode to a
// JSON object the keystore will sign, with the server's iss, aud and sub.
func FuzzParseSignBearer(f *testing.F) {
	for _, req := range []*signerv1.SignBearerRequest{
		{Space: "alpha", Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "bot", Ttl: durationpb.New(time.Minute)},
		{Space: "alpha", Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "bot", Scope: []string{"spawn", "run"},
			Parent: "u_zzzzzzzzzzzzzzzzzzzzzzzzzz.boss", LifecycleUid: "abcdefghijklmnopqrstuvwxyz",
			CredentialId: "c-1", View: "transfer-writer", Ttl: durationpb.New(time.Hour)},
		{Space: "a<b>&\u2028", Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "x", Ttl: durationpb.New(1500 * time.Millisecond)},
		{Space: "alpha", Owner: "alice", Actor: "a.b", Scope: []string{"x", "x"}, Ttl: durationpb.New(-time.Second)},
		{Space: "", View: "root", Parent: "u_x.y.z"},
		{Space: "alpha", Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "cli", View: "manager-caller",
			ManagerInstanceId: "bbbbbbbbbbbbbbbbbbbbbbbbbb", Ttl: durationpb.New(time.Minute)},
		{Space: "alpha", Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "cli", View: "admin",
			ManagerInstanceId: "b.b", Ttl: durationpb.New(time.Minute)},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req signerv1.SignBearerRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		in, err := parseSignBearer(&req)
		if err != nil {
			if in != nil {
				t.Fatal("parseSignBearer returned input with an error")
			}
			return
		}
		if space.ValidateName(in.space) != nil || space.ValidateDerivedOwner(in.owner) != nil || space.ValidateActor(in.actor) != nil {
			t.Fatalf("accepted malformed principal: %+v", in)
		}
		if in.parent != "" && strings.Count(in.parent, ".") != 1 {
			t.Fatalf("accepted parent %q", in.parent)
		}
		if in.lifecycleUID != "" && space.ValidateUID(in.lifecycleUID) != nil {
			t.Fatalf("accepted lifecycle uid %q", in.lifecycleUID)
		}
		if in.credentialID != "" && !space.IsCredentialID(in.credentialID) {
			t.Fatalf("accepted credential id %q", in.credentialID)
		}
		if in.view != "" && !slices.Contains(bearerViews, in.view) {
			t.Fatalf("accepted view %q", in.view)
		}
		if (in.managerInstanceID != "") != (in.view == viewManagerCaller) || (in.managerInstanceID != "" && space.ValidateUID(in.managerInstanceID) != nil) {
			t.Fatalf("accepted manager instance %q with view %q", in.managerInstanceID, in.view)
		}
		if len(in.scope) > MaxBearerScopes || len(slices.Compact(slices.Sorted(slices.Values(in.scope)))) != len(in.scope) {
			t.Fatalf("accepted scope %q", in.scope)
		}
		limit := MaxBearerTTL
		if in.view == viewTransferWriter {
			limit = MaxTransferWriterBearerTTL
		}
		if in.ttl < time.Second || in.ttl > limit || in.ttl%time.Second != 0 {
			t.Fatalf("accepted ttl %v", in.ttl)
		}
		b, err := json.Marshal(in.claims(1, 1+int64(in.ttl/time.Second), "jti"))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > keystore.MaxBearerClaimsBytes || !json.Valid(b) || b[0] != '{' {
			t.Fatalf("claims the keystore would refuse: %d bytes", len(b))
		}
		var got bearerClaims
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Iss != BearerIssuerPrefix+in.space || got.Aud != in.space || got.Sub != in.owner || got.Act.Owner != in.owner ||
			got.Ver != BearerVersion || !slices.Equal(got.Scope, got.Act.Scope) || got.Scope == nil {
			t.Fatalf("claims %s", b)
		}
	})
}
