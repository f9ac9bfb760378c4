package exchange_test

// pkg/authclient against this exchange: tests live here because authd/internal is importable
// only from under authd/.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

func (e *env) humanClient(t *testing.T, sub, actor string, ttl time.Duration) *authclient.Client {
	t.Helper()
	c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: actor, TTL: ttl,
		IdPToken: func(context.Context) (string, error) { return e.idpToken(sub, time.Hour), nil }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientExchange(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, envOpts{})
	owner := e.owner("client-user")
	row := e.grant(owner, "alice", "spawn")
	_, actorTok := e.spawn(owner, "agent1")

	t.Run("ok/human", func(t *testing.T) {
		c := e.humanClient(t, "client-user", "alice", 0)
		b, err := c.Exchange(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := e.verifyBearer(b.Token)
		if b.Owner != owner || got.Act.Actor != "alice" || got.Act.LifecycleUID != row.LifecycleUID || b.Expires.Unix() != got.Exp {
			t.Fatalf("bearer %+v for %+v", got, b)
		}
		tok, err := c.Bearer(ctx)
		if err != nil || tok != b.Token {
			t.Fatalf("Bearer() right after Exchange = %v; want the cached bearer", err)
		}
	})
	t.Run("ok/agent", func(t *testing.T) {
		c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: "agent1", Owner: owner, ActorToken: actorTok})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := c.Bearer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.verifyBearer(tok); got.Exp-got.Iat != 300 || got.Act.Actor != "agent1" {
			t.Fatalf("agent bearer %+v", got)
		}
	})
	t.Run("fail/wrong-cap", func(t *testing.T) {
		c, err := authclient.New(authclient.Config{URL: e.url, Cap: newCap(t), Actor: "alice",
			IdPToken: func(context.Context) (string, error) { return e.idpToken("client-user", time.Hour), nil }})
		if err != nil {
			t.Fatal(err)
		}
		var xe *authclient.ExchangeError
		if _, err := c.Exchange(ctx); !errors.As(err, &xe) || xe.Status != http.StatusUnauthorized || !strings.Contains(xe.Message, "capability") {
			t.Fatalf("Exchange with a wrong cap = %v", err)
		}
	})
	t.Run("fail/agent-wrong-secret", func(t *testing.T) {
		c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: "agent1", Owner: owner, ActorToken: "wrong"})
		if err != nil {
			t.Fatal(err)
		}
		var xe *authclient.ExchangeError
		if _, err := c.Bearer(ctx); !errors.Is(err, authclient.ErrExpired) || !errors.As(err, &xe) || xe.Status != 401 {
			t.Fatalf("Bearer with a wrong secret = %v", err)
		}
	})
	t.Run("fail/idp-source-error", func(t *testing.T) {
		c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: "alice",
			IdPToken: func(context.Context) (string, error) { return "", errors.New("login required") }})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exchange(ctx); err == nil || !strings.Contains(err.Error(), "login required") {
			t.Fatalf("Exchange with a failing IdP source = %v", err)
		}
	})
}

// TestClientRenews: Run renews a 3 s bearer at 75% of its usable life with a new exchange, and,
// once the grant is revoked, stops with ErrExpired when the last bearer's life is over.
func TestClientRenews(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("renew-user")
	e.grant(owner, "alice")
	c := e.humanClient(t, "renew-user", "alice", 3*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := c.Bearer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testkit.Eventually(t, 5*time.Second, func() error {
		tok, err := c.Bearer(ctx)
		if err != nil {
			return err
		}
		if tok == first {
			return errors.New("bearer not renewed yet")
		}
		return nil
	})
	if err := e.ledger.Revoke("actors", owner, "alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var xe *authclient.ExchangeError
		if !errors.Is(err, authclient.ErrExpired) || !errors.As(err, &xe) || xe.Status != 401 {
			t.Fatalf("Run after revoke = %v, want ErrExpired wrapping the 401", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop after the revoked grant's bearer expired")
	}
}

// TestClientNatsOptions checks the options the client connects with: the nonce as name, its
// inbox prefix, the sentinel from signerd's GetSpace as user JWT, and a bearer function that
// yields a live bearer, and, once the grant is revoked and the bearer has expired, a JWT callback
// that fails the attempt on the client.
func TestClientNatsOptions(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, envOpts{})
	owner := e.owner("nats-user")
	e.grant(owner, "alice")
	c := e.humanClient(t, "nats-user", "alice", 3*time.Second)
	sentinel, err := authclient.Sentinel(ctx, e.client.API(), spaceName)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.NatsOptions(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	o := nats.GetDefaultOptions()
	for _, f := range opts {
		if err := f(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.Name != c.Nonce() || o.InboxPrefix != "_INBOX_"+c.Nonce() {
		t.Fatalf("name %q inbox %q, nonce %q", o.Name, o.InboxPrefix, c.Nonce())
	}
	// A human client learns its owner from the exchange NatsOptions made; the nonce is bound to
	// it, as the callout requires.
	if err := space.ValidateBoundInboxNonce(c.Nonce(), owner, "alice"); err != nil {
		t.Fatalf("nonce %q: %v", c.Nonce(), err)
	}
	jwtOut, err := o.UserJWT()
	if err != nil || jwtOut != sentinel {
		t.Fatalf("user JWT callback = %v; want the sentinel", err)
	}
	tok := o.TokenHandler()
	if got := e.verifyBearer(tok); got.Act.Actor != "alice" {
		t.Fatalf("bearer function gave %+v", got)
	}
	if _, err := o.SignatureCB([]byte("nonce")); err != nil {
		t.Fatalf("signature callback: %v", err)
	}
	if err := e.ledger.Revoke("actors", owner, "alice"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if _, err := o.UserJWT(); !errors.Is(err, authclient.ErrExpired) {
			return errors.New("JWT callback still succeeds")
		}
		if tok := o.TokenHandler(); tok != "" {
			return errors.New("bearer function still yields a bearer")
		}
		return nil
	})
}

// TestClientConnectWithoutResponder: on the broker signerd's trust configures for the callout, a
// connect with the sentinel, a real bearer and the nonce is refused while no callout responder
// serves the space: nothing lets a client past the sentinel but authd's answer.
func TestClientConnectWithoutResponder(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("connect-user")
	e.grant(owner, "alice")
	brokerURL := e.signer.StartBroker(t)
	c := e.humanClient(t, "connect-user", "alice", 0)
	sentinel, err := authclient.Sentinel(context.Background(), e.client.API(), spaceName)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.NatsOptions(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	// No attempt may succeed. Under load the broker's handshake can end in a PING where nats.go
	// wants the PONG before the callout times out (the connection fails, but not with the
	// refusal this test names), so an attempt that fails otherwise is retried, at most thrice.
	var errs []error
	for range 3 {
		nc, err := nats.Connect(brokerURL, append(opts, nats.NoReconnect(), nats.Timeout(10*time.Second))...)
		if err == nil {
			nc.Close()
			t.Fatal("connect through the callout with no responder succeeded")
		}
		if strings.Contains(strings.ToLower(err.Error()), "authorization") {
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("connect = %v, want an authorization refusal", errs)
}

// TestClientBearerFunctionDoesNotWaitOnExchange: while a renewal is in flight (here held inside
// the IdP token source), the bearer function a reconnect calls still answers at once with the
// current, live bearer.
func TestClientBearerFunctionDoesNotWaitOnExchange(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("slow-user")
	e.grant(owner, "alice")
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	calls := 0
	c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: "alice",
		IdPToken: func(ctx context.Context) (string, error) {
			calls++
			if calls > 1 {
				entered <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			return e.idpToken("slow-user", time.Hour), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	first, err := c.Bearer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sentinel, err := authclient.Sentinel(context.Background(), e.client.API(), spaceName)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.NatsOptions(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	o := nats.GetDefaultOptions()
	for _, f := range opts {
		if err := f(&o); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _, _ = c.Exchange(context.Background()) }()
	<-entered
	got := make(chan string, 1)
	go func() { got <- o.TokenHandler() }()
	select {
	case tok := <-got:
		if tok != first {
			t.Fatal("bearer function did not return the current bearer")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("bearer function blocked on the exchange in flight")
	}
}
