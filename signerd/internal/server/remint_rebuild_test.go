package server_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// remintNow renews cred held by kp with a proof made now.
func remintNow(t *testing.T, c signerv1.SignerServiceClient, cred *signerv1.Credential, kp nkeys.KeyPair) (*signerv1.RemintResponse, error) {
	t.Helper()
	at := time.Now().Unix()
	return c.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: cred.GetJwt(), ProofUnixSeconds: at,
		Proof: remintProof(t, kp, "alpha", cred.GetJti(), at)})
}

// dataSigningKey returns the space's data signing key pair from signerd's key directory, to
// forge what an older signerd (or an older profile) would have issued.
func dataSigningKey(t *testing.T, s *signerdtest.Signer) nkeys.KeyPair {
	t.Helper()
	return signingKey(t, s, keystore.FileDataSigning)
}

// signingKey returns one of the space's signing key pairs (keystore.FileDataSigning or
// keystore.FileAuthSigning) from signerd's key directory.
func signingKey(t *testing.T, s *signerdtest.Signer, file string) nkeys.KeyPair {
	t.Helper()
	seed, err := creds.ReadSeedFile(keystore.SecretPath(filepath.Join(s.Dir, setup.SignerDir), "alpha", file, false))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Wipe()
	kp, err := seed.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	return kp
}

// TestRemintFollowsNarrowedPolicy is finding 6 of issue 7 (policy half): after team.* is
// removed from managerd's agent rule, a new Mint of team.secret is refused, and so is a Remint
// of the credential minted with it before (Remint used to copy its permissions unchanged).
func TestRemintFollowsNarrowedPolicy(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	manager := dial(t, s.Addr, s.ClientFor(t, mtls.KindManagerd, "alpha"))
	managerID := signerdtest.ID(mtls.KindManagerd, "alpha")

	mintAgent := func(t *testing.T, channels ...string) (*signerv1.Credential, nkeys.KeyPair, error) {
		t.Helper()
		kp, pub := newUser(t)
		resp, err := manager.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub,
			Params: &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, AllowSubscribe: channels, AllowPublish: channels}})
		return resp.GetCredential(), kp, err
	}
	secret, secretKP, err := mintAgent(t, "general", "team.secret")
	if err != nil {
		t.Fatalf("mint team.secret under the default policy: %v", err)
	}
	plain, plainKP, err := mintAgent(t, "general")
	if err != nil {
		t.Fatal(err)
	}

	narrowed := strings.Replace(signerdtest.DefaultPolicy, `channels: ["general", "team.*"]`, `channels: ["general"]`, 1)
	if narrowed == signerdtest.DefaultPolicy {
		t.Fatal("DefaultPolicy changed shape; update this test's edit")
	}
	s.SetPolicy(t, narrowed)
	testkit.Eventually(t, 5*time.Second, func() error {
		if _, _, err := mintAgent(t, "team.secret"); status.Code(err) != codes.PermissionDenied {
			return fmt.Errorf("mint team.secret: %v; want PermissionDenied", err)
		}
		return nil
	})

	t.Run("fail/mint-team-secret", func(t *testing.T) {
		cred, _, err := mintAgent(t, "team.secret")
		wantRefusal(t, err, codes.PermissionDenied, "CHANNEL_NOT_ALLOWED")
		if cred.GetJwt() != "" {
			t.Fatal("refused Mint returned a JWT")
		}
	})
	t.Run("fail/remint-team-secret", func(t *testing.T) {
		resp, err := remintNow(t, manager, secret, secretKP)
		wantRefusal(t, err, codes.PermissionDenied, "CHANNEL_NOT_ALLOWED")
		wantNoCredential(t, resp)
		recs := auditRecords(t, s.AuditPath)
		denied(managerID, "Remint", "alpha", "agent", "channel-not-allowed").check(t, recs[len(recs)-1])
	})
	t.Run("ok/remint-within-narrowed-policy", func(t *testing.T) {
		resp, err := remintNow(t, manager, plain, plainKP)
		if err != nil {
			t.Fatalf("remint of a general-only agent: %v", err)
		}
		was, now := decodeUser(t, plain.GetJwt()), decodeUser(t, resp.GetCredential().GetJwt())
		if now.Subject != was.Subject || !samePerms(was, now) || !slices.Equal(was.Tags, now.Tags) {
			t.Fatalf("renewed credential differs:\nwas %+v %v\nnow %+v %v", was.UserPermissionLimits, was.Tags, now.UserPermissionLimits, now.Tags)
		}
	})
}

// TestRemintRebuildsFromProfile is finding 6 of issue 7 (profile half): a credential whose
// permissions differ from what pkg/profiles builds today (an older profile that granted too
// much, forged here with the space's real data signing key) is renewed with the permissions
// Build gives now, and the broker refuses what only the old one allowed.
func TestRemintRebuildsFromProfile(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	manager := dial(t, s.Addr, s.ClientFor(t, mtls.KindManagerd, "alpha"))
	gs, err := manager.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	names, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}
	// The row an "older profile" granted: posting as another principal.
	other, err := names.Chat("o9", "a9", "general")
	if err != nil {
		t.Fatal(err)
	}

	kp, pub := newUser(t)
	params := &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}}
	resp, err := manager.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	uc := decodeUser(t, resp.GetCredential().GetJwt())
	uc.Pub.Allow.Add(other)
	token, err := uc.Encode(dataSigningKey(t, s))
	if err != nil {
		t.Fatal(err)
	}
	old := decodeUser(t, token)
	oldCred := &signerv1.Credential{Jwt: token, Jti: old.ID, UserPublicKey: pub}

	url := s.StartBroker(t)
	t.Run("ok/old-credential-allows-the-row", func(t *testing.T) {
		bc := connectBroker(t, url, oldCred, kp)
		defer bc.Close()
		if err := bc.Publish(other, []byte("as o9")); err != nil {
			t.Fatal(err)
		}
		bc.noViolations(t)
	})

	renewed, err := remintNow(t, manager, oldCred, kp)
	if err != nil {
		t.Fatalf("remint: %v", err)
	}
	now := decodeUser(t, renewed.GetCredential().GetJwt())

	t.Run("ok/reminted-claims-equal-a-fresh-build", func(t *testing.T) {
		spec, err := profiles.Build("alpha", profiles.Agent, profiles.Params{Owner: "o1", Actor: "a1", LifecycleUID: uid,
			AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}})
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := spec.Claims(pub, gs.GetAccountPublicKey(), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		// Compared as the JWT carries them (a decoded empty list is not nil).
		fj, _ := json.Marshal(fresh.UserPermissionLimits)
		nj, _ := json.Marshal(now.UserPermissionLimits)
		if string(fj) != string(nj) || fresh.Name != now.Name {
			t.Fatalf("reminted permissions differ from a fresh Build:\nfresh %+v\nnow   %+v", fresh.UserPermissionLimits, now.UserPermissionLimits)
		}
		for _, tag := range fresh.Tags {
			if !slices.Contains(now.Tags, tag) {
				t.Fatalf("reminted tags %v lack the profile's %q", now.Tags, tag)
			}
		}
		if slices.Contains(now.Pub.Allow, other) {
			t.Fatalf("reminted credential kept the old row %s", other)
		}
		if !slices.Contains(now.Tags, signerMinterTag(t, old)) {
			t.Fatalf("reminted credential lost the minter tag: %v", now.Tags)
		}
	})
	t.Run("fail/reminted-credential-refused-the-row", func(t *testing.T) {
		bc := connectBroker(t, url, renewed.GetCredential(), kp)
		defer bc.Close()
		if err := bc.Publish(other, []byte("as o9")); err != nil {
			t.Fatal(err)
		}
		bc.waitViolation(t, testkit.PublishViolation(other))
	})
}

// signerMinterTag returns the minter tag of uc.
func signerMinterTag(t *testing.T, uc *jwt.UserClaims) string {
	t.Helper()
	for _, tag := range uc.Tags {
		if strings.HasPrefix(tag, "minter:") {
			return tag
		}
	}
	t.Fatalf("no minter tag in %v", uc.Tags)
	return ""
}

// TestRemintAsksPolicyFirst is finding 9 of issue 7 (Remint part): a caller the policy does not
// know, or does not allow to Remint in the space it names, gets the policy's refusal before
// signerd reads the credential or looks the space up, so UNKNOWN_SPACE, BAD_PROOF and
// INVALID_ARGUMENT cannot be used to enumerate spaces or probe credentials.
func TestRemintAsksPolicyFirst(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: tablePolicy})
	manager := dialAs(t, s, managerAlpha)
	kp, pub := newUser(t)
	resp, err := manager.Mint(ctxT(t), agentReq("alpha", pub))
	if err != nil {
		t.Fatal(err)
	}
	cred := resp.GetCredential()
	at := time.Now().Unix()
	good := func(spaceName string) *signerv1.RemintRequest {
		return &signerv1.RemintRequest{Space: spaceName, Jwt: cred.GetJwt(), ProofUnixSeconds: at, Proof: remintProof(t, kp, spaceName, cred.GetJti(), at)}
	}
	badProof := func(spaceName string) *signerv1.RemintRequest {
		r := good(spaceName)
		r.Proof = make([]byte, 64)
		return r
	}
	garbage := func(spaceName string) *signerv1.RemintRequest {
		return &signerv1.RemintRequest{Space: spaceName, Jwt: "not a jwt", Proof: []byte("short")}
	}
	const stranger = "spiffe://cotal.local/stranger"
	for _, tc := range []struct {
		name   string
		caller string
		req    *signerv1.RemintRequest
		reason string
	}{
		{"fail/unknown-caller-unknown-space", stranger, good("nosuch"), "CALLER_UNKNOWN"},
		{"fail/unknown-caller-known-space-bad-proof", stranger, badProof("alpha"), "CALLER_UNKNOWN"},
		{"fail/unknown-caller-garbage", stranger, garbage("alpha"), "CALLER_UNKNOWN"},
		{"fail/no-remint-rpc-bad-proof", getSpaceOnly, badProof("alpha"), "RPC_NOT_ALLOWED"},
		{"fail/no-remint-rpc-garbage", getSpaceOnly, garbage("alpha"), "RPC_NOT_ALLOWED"},
		{"fail/other-space-unknown", managerAlpha, good("nosuch"), "SPACE_NOT_ALLOWED"},
		{"fail/other-space-garbage", managerAlpha, garbage("beta"), "SPACE_NOT_ALLOWED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := dialAs(t, s, tc.caller).Remint(ctxT(t), tc.req)
			wantRefusal(t, err, codes.PermissionDenied, tc.reason)
			wantNoCredential(t, resp)
			recs := auditRecords(t, s.AuditPath)
			last := recs[len(recs)-1]
			if last.RPC != "Remint" || last.Caller != tc.caller || last.Reason != kebab(tc.reason) || last.Subject != "" || last.Profile != "" {
				t.Fatalf("audit line %+v: want a %s refusal that read nothing from the credential", last, kebab(tc.reason))
			}
		})
	}
}

// TestRemintRechecksCalloutUser: Remint applies Mint's other rule too: an auth-callout
// credential is renewed only for a key the AUTH account still lists in auth_users (a credential
// for any other key is forged here with the space's real callout signing key).
func TestRemintRechecksCalloutUser(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	registered, kp := calloutUser(t, s, authd)

	t.Run("ok/registered", func(t *testing.T) {
		uc := decodeUser(t, registered)
		if _, err := remintNow(t, authd, &signerv1.Credential{Jwt: registered, Jti: uc.ID}, kp); err != nil {
			t.Fatalf("remint of the registered callout user: %v", err)
		}
	})
	t.Run("fail/unregistered", func(t *testing.T) {
		okp, other := newUser(t)
		uc := decodeUser(t, registered)
		uc.Subject = other
		token, err := uc.Encode(signingKey(t, s, keystore.FileAuthSigning))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := remintNow(t, authd, &signerv1.Credential{Jwt: token, Jti: decodeUser(t, token).ID}, okp)
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantMessage(t, err, "callout user")
		wantNoCredential(t, resp)
	})
}
