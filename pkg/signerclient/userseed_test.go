package signerclient

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// calloutPolicy lets authd mint and remint its callout credential with a lifetime of ttl.
func calloutPolicy(ttl string) string {
	return `version: 1
callers:
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      auth-callout: {ttl_max: ` + ttl + `}
`
}

// calloutSeed reads the callout-service user seed `signerd init` wrote for authd, through the
// checked reader.
func calloutSeed(t *testing.T, s *signerdtest.Signer) *creds.Seed {
	t.Helper()
	seed, err := creds.ReadSeedFile(filepath.Join(s.Dir, "authd", space.Segment(testSpace), "callout.nk"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(seed.Wipe)
	return seed
}

// TestRailUserSeed: a rail given authd's registered callout user seed mints the auth-callout
// credential for that key, proves it, answers the callout subject with it, and renews it with
// proofs from the same key (prove-then-adopt, same subject).
func TestRailUserSeed(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: calloutPolicy("3s")})
	url := s.StartBroker(t)
	client := dialAs(t, s, signerdtest.ID(mtls.KindAuthd, testSpace))
	seed := calloutSeed(t, s)
	want, err := seed.Public()
	if err != nil {
		t.Fatal(err)
	}
	renewed := make(chan string, 4)
	r, err := NewRail(RailConfig{Client: client, Space: testSpace, Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT,
		NatsURL: url, UserSeed: seed, OnRenew: func(jti string, _ time.Time) { renewed <- jti }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if r.PublicKey() != want {
		t.Fatalf("rail key %s, want the registered %s", r.PublicKey(), want)
	}
	if err := r.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	first, _ := r.Current()
	nc, err := nats.Connect(url, r.NatsOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.QueueSubscribe("$SYS.REQ.USER.AUTH", "cotal-auth-callout", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil || nc.LastError() != nil {
		t.Fatalf("callout subscription: %v, %v", err, nc.LastError())
	}
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case jti := <-renewed:
		if jti == first {
			t.Fatalf("renewal kept jti %s", jti)
		}
	case err := <-done:
		t.Fatalf("Run returned before renewing: %v", err)
	case <-ctx.Done():
		t.Fatal("no renewal")
	}
	if r.PublicKey() != want {
		t.Fatalf("renewed rail key %s, want %s", r.PublicKey(), want)
	}
	// The caller's Seed is its own: the rail holds a separate key pair.
	r.Close()
	if pub, err := seed.Public(); err != nil || pub != want {
		t.Fatalf("caller's seed after Close: %q, %v", pub, err)
	}
}

func TestRailUserSeedRefusals(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: calloutPolicy("1h")})
	url := s.StartBroker(t)
	client := dialAs(t, s, signerdtest.ID(mtls.KindAuthd, testSpace))
	cfg := func(seed *creds.Seed) RailConfig {
		return RailConfig{Client: client, Space: testSpace, Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, NatsURL: url, UserSeed: seed}
	}
	fromKP := func(t *testing.T, kp nkeys.KeyPair) *creds.Seed {
		seed, err := creds.SeedFromKeyPair(kp)
		if err != nil {
			t.Fatal(err)
		}
		return seed
	}
	t.Run("fail/account seed", func(t *testing.T) {
		kp, _ := nkeys.CreateAccount()
		_, err := NewRail(cfg(fromKP(t, kp)))
		if err == nil || !strings.Contains(err.Error(), "want a user seed") {
			t.Fatalf("NewRail = %v", err)
		}
	})
	t.Run("fail/wiped seed", func(t *testing.T) {
		kp, _ := nkeys.CreateUser()
		seed := fromKP(t, kp)
		seed.Wipe()
		if _, err := NewRail(cfg(seed)); err == nil {
			t.Fatal("NewRail accepted a wiped seed")
		}
	})
	t.Run("fail/unregistered user key", func(t *testing.T) {
		kp, _ := nkeys.CreateUser()
		r, err := NewRail(cfg(fromKP(t, kp)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		if err := r.Start(ctxT(t)); err == nil {
			t.Fatal("Start minted an auth-callout credential for a key outside auth_users")
		}
	})
	t.Run("fail/proof refused by the broker", func(t *testing.T) {
		// The registered key, but a broker that trusts another operator: the proof fails and
		// nothing is adopted.
		other := testkit.StartBroker(t, testSpace)
		c := cfg(calloutSeed(t, s))
		c.NatsURL = other.URL
		c.ProveTimeout = 2 * time.Second
		r, err := NewRail(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		if err := r.Start(ctxT(t)); err == nil {
			t.Fatal("Start adopted a credential the broker refused")
		}
		if jti, _ := r.Current(); jti != "" {
			t.Fatalf("adopted %s", jti)
		}
	})
}
