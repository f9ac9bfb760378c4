package callout

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/bearer/bearertest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// What the service tokens of these tests name.
const (
	svcEndpoint = "billing.api"
	svcInstance = "instance00000000000000000001"
	svcWitness  = "w_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	svcRoot     = "r_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	svcJTI      = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
)

// serviceGate is a ServiceGate that answers err and keeps the claims it was asked about.
type serviceGate struct {
	mu   sync.Mutex
	err  error
	seen []*serviceaccess.AccessClaims
}

func (g *serviceGate) CheckServe(_ context.Context, c *serviceaccess.AccessClaims) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen = append(g.seen, c)
	return g.err
}

func (g *serviceGate) set(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err = err
}

func (g *serviceGate) calls() []*serviceaccess.AccessClaims {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*serviceaccess.AccessClaims(nil), g.seen...)
}

// svcHeader is the header signerd writes on a service token of typ, with k's kid.
func svcHeader(k *bearertest.Key, typ string) string {
	return `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"` + typ + `"}`
}

// accessClaims is a valid access payload issued at now (30 s of life), edited by edit (a nil
// value deletes the key).
func accessClaims(t testing.TB, now time.Time, edit map[string]any) string {
	t.Helper()
	m := map[string]any{
		"iss": serviceaccess.Issuer(testSpace), "aud": testSpace, "sub": owner, "duty": serviceaccess.DutyServe,
		"wit": svcWitness, "ep": svcEndpoint, "iid": svcInstance, "root": svcRoot, "ver": 1,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Unix() + 30, "jti": svcJTI,
	}
	return claimsJSON(t, m, edit)
}

// renewalClaims is a valid renewal proof payload issued at now (1 h of life).
func renewalClaims(t testing.TB, now time.Time) string {
	t.Helper()
	m := map[string]any{
		"iss": serviceaccess.Issuer(testSpace), "aud": serviceaccess.RenewalAudience(testSpace), "sub": owner,
		"use": serviceaccess.UseRenew, "wit": svcWitness, "ep": svcEndpoint, "iid": svcInstance, "root": svcRoot,
		"ver": 1, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Unix() + 3600, "jti": svcJTI,
	}
	return claimsJSON(t, m, nil)
}

func claimsJSON(t testing.TB, m, edit map[string]any) string {
	t.Helper()
	for k, v := range edit {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// relabel replaces token's header with header, keeping its payload and signature (which then
// covers another signing input).
func relabel(token, header string) string {
	parts := strings.SplitN(token, ".", 2)
	return base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + parts[1]
}

// serviceGrant is the grant the service arm must send for the test access bearer expiring at exp.
func serviceGrant(exp int64) *signerv1.CalloutGrant {
	return &signerv1.CalloutGrant{
		Profile:   signerv1.Profile_PROFILE_SERVICE_SERVE,
		Params:    &signerv1.ProfileParams{Owner: owner, ServiceEndpoint: svcEndpoint, InstanceId: svcInstance},
		ExpiresAt: timestamppb.New(time.Unix(exp, 0)),
	}
}

// decider is a responder that is never started: its decide is called with an opened request
// the test makes up, at a fixed clock, with issuer keys the test holds.
type decider struct {
	r    *Responder
	gate *serviceGate
	now  time.Time
	k    *bearertest.Key
}

func newDecider(t *testing.T, withGate bool) *decider {
	t.Helper()
	d := &decider{now: time.Unix(1_800_000_000, 0), k: bearertest.NewKey(t), gate: &serviceGate{}}
	led, err := ledger.Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	if err := led.Put(ledger.Interactive, row("laptop")); err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return d.now }
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: bearertest.NewJWKS(d.k.JWK), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Space: testSpace, Ledger: led, JWKS: cache, Now: clock, Logger: testLogger(t), signer: newRecorder(nil)}
	if withGate {
		cfg.Services = d.gate
	}
	if d.r, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return d
}

// decide runs the responder's decision on token presented under connection name name.
func (d *decider) decide(t *testing.T, token, name string) (*signerv1.CalloutGrant, string) {
	t.Helper()
	return d.r.decide(ctxT(t), &signerv1.OpenCalloutRequestResponse{UserNkey: "UTEST", ServerId: "NTEST",
		AuthToken: token, ConnectionName: name})
}

// userToken is a user bearer for owner.laptop signed by d's key under header.
func (d *decider) userToken(t *testing.T, header string) string {
	t.Helper()
	p := bearertest.Principal{Space: testSpace, Owner: owner, Owner2: owner2, Actor: "laptop", UID: uid1, Now: d.now}
	for _, c := range bearertest.Cases(t, d.k, p) {
		if c.Name == "ok/hand-signed baseline" {
			parts := strings.Split(c.Token, ".")
			payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
			return d.k.Sign(header, string(payload))
		}
	}
	t.Fatal("bearertest has no baseline case")
	return ""
}

// TestServiceArmDecide: the callout's decision per token kind, at a fixed clock, with a test
// issuer key: typ JWT goes to the user arm, cotal-service-access+jwt to the service arm (verify,
// then the service gate, then exactly the service-serve grant expiring at the bearer's exp), and
// every other typ, every token of one kind presented as another, and every bearer the validator
// refuses is denied without the gate being asked.
func TestServiceArmDecide(t *testing.T) {
	t.Run("ok/user bearer typ JWT takes the user arm", func(t *testing.T) {
		d := newDecider(t, true)
		tok := d.userToken(t, d.k.Header())
		g, refusal := d.decide(t, tok, nonceFor(t, tok))
		if refusal != "" || g.GetProfile() != signerv1.Profile_PROFILE_AGENT || g.GetParams().GetActor() != "laptop" {
			t.Fatalf("decide = %v, %q; want the agent grant", g, refusal)
		}
		if n := len(d.gate.calls()); n != 0 {
			t.Fatalf("service gate asked %d times for a user bearer", n)
		}
	})
	t.Run("ok/access bearer with an admitting gate is granted service-serve", func(t *testing.T) {
		d := newDecider(t, true)
		tok := d.k.Sign(svcHeader(d.k, serviceaccess.TypAccess), accessClaims(t, d.now, nil))
		g, refusal := d.decide(t, tok, "any-name")
		if refusal != "" {
			t.Fatalf("refused: %q", refusal)
		}
		if want := serviceGrant(d.now.Unix() + 30); !proto.Equal(g, want) {
			t.Fatalf("grant = %v, want exactly %v", g, want)
		}
		seen := d.gate.calls()
		if len(seen) != 1 || seen[0].Wit != svcWitness || seen[0].Root != svcRoot || seen[0].Sub != owner ||
			seen[0].Ep != svcEndpoint || seen[0].Iid != svcInstance || seen[0].Exp != d.now.Unix()+30 {
			t.Fatalf("gate asked %+v, want once with the bearer's claims", seen)
		}
	})
	t.Run("ok/access bearer issued 5 s ahead", func(t *testing.T) {
		d := newDecider(t, true)
		tok := d.k.Sign(svcHeader(d.k, serviceaccess.TypAccess), accessClaims(t, d.now, map[string]any{
			"iat": d.now.Unix() + 5, "nbf": d.now.Unix() + 5, "exp": d.now.Unix() + 35}))
		g, refusal := d.decide(t, tok, "any-name")
		if refusal != "" || !proto.Equal(g, serviceGrant(d.now.Unix()+35)) {
			t.Fatalf("decide = %v, %q; want the service grant", g, refusal)
		}
	})
	t.Run("ok/the connection name does not matter and grants no inbox", func(t *testing.T) {
		d := newDecider(t, true)
		tok := d.k.Sign(svcHeader(d.k, serviceaccess.TypAccess), accessClaims(t, d.now, nil))
		for _, name := range []string{"", "_INBOX_UABC", nonceFor(t, d.userToken(t, d.k.Header()))} {
			g, refusal := d.decide(t, tok, name)
			if refusal != "" || !proto.Equal(g, serviceGrant(d.now.Unix()+30)) {
				t.Fatalf("name %q: decide = %v, %q; want the service grant, no more", name, g, refusal)
			}
		}
	})

	type failCase struct {
		name    string
		token   func(d *decider) string
		refusal string
	}
	at := func(d *decider, edit map[string]any) string {
		return d.k.Sign(svcHeader(d.k, serviceaccess.TypAccess), accessClaims(t, d.now, edit))
	}
	cases := []failCase{
		{"fail/user bearer without typ", func(d *decider) string {
			return d.userToken(t, `{"alg":"EdDSA","kid":"`+d.k.JWK.Kid+`"}`)
		}, "bearer refused: typ"},
		{"fail/user bearer with typ jwt in another case", func(d *decider) string {
			return d.userToken(t, `{"alg":"EdDSA","kid":"`+d.k.JWK.Kid+`","typ":"jwt"}`)
		}, "bearer refused: typ"},
		{"fail/renewal proof as auth_token", func(d *decider) string {
			return d.k.Sign(svcHeader(d.k, serviceaccess.TypRenewal), renewalClaims(t, d.now))
		}, "bearer refused: typ"},
		{"fail/unknown typ", func(d *decider) string {
			return d.k.Sign(svcHeader(d.k, "at+jwt"), accessClaims(t, d.now, nil))
		}, "bearer refused: typ"},
		{"fail/access claims without typ", func(d *decider) string {
			return d.k.Sign(`{"alg":"EdDSA","kid":"`+d.k.JWK.Kid+`"}`, accessClaims(t, d.now, nil))
		}, "bearer refused: typ"},
		{"fail/header not JSON", func(d *decider) string {
			return base64.RawURLEncoding.EncodeToString([]byte("not json")) + ".e30." + strings.Repeat("A", 86)
		}, "bearer refused: header"},
		{"fail/not three segments", func(*decider) string { return "abc.def" }, "bearer refused: format"},
		{"fail/access claims labelled typ JWT", func(d *decider) string {
			return d.k.Sign(d.k.Header(), accessClaims(t, d.now, nil))
		}, "bearer refused: payload"},
		{"fail/renewal claims labelled typ access", func(d *decider) string {
			return d.k.Sign(svcHeader(d.k, serviceaccess.TypAccess), renewalClaims(t, d.now))
		}, "service access bearer refused: payload"},
		{"fail/user JWT relabelled typ access", func(d *decider) string {
			return relabel(d.userToken(t, d.k.Header()), svcHeader(d.k, serviceaccess.TypAccess))
		}, "service access bearer refused: signature"},
		{"fail/access bearer relabelled typ JWT", func(d *decider) string {
			return relabel(at(d, nil), d.k.Header())
		}, "bearer refused: signature"},
		{"fail/access bearer relabelled typ renewal", func(d *decider) string {
			return relabel(at(d, nil), svcHeader(d.k, serviceaccess.TypRenewal))
		}, "bearer refused: typ"},
		{"fail/access bearer signed by another key under the issuer's kid", func(d *decider) string {
			other := bearertest.NewKey(t)
			return other.Sign(svcHeader(d.k, serviceaccess.TypAccess), accessClaims(t, d.now, nil))
		}, "service access bearer refused: signature"},
		{"fail/access bearer signed by an unknown key", func(d *decider) string {
			other := bearertest.NewKey(t)
			return other.Sign(svcHeader(other, serviceaccess.TypAccess), accessClaims(t, d.now, nil))
		}, "service access bearer refused: kid"},
		{"fail/access bearer expired (exp == now)", func(d *decider) string {
			return at(d, map[string]any{"iat": d.now.Unix() - 30, "nbf": d.now.Unix() - 30, "exp": d.now.Unix()})
		}, "service access bearer refused: exp"},
		{"fail/access bearer issued 6 s ahead", func(d *decider) string {
			return at(d, map[string]any{"iat": d.now.Unix() + 6, "nbf": d.now.Unix(), "exp": d.now.Unix() + 36})
		}, "service access bearer refused: iat"},
		{"fail/access bearer over 60 s", func(d *decider) string {
			return at(d, map[string]any{"exp": d.now.Unix() + 61})
		}, "service access bearer refused: lifetime"},
		{"fail/access bearer of another space", func(d *decider) string {
			return at(d, map[string]any{"iss": serviceaccess.Issuer("beta"), "aud": "beta"})
		}, "service access bearer refused: iss"},
		{"fail/access bearer with a user bearer's issuer", func(d *decider) string {
			return at(d, map[string]any{"iss": bearer.IssuerPrefix + testSpace})
		}, "service access bearer refused: iss"},
		{"fail/access bearer with an unknown claim", func(d *decider) string {
			return at(d, map[string]any{"act": map[string]any{"owner": owner, "actor": "laptop"}})
		}, "service access bearer refused: payload"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecider(t, true)
			g, refusal := d.decide(t, tc.token(d), "any-name")
			if g != nil || refusal != tc.refusal {
				t.Fatalf("decide = %v, %q; want refusal %q", g, refusal, tc.refusal)
			}
			if n := len(d.gate.calls()); n != 0 {
				t.Fatalf("service gate asked %d times for a refused token", n)
			}
		})
	}

	t.Run("fail/gate refuses", func(t *testing.T) {
		d := newDecider(t, true)
		d.gate.set(errors.New("root revoked"))
		g, refusal := d.decide(t, at(d, nil), "any-name")
		if g != nil || refusal != refuseService || len(d.gate.calls()) != 1 {
			t.Fatalf("decide = %v, %q (gate asked %d times); want %q after one gate call", g, refusal, len(d.gate.calls()), refuseService)
		}
		if log := logOf(t); !strings.Contains(log, "root revoked") || strings.Contains(log, "eyJ") {
			t.Fatalf("log does not name the gate's reason, or names a token:\n%s", log)
		}
	})
	t.Run("fail/no service gate configured", func(t *testing.T) {
		d := newDecider(t, false)
		g, refusal := d.decide(t, at(d, nil), "any-name")
		if g != nil || refusal != refuseService {
			t.Fatalf("decide = %v, %q; want %q", g, refusal, refuseService)
		}
	})
}

// serviceToken mints a service token of kind for the test instance through signerd's
// SignServiceCredential (authd's client), living ttl.
func (e *env) serviceToken(t testing.TB, kind signerv1.ServiceCredentialKind, ttl time.Duration) (string, time.Time) {
	t.Helper()
	resp, err := e.authd.API().SignServiceCredential(ctxT(t), &signerv1.SignServiceCredentialRequest{
		Space: testSpace, Kind: kind, Owner: owner, Witness: svcWitness, Endpoint: svcEndpoint, InstanceId: svcInstance,
		Root: svcRoot, Ttl: durationpb.New(ttl), NotAfter: timestamppb.New(time.Now().Add(time.Hour)),
	})
	if err != nil {
		t.Fatalf("SignServiceCredential: %v", err)
	}
	return resp.GetToken(), resp.GetExpiresAt().AsTime()
}

// svcName is a fresh connection name for a service connect (the service arm does not read it).
func svcName() string { return "svc-" + rand.Text() }

// TestCalloutServiceConnect is the service arm on the real broker with real signerd: an access
// bearer signerd minted, admitted by the service gate, lands as service-serve with exactly the
// bearer's owner, endpoint and instance and its exp (the broker drops it then); it may subscribe
// its serve family and publish its reply family, and reaches no inbox. A refusing gate, a
// renewal proof, a user bearer without typ, tokens relabelled as another kind and an access
// bearer of another issuer key are each denied with a signed refusal, and no grant is asked.
func TestCalloutServiceConnect(t *testing.T) {
	top := t
	gate := &serviceGate{}
	e := startEnv(t, envOptions{services: gate})
	epTok, err := lifecycle.EndpointToken(svcEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	serve, _ := e.names.ServiceServe(epTok, svcInstance)
	reply, _ := e.names.ServiceReply(epTok, svcInstance)

	tok, exp := e.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
	name := svcName()
	c, err := e.connect(t, tok, name)
	if err != nil {
		t.Fatalf("service connect: %v", err)
	}
	t.Run("ok/lands as service-serve with exactly the bearer's coordinates", func(t *testing.T) {
		if ci := e.connInfo(t, name); ci.Account != e.gs.GetAccountPublicKey() {
			t.Fatalf("account %s, want the data account %s", ci.Account, e.gs.GetAccountPublicKey())
		}
		if g, want := e.rec.grant(t, name), serviceGrant(exp.Unix()); !proto.Equal(g, want) {
			t.Fatalf("grant = %v, want exactly %v", g, want)
		}
		seen := gate.calls()
		if len(seen) != 1 || seen[0].Sub != owner || seen[0].Wit != svcWitness || seen[0].Root != svcRoot ||
			seen[0].Ep != svcEndpoint || seen[0].Iid != svcInstance || seen[0].Exp != exp.Unix() {
			t.Fatalf("gate asked %+v, want once with the bearer's claims", seen)
		}
	})
	t.Run("ok/subscribes its serve family and publishes its reply family", func(t *testing.T) {
		if _, err := c.SubscribeSync(serve); err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(strings.TrimSuffix(reply, ">")+"r1", []byte("answer")); err != nil {
			t.Fatal(err)
		}
		c.noErrors(t)
	})
	t.Run("fail/no inbox, not even the one its connection name spells", func(t *testing.T) {
		subject := "_INBOX_" + name + ".x"
		if _, err := c.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.SubscribeViolation(subject))
	})
	t.Run("fail/publish outside its reply family", func(t *testing.T) {
		subject := strings.TrimSuffix(serve, ">") + "x"
		if err := c.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.PublishViolation(subject))
	})
	t.Run("ok/dropped at the bearer's exp", func(t *testing.T) {
		// iat and exp are whole seconds and signerd mints no grant under a second, so the
		// bearer keeps a margin for a slow connect.
		short, _ := e.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, 5*time.Second)
		sc, err := e.connect(t, short, svcName())
		if err != nil {
			t.Fatalf("service connect: %v", err)
		}
		select {
		case <-sc.closed:
		case <-time.After(15 * time.Second):
			t.Fatal("connection still open long after the bearer expired")
		}
		sc.waitError(t, "expired")
	})

	other := startEnvSigner(t)
	otherTok, _ := other.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
	userTok, _ := e.bearerFor(t, e.grant(t, row("laptop")), time.Minute, nil)
	for _, tc := range []struct {
		name    string
		token   func() string
		refusal string
		gateErr error
	}{
		{"fail/gate refuses", func() string {
			tok, _ := e.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
			return tok
		}, refuseService, errors.New("approval revoked")},
		{"fail/renewal proof as auth_token", func() string {
			tok, _ := e.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL, time.Hour)
			return tok
		}, "bearer refused: " + checkTyp, nil},
		{"fail/user bearer without typ", func() string {
			return relabel(userTok, `{"alg":"EdDSA","kid":"`+kidOf(t, userTok)+`"}`)
		}, "bearer refused: " + checkTyp, nil},
		{"fail/user bearer relabelled typ access", func() string {
			return relabel(userTok, `{"alg":"EdDSA","kid":"`+kidOf(t, userTok)+`","typ":"`+serviceaccess.TypAccess+`"}`)
		}, "service access bearer refused: " + serviceaccess.CheckSignature, nil},
		{"fail/access bearer relabelled typ JWT", func() string {
			return relabel(tok, `{"alg":"EdDSA","kid":"`+kidOf(t, tok)+`","typ":"JWT"}`)
		}, "bearer refused: " + string(bearer.CheckSignature), nil},
		{"fail/access bearer of another issuer key", func() string { return otherTok }, "service access bearer refused: " + serviceaccess.CheckKID, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate.set(tc.gateErr)
			defer gate.set(nil)
			n := svcName()
			sc, err := e.connect(t, tc.token(), n)
			wantDenied(t, sc, err)
			if got := e.rec.refusal(n); got != tc.refusal {
				t.Fatalf("refusal signed: %q, want %q", got, tc.refusal)
			}
			if g := e.rec.askedGrant(n); g != nil {
				t.Fatalf("a grant was asked for a refused token: %v", g)
			}
		})
	}
	if log := logOf(top); strings.Contains(log, tok) || strings.Contains(log, "eyJ") {
		t.Fatal("the responder logged a token")
	}
}

// kidOf is the kid in token's header.
func kidOf(t testing.TB, token string) string {
	t.Helper()
	hdr, err := base64.RawURLEncoding.DecodeString(strings.SplitN(token, ".", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(hdr, &h); err != nil || h.Kid == "" {
		t.Fatalf("token header has no kid: %v", err)
	}
	return h.Kid
}

// TestCalloutServiceBudgets: the service arm spends the same local budgets as the user arm, on a
// clock that stands still (the buckets never refill, so the counts are exact): a refused service
// connect is charged to the refusal budget and, past it, gets no reply and no signature; a
// granted one costs an open and a grant and nothing of the refusal budget; past the open budget
// signerd is not asked at all (nor the service gate). WaitIdle returns once the service connects
// are answered.
func TestCalloutServiceBudgets(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	gate := &serviceGate{err: errors.New("root expired")}
	frozen := time.Now()
	c := &counting{Signer: e.authd.API()}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, Services: gate,
		OpenRate: Rate{PerSecond: 1, Burst: 4}, RefusalRate: Rate{PerSecond: 1, Burst: 1},
		Now: func() time.Time { return frozen }, Logger: testLogger(t), signer: c})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	tok, _ := e.serviceToken(t, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
	connect := func(t *testing.T) error {
		t.Helper()
		cl, err := e.connect(t, tok, svcName())
		if err == nil {
			cl.Close()
		}
		return err
	}
	counts := func() [3]int64 { return [3]int64{c.opens.Load(), c.grants.Load(), c.refusals.Load()} }
	step := func(name string, admit bool, want [3]int64) {
		t.Run(name, func(t *testing.T) {
			if admit {
				gate.set(nil)
			} else {
				gate.set(errors.New("root expired"))
			}
			err := connect(t)
			if admit != (err == nil) {
				t.Fatalf("connect: %v, want admitted %v", err, admit)
			}
			if err := r.WaitIdle(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if got := counts(); got != want {
				t.Fatalf("signerd calls (opens, grants, refusals) = %v, want %v", got, want)
			}
		})
	}
	step("ok/a refused service connect is signed within the refusal budget", false, [3]int64{1, 0, 1})
	step("fail/past the refusal budget it gets no reply or signature", false, [3]int64{2, 0, 1})
	step("ok/a granted service connect costs an open and a grant", true, [3]int64{3, 1, 1})
	step("ok/and another", true, [3]int64{4, 2, 1})
	step("fail/past the open budget signerd is not asked", false, [3]int64{4, 2, 1})
	if n := len(gate.calls()); n != 4 {
		t.Fatalf("service gate asked %d times, want 4 (not for the request past the open budget)", n)
	}
}
