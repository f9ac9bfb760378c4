package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fixture is a server PKI on disk: the server certificate comes from serverCA, client
// certificates must come from clientCA.
type fixture struct {
	dir          string
	serverCA     *CA
	clientCA     *CA
	server       ServerFiles
	serverCAFile string
	serverLeaf   *Leaf
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir(), serverCA: newTestCA(t, "server CA"), clientCA: newTestCA(t, "client CA")}
	chmod(t, f.dir, 0o700) // keys live in a 0700 directory, as creds.ReadSecretFile requires
	f.serverLeaf = serverLeaf(t, f.serverCA)
	cert, key := writeLeaf(t, f.dir, "signerd", f.serverLeaf)
	f.server = ServerFiles{CertFile: cert, KeyFile: key, ClientCAFile: writeCA(t, f.dir, "client-ca", f.clientCA)}
	f.serverCAFile = writeCA(t, f.dir, "server-ca", f.serverCA)
	return f
}

// client writes leaf under name and builds a client config for it with NewClientTLS.
func (f *fixture) client(t *testing.T, name string, leaf *Leaf, opts ...Option) (*tls.Config, *Reloader) {
	t.Helper()
	cert, key := writeLeaf(t, f.dir, name, leaf)
	cfg, r, err := NewClientTLS(ClientFiles{CertFile: cert, KeyFile: key, ServerCAFile: f.serverCAFile}, "localhost", opts...)
	if err != nil {
		t.Fatalf("NewClientTLS %s: %v", name, err)
	}
	return cfg, r
}

// wantStatus checks err is a gRPC status with code and a message containing msg.
func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("error = %v, want code %v with message containing %q", err, code, msg)
	}
}

func TestHandshakeAndIdentity(t *testing.T) {
	const authdID = "spiffe://" + testTD + "/authd/sp1"
	tests := []struct {
		name       string
		serverOpts []Option
		client     func(t *testing.T, f *fixture) *tls.Config
		wantID     string
		wantCode   codes.Code
		wantMsg    string // in the client's status message; only for failures the client sees in its handshake
		// wantRefusal checks why the server's handshake failed; nil means it must not fail.
		wantRefusal func(error) bool
		wantSrvErr  error // what IdentityFromContext returned on the server, if it ran
	}{
		{
			name: "ok/valid-client",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, authdID))
				return cfg
			},
			wantID: authdID,
		},
		{
			name: "ok/server-id-checked",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, authdID), WithServerID("spiffe://"+testTD+"/signerd"))
				return cfg
			},
			wantID: authdID,
		},
		{
			name: "fail/no-client-cert",
			client: func(t *testing.T, f *fixture) *tls.Config {
				return &tls.Config{MinVersion: tls.VersionTLS13, ServerName: "localhost", RootCAs: mustPool(t, f.serverCAFile)}
			},
			wantCode:    codes.Unavailable,
			wantRefusal: errContains("tls: client didn't provide a certificate"),
		},
		{
			name: "fail/wrong-ca",
			client: func(t *testing.T, f *fixture) *tls.Config {
				other := newTestCA(t, "other CA")
				cfg, _ := f.client(t, "rogue", clientLeaf(t, other, authdID))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: isUnknownAuthority,
		},
		{
			name: "fail/expired-cert",
			client: func(t *testing.T, f *fixture) *tls.Config {
				leaf := issue(t, f.clientCA, LeafSpec{
					CommonName: "expired", URIs: []string{authdID},
					NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
				})
				cfg, _ := f.client(t, "expired", leaf)
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: isExpired,
		},
		{
			// The injected server clock is two days ahead: a certificate valid now has expired.
			name:       "fail/expired-by-server-clock",
			serverOpts: []Option{WithClock(func() time.Time { return time.Now().Add(48 * time.Hour) })},
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, authdID))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: isExpired,
		},
		{
			// Finding 9 of issue 7: crypto/tls takes a leaf with no EKU as good for any
			// purpose; a caller must be certified for client authentication.
			name: "fail/no-eku",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "noeku", issue(t, f.clientCA, LeafSpec{CommonName: "noeku", URIs: []string{authdID}, OmitExtKeyUsage: true}))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: func(err error) bool { return errors.Is(err, ErrNoClientAuth) },
		},
		{
			name: "fail/any-eku",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "anyeku", issue(t, f.clientCA, LeafSpec{CommonName: "anyeku", URIs: []string{authdID}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: func(err error) bool { return errors.Is(err, ErrNoClientAuth) },
		},
		{
			name: "fail/server-auth-only",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "srveku", issue(t, f.clientCA, LeafSpec{CommonName: "srveku", URIs: []string{authdID}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantRefusal: errContains("incompatible key usage"),
		},
		{
			name: "fail/tls12-client",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, authdID))
				cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantMsg:     "tls: protocol version not supported",
			wantRefusal: errContains("tls: client offered only unsupported versions"),
		},
		{
			name: "fail/wrong-server-id",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, authdID), WithServerID("spiffe://"+testTD+"/impostor"))
				return cfg
			},
			wantCode:    codes.Unavailable,
			wantMsg:     "authentication handshake failed: mtls: server identity",
			wantRefusal: errContains("remote error: tls: bad certificate"),
		},
		{
			// The handshake succeeds (the CA signed it) but the certificate names no caller.
			name: "fail/no-uri-san",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "nouri", clientLeaf(t, f.clientCA))
				return cfg
			},
			wantCode:   codes.Unauthenticated,
			wantMsg:    "caller identity refused",
			wantSrvErr: ErrNoURISAN,
		},
		{
			name: "fail/two-uri-sans",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "twouri", clientLeaf(t, f.clientCA, authdID, "spiffe://"+testTD+"/managerd/sp1"))
				return cfg
			},
			wantCode:   codes.Unauthenticated,
			wantMsg:    "caller identity refused",
			wantSrvErr: ErrManyURISANs,
		},
		{
			name: "fail/non-spiffe-uri-san",
			client: func(t *testing.T, f *fixture) *tls.Config {
				cfg, _ := f.client(t, "https", clientLeaf(t, f.clientCA, "https://"+testTD+"/authd/sp1"))
				return cfg
			},
			wantCode:   codes.Unauthenticated,
			wantMsg:    "caller identity refused",
			wantSrvErr: ErrInvalidID,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			srv := startServer(t, f.server, tt.serverOpts...)
			res := call(t, srv.addr, tt.client(t, f))
			if tt.wantCode != codes.OK {
				wantStatus(t, res.err, tt.wantCode, tt.wantMsg)
				if tt.wantRefusal != nil {
					if err := srv.handshakeErr(t); !tt.wantRefusal(err) {
						t.Fatalf("server handshake error = %v, not the expected refusal", err)
					}
				} else {
					noHandshakeErr(t, srv)
				}
				if res.callerID != "" {
					t.Fatalf("refused call still reported caller %q", res.callerID)
				}
				if got := srv.identityErr(); !errors.Is(got, tt.wantSrvErr) || (tt.wantSrvErr == nil) != (got == nil) {
					t.Fatalf("server IdentityFromContext error = %v, want %v", got, tt.wantSrvErr)
				}
				return
			}
			if res.err != nil || res.callerID != tt.wantID {
				t.Fatalf("call = %q, %v; want caller %q", res.callerID, res.err, tt.wantID)
			}
			noHandshakeErr(t, srv)
			if res.serverCert == nil || res.serverCert.SerialNumber.Cmp(f.serverLeaf.Certificate().SerialNumber) != 0 {
				t.Fatalf("server presented %v, want serial %x", res.serverCert, f.serverLeaf.Certificate().SerialNumber)
			}
		})
	}
}

// noHandshakeErr fails if the server refused a handshake. The call has returned, so a
// handshake it depended on has finished on the server too.
func noHandshakeErr(t *testing.T, srv *testServer) {
	t.Helper()
	select {
	case err := <-srv.handshakeErrs:
		t.Fatalf("server refused a handshake: %v", err)
	default:
	}
}

func errContains(s string) func(error) bool {
	return func(err error) bool { return err != nil && strings.Contains(err.Error(), s) }
}

func isUnknownAuthority(err error) bool {
	var ua x509.UnknownAuthorityError
	return errors.As(err, &ua)
}

func isExpired(err error) bool {
	var ci x509.CertificateInvalidError
	return errors.As(err, &ci) && ci.Reason == x509.Expired
}

func mustPool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	b, err := readPublicFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := parseCAPool(b)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestClientCAReload(t *testing.T) {
	t.Run("ok/client-ca-reload", func(t *testing.T) {
		f := newFixture(t)
		srv := startServer(t, f.server)
		oldCfg, _ := f.client(t, "old", clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/authd/old"))
		newCA := newTestCA(t, "rotated client CA")
		newCfg, _ := f.client(t, "new", clientLeaf(t, newCA, "spiffe://"+testTD+"/authd/new"))

		if res := call(t, srv.addr, oldCfg); res.err != nil || res.callerID != "spiffe://"+testTD+"/authd/old" {
			t.Fatalf("before rotation, old client = %q, %v", res.callerID, res.err)
		}
		wantStatus(t, call(t, srv.addr, newCfg).err, codes.Unavailable, "")
		if err := srv.handshakeErr(t); !isUnknownAuthority(err) {
			t.Fatalf("before rotation, new client refused with %v, want unknown authority", err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.reloader.Run(ctx, 10*time.Millisecond, func(err error) { errs <- err })
		}()
		t.Cleanup(func() { cancel(); <-done })

		writeFile(t, f.server.ClientCAFile, newCA.CertPEM(), 0o644)
		eventually(t, "the server to accept the new CA", func() bool {
			res := call(t, srv.addr, newCfg)
			return res.err == nil && res.callerID == "spiffe://"+testTD+"/authd/new"
		})
		for len(srv.handshakeErrs) > 0 { // refusals of the new client while the CA was old
			<-srv.handshakeErrs
		}
		wantStatus(t, call(t, srv.addr, oldCfg).err, codes.Unavailable, "")
		if err := srv.handshakeErr(t); !isUnknownAuthority(err) {
			t.Fatalf("after rotation, old client refused with %v, want unknown authority", err)
		}
		select {
		case err := <-errs:
			t.Fatalf("Run reported %v", err)
		default:
		}
	})
}

func TestServerCertReload(t *testing.T) {
	t.Run("ok/server-cert-reload", func(t *testing.T) {
		f := newFixture(t)
		srv := startServer(t, f.server)
		cfg, _ := f.client(t, "authd", clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/authd/sp1"))
		first := call(t, srv.addr, cfg)
		if first.err != nil || first.serverCert.SerialNumber.Cmp(f.serverLeaf.Certificate().SerialNumber) != 0 {
			t.Fatalf("before rotation: %v, serial %v", first.err, first.serverCert)
		}

		rotated := serverLeaf(t, f.serverCA)
		writeFile(t, f.server.CertFile, rotated.CertPEM(), 0o644)
		writeFile(t, f.server.KeyFile, rotated.KeyPEM(), 0o600)
		if err := srv.reloader.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		second := call(t, srv.addr, cfg)
		if second.err != nil || second.serverCert.SerialNumber.Cmp(rotated.Certificate().SerialNumber) != 0 {
			t.Fatalf("after rotation: %v, serial %x, want %x", second.err, second.serverCert.SerialNumber, rotated.Certificate().SerialNumber)
		}
	})
}

func TestClientCertReload(t *testing.T) {
	t.Run("ok/client-cert-reload", func(t *testing.T) {
		f := newFixture(t)
		srv := startServer(t, f.server)
		cfg, r := f.client(t, "caller", clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/authd/sp1"))
		if res := call(t, srv.addr, cfg); res.err != nil || res.callerID != "spiffe://"+testTD+"/authd/sp1" {
			t.Fatalf("before rotation: %q, %v", res.callerID, res.err)
		}
		writeLeaf(t, f.dir, "caller", clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/managerd/sp1"))
		if err := r.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		if res := call(t, srv.addr, cfg); res.err != nil || res.callerID != "spiffe://"+testTD+"/managerd/sp1" {
			t.Fatalf("after rotation: %q, %v", res.callerID, res.err)
		}
	})
}

func TestDevPKIEndToEnd(t *testing.T) {
	t.Run("ok/dev-pki", func(t *testing.T) {
		res, err := WriteDevPKI(PKIOptions{Dir: t.TempDir() + "/pki", TrustDomain: testTD, Spaces: []string{"sp1"}})
		if err != nil {
			t.Fatal(err)
		}
		srv := startServer(t, res.Server)
		if len(res.Clients) != 3 {
			t.Fatalf("got %d clients, want 3", len(res.Clients))
		}
		for _, c := range res.Clients {
			cfg, _, err := NewClientTLS(c.Files, "localhost", WithServerID(res.ServerID))
			if err != nil {
				t.Fatalf("NewClientTLS %s: %v", c.ID, err)
			}
			if got := call(t, srv.addr, cfg); got.err != nil || got.callerID != c.ID {
				t.Fatalf("%s: call = %q, %v", c.ID, got.callerID, got.err)
			}
		}
	})
}
