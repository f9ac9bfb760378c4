package sepdoor_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/sepdoor"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const spaceName = "alpha"

// env is the loopback door routed through a real exchange face (as authd routes it), a public
// door of its own, and an exchange face with service endpoints off, all backed by a real signerd
// over mTLS, a real ledger, a fake IdP serving a real Ed25519 JWKS, and the bearer JWKS cache
// over signerd joined with a service-token issuer key of the test's (signerd's
// SignServiceCredential is another helper's). The authority is a fake that records its callers.
type env struct {
	t       *testing.T
	signer  *signerdtest.Signer
	client  *signerclient.Client
	ledger  *ledger.Ledger
	idp     *idptest.IdP
	verify  *countingIdP
	keys    *svcKeys
	auth    *fakeAuthority
	cap     string
	account string
	clock   *clock
	logs    *syncBuffer

	loopURL string // the exchange face with the loopback door on
	pubURL  string // the public door
	offURL  string // an exchange face with service endpoints off
}

type clock struct {
	mu sync.Mutex
	d  time.Duration
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.d) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// countingIdP is the real IdP verifier, counting the tokens it was asked to verify.
type countingIdP struct {
	v     exchange.IdP
	calls atomic.Int64
}

func (c *countingIdP) Verify(ctx context.Context, token string) (idp.Claims, error) {
	c.calls.Add(1)
	return c.v.Verify(ctx, token)
}

// svcKeys is the door's KeySource: the test's service-token issuer key, else signerd's bearer
// keys through authd's bearer JWKS cache.
type svcKeys struct {
	kid   string
	pub   ed25519.PublicKey
	priv  ed25519.PrivateKey
	cache *bearer.Cache
}

func (k *svcKeys) Key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if kid == k.kid {
		return k.pub, nil
	}
	return k.cache.Key(ctx, kid)
}

// fakeAuthority records every call and answers with answer (or err).
type fakeAuthority struct {
	mu     sync.Mutex
	calls  []call
	answer func(req *serviceaccess.Request) (*serviceaccess.Answer, error)
}

type call struct {
	req    serviceaccess.Request
	caller authority.ServiceCaller
}

func (f *fakeAuthority) ServiceRequest(_ context.Context, req *serviceaccess.Request, caller authority.ServiceCaller) (*serviceaccess.Answer, error) {
	f.mu.Lock()
	f.calls = append(f.calls, call{req: *req, caller: caller})
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		return answer(req)
	}
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerStatus, Instance: &serviceaccess.InstanceStatus{State: "absent"}}, nil
}

// take returns the calls since the last take.
func (f *fakeAuthority) take() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeAuthority) setAnswer(a func(req *serviceaccess.Request) (*serviceaccess.Answer, error)) {
	f.mu.Lock()
	f.answer = a
	f.mu.Unlock()
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})
	client, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, "authd", spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l, err := ledger.Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	acct, _ := nkeys.CreateAccount()
	account, _ := acct.PublicKey()
	e := &env{t: t, signer: s, client: client, ledger: l, idp: idptest.Start(t), cap: newCap(t), account: account,
		clock: &clock{}, auth: &fakeAuthority{}, logs: &syncBuffer{}}
	pin, err := idp.NewPin(e.idp.URL)
	if err != nil {
		t.Fatal(err)
	}
	v, err := idp.NewVerifier(pin, idp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.verify = &countingIdP{v: v}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: spaceName, Signer: client.API()})
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	e.keys = &svcKeys{kid: "svc-test-key", pub: pub, priv: priv, cache: cache}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	throttle := exchange.NewFailureThrottle()
	loop := e.door(true, throttle, log)
	pubDoor := e.door(false, throttle, log)
	face := func(sep http.Handler) string {
		h, err := exchange.New(exchange.Config{Space: spaceName, Signer: client, Ledger: l, IdP: e.verify, Cap: e.cap, Now: e.clock.Now,
			Logger: log, ServiceEndpoints: sep, Throttle: throttle})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	e.loopURL = face(loop)
	e.offURL = face(nil)
	srv := httptest.NewServer(pubDoor)
	t.Cleanup(srv.Close)
	e.pubURL = srv.URL
	return e
}

// door builds one face's door.
func (e *env) door(loopback bool, throttle *exchange.Throttle, log *slog.Logger) *sepdoor.Door {
	e.t.Helper()
	cfg := sepdoor.Config{Space: spaceName, Account: e.account, Signer: e.client.API(), IdP: e.verify, Ledger: e.ledger, Keys: e.keys,
		Authority: e.auth, Loopback: loopback, Throttle: throttle, Now: e.clock.Now, Logger: log}
	if loopback {
		cfg.Cap = e.cap
	}
	d, err := sepdoor.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func newCap(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// randB32 is n lowercase base32 characters.
func randB32(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(b32.EncodeToString(b))[:n]
}

// b32Of is the lowercase unpadded base32 of n random bytes (a witness hashes 32, a root, a
// proposal and a jti are 16).
func b32Of(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(b32.EncodeToString(b))
}

// owner derives the owner of an IdP subject through signerd, as the door does.
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

func row(t *testing.T, owner, actor string) ledger.Row {
	return ledger.Row{Ver: ledger.Version, Owner: owner, Actor: actor, Scope: []string{}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		LifecycleUID: newUID(t), GrantedAt: time.Now().UnixMilli()}
}

// grant writes an interactive row.
func (e *env) grant(owner, actor string) {
	e.t.Helper()
	if err := e.ledger.Put(ledger.Interactive, row(e.t, owner, actor)); err != nil {
		e.t.Fatal(err)
	}
}

// spawn writes a managed row.
func (e *env) spawn(owner, actor string) {
	e.t.Helper()
	r := row(e.t, owner, actor)
	_, hash, err := ledger.NewActorToken()
	if err != nil {
		e.t.Fatal(err)
	}
	r.TokenHash = hash
	if err := e.ledger.Put(ledger.Managed, r); err != nil {
		e.t.Fatal(err)
	}
}

// double puts a managed row of owner.actor next to its interactive one, as only tampering or a
// crash can (Put refuses it): a managed row written by a ledger of its own, moved in.
func (e *env) double(owner, actor string) {
	e.t.Helper()
	other, err := ledger.Open(filepath.Join(e.t.TempDir(), "other"))
	if err != nil {
		e.t.Fatal(err)
	}
	r := row(e.t, owner, actor)
	_, hash, _ := ledger.NewActorToken()
	r.TokenHash = hash
	if err := other.Put(ledger.Managed, r); err != nil {
		e.t.Fatal(err)
	}
	from, _ := other.Path(ledger.Managed, owner, actor)
	to, _ := e.ledger.Path(ledger.Managed, owner, actor)
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(from, to); err != nil {
		e.t.Fatal(err)
	}
	if _, _, err := e.ledger.Get(owner, actor); !errors.Is(err, ledger.ErrBothSpaces) {
		e.t.Fatalf("doubled row: Get = %v, want ErrBothSpaces", err)
	}
}

// idpToken is a valid IdP token for sub.
func (e *env) idpToken(sub string) string {
	e.t.Helper()
	return e.idp.Token(e.t, e.idp.Claims(sub, time.Now(), 10*time.Minute), nil)
}

// target is one service instance: endpoint, instance, witness and the owner its tokens name.
type target struct {
	endpoint, instance, witness, owner string
}

func newTarget(owner string) target {
	return target{endpoint: "svc.echo", instance: randB32(26), witness: "w_" + b32Of(32), owner: owner}
}

// serviceToken signs a service token of typ under the test issuer key with exactly the claims
// of the documented shape (access: duty serve, aud the space, <= 60 s; renewal: use renew, aud
// the renewal audience, <= 24 h), over edit's changes.
func (e *env) serviceToken(typ string, tg target, edit func(map[string]any)) string {
	e.t.Helper()
	now := e.clock.Now().Unix()
	c := map[string]any{"iss": serviceaccess.Issuer(spaceName), "sub": tg.owner, "wit": tg.witness, "ep": tg.endpoint, "iid": tg.instance,
		"root": "r_" + b32Of(16), "ver": 1, "iat": now, "nbf": now, "jti": b32Of(16)}
	if typ == serviceaccess.TypAccess {
		c["aud"], c["duty"], c["exp"] = spaceName, serviceaccess.DutyServe, now+60
	} else {
		c["aud"], c["use"], c["exp"] = serviceaccess.RenewalAudience(spaceName), serviceaccess.UseRenew, now+3600
	}
	if edit != nil {
		edit(c)
	}
	return idptest.Sign(e.t, e.keys.priv, map[string]any{"alg": "EdDSA", "kid": e.keys.kid, "typ": typ}, c)
}

// userBearer is a real Cotal user bearer (typ JWT) signerd signed for owner.cli through
// /exchange.
func (e *env) userBearer(sub string) string {
	e.t.Helper()
	b, _ := json.Marshal(map[string]any{"idpToken": e.idpToken(sub), "actor": "cli"})
	a := e.do(e.loopURL, http.MethodPost, "/exchange", b, map[string]string{"Authorization": "Bearer " + e.cap})
	var resp struct{ Token string }
	if a.status != http.StatusOK || json.Unmarshal(a.body, &resp) != nil || resp.Token == "" {
		e.t.Fatalf("exchange = %d %s", a.status, a.body)
	}
	return resp.Token
}

// contract is a one-closure contract for endpoint: a manifest whose root is the endpoint.
func contract(endpoint string) *serviceaccess.Contract {
	m, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: endpoint, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	sum := sha256.Sum256(m)
	d := "sha256:" + hex.EncodeToString(sum[:])
	return &serviceaccess.Contract{Closures: []string{d}, Artifacts: []serviceaccess.Artifact{{Digest: d, Bytes: m}}}
}

// request is a well-formed request of kind k for tg.
func (e *env) request(k serviceaccess.Kind, tg target) serviceaccess.Request {
	r := serviceaccess.Request{Kind: k, Account: e.account, Space: spaceName, RequestID: "req-" + randB32(12), Endpoint: tg.endpoint}
	switch k {
	case serviceaccess.KindRegister:
		r.Instance, r.Contract = tg.instance, contract(tg.endpoint)
	case serviceaccess.KindActivate, serviceaccess.KindRenew, serviceaccess.KindReady:
		r.Instance, r.Witness = tg.instance, tg.witness
	case serviceaccess.KindStatus:
		r.RequestID, r.Instance, r.Target = "", tg.instance, &serviceaccess.Target{Kind: serviceaccess.TargetInstance}
	case serviceaccess.KindNameBind:
		r.Owner = tg.owner
	case serviceaccess.KindDecide:
		r.Instance, r.Proposal, r.Contract, r.Decision = tg.instance, "p_"+b32Of(16), contract(tg.endpoint), serviceaccess.DecisionApprove
	}
	return r
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// denied parses a door refusal: a denied answer with its code, reason and message.
func (a answer) answer(t *testing.T) serviceaccess.Answer {
	t.Helper()
	var ans serviceaccess.Answer
	dec := json.NewDecoder(bytes.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	return ans
}

// post sends an envelope to url's route; hdr entries with an empty value are deleted.
func (e *env) post(url string, req serviceaccess.Request, proof serviceaccess.Proof, hdr map[string]string) answer {
	e.t.Helper()
	b, err := json.Marshal(serviceaccess.Envelope{Request: req, Proof: proof})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.do(url, http.MethodPost, serviceaccess.Path, b, hdr)
}

func (e *env) do(url, method, path string, body []byte, hdr map[string]string) answer {
	e.t.Helper()
	return e.doFrom("", url, method, path, body, hdr)
}

// doFrom is do from the loopback source address from ("" is the kernel's choice) on a fresh
// connection: what the throttle sees as another caller.
func (e *env) doFrom(from, url, method, path string, body []byte, hdr map[string]string) answer {
	e.t.Helper()
	client := http.DefaultClient
	if from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		client = &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	req, err := http.NewRequest(method, url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
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

// wantDenied fails unless a is a denied answer with status, the code of status and reason.
func wantDenied(t *testing.T, a answer, status int, code, reason string) serviceaccess.Answer {
	t.Helper()
	ans := a.answer(t)
	// The client's own parser accepts it.
	if _, err := serviceaccess.ParseAnswer(a.body); err != nil {
		t.Fatalf("ParseAnswer(%s): %v", a.body, err)
	}
	if a.status != status || ans.Kind != serviceaccess.AnswerDenied || ans.Code != code || ans.Reason != reason || ans.Message == "" {
		t.Fatalf("answer = %d %s, want %d denied %s/%s", a.status, a.body, status, code, reason)
	}
	for k := range a.header {
		if strings.HasPrefix(strings.ToLower(k), "access-control-") {
			t.Fatalf("CORS header %s sent", k)
		}
	}
	return ans
}

// noTokenLogged fails if any of tokens appears in the door's log or in body.
func (e *env) noTokenLogged(body []byte, tokens ...string) {
	e.t.Helper()
	logs := e.logs.String()
	for _, tok := range tokens {
		if tok == "" {
			continue
		}
		// The signature segment alone is already secret material.
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		if strings.Contains(logs, sig) || bytes.Contains(body, []byte(sig)) {
			e.t.Fatalf("a token was logged or answered")
		}
	}
}
