package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestMintDeprovisionerMemberChannels: managerd mints a deprovisioner naming member channels; its
// JWT may read and purge exactly the target's membership row on each (sorted, deduplicated), the
// channels are recorded as given in a parameter tag (as every list is), and the broker admits
// it. A pattern, or member channels on any other profile, is refused.
func TestMintDeprovisionerMemberChannels(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	url := s.StartBroker(t)
	managerd := dialAs(t, s, signerdtest.ID("managerd", "alpha"))
	mint := func(p signerv1.Profile, params *signerv1.ProfileParams) (*signerv1.MintResponse, error) {
		_, pub := newUser(t)
		return managerd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub, Profile: p, Params: params})
	}

	t.Run("ok/the rows of the named channels, nothing else", func(t *testing.T) {
		kp, pub := newUser(t)
		resp, err := managerd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub,
			Profile: signerv1.Profile_PROFILE_DEPROVISIONER,
			Params:  &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, MemberChannels: []string{"team.b", "general", "team.b"}}})
		if err != nil {
			t.Fatal(err)
		}
		cred := resp.GetCredential()
		wantLifetime(t, cred, 5*time.Minute)
		uc, err := jwt.DecodeUserClaims(cred.GetJwt())
		if err != nil {
			t.Fatal(err)
		}
		var members []string
		for _, row := range uc.Pub.Allow {
			if strings.Contains(row, "cotal_members_alpha") {
				members = append(members, row)
			}
		}
		key := func(ch string) string { return "$KV.cotal_members_alpha." + ch + "/o1.a1." + uid }
		want := []string{
			"$JS.API.STREAM.INFO.KV_cotal_members_alpha",
			"$JS.API.DIRECT.GET.KV_cotal_members_alpha." + key("general"), key("general"),
			"$JS.API.DIRECT.GET.KV_cotal_members_alpha." + key("team.b"), key("team.b"),
		}
		if !slices.Equal(members, want) {
			t.Fatalf("members rows %v, want %v", members, want)
		}
		if !slices.Contains(uc.Tags, "param:member_channels=team.b,general,team.b") {
			t.Fatalf("tags %v do not record the member channels", uc.Tags)
		}
		connectBroker(t, url, cred, kp)
	})
	for _, tc := range []struct {
		name    string
		profile signerv1.Profile
		params  *signerv1.ProfileParams
	}{
		{"a pattern", signerv1.Profile_PROFILE_DEPROVISIONER, &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, MemberChannels: []string{"team.>"}}},
		{"a wildcard token", signerv1.Profile_PROFILE_DEPROVISIONER, &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, MemberChannels: []string{"team.*"}}},
		{"on the provisioner", signerv1.Profile_PROFILE_PROVISIONER, &signerv1.ProfileParams{MemberChannels: []string{"general"}}},
		{"on an agent", signerv1.Profile_PROFILE_AGENT, &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, MemberChannels: []string{"general"}}},
	} {
		t.Run("fail/member channels: "+tc.name, func(t *testing.T) {
			_, err := mint(tc.profile, tc.params)
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		})
	}
}
