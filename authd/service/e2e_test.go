package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// human is a running authd with a pinned fake IdP (httptest serving a real Ed25519 JWKS) and an
// interactive ledger row for owner.alice, plus what a client needs to reach it.
type human struct {
	e      *env
	s      *service.Service
	cfg    string // state dir
	idp    *idptest.IdP
	api    signerv1.SignerServiceClient
	owner  string
	cap    string
	led    *ledger.Ledger
	row    ledger.Row
	sentin string
	ev     events // what the service told its host
}

const idpSub = "alice-subject"

func newHuman(t *testing.T) *human { return newHumanPin(t, true) }

// newHumanPin is newHuman, with the IdP pinned before authd starts or not at all.
func newHumanPin(t *testing.T, pin bool) *human {
	t.Helper()
	return newHumanEnv(t, newEnv(t), pin, nil)
}

// newHumanEnv is newHumanPin on e; load, if set, turns the configuration into the one authd
// starts with (written as YAML and loaded back, say); opts are authd's extra broker options.
func newHumanEnv(t testing.TB, e *env, pin bool, load func(*config.Config) *config.Config, opts ...nats.Option) *human {
	t.Helper()
	return newHumanWith(t, e, pin, load, func(_ *service.Inputs, o *service.RuntimeOptions) { o.NatsOptions = opts })
}

// newHumanWith is newHumanEnv with Start's inputs and options set by with (after the events
// hook, which it may keep or replace).
func newHumanWith(t testing.TB, e *env, pin bool, load func(*config.Config) *config.Config, with func(*service.Inputs, *service.RuntimeOptions)) *human {
	t.Helper()
	cfg := e.config(t)
	if load != nil {
		cfg = load(cfg)
	}
	h := &human{e: e, cfg: cfg.StateDir, idp: idptest.Start(t)}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if pin {
		if _, err := idp.PinURL(ctxT(t), cfg.StateDir, h.idp.URL, nil); err != nil {
			t.Fatalf("pin: %v", err)
		}
	}
	c, err := signerclient.Dial(signerclient.Config{Addrs: e.sg.Addrs(), TLS: e.sg.ClientFor(t, "authd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	h.api = c.API()
	resp, err := h.api.DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: sp, IdpIssuer: h.idp.URL, Subject: idpSub})
	if err != nil {
		t.Fatal(err)
	}
	h.owner = resp.GetOwner()
	if h.led, err = ledger.Open(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	uid, err := admin.NewLifecycleUID()
	if err != nil {
		t.Fatal(err)
	}
	h.row = ledger.Row{Ver: ledger.Version, Owner: h.owner, Actor: "alice", Scope: []string{}, AllowSubscribe: []string{"general"},
		AllowPublish: []string{"general"}, LifecycleUID: uid, GrantedAt: time.Now().UnixMilli()}
	if err := h.led.Put(ledger.Interactive, h.row); err != nil {
		t.Fatal(err)
	}
	in, o := service.Inputs{Config: cfg}, service.RuntimeOptions{Events: h.ev.on}
	with(&in, &o)
	h.s = startWith(t, in, o)
	b, err := os.ReadFile(daemon.DiscoveryPath(cfg.StateDir, service.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var d daemon.Discovery
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	h.cap = d.Cap
	if h.sentin, err = authclient.Sentinel(ctxT(t), h.api, sp); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *human) client(t *testing.T, ttl time.Duration) *authclient.Client {
	t.Helper()
	c, err := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "alice", TTL: ttl,
		IdPToken: func(context.Context) (string, error) {
			return h.idp.Token(t, h.idp.Claims(idpSub, time.Now(), time.Hour), nil), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// conn is a client connection through the callout with its asynchronous errors recorded.
type conn struct {
	nc     *nats.Conn
	mu     sync.Mutex
	errs   []error
	closed chan struct{}
}

func (c *conn) asyncErrs() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

func (h *human) connect(t *testing.T, c *authclient.Client) (*conn, error) {
	t.Helper()
	opts, err := c.NatsOptions(h.sentin)
	if err != nil {
		t.Fatal(err)
	}
	cn := &conn{closed: make(chan struct{})}
	opts = append(opts, nats.NoReconnect(), nats.Timeout(10*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			cn.mu.Lock()
			cn.errs = append(cn.errs, err)
			cn.mu.Unlock()
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(cn.closed) }))
	nc, err := nats.Connect(h.e.url, opts...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(nc.Close)
	cn.nc = nc
	return cn, nil
}

// dataWatcher is a data-account connection of its own (an agent minted through signerd for
// managerd's identity) subscribed to the general channel: what it receives was published in the
// space's data account.
func (h *human) dataWatcher(t *testing.T, subject string) *nats.Subscription {
	t.Helper()
	mgr, err := signerclient.Dial(signerclient.Config{Addr: h.e.sg.Addr, TLS: h.e.sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close() })
	uid, _ := admin.NewLifecycleUID()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: mgr, Space: sp, Profile: signerv1.Profile_PROFILE_AGENT, NatsURL: h.e.url,
		Params: &signerv1.ProfileParams{Owner: "watcher", Actor: "w", LifecycleUid: uid, Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(h.e.url, append(rail.NatsOptions(), nats.NoReconnect())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestHappyPath is issue 9's acceptance path through the real daemon: an IdP token is exchanged
// at authd's loopback face for a bearer, the bearer connects through the callout (sentinel +
// bearer + inbox nonce) and lands in the space's data account as owner.alice with the ledger
// row's ACL, which the broker enforces; the broker drops the connection at the bearer's exp;
// a revoked row denies the next connect without a restart.
func TestHappyPath(t *testing.T) {
	h := newHuman(t)
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	watch := h.dataWatcher(t, must(n.ChatRead("general")))
	c := h.client(t, 3*time.Second)
	cn, err := h.connect(t, c)
	if err != nil {
		t.Fatalf("connect through the callout: %v", err)
	}
	own := must(n.Chat(h.owner, "alice", "general"))
	gs, err := h.api.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: sp})
	if err != nil {
		t.Fatal(err)
	}
	cz, err := h.e.ns.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	var ci *server.ConnInfo
	for _, x := range cz.Conns {
		if x.Name == c.Nonce() {
			ci = x
		}
	}
	if ci == nil {
		t.Fatalf("no connection named %s in connz", c.Nonce())
	}
	// The broker's own view: the data account, as the user the grant names, <owner>-<actor>. (Its
	// connz tags stay the sentinel's, which the broker authenticated first; the grant's principal
	// tags are checked on the signed grant in the callout package's tests.)
	if ci.Account != gs.GetAccountPublicKey() || ci.AuthorizedUser != h.owner+"-alice" {
		t.Fatalf("connection is %q in account %s; want %q in the data account %s", ci.AuthorizedUser, ci.Account, h.owner+"-alice", gs.GetAccountPublicKey())
	}
	// Its post on its own chat subject reaches another data-account subscriber of the channel. The
	// agent ACL from the row: a channel
	// outside allowPublish and another principal's subject are violations.
	if err := cn.nc.Publish(own, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if m, err := watch.NextMsg(5 * time.Second); err != nil || m.Subject != own || string(m.Data) != "hi" {
		t.Fatalf("own publish not delivered in the data account: %v", err)
	}
	for _, bad := range []string{must(n.Chat(h.owner, "alice", "secret")), must(n.Chat("someone", "else", "general"))} {
		if err := cn.nc.Publish(bad, []byte("x")); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			_ = cn.nc.Flush()
			for _, e := range cn.asyncErrs() {
				if strings.Contains(e.Error(), testkit.PublishViolation(bad)) {
					return nil
				}
			}
			return errors.New("no violation yet for " + bad)
		})
	}

	// The broker drops the connection at the bearer's exp (3 s).
	select {
	case <-cn.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("connection still open long after the bearer's exp")
	}
	expired := false
	for _, e := range cn.asyncErrs() {
		expired = expired || errors.Is(e, nats.ErrAuthExpired) || strings.Contains(strings.ToLower(e.Error()), "expired")
	}
	if !expired && !errors.Is(cn.nc.LastError(), nats.ErrAuthExpired) {
		t.Fatalf("closed without an expiry: %v / %v", cn.asyncErrs(), cn.nc.LastError())
	}

	// A new connect renews the bearer through the client and is admitted again.
	if _, err := h.connect(t, c); err != nil {
		t.Fatalf("reconnect after renewal: %v", err)
	}
	// Revocation bites at the next connect, without restarting authd.
	if err := h.led.Revoke(ledger.Interactive, h.owner, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.connect(t, c); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("connect after revoke = %v, want an authorization violation", err)
	}
}

// TestSignerdStopped: with signerd stopped, connects are denied (nothing can be signed) and
// authd keeps running and ready; when signerd is back, authd admits again without a restart.
func TestSignerdStopped(t *testing.T) {
	h := newHuman(t)
	c := h.client(t, 0)
	if _, err := h.connect(t, c); err != nil {
		t.Fatalf("connect with signerd up: %v", err)
	}
	h.e.sg.Stop(t)
	if _, err := h.connect(t, c); err == nil {
		t.Fatal("connect admitted with signerd stopped")
	}
	select {
	case <-h.s.Done():
		t.Fatalf("authd stopped when signerd did: %v", h.s.Err())
	default:
	}
	if _, err := daemon.Ready(readyCtx(t), h.cfg, service.FileName, os.Getpid()); err != nil {
		t.Fatalf("authd not ready while signerd is down: %v", err)
	}
	h.e.sg.Restart(t)
	testkit.Eventually(t, 30*time.Second, func() error {
		_, err := h.connect(t, c)
		return err
	})
}

// TestSignerdReplicaStopped (issue 13): authd configured from YAML with `signer.addresses: [a,
// b]` starts, admits connections through the callout (signerd opens and signs every answer), and
// keeps admitting every one of them after replica a stops: no connect fails, replica b audits
// at least the open and the signed answer of each, and authd stays ready.
func TestSignerdReplicaStopped(t *testing.T) {
	e := newEnvReplicas(t, 2)
	h := newHumanEnv(t, e, true, func(cfg *config.Config) *config.Config {
		path := filepath.Join(t.TempDir(), "authd.yaml")
		if err := os.WriteFile(path, []byte(yamlOf(cfg)), 0o600); err != nil {
			t.Fatal(err)
		}
		loaded, err := config.Load(path)
		if err != nil {
			t.Fatalf("load %s: %v", path, err)
		}
		if !slices.Equal(loaded.Signer.Addresses, e.sg.Addrs()) || loaded.Signer.Address != "" {
			t.Fatalf("signer block loaded as %+v, want addresses %v", loaded.Signer, e.sg.Addrs())
		}
		return loaded
	})
	c := h.client(t, 0)
	const n = 6
	for i := range n {
		if _, err := h.connect(t, c); err != nil {
			t.Fatalf("connect %d with both replicas up: %v", i, err)
		}
	}
	e.sg.Replicas[0].Stop(t)
	b0 := e.sg.Replicas[1].Audit(t).Lines
	for i := range n {
		if _, err := h.connect(t, c); err != nil {
			t.Fatalf("connect %d with replica %s stopped: %v", i, e.sg.Replicas[0].ID, err)
		}
	}
	select {
	case <-h.s.Done():
		t.Fatalf("authd stopped when one replica did: %v", h.s.Err())
	default:
	}
	if _, err := daemon.Ready(readyCtx(t), h.cfg, service.FileName, os.Getpid()); err != nil {
		t.Fatalf("authd not ready with one replica down: %v", err)
	}
	if b := e.sg.Replicas[1].Audit(t).Lines - b0; b < 2*n {
		t.Fatalf("replica b audited %d lines for %d connects, want at least %d (open and answer each)", b, n, 2*n)
	}
}

// TestPinWhileRunning: authd started before its IdP was pinned answers the human arm 503, and
// `authd idp pin` (idp.PinURL on the state dir) takes effect without a restart.
func TestPinWhileRunning(t *testing.T) {
	h := newHumanPin(t, false)
	c := h.client(t, 0)
	var xe *authclient.ExchangeError
	if _, err := c.Exchange(ctxT(t)); !errors.As(err, &xe) || xe.Status != 503 {
		t.Fatalf("exchange before the pin = %v, want 503", err)
	}
	if _, err := idp.PinURL(ctxT(t), h.cfg, h.idp.URL, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := c.Exchange(ctxT(t))
		return err
	})
	if _, err := h.connect(t, c); err != nil {
		t.Fatalf("connect after pinning: %v", err)
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}
