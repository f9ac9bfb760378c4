package server_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestMintSystemProfiles: deliveryd's policy mints the two $SYS users, signed by the system
// account's signing key and naming the space's data account, and the broker accepts them; no
// other caller, no caller parameter, no remint, and no signer without the key.
func TestMintSystemProfiles(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	url := s.StartBroker(t)
	broker, spaces := s.Trust(t)
	dlv := dialAs(t, s, signerdtest.ID("deliveryd", "alpha"))
	mint := func(c signerv1.SignerServiceClient, p signerv1.Profile, params *signerv1.ProfileParams) (*signerv1.MintResponse, error) {
		_, pub := newUser(t)
		return c.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub, Profile: p, Params: params})
	}

	t.Run("ok/deliveryd mints the observer and the broker answers its CONNZ", func(t *testing.T) {
		kp, pub := newUser(t)
		resp, err := dlv.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub, Profile: signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER})
		if err != nil {
			t.Fatal(err)
		}
		cred := resp.GetCredential()
		uc, err := jwt.DecodeUserClaims(cred.GetJwt())
		if err != nil {
			t.Fatal(err)
		}
		connz, _ := space.SysAccountConnz(spaces[0].DataAccountPublicKey())
		if uc.IssuerAccount != broker.SystemAccountPublicKey() || !slices.Contains(broker.SystemSigningKeys(), uc.Issuer) ||
			!slices.Equal(uc.Pub.Allow, jwt.StringList{connz}) || cred.GetProfile() != signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER {
			t.Fatalf("observer claims: issuer %s account %s pub %v", uc.Issuer, uc.IssuerAccount, uc.Pub.Allow)
		}
		nc := connectBroker(t, url, cred, kp)
		msg, err := nc.Request(connz, []byte(`{}`), 5*time.Second)
		if err != nil || !strings.Contains(string(msg.Data), `"connections"`) {
			t.Fatalf("CONNZ: %v", err)
		}
	})
	t.Run("ok/deliveryd mints the evictor", func(t *testing.T) {
		resp, err := mint(dlv, signerv1.Profile_PROFILE_CONNECTION_EVICTOR, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantLifetime(t, resp.GetCredential(), 5*time.Minute)
	})
	t.Run("fail/another daemon may not", func(t *testing.T) {
		for _, kind := range []string{"managerd", "authd"} {
			_, err := mint(dialAs(t, s, signerdtest.ID(kind, "alpha")), signerv1.Profile_PROFILE_CONNECTION_EVICTOR, nil)
			wantRefusal(t, err, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
		}
	})
	t.Run("fail/no caller parameter", func(t *testing.T) {
		_, err := mint(dlv, signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, &signerv1.ProfileParams{Owner: "o", Actor: "a"})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
	})
	t.Run("fail/not renewable", func(t *testing.T) {
		kp, pub := newUser(t)
		resp, err := dlv.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", UserPublicKey: pub, Profile: signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().Unix()
		_, err = dlv.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: resp.GetCredential().GetJwt(),
			ProofUnixSeconds: now, Proof: remintProof(t, kp, "alpha", resp.GetCredential().GetJti(), now)})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
	})
	t.Run("fail/a signer without the system key mints none", func(t *testing.T) {
		if err := os.Remove(filepath.Join(s.Dir, "signer", "system-signing.nk")); err != nil {
			t.Fatal(err)
		}
		s.Replicas[0].Restart(t)
		_, err := mint(dialAs(t, s, signerdtest.ID("deliveryd", "alpha")), signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, nil)
		wantRefusal(t, err, codes.FailedPrecondition, "SYSTEM_KEY_MISSING")
		if _, err := mint(dialAs(t, s, signerdtest.ID("deliveryd", "alpha")), signerv1.Profile_PROFILE_DELIVERY, nil); err != nil {
			t.Fatalf("delivery after the key went: %v", err)
		}
	})
}
