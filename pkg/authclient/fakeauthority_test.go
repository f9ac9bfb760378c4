package authclient_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// The fake authority answers /service-endpoint-authority as authd's route does for the kinds a
// renewal source sends (activate, renew), signing access bearers and renewal proofs of the
// exact shape signerd mints with a real Ed25519 key, and checking proofs with the shared
// validator. authd's route is built in parallel; the end-to-end test against it is the lead's.

const (
	loginToken = "idp-login-token-7f3a9c"
	remoteText = "REMOTE-TEXT-do-not-echo"
	testSpace  = "acme"
	testEP     = "billing.invoices"
	testIID    = "01hzz8k3q4w5e6r7t8y9u0i1o2"
)

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func randID(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return strings.ToLower(b32.EncodeToString(b))
}

// seen is one request the fake authority received.
type seen struct {
	Kind      serviceaccess.Kind
	RequestID string
	Proof     serviceaccess.ProofKind
}

type fakeAuthority struct {
	t       testing.TB
	account string
	owner   string
	root    string
	kid     string
	priv    ed25519.PrivateKey
	srv     *httptest.Server

	mu sync.Mutex
	// renewalTTL is the lifetime of the renewal proofs it mints.
	renewalTTL time.Duration
	// hook, when set, runs first; a non-nil answer is written instead of the normal one.
	hook     func(r *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer
	requests []seen
	gets     int
	issued   []string // every token minted
}

func newFakeAuthority(t testing.TB) *fakeAuthority {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	acct, err := akp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAuthority{
		t: t, account: acct, owner: "u_" + randID(t, 16)[:26], root: "r_" + randID(t, 16),
		kid: serviceaccess.Thumbprint(base64.RawURLEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))), priv: priv, renewalTTL: time.Hour,
	}
	mux := http.NewServeMux()
	mux.HandleFunc(serviceaccess.Path, a.serve)
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAuthority) info() serviceaccess.Info {
	pub := a.priv.Public().(ed25519.PublicKey)
	return serviceaccess.Info{V: 1, Account: a.account, Space: testSpace, Issuer: serviceaccess.Issuer(testSpace),
		Keys: []serviceaccess.JWK{{Kty: "OKP", Crv: "Ed25519", X: base64.RawURLEncoding.EncodeToString(pub), Kid: a.kid, Alg: "EdDSA", Use: "sig"}}}
}

// Key makes the fake its own KeySource for checking the proofs it receives.
func (a *fakeAuthority) key(kid string) (ed25519.PublicKey, bool) {
	if kid != a.kid {
		return nil, false
	}
	return a.priv.Public().(ed25519.PublicKey), true
}

func (a *fakeAuthority) setHook(h func(r *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = h
}

func (a *fakeAuthority) seenRequests() []seen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seen(nil), a.requests...)
}

func (a *fakeAuthority) getCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gets
}

func (a *fakeAuthority) tokens() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string{loginToken}, a.issued...)
}

func write(w http.ResponseWriter, ans *serviceaccess.Answer) {
	raw, err := ans.Marshal()
	if err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ans.HTTPStatus())
	_, _ = w.Write(raw)
}

func denied(reqID, code string) *serviceaccess.Answer {
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, RequestID: reqID, Code: code, Reason: "refused", Message: remoteText}
}

func (a *fakeAuthority) serve(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		a.mu.Lock()
		a.gets++
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a.info())
		return
	case http.MethodPost:
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("Origin") != "" {
		write(w, denied("", serviceaccess.CodePermissionDenied))
		return
	}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		write(w, denied("", serviceaccess.CodeUnsupportedMedia))
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, serviceaccess.MaxEnvelopeBytes+1))
	if err != nil || len(raw) > serviceaccess.MaxEnvelopeBytes {
		write(w, denied("", serviceaccess.CodeTooLarge))
		return
	}
	env, err := serviceaccess.ParseEnvelope(raw)
	if err != nil {
		a.t.Errorf("fake authority: the client sent an envelope that does not parse: %v", err)
		write(w, denied("", serviceaccess.CodeBadRequest))
		return
	}
	req := &env.Request
	a.mu.Lock()
	a.requests = append(a.requests, seen{Kind: req.Kind, RequestID: req.RequestID, Proof: env.Proof.Kind})
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		if ans := hook(r, env); ans != nil {
			write(w, ans)
			return
		}
	}
	if req.Account != a.account || req.Space != testSpace {
		write(w, denied(req.RequestID, serviceaccess.CodePermissionDenied))
		return
	}
	// The door's kind x proof matrix and proof checks, for the kinds a source sends.
	switch {
	case req.Kind == serviceaccess.KindActivate && env.Proof.Kind == serviceaccess.ProofIDP,
		req.Kind == serviceaccess.KindRegister && env.Proof.Kind == serviceaccess.ProofIDP:
		if env.Proof.Token != loginToken {
			write(w, denied(req.RequestID, serviceaccess.CodeUnauthenticated))
			return
		}
	case (req.Kind == serviceaccess.KindActivate || req.Kind == serviceaccess.KindRenew) && env.Proof.Kind == serviceaccess.ProofRenewal:
		v := &serviceaccess.Validator{Space: testSpace, Keys: keyFunc(a.key)}
		c, err := v.Renewal(r.Context(), env.Proof.Token)
		if err != nil {
			write(w, denied(req.RequestID, serviceaccess.CodeUnauthenticated))
			return
		}
		if c.Ep != req.Endpoint || c.Iid != req.Instance || c.Wit != req.Witness {
			write(w, denied(req.RequestID, serviceaccess.CodePermissionDenied))
			return
		}
	default:
		write(w, denied(req.RequestID, serviceaccess.CodePermissionDenied))
		return
	}
	switch req.Kind {
	case serviceaccess.KindActivate, serviceaccess.KindRenew:
		write(w, a.credential(req))
	default:
		write(w, denied(req.RequestID, serviceaccess.CodeFailedPrecondition))
	}
}

// credential mints an access bearer (60 s) and a renewal proof (renewalTTL) for req.
func (a *fakeAuthority) credential(req *serviceaccess.Request) *serviceaccess.Answer {
	now := time.Now().Unix()
	a.mu.Lock()
	rttl := int64(a.renewalTTL / time.Second)
	a.mu.Unlock()
	ac := serviceaccess.AccessClaims{
		Iss: serviceaccess.Issuer(testSpace), Aud: testSpace, Sub: a.owner, Duty: serviceaccess.DutyServe,
		Wit: req.Witness, Ep: req.Endpoint, Iid: req.Instance, Root: a.root, Ver: 1,
		Iat: now, Nbf: now, Exp: now + 60, Jti: randID(a.t, 16),
	}
	rc := serviceaccess.RenewalClaims{
		Iss: serviceaccess.Issuer(testSpace), Aud: serviceaccess.RenewalAudience(testSpace), Sub: a.owner, Use: serviceaccess.UseRenew,
		Wit: req.Witness, Ep: req.Endpoint, Iid: req.Instance, Root: a.root, Ver: 1,
		Iat: now, Nbf: now, Exp: now + rttl, Jti: randID(a.t, 16),
	}
	access, renewal := a.sign(serviceaccess.TypAccess, ac), a.sign(serviceaccess.TypRenewal, rc)
	a.mu.Lock()
	a.issued = append(a.issued, access, renewal)
	a.mu.Unlock()
	return &serviceaccess.Answer{
		Kind: serviceaccess.AnswerCredential, RequestID: req.RequestID, Witness: req.Witness, Root: a.root,
		Access: &serviceaccess.Token{Token: access, Exp: ac.Exp}, Renewal: &serviceaccess.Token{Token: renewal, Exp: rc.Exp},
		ApprovalExpiresAt: now + 7*24*3600,
	}
}

// sign makes a compact JWS with the header signerd writes: {"alg","kid","typ"}.
func (a *fakeAuthority) sign(typ string, claims any) string {
	h, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}{"EdDSA", a.kid, typ})
	if err != nil {
		a.t.Fatal(err)
	}
	p, err := json.Marshal(claims)
	if err != nil {
		a.t.Fatal(err)
	}
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(a.priv, []byte(in)))
}

// keyFunc adapts a lookup to serviceaccess.KeySource.
type keyFunc func(kid string) (ed25519.PublicKey, bool)

func (f keyFunc) Key(_ context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok := f(kid); ok {
		return k, nil
	}
	return nil, errors.New("fake authority: unknown kid")
}

// stripProxy serves /<tenant>/... by stripping the tenant and forwarding to target, as a
// reverse proxy in front of several tenants' authorities does; any other path is 404.
func stripProxy(t testing.TB, tenant string, target *httptest.Server) *httptest.Server {
	t.Helper()
	u, err := url.Parse(target.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/"+tenant+"/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		r.URL.Path, r.URL.RawPath = "/"+rest, ""
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}
