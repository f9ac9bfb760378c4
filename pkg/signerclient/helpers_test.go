package signerclient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	testSpace = "alpha"
	testOwner = "u_owner"
	testActor = "bot"
	testUID   = "0123456789abcdefghijklmnop"
)

// shortPolicy is signerdtest's policy for managerd with an agent lifetime of ttl and the given
// remint mode.
func shortPolicy(ttl, remint string) string {
	return `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent:
        ttl_max: ` + ttl + `
        any_owner: true
        channels: ["general"]
        remint: ` + remint + `
`
}

// env is a running signerd, its broker and a managerd client.
type env struct {
	s      *signerdtest.Signer
	url    string
	client *Client
}

func startEnv(t *testing.T, policy string) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Policy: policy})
	url := s.StartBroker(t)
	return &env{s: s, url: url, client: dialAs(t, s, signerdtest.ID(mtls.KindManagerd, testSpace))}
}

// dialAs dials the test signerd with a certificate for id.
func dialAs(t *testing.T, s *signerdtest.Signer, id string) *Client {
	t.Helper()
	c, err := Dial(Config{Addr: s.Addr, TLS: s.Client(t, id), ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd"})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func agentParams() *signerv1.ProfileParams {
	return &signerv1.ProfileParams{
		Owner: testOwner, Actor: testActor, LifecycleUid: testUID,
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
	}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newRail builds a rail for the test agent; mutate adjusts the config.
func newRail(t *testing.T, e *env, mutate func(*RailConfig)) *Rail {
	t.Helper()
	cfg := RailConfig{Client: e.client, Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, Params: agentParams(), NatsURL: e.url}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := NewRail(cfg)
	if err != nil {
		t.Fatalf("NewRail: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// chat is a live agent connection subscribed to its own channel.
type chat struct {
	nc      *nats.Conn
	sub     *nats.Subscription
	pubSubj string
	n       int
}

func connectChat(t *testing.T, url string, opts ...nats.Option) *chat {
	t.Helper()
	names, err := space.NewNames(testSpace)
	if err != nil {
		t.Fatal(err)
	}
	pubSubj, err := names.Chat(testOwner, testActor, "general")
	if err != nil {
		t.Fatal(err)
	}
	readSubj, err := names.ChatRead("general")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(readSubj)
	if err != nil {
		t.Fatalf("subscribe %s: %v", readSubj, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if err := nc.LastError(); err != nil {
		t.Fatalf("subscribe %s refused: %v", readSubj, err)
	}
	return &chat{nc: nc, sub: sub, pubSubj: pubSubj}
}

// roundTrip publishes a fresh message on the agent's chat subject and reads it back.
func (c *chat) roundTrip(wait time.Duration) error {
	c.n++
	want := fmt.Sprintf("hello %d", c.n)
	if err := c.nc.Publish(c.pubSubj, []byte(want)); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if err := c.nc.FlushTimeout(wait); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		m, err := c.sub.NextMsg(time.Until(deadline))
		if err != nil {
			return fmt.Errorf("receive %q: %w (last error %v)", want, err, c.nc.LastError())
		}
		if string(m.Data) == want {
			return nil
		}
	}
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct{ testkit.SyncBuffer }

func (b *logBuffer) count(s string) int { return strings.Count(b.String(), s) }

func newLogger(b *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
