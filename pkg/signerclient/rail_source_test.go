package signerclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// mintSource is a Source that is not the rail's signerd path: each Mint and Renew is a fresh
// signerd Mint for the key it is asked about (as authd's manager-service authority mints a remote
// manager's credential), recording what it was asked.
type mintSource struct {
	c       *Client
	subject string // "" mints for the asked key; else for this key
	fail    error

	mu      sync.Mutex
	mints   int
	renewed []string // the current JWT each Renew was given
}

func (s *mintSource) mint(ctx context.Context, pub string) (string, error) {
	if s.fail != nil {
		return "", s.fail
	}
	if s.subject != "" {
		pub = s.subject
	}
	cred, err := s.c.Mint(ctx, &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()})
	if err != nil {
		return "", err
	}
	return cred.GetJwt(), nil
}

func (s *mintSource) Mint(ctx context.Context, pub string) (string, error) {
	s.mu.Lock()
	s.mints++
	s.mu.Unlock()
	return s.mint(ctx, pub)
}

func (s *mintSource) Renew(ctx context.Context, pub, cur string) (string, error) {
	s.mu.Lock()
	s.renewed = append(s.renewed, cur)
	s.mu.Unlock()
	return s.mint(ctx, pub)
}

// TestRailSource: a rail with a Source takes its first credential from Source.Mint and renews by
// Source.Renew (given the JWT in use) at RenewFraction of its life, proving each on the broker
// before adopting it, with no signerd client of its own; a live connection keeps working across
// the renewal. A Source that answers another subject's credential, or fails, adopts nothing.
func TestRailSource(t *testing.T) {
	e := startEnv(t, shortPolicy("3s", "own"))
	t.Run("ok/mint and renew through the source", func(t *testing.T) {
		src := &mintSource{c: e.client}
		r, err := NewRail(RailConfig{Source: src, Space: testSpace, NatsURL: e.url, RetryInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		first := r.cur.Load().jwt
		jti0, exp0 := r.Current()
		if src.mints != 1 || jti0 == "" {
			t.Fatalf("mints %d jti %q, want 1 and a credential", src.mints, jti0)
		}
		c := connectChat(t, e.url, r.NatsOptions()...)
		if err := c.roundTrip(5 * time.Second); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		runRail(t, r)
		testkit.Eventually(t, 15*time.Second, func() error {
			if jti, _ := r.Current(); jti == jti0 {
				return errors.New("not renewed yet")
			}
			return nil
		})
		src.mu.Lock()
		renewed := append([]string(nil), src.renewed...)
		src.mu.Unlock()
		if len(renewed) == 0 || renewed[0] != first {
			t.Fatalf("Renew was given %d JWTs, the first the one in use: %v", len(renewed), len(renewed) > 0 && renewed[0] == first)
		}
		if _, exp := r.Current(); !exp.After(exp0) {
			t.Fatalf("renewed expiry %v, want after %v", exp, exp0)
		}
		testkit.Eventually(t, 10*time.Second, func() error { return c.roundTrip(time.Second) })
	})
	t.Run("fail/the source answers another subject", func(t *testing.T) {
		other, _ := nkeys.CreateUser()
		opub, _ := other.PublicKey()
		r, err := NewRail(RailConfig{Source: &mintSource{c: e.client, subject: opub}, Space: testSpace, NatsURL: e.url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		if err := r.Start(ctxT(t)); !errors.Is(err, ErrSubjectChanged) {
			t.Fatalf("Start = %v, want ErrSubjectChanged", err)
		}
		if jti, _ := r.Current(); jti != "" {
			t.Fatalf("adopted %s", jti)
		}
	})
	t.Run("fail/the source refuses", func(t *testing.T) {
		want := fmt.Errorf("authority down")
		r, err := NewRail(RailConfig{Source: &mintSource{c: e.client, fail: want}, Space: testSpace, NatsURL: e.url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		if err := r.Start(ctxT(t)); !errors.Is(err, want) {
			t.Fatalf("Start = %v, want the source's error", err)
		}
	})
	t.Run("fail/neither client nor source", func(t *testing.T) {
		if _, err := NewRail(RailConfig{Space: testSpace, NatsURL: e.url}); err == nil {
			t.Fatal("NewRail accepted a config without Client or Source")
		}
	})
}
