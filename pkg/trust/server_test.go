package trust_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
)

// startServer starts opts and shuts it down at cleanup.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoLog = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	return s
}

// mintUser signs a user of account accountPub with signer and returns its JWT and key pair.
// allow, when non-empty, limits publish and subscribe to those subjects and the inbox.
func mintUser(t *testing.T, signer *creds.Seed, accountPub string, allow ...string) (string, nkeys.KeyPair) {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.IssuerAccount = accountPub
	uc.Expires = time.Now().Add(time.Minute).Unix()
	if len(allow) > 0 {
		uc.Pub.Allow.Add(allow...)
		uc.Sub.Allow.Add(allow...)
		uc.Sub.Allow.Add("_INBOX.>")
	}
	skp, err := signer.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer skp.Wipe()
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ukp
}

func connect(url, userJWT string, kp nkeys.KeyPair) (*nats.Conn, error) {
	return nats.Connect(url,
		nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign),
		nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// roundTrip proves nc can publish to subj and receive it back.
func roundTrip(t *testing.T, nc *nats.Conn, subj string) {
	t.Helper()
	sub, err := nc.SubscribeSync(subj)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subj, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != "hello" {
		t.Fatalf("NextMsg = %v, %v; want hello", m, err)
	}
}

// TestRenderedConfigServes renders the configuration, has nats-server parse it from a file,
// starts it, and proves the trust chain: a data user signed by the data signing key connects
// and exchanges messages; users signed by the account identity key (strict usage), by another
// space's key, or by a foreign broker's key are refused.
func TestRenderedConfigServes(t *testing.T) {
	b, op := newBroker(t, "dev")
	sp, id, sg := newSpace(t, b, op, "alpha")
	other, otherOp := newBroker(t, "other")
	_, _, foreignSG := newSpace(t, other, otherOp, "alpha")

	dir := t.TempDir()
	out, err := trust.RenderServerConfig(trust.ServerConfig{Port: -1, StoreDir: filepath.Join(dir, "js"), Broker: b, Spaces: []*trust.Space{sp}})
	if err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, out, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(confPath)
	if err != nil {
		t.Fatalf("nats-server refused the rendered config: %v", err)
	}
	if opts.MaxControlLine != trust.MaxControlLine || !opts.JetStream || opts.SystemAccount != b.SystemAccountPublicKey() {
		t.Fatalf("parsed options lost settings: max_control_line %d, jetstream %v, system %s", opts.MaxControlLine, opts.JetStream, opts.SystemAccount)
	}
	s := startServer(t, opts)
	checkTrust(t, s.ClientURL(), sp, id, sg, foreignSG)
}

// TestServerOptionsServes does the same with in-process options.
func TestServerOptionsServes(t *testing.T) {
	b, op := newBroker(t, "dev")
	sp, id, sg := newSpace(t, b, op, "alpha")
	other, otherOp := newBroker(t, "other")
	_, _, foreignSG := newSpace(t, other, otherOp, "alpha")
	opts, err := trust.ServerOptions(trust.ServerConfig{Port: -1, StoreDir: t.TempDir(), Broker: b, Spaces: []*trust.Space{sp}})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, opts)
	checkTrust(t, s.ClientURL(), sp, id, sg, foreignSG)
}

func checkTrust(t *testing.T, url string, sp *trust.Space, id *trust.SpaceIdentity, sg, foreignSG *trust.SpaceSigning) {
	t.Helper()
	t.Run("ok/data user signed by the data signing key", func(t *testing.T) {
		tok, kp := mintUser(t, sg.DataSigning, sp.DataAccountPublicKey(), "cotal.alpha.test", "$JS.API.INFO")
		nc, err := connect(url, tok, kp)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		roundTrip(t, nc, "cotal.alpha.test")
		js, err := nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		// The data account has JetStream with unlimited limits.
		info, err := js.AccountInfo()
		if err != nil || info.Limits.MaxStreams != -1 {
			t.Fatalf("AccountInfo = %+v, %v; want JetStream with unlimited streams", info, err)
		}
	})
	tests := []struct {
		name    string
		signer  *creds.Seed
		account string
	}{
		{"fail/user signed by the account identity key", id.DataAccount, sp.DataAccountPublicKey()},
		{"fail/user signed by the callout signing key for the data account", sg.AuthSigning, sp.DataAccountPublicKey()},
		{"fail/user signed by a foreign broker's data key", foreignSG.DataSigning, sp.DataAccountPublicKey()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, kp := mintUser(t, tt.signer, tt.account)
			nc, err := connect(url, tok, kp)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				t.Fatalf("err = %v, want an authorization violation", err)
			}
		})
	}
}
