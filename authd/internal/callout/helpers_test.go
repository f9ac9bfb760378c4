package callout

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	testSpace = "alpha"
	owner     = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	owner2    = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	uid1      = "lifecycle0000000000000000001"
	uid2      = "lifecycle0000000000000000002"
)

// testPolicy is signerdtest's default policy with the admin profile added for authd (the admin
// view), the service tokens and service-serve grants authd makes (the service arm), the agent
// capabilities the tests grant, and the channel subtree team.> for authd's agents (a ledger row
// may hold a channel pattern; signerd grants it only where a policy pattern covers its broker
// reach, and team.* does not cover team.>).
const testPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 10000, burst: 10000}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["general", "team.*"], capabilities: [spawn]}
      provisioner: {ttl_max: 5m, any_owner: true}
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [Mint, Remint, GetSpace, OpenCalloutRequest, SignCalloutResponse, SignBearer, GetJWKS, DeriveOwner, SignServiceCredential]
    spaces: ["{space}"]
    rate: {per_second: 10000, burst: 20000}
    profiles:
      auth-callout: {ttl_max: 24h}
      service-serve: {ttl_max: 1m, any_owner: true, remint: none}
      agent: {ttl_max: 1h, any_owner: true, channels: ["general", "team.>"], capabilities: [spawn, run]}
      admin: {ttl_max: 1h, any_owner: true}
`

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// env is a real signerd, a broker trusting it with the callout in the AUTH account, and a
// running responder whose signerd calls go through a proxy the test can cut.
type env struct {
	s      *signerdtest.Signer
	ns     *server.Server
	url    string
	names  space.Names
	gs     *signerv1.GetSpaceResponse
	authd  *signerclient.Client // direct: SignBearer, GetSpace, the callout rail
	proxy  *proxy               // the responder's path to signerd
	ledger *ledger.Ledger
	r      *Responder
	svc    *nats.Conn // the callout-service connection
	rec    *recorder  // the responder's signerd calls
}

type envOptions struct {
	allowed     func(ns *server.Server) []string
	maxInFlight int
	policy      string
	// noResponder leaves the responder unstarted (benchmarks start their own).
	noResponder bool
	// jwks, when set, feeds the responder's issuer keys instead of signerd's GetJWKS.
	jwks bearer.JWKSFetcher
	// lifecycle is the responder's issuance gate reader (nil: managed rows are refused).
	lifecycle GateReader
	// services is the responder's service gate (nil: every service connect is refused).
	services ServiceGate
	// extraKeys are issuer keys the responder's JWKS serves besides signerd's (test keys that
	// sign service tokens).
	extraKeys []*signerv1.JWK
}

// plusKeys is a GetJWKS that serves the inner set and extra keys.
type plusKeys struct {
	inner bearer.JWKSFetcher
	extra []*signerv1.JWK
}

func (p plusKeys) GetJWKS(ctx context.Context, in *signerv1.GetJWKSRequest, opts ...grpc.CallOption) (*signerv1.GetJWKSResponse, error) {
	resp, err := p.inner.GetJWKS(ctx, in, opts...)
	if err != nil {
		return nil, err
	}
	return &signerv1.GetJWKSResponse{Keys: append(slices.Clone(resp.GetKeys()), p.extra...)}, nil
}

func startEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	if o.policy == "" {
		o.policy = testPolicy
	}
	e := &env{}
	e.s = signerdtest.Start(t, signerdtest.Options{Policy: o.policy})
	e.ns = startBroker(t, e.s, "")
	e.url = e.ns.ClientURL()
	var err error
	if e.names, err = space.NewNames(testSpace); err != nil {
		t.Fatal(err)
	}
	files := e.s.ClientFor(t, mtls.KindAuthd, testSpace)
	e.authd = dialSigner(t, e.s.Addr, files)
	if e.gs, err = e.authd.GetSpace(ctxT(t), testSpace); err != nil {
		t.Fatal(err)
	}
	e.proxy = startProxy(t, e.s.Addr)
	viaProxy := dialSigner(t, e.proxy.addr(), files)

	e.svc = calloutConn(t, e.authd, e.s, e.url)
	if e.ledger, err = ledger.Open(filepath.Join(t.TempDir(), "state")); err != nil {
		t.Fatal(err)
	}
	var fetcher bearer.JWKSFetcher = viaProxy.API()
	if o.jwks != nil {
		fetcher = o.jwks
	}
	if len(o.extraKeys) > 0 {
		fetcher = plusKeys{inner: fetcher, extra: o.extraKeys}
	}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: fetcher})
	if err != nil {
		t.Fatal(err)
	}
	var allowed []string
	if o.allowed != nil {
		allowed = o.allowed(e.ns)
	}
	e.rec = newRecorder(viaProxy.API())
	e.r, err = New(Config{Space: testSpace, Signer: viaProxy, Ledger: e.ledger, JWKS: cache,
		AllowedServers: allowed, MaxInFlight: o.maxInFlight, Logger: testLogger(t), signer: e.rec, Lifecycle: o.lifecycle, Services: o.services})
	if err != nil {
		t.Fatal(err)
	}
	if o.noResponder {
		return e
	}
	if err := e.r.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.r.Close)
	return e
}

// startBroker runs a broker that trusts signerd's operator and spaces (the AUTH account JWT
// carries the callout configuration, as `signerd init` writes it). storeDir "" is a fresh one.
func startBroker(t testing.TB, s *signerdtest.Signer, storeDir string) *server.Server {
	t.Helper()
	return startBrokerOn(t, s, storeDir, -1)
}

func startBrokerOn(t testing.TB, s *signerdtest.Signer, storeDir string, port int) *server.Server {
	t.Helper()
	if storeDir == "" {
		storeDir = t.TempDir()
	}
	b, spaces := s.Trust(t)
	opts, err := trust.ServerOptions(trust.ServerConfig{Host: "127.0.0.1", Port: port, StoreDir: storeDir, Broker: b, Spaces: spaces})
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("broker not ready")
	}
	return ns
}

func dialSigner(t testing.TB, addr string, files mtls.ClientFiles) *signerclient.Client {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: addr, TLS: files, ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd", CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// calloutConn is authd's callout-service connection: the rail with the registered user seed.
func calloutConn(t testing.TB, client *signerclient.Client, s *signerdtest.Signer, url string) *nats.Conn {
	t.Helper()
	seed, err := creds.ReadSeedFile(filepath.Join(s.Dir, "authd", space.Segment(testSpace), "callout.nk"))
	if err != nil {
		t.Fatal(err)
	}
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: client, Space: testSpace,
		Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, NatsURL: url, UserSeed: seed})
	seed.Wipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, append(rail.NatsOptions(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// row is an interactive grant for owner.actor on channel general, scope [spawn].
func row(actor string) ledger.Row {
	return ledger.Row{Owner: owner, Actor: actor, Scope: []string{"spawn"},
		AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		LifecycleUID: uid1, GrantedAt: time.Now().UnixMilli()}
}

func (e *env) grant(t testing.TB, r ledger.Row) ledger.Row {
	t.Helper()
	if err := e.ledger.Put(ledger.Interactive, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// bearerFor signs a bearer for r through signerd (scope and uid from the row, as the exchange
// takes them), edited by edit.
func (e *env) bearerFor(t testing.TB, r ledger.Row, ttl time.Duration, edit func(*signerv1.SignBearerRequest)) (string, time.Time) {
	t.Helper()
	req := &signerv1.SignBearerRequest{Space: testSpace, Owner: r.Owner, Actor: r.Actor, Scope: r.BearerScope(),
		LifecycleUid: r.LifecycleUID, Ttl: durationpb.New(ttl)}
	if edit != nil {
		edit(req)
	}
	resp, err := e.authd.API().SignBearer(ctxT(t), req)
	if err != nil {
		t.Fatalf("SignBearer: %v", err)
	}
	return resp.GetToken(), resp.GetExpiresAt().AsTime()
}

// newNonce is a fresh inbox nonce bound to no principal: what a client that does not bind its
// nonce (or an attacker) presents.
func newNonce() string { return "n_" + rand.Text() }

// nonceFor is a fresh inbox nonce bound to the principal of bearer token (act.owner, act.actor),
// as pkg/authclient makes it; an unreadable token or an invalid principal gets newNonce.
func nonceFor(t testing.TB, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return newNonce()
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return newNonce()
	}
	var claims struct {
		Act struct{ Owner, Actor string } `json:"act"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Act.Owner == "" {
		return newNonce()
	}
	n, err := space.BoundInboxNonce(claims.Act.Owner, claims.Act.Actor, rand.Text())
	if err != nil {
		// A bearer naming a principal outside the grammars, which the callout refuses anyway.
		return newNonce()
	}
	return n
}

// client is a connection made the way Cotal clients connect through the callout.
type client struct {
	*nats.Conn
	nonce  string
	mu     sync.Mutex
	errs   []error
	closed chan struct{}
}

// connect presents the sentinel JWT (any key signs the nonce), the bearer as auth token and the
// nonce as connection name and inbox prefix.
func (e *env) connect(t testing.TB, token, nonce string) (*client, error) {
	t.Helper()
	return e.connectInbox(t, token, nonce, "_INBOX_"+nonce)
}

// connectInbox is connect with another inbox prefix (for names no prefix could be made of).
func (e *env) connectInbox(t testing.TB, token, nonce, inbox string) (*client, error) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	c := &client{nonce: nonce, closed: make(chan struct{})}
	nc, err := nats.Connect(e.url,
		nats.UserJWT(func() (string, error) { return e.gs.GetSentinelJwt(), nil }, kp.Sign),
		nats.Token(token), nats.Name(nonce), nats.CustomInboxPrefix(inbox),
		nats.NoReconnect(), nats.Timeout(10*time.Second),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.errs = append(c.errs, err)
		}))
	if err != nil {
		// A callout answered by silence can lose its refusal to the broker's RTT PING.
		return nil, testkit.RefusedOnRecord(t, e.ns, nonce, err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c, nil
}

// waitError waits until the broker has sent c an asynchronous error containing want.
func (c *client) waitError(t testing.TB, want string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		if err := c.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			return err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, err := range c.errs {
			if strings.Contains(err.Error(), want) {
				return nil
			}
		}
		return fmt.Errorf("no error containing %q yet; have %v", want, c.errs)
	})
}

func (c *client) noErrors(t testing.TB) {
	t.Helper()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) != 0 {
		t.Fatalf("async errors: %v", c.errs)
	}
}

// wantDenied asserts a connect failed on authorization.
func wantDenied(t testing.TB, c *client, err error) {
	t.Helper()
	if err == nil {
		c.Close()
		t.Fatal("connect succeeded; want an authorization violation")
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("connect error = %v, want an authorization violation", err)
	}
}

// connInfo returns the broker's view of the connection named nonce.
func (e *env) connInfo(t testing.TB, nonce string) *server.ConnInfo {
	t.Helper()
	cz, err := e.ns.Connz(&server.ConnzOptions{Username: true, Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cz.Conns {
		if ci.Name == nonce {
			return ci
		}
	}
	t.Fatalf("broker has no connection named %s", nonce)
	return nil
}

// recorder passes the responder's signerd calls through and keeps each grant by the
// connection name of the request it answered, so tests can check what authd asked signerd to mint.
type recorder struct {
	Signer
	mu       sync.Mutex
	names    map[string]string // sealed request -> connection name
	grants   map[string]*signerv1.CalloutGrant
	asked    map[string]*signerv1.CalloutGrant // every grant sent, signed or refused by signerd
	refusals map[string]string                 // connection name -> refusal sentence signed
}

func newRecorder(inner Signer) *recorder {
	return &recorder{Signer: inner, names: map[string]string{}, grants: map[string]*signerv1.CalloutGrant{},
		asked: map[string]*signerv1.CalloutGrant{}, refusals: map[string]string{}}
}

func (r *recorder) OpenCalloutRequest(ctx context.Context, in *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	resp, err := r.Signer.OpenCalloutRequest(ctx, in, opts...)
	if err == nil {
		r.mu.Lock()
		r.names[string(in.GetSealedRequest())] = resp.GetConnectionName()
		r.mu.Unlock()
	}
	return resp, err
}

func (r *recorder) SignCalloutResponse(ctx context.Context, in *signerv1.SignCalloutResponseRequest, opts ...grpc.CallOption) (*signerv1.SignCalloutResponseResponse, error) {
	if in.GetGrant() != nil {
		r.mu.Lock()
		r.asked[r.names[string(in.GetSealedRequest())]] = in.GetGrant()
		r.mu.Unlock()
	}
	resp, err := r.Signer.SignCalloutResponse(ctx, in, opts...)
	if err == nil {
		r.mu.Lock()
		name := r.names[string(in.GetSealedRequest())]
		if in.GetGrant() != nil {
			r.grants[name] = in.GetGrant()
		} else {
			r.refusals[name] = in.GetError()
		}
		r.mu.Unlock()
	}
	return resp, err
}

// refusal returns the refusal signed for the connection named name ("" if none).
func (r *recorder) refusal(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refusals[name]
}

// askedGrant returns the grant the responder sent signerd for the connection named name (nil
// if none), whether signerd signed it or not.
func (r *recorder) askedGrant(name string) *signerv1.CalloutGrant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked[name]
}

func (r *recorder) grant(t testing.TB, name string) *signerv1.CalloutGrant {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.grants[name]
	if !ok {
		t.Fatalf("no grant signed for connection %s", name)
	}
	return g
}

// proxy forwards TCP to a target until cut; restore listens on the same port again.
type proxy struct {
	target string
	mu     sync.Mutex
	ln     net.Listener
	port   string
	conns  map[net.Conn]bool
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p := &proxy{target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, p.port, _ = net.SplitHostPort(ln.Addr().String())
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return "127.0.0.1:" + p.port }

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); _ = u.Close(); _ = c.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = u.Close(); _ = c.Close() }()
		}
	}()
}

// cut closes the listener and every forwarded connection: signerd is unreachable.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// restore listens on the same port again.
func (p *proxy) restore(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

var testLogs sync.Map // testing.TB -> *testkit.SyncBuffer

func testLogger(t testing.TB) *slog.Logger {
	b := &testkit.SyncBuffer{}
	testLogs.Store(t, b)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("responder log:\n%s", b.String())
		}
	})
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func logOf(t testing.TB) string {
	b, ok := testLogs.Load(t)
	if !ok {
		return ""
	}
	return b.(*testkit.SyncBuffer).String()
}
