package exchange_test

// End to end: IdP token → this exchange → bearer → pkg/authclient connects through the real
// callout responder (authd/internal/callout) on a broker trusting signerd, and reconnects with a
// fresh bearer after the broker drops it at the first bearer's expiry.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// startCallout runs the callout responder for e's space on a new broker and returns its URL.
func (e *env) startCallout(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	url := e.signer.StartBroker(t)
	seed, err := creds.ReadSeedFile(filepath.Join(e.signer.Dir, "authd", space.Segment(spaceName), "callout.nk"))
	if err != nil {
		t.Fatal(err)
	}
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: e.client, Space: spaceName,
		Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, NatsURL: url, UserSeed: seed})
	seed.Wipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctx); err != nil {
		t.Fatal(err)
	}
	svc, err := nats.Connect(url, rail.NatsOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: spaceName, Signer: e.client.API()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := callout.New(callout.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger, JWKS: cache, Lifecycle: e.store})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return url
}

// roundTrip publishes on the actor's own general channel and waits to read it back.
func roundTrip(nc *nats.Conn, owner, actor string) error {
	names, err := space.NewNames(spaceName)
	if err != nil {
		return err
	}
	pub, err := names.Chat(owner, actor, "general")
	if err != nil {
		return err
	}
	read, err := names.ChatRead("general")
	if err != nil {
		return err
	}
	sub, err := nc.SubscribeSync(read)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Publish(pub, []byte("hi")); err != nil {
		return err
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		return fmt.Errorf("read back %s: %w", pub, err)
	}
	if m.Subject != pub {
		return fmt.Errorf("read %s, want %s", m.Subject, pub)
	}
	return nil
}

func TestClientConnectsThroughCallout(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("e2e-user")
	e.grant(owner, "alice")
	url := e.startCallout(t)
	sentinel, err := authclient.Sentinel(context.Background(), e.client.API(), spaceName)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ok/connect-and-talk", func(t *testing.T) {
		c := e.humanClient(t, "e2e-user", "alice", 0)
		opts, err := c.NatsOptions(sentinel)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 16)
		nc, err := nats.Connect(url, append(opts, nats.NoReconnect(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
		if err != nil {
			t.Fatalf("connect through the callout: %v", err)
		}
		defer nc.Close()
		if err := roundTrip(nc, owner, "alice"); err != nil {
			t.Fatal(err)
		}
		// Request/reply on the nonce inbox the callout granted works; a publish as another
		// principal is a broker violation.
		names, _ := space.NewNames(spaceName)
		other, _ := names.Chat(owner, "mallory", "general")
		if err := nc.Publish(other, []byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), testkit.PublishViolation(other)) {
				t.Fatalf("async error %v, want a publish violation on %s", err, other)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publish as another principal was not refused by the broker")
		}
	})
	t.Run("ok/agent-arm", func(t *testing.T) {
		_, tok := e.spawn(owner, "worker")
		c, err := authclient.New(authclient.Config{URL: e.url, Cap: e.cap, Actor: "worker", Owner: owner, ActorToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		opts, err := c.NatsOptions(sentinel)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, append(opts, nats.NoReconnect())...)
		if err != nil {
			t.Fatalf("agent connect through the callout: %v", err)
		}
		defer nc.Close()
		if err := roundTrip(nc, owner, "worker"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("fail/revoked-grant", func(t *testing.T) {
		e.grant(owner, "temp")
		c := e.humanClient(t, "e2e-user", "temp", 0)
		opts, err := c.NatsOptions(sentinel)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Bearer(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := e.ledger.Revoke("actors", owner, "temp"); err != nil {
			t.Fatal(err)
		}
		// The bearer is still live, but the callout's ledger arm refuses the connect.
		nc, err := nats.Connect(url, append(opts, nats.NoReconnect())...)
		if err == nil {
			nc.Close()
			t.Fatal("connect after revoke succeeded")
		}
		if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Fatalf("connect after revoke = %v", err)
		}
	})
}

// TestClientReconnectsWithFreshBearer: the broker drops the connection when the first bearer
// expires (the callout binds the user JWT's exp to it); nats.go reconnects, and the bearer
// function presents a renewed bearer, so the client is back without the caller doing anything.
func TestClientReconnectsWithFreshBearer(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("reconnect-user")
	e.grant(owner, "alice")
	url := e.startCallout(t)
	sentinel, err := authclient.Sentinel(context.Background(), e.client.API(), spaceName)
	if err != nil {
		t.Fatal(err)
	}
	c := e.humanClient(t, "reconnect-user", "alice", 3*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	opts, err := c.NatsOptions(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	var reconnects atomic.Int64
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testkit.Eventually(t, 15*time.Second, func() error {
		if reconnects.Load() == 0 {
			return errors.New("not dropped and reconnected yet")
		}
		if !nc.IsConnected() {
			return errors.New("not connected")
		}
		return roundTrip(nc, owner, "alice")
	})
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
