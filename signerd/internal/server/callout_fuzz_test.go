package server

import (
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// fuzzNow is the fixed clock of the callout fuzz targets.
var fuzzNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// FuzzVerifyCalloutRequest feeds arbitrary opened bytes and server xkeys to the request checks
// both callout RPCs run. It must never panic, and whatever it accepts must be a request signed
// by its server_id for this callout account, bound to the given xkey and not expired.
func FuzzVerifyCalloutRequest(f *testing.F) {
	skp, _ := nkeys.CreateServer()
	sid, _ := skp.PublicKey()
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	request := func(edit func(*jwt.AuthorizationRequestClaims)) string {
		ac := jwt.NewAuthorizationRequestClaims(apub)
		ac.Audience = calloutRequestAudience
		ac.UserNkey = upub
		ac.Server = jwt.ServerID{ID: sid, Name: "n", XKey: xpub}
		ac.ConnectOptions = jwt.ConnectOptions{Token: "t", Name: "nonce_123"}
		ac.Expires = fuzzNow.Add(2 * time.Second).Unix()
		if edit != nil {
			edit(ac)
		}
		tok, err := ac.Encode(skp)
		if err != nil {
			f.Fatal(err)
		}
		return tok
	}
	f.Add([]byte(request(nil)), xpub)
	f.Add([]byte(request(func(ac *jwt.AuthorizationRequestClaims) { ac.Server.XKey = "" })), xpub)
	f.Add([]byte(request(func(ac *jwt.AuthorizationRequestClaims) { ac.UserNkey = "" })), xpub)
	f.Add([]byte(request(func(ac *jwt.AuthorizationRequestClaims) { ac.Expires = 1 })), xpub)
	f.Add([]byte(request(nil)), "")
	f.Add([]byte("eyJ.e30.x"), xpub)
	f.Add([]byte{}, "")
	f.Fuzz(func(t *testing.T, data []byte, serverXKey string) {
		ac, err := verifyCalloutRequest(data, serverXKey, apub, fuzzNow)
		if err != nil {
			if ac != nil {
				t.Fatalf("error %v with claims", err)
			}
			return
		}
		switch {
		case !nkey.IsUser(ac.UserNkey):
			t.Fatalf("accepted user_nkey %q", ac.UserNkey)
		case !nkey.IsServer(ac.Server.ID) || ac.Issuer != ac.Server.ID:
			t.Fatalf("accepted iss %q for server_id %q", ac.Issuer, ac.Server.ID)
		case ac.Server.XKey != serverXKey || ac.Subject != apub || ac.Audience != calloutRequestAudience:
			t.Fatalf("accepted xkey %q sub %q aud %q", ac.Server.XKey, ac.Subject, ac.Audience)
		case ac.Expires == 0 || fuzzNow.After(time.Unix(ac.Expires, 0).Add(CalloutClockSkew)):
			t.Fatalf("accepted exp %d", ac.Expires)
		}
	})
}

// FuzzParseSignCallout feeds arbitrary bytes, decoded as a SignCalloutResponseRequest, to the
// validation every SignCalloutResponse goes through first. It must never panic, and whatever it
// accepts must be well formed: a valid space, a bounded box, a curve xkey, and either a grant of
// a data-account profile that builds and lives at least a second, or a printable refusal.
func FuzzParseSignCallout(f *testing.F) {
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	for _, req := range []*signerv1.SignCalloutResponseRequest{
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: xpub, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: &signerv1.CalloutGrant{
			Profile: signerv1.Profile_PROFILE_AGENT, ExpiresAt: timestamppb.New(fuzzNow.Add(time.Hour)),
			Params: &signerv1.ProfileParams{Owner: "o", Actor: "a", LifecycleUid: "abcdefghijklmnopqrstuvwxyz", AllowPublish: []string{"general"}}}}},
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: xpub, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: &signerv1.CalloutGrant{
			Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, ExpiresAt: timestamppb.New(fuzzNow.Add(time.Hour))}}},
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: xpub, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: &signerv1.CalloutGrant{
			Profile: signerv1.Profile_PROFILE_OBSERVER, ExpiresAt: timestamppb.New(fuzzNow.Add(-time.Hour))}}},
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: xpub, Decision: &signerv1.SignCalloutResponseRequest_Error{Error: "refused"}},
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: "XBAD", Decision: &signerv1.SignCalloutResponseRequest_Error{Error: "a\tb"}},
		{Space: "alpha", SealedRequest: []byte("box"), ServerXkey: xpub, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: &signerv1.CalloutGrant{
			Profile: signerv1.Profile_PROFILE_SERVICE_SERVE, ExpiresAt: timestamppb.New(fuzzNow.Add(time.Minute)),
			Params: &signerv1.ProfileParams{Owner: "u_abcdefghijklmnopqrstuvwxyz", ServiceEndpoint: "billing.api", InstanceId: "ssssssssssssssssssssssssss"}}}},
		{Space: "a.b"},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req signerv1.SignCalloutResponseRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		in, err := parseSignCallout(&req, fuzzNow)
		if err != nil {
			return
		}
		switch {
		case space.ValidateName(in.space) != nil:
			t.Fatalf("accepted space %q", in.space)
		case len(in.sealed) == 0 || len(in.sealed) > MaxSealedRequestBytes || !nkey.IsCurve(in.serverXKey):
			t.Fatalf("accepted a %d-byte box with xkey %q", len(in.sealed), in.serverXKey)
		}
		if in.profile == "" {
			if in.refusal == "" || len(in.refusal) > MaxCalloutErrorLen || !utf8.ValidString(in.refusal) {
				t.Fatalf("accepted refusal %q", in.refusal)
			}
			for _, r := range in.refusal {
				if !unicode.IsPrint(r) {
					t.Fatalf("accepted refusal %q", in.refusal)
				}
			}
			return
		}
		if in.profile.Account() != profiles.AccountData || in.ttl < time.Second || in.refusal != "" {
			t.Fatalf("accepted grant of %s for %v (refusal %q)", in.profile, in.ttl, in.refusal)
		}
		if _, err := profiles.Build(in.space, in.profile, in.params); err != nil {
			t.Fatalf("accepted params that do not build: %v", err)
		}
	})
}
