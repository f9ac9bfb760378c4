package server

import (
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzParseMint feeds arbitrary bytes, decoded as a MintRequest, to the validation every Mint
// goes through first. It must never panic, and whatever it accepts must be well formed: a valid
// space and user key, a known profile, a non-negative TTL, and claims that build.
func FuzzParseMint(f *testing.F) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	for _, req := range []*signerv1.MintRequest{
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: &signerv1.ProfileParams{
			Owner: "alice", Actor: "bot", LifecycleUid: "abcdefghijklmnopqrstuvwxyz", AllowPublish: []string{"general"}}},
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: &signerv1.ProfileParams{
			Owner: "alice", Actor: "bot", LifecycleUid: "abcdefghijklmnopqrstuvwxyz", AllowPublish: []string{"team.*"}}},
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_SUPERVISOR, UserPublicKey: pub, Params: &signerv1.ProfileParams{Owner: "o", Actor: "a"},
			Ttl: durationpb.New(time.Hour), RequestId: "r-1"},
		{Space: "a.b", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub, Ttl: durationpb.New(-time.Second)},
		{Space: "", Profile: 99, UserPublicKey: "SUAXXX"},
		// Finding 1 of issue 7: nkeys accepts CR and LF inside a key.
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_SENTINEL, UserPublicKey: pub[:20] + "\r\n" + pub[20:]},
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub, Ttl: durationpb.New(500 * time.Millisecond)},
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_RETIREMENT_REQUESTER, UserPublicKey: pub, Params: &signerv1.ProfileParams{
			Owner: "o", Actor: "manager_serve_iiiiiiiiiiiiiiiiiiiiiiiiii", LifecycleUid: "mmmmmmmmmmmmmmmmmmmmmmmmmm",
			Target: &signerv1.RetirementTarget{Owner: "o", Actor: "a", LifecycleUid: "abcdefghijklmnopqrstuvwxyz"}}},
		// service-serve is callout-only: Mint refuses it whatever its parameters.
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_SERVICE_SERVE, UserPublicKey: pub, Params: &signerv1.ProfileParams{
			Owner: "u_abcdefghijklmnopqrstuvwxyz", ServiceEndpoint: "billing.api", InstanceId: "ssssssssssssssssssssssssss"}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req signerv1.MintRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		in, err := parseMint(&req)
		if err != nil {
			if in != nil {
				t.Fatal("parseMint returned input with an error")
			}
			return
		}
		if space.ValidateName(in.space) != nil || !nkey.IsUser(in.subject) || CheckTTL(in.ttl) != nil {
			t.Fatalf("accepted malformed request: %+v", in)
		}
		if validRequestID(in.requestID) != nil {
			t.Fatalf("accepted request id %q", in.requestID)
		}
		for _, ch := range append(append(append([]string{}, in.params.Subscribe...), in.params.AllowSubscribe...), in.params.AllowPublish...) {
			// A pattern ("team.>") may pass parsing; the policy judges its width.
			if space.ValidateChannelPattern(ch) != nil {
				t.Fatalf("accepted malformed channel %q", ch)
			}
		}
		// What Remint reads back from the credential is what was minted.
		back, err := paramsFromTags(paramTags(in.params))
		if err != nil || !sameParams(back, in.params) {
			t.Fatalf("parameter tags do not round-trip: %+v -> %+v (%v)", in.params, back, err)
		}
		ttl := in.spec.Lifetime.Default
		uc, err := in.spec.Claims(in.subject, apub, time.Now(), ttl)
		if err != nil {
			t.Fatalf("accepted request whose claims do not build: %v", err)
		}
		if uc.Subject != in.subject {
			t.Fatalf("claims subject %q, want %q", uc.Subject, in.subject)
		}
	})
}
