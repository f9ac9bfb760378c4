package server_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestMintAuthCallout: authd gets its callout-service credential only for the user key that
// `signerd init` registered in the AUTH account's auth_users, and that credential answers the
// callout subject on the broker but cannot publish to it.
func TestMintAuthCallout(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))

	seed, err := creds.ReadSeedFile(filepath.Join(s.Dir, "authd", space.Segment("alpha"), "callout.nk"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := seed.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()

	t.Run("fail/unregistered-key", func(t *testing.T) {
		_, other := newUser(t)
		resp, err := authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, UserPublicKey: other})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantNoCredential(t, resp)
	})

	t.Run("ok/registered-key-answers-callout-subject", func(t *testing.T) {
		resp, err := authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, UserPublicKey: pub})
		if err != nil {
			t.Fatal(err)
		}
		cred := resp.GetCredential()
		uc, err := jwt.DecodeUserClaims(cred.GetJwt())
		if err != nil {
			t.Fatal(err)
		}
		gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		if uc.Subject != pub || uc.IssuerAccount != gs.GetCalloutAccountPublicKey() || uc.Issuer != gs.GetCalloutSigningPublicKey() {
			t.Fatalf("claims sub %s issuer_account %s iss %s; want %s, %s, %s", uc.Subject, uc.IssuerAccount, uc.Issuer,
				pub, gs.GetCalloutAccountPublicKey(), gs.GetCalloutSigningPublicKey())
		}

		url := s.StartBroker(t)
		errs := make(chan error, 4)
		nc, err := nats.Connect(url, nats.NoReconnect(), nats.Timeout(5*time.Second),
			nats.UserJWT(func() (string, error) { return cred.GetJwt(), nil }, func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) }),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		if err != nil {
			t.Fatalf("registered callout user refused by the broker: %v", err)
		}
		defer nc.Close()
		if _, err := nc.SubscribeSync(space.AuthCalloutSubject); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(space.AuthCalloutSubject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if want := `Permissions Violation for Publish to "` + space.AuthCalloutSubject + `"`; !strings.Contains(err.Error(), want) {
				t.Fatalf("async error %q, want %q", err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the broker did not refuse a publish to the callout subject")
		}
	})
}
