package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/server"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestMintRetirementRequester: authd, and only authd, mints a retirement requester: a 5-minute
// credential that publishes exactly its one retire-lifecycle subject, records its target for a
// Remint the policy refuses, and is accepted by the broker. Every other profile refuses a target.
func TestMintRetirementRequester(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	url := s.StartBroker(t)
	authd := dialAs(t, s, signerdtest.ID("authd", "alpha"))
	const iid, managerUID = "iiiiiiiiiiiiiiiiiiiiiiiiii", "mmmmmmmmmmmmmmmmmmmmmmmmmm"
	params := func() *signerv1.ProfileParams {
		return &signerv1.ProfileParams{Owner: "o1", Actor: "manager_serve_" + iid, LifecycleUid: managerUID,
			Target: &signerv1.RetirementTarget{Owner: "o1", Actor: "a1", LifecycleUid: uid}}
	}
	mint := func(c signerv1.SignerServiceClient, p signerv1.Profile, params *signerv1.ProfileParams) (*signerv1.MintResponse, error) {
		_, pub := newUser(t)
		return c.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub, Profile: p, Params: params})
	}

	t.Run("ok/authd mints it and the broker admits it", func(t *testing.T) {
		kp, pub := newUser(t)
		resp, err := authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub,
			Profile: signerv1.Profile_PROFILE_RETIREMENT_REQUESTER, Params: params()})
		if err != nil {
			t.Fatal(err)
		}
		cred := resp.GetCredential()
		wantLifetime(t, cred, 5*time.Minute)
		uc, err := jwt.DecodeUserClaims(cred.GetJwt())
		if err != nil {
			t.Fatal(err)
		}
		n, _ := space.NewNames("alpha")
		grant, err := n.RetireLifecycleCaller(space.RetireRail{TargetOwner: "o1", TargetActor: "a1", TargetUID: uid,
			CallerOwner: "o1", CallerActor: "manager_serve_" + iid, CallerUID: managerUID})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(uc.Pub.Allow, jwt.StringList{grant}) || !slices.Equal(uc.Sub.Allow, jwt.StringList{"_INBOX_" + pub + ".>", space.RailReplyGrant(grant)}) ||
			cred.GetProfile() != signerv1.Profile_PROFILE_RETIREMENT_REQUESTER {
			t.Fatalf("claims pub %v sub %v profile %v", uc.Pub.Allow, uc.Sub.Allow, cred.GetProfile())
		}
		for _, tag := range []string{"param:target_owner=o1", "param:target_actor=a1", "param:target_uid=" + uid, "principal:o1.manager_serve_" + iid} {
			if !slices.Contains(uc.Tags, tag) {
				t.Fatalf("tags %v lack %s", uc.Tags, tag)
			}
		}
		connectBroker(t, url, cred, kp)

		// One-shot: the policy refuses its renewal (after the recorded target was read back).
		now := time.Now().Unix()
		_, err = authd.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: cred.GetJwt(),
			ProofUnixSeconds: now, Proof: remintProof(t, kp, "alpha", cred.GetJti(), now)})
		wantRefusal(t, err, codes.PermissionDenied, "REMINT_NOT_ALLOWED")
	})
	t.Run("fail/another daemon may not", func(t *testing.T) {
		for _, kind := range []string{"managerd", "deliveryd"} {
			_, err := mint(dialAs(t, s, signerdtest.ID(kind, "alpha")), signerv1.Profile_PROFILE_RETIREMENT_REQUESTER, params())
			wantRefusal(t, err, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
		}
	})
	for _, tc := range []struct {
		name string
		edit func(*signerv1.ProfileParams)
	}{
		{"no target", func(p *signerv1.ProfileParams) { p.Target = nil }},
		{"empty target", func(p *signerv1.ProfileParams) { p.Target = &signerv1.RetirementTarget{} }},
		{"target of another owner", func(p *signerv1.ProfileParams) { p.Target.Owner = "o2" }},
		{"caller not a serve principal", func(p *signerv1.ProfileParams) { p.Actor = "manager_" + iid }},
		{"target uid malformed", func(p *signerv1.ProfileParams) { p.Target.LifecycleUid = strings.ToUpper(uid) }},
	} {
		t.Run("fail/"+tc.name, func(t *testing.T) {
			p := params()
			tc.edit(p)
			_, err := mint(authd, signerv1.Profile_PROFILE_RETIREMENT_REQUESTER, p)
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		})
	}
	target := &signerv1.RetirementTarget{Owner: "o1", Actor: "a1", LifecycleUid: uid}
	for _, tc := range []struct {
		caller  string
		profile signerv1.Profile
		params  *signerv1.ProfileParams
	}{
		{"authd", signerv1.Profile_PROFILE_AUTH_PLANE, &signerv1.ProfileParams{Target: target}},
		{"authd", signerv1.Profile_PROFILE_AGENT, &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, Target: &signerv1.RetirementTarget{}}},
		{"managerd", signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "o1", Actor: "s1", Target: target}},
		{"managerd", signerv1.Profile_PROFILE_DEPROVISIONER, &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, Target: target}},
		{"deliveryd", signerv1.Profile_PROFILE_CONNECTION_EVICTOR, &signerv1.ProfileParams{Target: target}},
	} {
		t.Run("fail/"+tc.profile.String()+" refuses a target", func(t *testing.T) {
			_, err := mint(dialAs(t, s, signerdtest.ID(tc.caller, "alpha")), tc.profile, tc.params)
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		})
	}
}

// TestProfileEnumTable: every profile of the matrix has its proto enum value and back, and every
// enum value but UNSPECIFIED names a profile, so a profile added on one side only fails here.
func TestProfileEnumTable(t *testing.T) {
	for _, n := range profiles.All() {
		e := server.ProfileEnum(n)
		if back, err := server.ProfileName(e); e == signerv1.Profile_PROFILE_UNSPECIFIED || err != nil || back != n {
			t.Errorf("%s -> %v -> %q (%v)", n, e, back, err)
		}
	}
	for v, name := range signerv1.Profile_name {
		if v == 0 {
			continue
		}
		if _, err := server.ProfileName(signerv1.Profile(v)); err != nil {
			t.Errorf("enum %s names no profile: %v", name, err)
		}
	}
	if len(signerv1.Profile_name) != len(profiles.All())+1 {
		t.Errorf("%d enum values, %d profiles", len(signerv1.Profile_name), len(profiles.All()))
	}
}
