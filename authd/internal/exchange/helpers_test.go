package exchange_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const spaceName = "alpha"

// env is one exchange on a real loopback listener, backed by a real signerd over mTLS, a real
// ledger in a temp state dir and a fake IdP serving a real Ed25519 JWKS.
type env struct {
	t      *testing.T
	signer *signerdtest.Signer
	client *signerclient.Client
	ledger *ledger.Ledger
	idp    *idptest.IdP
	cap    string
	url    string
	clock  *clock
	// auth is the lifecycle authority on a provisioned space of its own broker (the agent arm's
	// Activator); store is its Store, held says whether its plane check passes.
	auth    *authority.Authority
	store   *authority.Store
	account string
	held    atomic.Bool
}

type clock struct {
	mu sync.Mutex
	d  time.Duration
}

// Now is the wall clock plus an offset the test can advance (signerd keeps the real clock).
func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.d) }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.d += d
	c.mu.Unlock()
}

type envOpts struct {
	noIdP bool
	// noActivator leaves Config.Activator nil; lifecycle sets Config.Lifecycle.
	noActivator bool
	lifecycle   func(e *env) http.Handler
	// idp, when set, replaces the verifier of the fake IdP's pin.
	idp func(e *env) exchange.IdP
	// selector, when set, binds manager-caller bearers.
	selector exchange.ManagerSelector
	// public serves the public face (exchange.NewPublic, no cap) on a real 127.0.0.1:0 listener
	// instead of the loopback face; publicCfg, when set, adjusts its PublicConfig first.
	public    bool
	publicCfg func(e *env, pc *exchange.PublicConfig)
}

// Public face defaults of the test env.
const (
	testPublicURL    = "https://auth.example/tenant-a"
	testPublicServer = "wss://mesh.example/ws"
)

func newEnv(t *testing.T, opts envOpts) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})
	client, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, "authd", spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	state := filepath.Join(t.TempDir(), "state")
	l, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, signer: s, client: client, ledger: l, idp: idptest.Start(t), cap: newCap(t), clock: &clock{}}
	cfg := exchange.Config{Space: spaceName, Signer: client, Ledger: l, Cap: e.cap, Now: e.clock.Now, Selector: opts.selector}
	e.startAuthority()
	if !opts.noActivator {
		cfg.Activator = e.auth
	}
	if opts.lifecycle != nil {
		cfg.Lifecycle = opts.lifecycle(e)
	}
	switch {
	case opts.idp != nil:
		cfg.IdP = opts.idp(e)
	case !opts.noIdP:
		pin, err := idp.NewPin(e.idp.URL)
		if err != nil {
			t.Fatal(err)
		}
		v, err := idp.NewVerifier(pin, idp.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.IdP = v
	}
	if opts.public {
		e.startPublic(cfg, opts.publicCfg)
		return e
	}
	h, err := exchange.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// startPublic serves the public face of cfg (no cap, no lifecycle door) through
// exchange.NewPublicServer on a real loopback listener; e.cap is then "" and do sends no
// Authorization header.
func (e *env) startPublic(cfg exchange.Config, adjust func(e *env, pc *exchange.PublicConfig)) {
	e.t.Helper()
	cfg.Cap, cfg.Lifecycle, e.cap = "", nil, ""
	pc := exchange.PublicConfig{Exchange: cfg, URL: testPublicURL, Server: testPublicServer,
		Pin: func() (idp.Pin, error) { return idp.NewPin(e.idp.URL) }}
	if adjust != nil {
		adjust(e, &pc)
	}
	p, err := exchange.NewPublic(pc)
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	srv := exchange.NewPublicServer(p)
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(func() { _ = srv.Close() })
	e.url = "http://" + ln.Addr().String()
}

// startAuthority builds e's lifecycle authority over authoritytest's provisioned space.
func (e *env) startAuthority() {
	e.t.Helper()
	sp := authoritytest.Provisioned(e.t, spaceName)
	st, err := authority.NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	e.held.Store(true)
	a, err := authority.New(authority.Config{Store: st, Ledger: e.ledger, Space: spaceName, Account: sp.Account,
		Held: func() error {
			if !e.held.Load() {
				return errors.New("plane claim not held (test)")
			}
			return nil
		}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.auth, e.store, e.account = a, st, sp.Account
}

func newCap(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// owner derives the owner of an IdP subject through signerd, as the exchange does.
func (e *env) owner(sub string) string {
	e.t.Helper()
	resp, err := e.client.API().DeriveOwner(context.Background(), &signerv1.DeriveOwnerRequest{Space: spaceName, IdpIssuer: e.idp.URL, Subject: sub})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.GetOwner()
}

func newUID(t *testing.T) string {
	t.Helper()
	uid, err := admin.NewLifecycleUID()
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// grant writes an interactive row.
func (e *env) grant(owner, actor string, scope ...string) ledger.Row {
	e.t.Helper()
	r := ledger.Row{Ver: ledger.Version, Owner: owner, Actor: actor, Scope: scope, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		LifecycleUID: newUID(e.t), GrantedAt: time.Now().UnixMilli()}
	if err := e.ledger.Put(ledger.Interactive, r); err != nil {
		e.t.Fatal(err)
	}
	return r
}

// spawn writes a managed row and returns it with its actor token.
func (e *env) spawn(owner, actor string, scope ...string) (ledger.Row, string) {
	e.t.Helper()
	tok, hash, err := ledger.NewActorToken()
	if err != nil {
		e.t.Fatal(err)
	}
	r := ledger.Row{Ver: ledger.Version, Owner: owner, Actor: actor, Scope: scope, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		TokenHash: hash, LifecycleUID: newUID(e.t), GrantedAt: time.Now().UnixMilli()}
	if err := e.ledger.Put(ledger.Managed, r); err != nil {
		e.t.Fatal(err)
	}
	return r, tok
}

// idpToken is a valid IdP token for sub, expiring in ttl.
func (e *env) idpToken(sub string, ttl time.Duration) string {
	e.t.Helper()
	return e.idp.Token(e.t, e.idp.Claims(sub, time.Now(), ttl), nil)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	return m
}

func (a answer) errorText(t *testing.T) string {
	t.Helper()
	s, _ := a.json(t)["error"].(string)
	return s
}

// do sends one request over the loopback listener; hdr entries with an empty value are deleted.
func (e *env) do(method, path string, body []byte, hdr map[string]string) answer {
	e.t.Helper()
	return e.doFrom("", method, path, body, hdr)
}

// doFrom is do from the loopback source address from (127.0.0.2, ...; "" is the kernel's
// choice), on a fresh connection: what the throttle sees as another caller.
func (e *env) doFrom(from, method, path string, body []byte, hdr map[string]string) answer {
	e.t.Helper()
	client := http.DefaultClient
	if from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
		client = &http.Client{Transport: tr}
	}
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
		if e.cap != "" {
			req.Header.Set("Authorization", "Bearer "+e.cap)
		}
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// exchange posts an exchange request body (marshalled from v).
func (e *env) exchange(v any) answer {
	e.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.do(http.MethodPost, "/exchange", b, nil)
}

// bearer is a granted answer's token, checked against signerd's JWKS (served by /jwks).
type bearerClaims struct {
	Scope []string `json:"scope"`
	Ver   int      `json:"ver"`
	Act   struct {
		Owner        string   `json:"owner"`
		Actor        string   `json:"actor"`
		Scope        []string `json:"scope"`
		Parent       string   `json:"parent"`
		LifecycleUID string   `json:"lifecycleUid"`
		CredentialID string   `json:"credentialId"`
		View         string   `json:"view"`
		// ManagerInstanceID is act.managerInstanceId.
		ManagerInstanceID string `json:"managerInstanceId"`
	} `json:"act"`
	Sub string `json:"sub"`
	Iss string `json:"iss"`
	Aud any    `json:"aud"`
	Iat int64  `json:"iat"`
	Exp int64  `json:"exp"`
}

func (e *env) verifyBearer(token string) bearerClaims {
	e.t.Helper()
	jwks := e.do(http.MethodGet, "/jwks", nil, nil)
	var set struct {
		Keys []struct{ Kid, X string } `json:"keys"`
	}
	if err := json.Unmarshal(jwks.body, &set); err != nil {
		e.t.Fatal(err)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		e.t.Fatalf("bearer is not a compact JWS")
	}
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	var hdr struct{ Alg, Kid string }
	if err := json.Unmarshal(hb, &hdr); err != nil || hdr.Alg != "EdDSA" {
		e.t.Fatalf("bearer header %s: %v", hb, err)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	verified := false
	for _, k := range set.Keys {
		x, _ := base64.RawURLEncoding.DecodeString(k.X)
		if k.Kid == hdr.Kid && len(x) == ed25519.PublicKeySize && ed25519.Verify(x, []byte(parts[0]+"."+parts[1]), sig) {
			verified = true
		}
	}
	if !verified {
		e.t.Fatalf("bearer does not verify against /jwks (kid %q)", hdr.Kid)
	}
	pb, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var b bearerClaims
	if err := json.Unmarshal(pb, &b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

// noCORS fails if any Access-Control-* header is present.
func noCORS(t *testing.T, h http.Header) {
	t.Helper()
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			t.Fatalf("CORS header %s sent", k)
		}
	}
}
