package signerclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
)

func TestClientOK(t *testing.T) {
	e := startEnv(t, "")

	t.Run("ok/mint-and-connect", func(t *testing.T) {
		r := newRail(t, e, nil)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		jti, exp := r.Current()
		if jti == "" || !exp.After(time.Now()) {
			t.Fatalf("Current = %q, %v; want a jti and a future expiry", jti, exp)
		}
		c := connectChat(t, e.url, r.NatsOptions()...)
		if err := c.roundTrip(5 * time.Second); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if got := c.nc.Opts.InboxPrefix; got != "_INBOX_"+r.PublicKey() {
			t.Fatalf("inbox prefix = %q, want _INBOX_%s", got, r.PublicKey())
		}
	})

	t.Run("ok/get-space", func(t *testing.T) {
		resp, err := e.client.GetSpace(ctxT(t), testSpace)
		if err != nil {
			t.Fatalf("GetSpace: %v", err)
		}
		if resp.GetSpace() != testSpace || resp.GetAccountPublicKey() == "" {
			t.Fatalf("GetSpace = %q account %q", resp.GetSpace(), resp.GetAccountPublicKey())
		}
		r := newRail(t, e, nil)
		if got := r.Account(); got != "" {
			t.Fatalf("Account before Start = %q", got)
		}
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if got := r.Account(); got != resp.GetAccountPublicKey() {
			t.Fatalf("rail Account = %q, want the space's %q", got, resp.GetAccountPublicKey())
		}
	})

	t.Run("ok/remint", func(t *testing.T) {
		kp, pub := newUser(t)
		first := mintAgent(t, e.client, pub)
		second, err := e.client.Remint(ctxT(t), testSpace, first.GetJwt(), kp, time.Minute)
		if err != nil {
			t.Fatalf("Remint: %v", err)
		}
		if second.GetJti() == first.GetJti() {
			t.Fatalf("Remint returned the same jti %q", second.GetJti())
		}
		uc, err := jwt.DecodeUserClaims(second.GetJwt())
		if err != nil {
			t.Fatalf("decode reminted JWT: %v", err)
		}
		if uc.Subject != pub || second.GetUserPublicKey() != pub {
			t.Fatalf("reminted subject = %q / %q, want %q", uc.Subject, second.GetUserPublicKey(), pub)
		}
		if second.GetProfile() != signerv1.Profile_PROFILE_AGENT {
			t.Fatalf("reminted profile = %v", second.GetProfile())
		}
	})
}

func TestClientRefusals(t *testing.T) {
	e := startEnv(t, "")
	tests := []struct {
		name       string
		call       func(t *testing.T) error
		wantIs     []error // the error must match one of these
		wantReason signerv1.Reason
	}{
		{
			name: "fail/denied-profile",
			call: func(t *testing.T) error {
				_, pub := newUser(t)
				_, err := e.client.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_OBSERVER, UserPublicKey: pub,
					Params: &signerv1.ProfileParams{Owner: testOwner, Actor: testActor}})
				return err
			},
			wantIs: []error{ErrDenied}, wantReason: signerv1.Reason_REASON_PROFILE_NOT_ALLOWED,
		},
		{
			name: "fail/unknown-caller",
			call: func(t *testing.T) error {
				c := dialAs(t, e.s, "spiffe://cotal.local/stranger/alpha")
				_, pub := newUser(t)
				_, err := c.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()})
				return err
			},
			wantIs: []error{ErrDenied}, wantReason: signerv1.Reason_REASON_CALLER_UNKNOWN,
		},
		{
			name: "fail/no-client-cert",
			call: func(t *testing.T) error {
				pool := x509.NewCertPool()
				pem, err := os.ReadFile(e.s.ServerCAFile)
				if err != nil || !pool.AppendCertsFromPEM(pem) {
					t.Fatalf("read CA %s: %v", e.s.ServerCAFile, err)
				}
				c, err := dial(Config{Addr: e.s.Addr, CallTimeout: 5 * time.Second}, &tls.Config{MinVersion: tls.VersionTLS13, ServerName: DefaultServerName, RootCAs: pool})
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				t.Cleanup(func() { _ = c.Close() })
				_, err = c.GetSpace(ctxT(t), testSpace)
				return err
			},
			wantIs: []error{ErrUnavailable, ErrUnauthenticated},
		},
		{
			name: "fail/wrong-server-id",
			call: func(t *testing.T) error {
				c, err := Dial(Config{Addr: e.s.Addr, TLS: e.s.ClientFor(t, mtls.KindManagerd, testSpace), ServerID: "spiffe://cotal.local/impostor", CallTimeout: 5 * time.Second})
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				t.Cleanup(func() { _ = c.Close() })
				_, err = c.GetSpace(ctxT(t), testSpace)
				return err
			},
			wantIs: []error{ErrUnavailable},
		},
		{
			name: "fail/unix-socket-absent",
			call: func(t *testing.T) error {
				c, err := Dial(Config{Addr: "unix:" + filepath.Join(t.TempDir(), "signerd.sock"), TLS: e.s.ClientFor(t, mtls.KindManagerd, testSpace), CallTimeout: 2 * time.Second})
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				t.Cleanup(func() { _ = c.Close() })
				_, err = c.GetSpace(ctxT(t), testSpace)
				return err
			},
			wantIs: []error{ErrUnavailable},
		},
		{
			name: "fail/remint-bad-proof",
			call: func(t *testing.T) error {
				_, pub := newUser(t)
				cred := mintAgent(t, e.client, pub)
				other, _ := newUser(t)
				_, err := e.client.Remint(ctxT(t), testSpace, cred.GetJwt(), other, 0)
				return err
			},
			wantIs: []error{ErrDenied}, wantReason: signerv1.Reason_REASON_BAD_PROOF,
		},
		{
			name: "fail/remint-not-a-jwt",
			call: func(t *testing.T) error {
				kp, _ := newUser(t)
				_, err := e.client.Remint(ctxT(t), testSpace, "not-a-jwt", kp, 0)
				return err
			},
			wantIs: []error{ErrInvalid},
		},
		{
			name: "fail/unknown-space",
			call: func(t *testing.T) error {
				_, err := e.client.GetSpace(ctxT(t), "nosuchspace")
				return err
			},
			wantIs: []error{ErrDenied, ErrNotFound},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(t)
			if err == nil {
				t.Fatal("call succeeded, want an error")
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("error %T %v is not an *Error", err, err)
			}
			matched := false
			for _, want := range tt.wantIs {
				matched = matched || errors.Is(err, want)
			}
			if !matched {
				t.Fatalf("error %v (code %v) matches none of %v", err, se.Code, tt.wantIs)
			}
			if tt.wantReason != signerv1.Reason_REASON_UNSPECIFIED {
				if got := ReasonOf(err); got != tt.wantReason {
					t.Fatalf("ReasonOf = %v, want %v (error %v)", got, tt.wantReason, err)
				}
				if se.Reason != tt.wantReason {
					t.Fatalf("Error.Reason = %v, want %v", se.Reason, tt.wantReason)
				}
			}
			if se.Code == codes.Unavailable && errors.Unwrap(err) == nil {
				t.Fatalf("transport error %v lost its cause", err)
			}
		})
	}
}

func TestDialConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		cfg  Config
	}{
		{name: "fail/no-addr", cfg: Config{TLS: mtls.ClientFiles{CertFile: "c", KeyFile: "k", ServerCAFile: "ca"}}},
		{name: "fail/negative-timeout", cfg: Config{Addr: "127.0.0.1:1", CallTimeout: -time.Second}},
		{name: "fail/missing-files", cfg: Config{Addr: "127.0.0.1:1", TLS: mtls.ClientFiles{CertFile: filepath.Join(dir, "c"), KeyFile: filepath.Join(dir, "k"), ServerCAFile: filepath.Join(dir, "ca")}}},
		{name: "fail/bad-server-id", cfg: Config{Addr: "unix:" + filepath.Join(dir, "sock"), ServerID: "not a spiffe id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Dial(tt.cfg)
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial succeeded, want an error")
			}
		})
	}
}

func newUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

func mintAgent(t *testing.T, c *Client, pub string) *signerv1.Credential {
	t.Helper()
	cred, err := c.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()})
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	if cred.GetUserPublicKey() != pub {
		t.Fatalf("minted subject %q, want %q", cred.GetUserPublicKey(), pub)
	}
	return cred
}
