package exchange_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/views"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

func TestNewRefuses(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, tc := range []struct {
		name string
		cfg  exchange.Config
		err  string
	}{
		{name: "fail/space", cfg: exchange.Config{Space: "", Signer: e.client, Ledger: e.ledger, Cap: e.cap}, err: "space"},
		{name: "fail/no-signer", cfg: exchange.Config{Space: spaceName, Ledger: e.ledger, Cap: e.cap}, err: "signer"},
		{name: "fail/no-ledger", cfg: exchange.Config{Space: spaceName, Signer: e.client, Cap: e.cap}, err: "ledger"},
		{name: "fail/short-cap", cfg: exchange.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger, Cap: "abcd"}, err: "cap"},
		{name: "fail/upper-cap", cfg: exchange.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger, Cap: strings.ToUpper(e.cap)}, err: "cap"},
		{name: "fail/non-hex-cap", cfg: exchange.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger, Cap: strings.Repeat("z", 64)}, err: "cap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := exchange.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("New = %v, want error containing %q", err, tc.err)
			}
		})
	}
}

func TestHealthAndJWKS(t *testing.T) {
	e := newEnv(t, envOpts{})
	t.Run("ok/health", func(t *testing.T) {
		a := e.do(http.MethodGet, "/health", nil, nil)
		m := a.json(t)
		// ok and nothing else: no issuer, space or service name for a port scanner.
		if a.status != http.StatusOK || m["ok"] != true || len(m) != 1 || bytes.Contains(a.body, []byte(spaceName)) {
			t.Fatalf("/health = %d %s, want exactly {\"ok\":true}", a.status, a.body)
		}
		noCORS(t, a.header)
	})
	t.Run("ok/jwks", func(t *testing.T) {
		a := e.do(http.MethodGet, "/jwks", nil, nil)
		if a.status != http.StatusOK || a.header.Get("Cache-Control") != "max-age=300" {
			t.Fatalf("/jwks = %d, Cache-Control %q", a.status, a.header.Get("Cache-Control"))
		}
		want, err := e.client.API().GetJWKS(context.Background(), &signerv1.GetJWKSRequest{Space: spaceName})
		if err != nil {
			t.Fatal(err)
		}
		keys, _ := a.json(t)["keys"].([]any)
		if len(keys) != len(want.GetKeys()) || len(keys) == 0 {
			t.Fatalf("/jwks keys = %s, signerd has %d", a.body, len(want.GetKeys()))
		}
		k := keys[0].(map[string]any)
		w := want.GetKeys()[0]
		if k["kid"] != w.GetKid() || k["x"] != w.GetX() || k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["alg"] != "EdDSA" || k["use"] != "sig" {
			t.Fatalf("/jwks key = %v, want %v", k, w)
		}
		noCORS(t, a.header)
	})
	t.Run("fail/method", func(t *testing.T) {
		for _, p := range []string{"/health", "/jwks"} {
			if a := e.do(http.MethodPost, p, []byte("{}"), nil); a.status != http.StatusMethodNotAllowed {
				t.Fatalf("POST %s = %d", p, a.status)
			}
		}
		if a := e.do(http.MethodGet, "/exchange", nil, nil); a.status != http.StatusMethodNotAllowed {
			t.Fatalf("GET /exchange = %d", a.status)
		}
	})
	t.Run("fail/unknown-route", func(t *testing.T) {
		if a := e.do(http.MethodGet, "/manager-service-authority", nil, nil); a.status != http.StatusNotFound {
			t.Fatalf("unknown route = %d", a.status)
		}
	})
}

func TestGuards(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("guard-user")
	e.grant(owner, "bob")
	good := []byte(`{"idpToken":"` + e.idpToken("guard-user", 10*time.Minute) + `","actor":"bob"}`)
	big := append(append([]byte(`{"actor":"bob","idpToken":"`), bytes.Repeat([]byte("a"), exchange.MaxBodyBytes)...), []byte(`"}`)...)
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   []byte
		hdr    map[string]string
		status int
		err    string
	}{
		{name: "ok/charset-param", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Content-Type": "application/json; charset=utf-8"}, status: 200},
		{name: "fail/origin-exchange", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Origin": "http://127.0.0.1:1"}, status: 403, err: "Origin"},
		{name: "fail/origin-health", method: http.MethodGet, path: "/health", hdr: map[string]string{"Origin": "null"}, status: 403, err: "Origin"},
		{name: "fail/origin-jwks", method: http.MethodGet, path: "/jwks", hdr: map[string]string{"Origin": "https://evil.example"}, status: 403, err: "Origin"},
		{name: "fail/no-cap", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Authorization": ""}, status: 401, err: "capability"},
		{name: "fail/wrong-cap", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Authorization": "Bearer " + newCap(t)}, status: 401, err: "capability"},
		{name: "fail/cap-without-scheme", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Authorization": e.cap}, status: 401, err: "capability"},
		{name: "fail/cap-basic-scheme", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Authorization": "Basic " + e.cap}, status: 401, err: "capability"},
		{name: "fail/text-plain", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Content-Type": "text/plain"}, status: 415, err: "application/json"},
		{name: "fail/form", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, status: 415, err: "application/json"},
		{name: "fail/no-content-type", method: http.MethodPost, path: "/exchange", body: good, hdr: map[string]string{"Content-Type": ""}, status: 415, err: "application/json"},
		{name: "fail/body-over-64k", method: http.MethodPost, path: "/exchange", body: big, status: 413, err: "larger than"},
		{name: "fail/not-json", method: http.MethodPost, path: "/exchange", body: []byte("idpToken=x"), status: 400, err: "not an exchange request"},
		{name: "fail/two-values", method: http.MethodPost, path: "/exchange", body: append(append([]byte{}, good...), good...), status: 400, err: "more than one"},
		{name: "fail/unknown-member", method: http.MethodPost, path: "/exchange", body: []byte(`{"idpToken":"x","actor":"bob","scope":["admin"]}`), status: 400, err: "unknown field"},
		{name: "fail/both-tokens", method: http.MethodPost, path: "/exchange", body: []byte(`{"idpToken":"x","actorToken":"y","actor":"bob"}`), status: 400, err: "exclusive"},
		{name: "fail/no-token", method: http.MethodPost, path: "/exchange", body: []byte(`{"actor":"bob"}`), status: 400, err: "required"},
		{name: "fail/ttl-zero", method: http.MethodPost, path: "/exchange", body: []byte(`{"idpToken":"x","actor":"bob","ttlSec":0}`), status: 400, err: "ttlSec"},
		{name: "fail/ttl-fraction", method: http.MethodPost, path: "/exchange", body: []byte(`{"idpToken":"x","actor":"bob","ttlSec":1.5}`), status: 400, err: "ttlSec"},
		{name: "fail/human-with-owner", method: http.MethodPost, path: "/exchange", body: []byte(`{"idpToken":"x","actor":"bob","owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa"}`), status: 400, err: "no owner"},
		{name: "fail/options-preflight", method: http.MethodOptions, path: "/exchange", hdr: map[string]string{"Access-Control-Request-Method": "POST"}, status: 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.do(tc.method, tc.path, tc.body, tc.hdr)
			if a.status != tc.status {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, a.status, a.body, tc.status)
			}
			if tc.err != "" && !strings.Contains(a.errorText(t), tc.err) {
				t.Fatalf("error %q, want it to contain %q", a.errorText(t), tc.err)
			}
			noCORS(t, a.header)
		})
	}
}

// TestThrottle: refusals are throttled per source, only refusals count, and a correct credential
// is never refused because other callers failed. Each case calls from its own loopback source
// address, as separate local callers would, over TCP to the real listener.
func TestThrottle(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("window-user")
	e.grant(owner, "bob")
	good := []byte(`{"idpToken":"` + e.idpToken("window-user", 30*time.Minute) + `","actor":"bob"}`)
	boss := e.owner("spawner")
	e.grant(boss, "boss", "spawn")
	_, tok := e.spawn(boss, "agent1")
	goodAgent, _ := json.Marshal(map[string]any{"owner": boss, "actor": "agent1", "actorToken": tok})
	wrongCap := map[string]string{"Authorization": "Bearer " + newCap(t)}
	post := func(from string, body []byte, hdr map[string]string) answer {
		t.Helper()
		return e.doFrom(from, http.MethodPost, "/exchange", body, hdr)
	}
	// spend makes MaxFailures refusals from a source, each 401, then one more: 429.
	spend := func(t *testing.T, what string, refuse func() answer) {
		t.Helper()
		for i := range exchange.MaxFailures {
			if a := refuse(); a.status != http.StatusUnauthorized {
				t.Fatalf("%s %d = %d %s, want 401", what, i+1, a.status, a.body)
			}
		}
		if a := refuse(); a.status != http.StatusTooManyRequests {
			t.Fatalf("%s %d = %d %s, want 429", what, exchange.MaxFailures+1, a.status, a.body)
		}
	}

	t.Run("ok/correct-cap-after-wrong-caps", func(t *testing.T) {
		const bad = "127.0.0.2"
		spend(t, "wrong cap", func() answer { return post(bad, good, wrongCap) })
		// The correct cap from the same address, and from another, is served.
		for _, from := range []string{bad, "127.0.0.3", ""} {
			if a := post(from, good, nil); a.status != http.StatusOK {
				t.Fatalf("correct cap from %q after %d wrong caps = %d %s, want 200", from, exchange.MaxFailures+1, a.status, a.body)
			}
		}
		if a := post(bad, good, map[string]string{"Authorization": ""}); a.status != http.StatusTooManyRequests || !strings.Contains(a.errorText(t), "from this source") {
			t.Fatalf("no cap from the throttled source = %d %s, want 429", a.status, a.body)
		}
		// Another source's wrong cap is its own: 401.
		if a := post("127.0.0.3", good, wrongCap); a.status != http.StatusUnauthorized {
			t.Fatalf("wrong cap from another source = %d, want 401", a.status)
		}
		// /health and /jwks are not throttled.
		if a := e.doFrom(bad, http.MethodGet, "/health", nil, nil); a.status != http.StatusOK {
			t.Fatalf("/health while throttled = %d", a.status)
		}
	})
	t.Run("ok/correct-agent-token-after-wrong-tokens", func(t *testing.T) {
		const bad = "127.0.0.4"
		wrong, _ := json.Marshal(map[string]any{"owner": boss, "actor": "agent1", "actorToken": "wrong"})
		spend(t, "wrong agent token", func() answer { return post(bad, wrong, nil) })
		if a := post(bad, goodAgent, nil); a.status != http.StatusOK {
			t.Fatalf("correct agent token after %d wrong ones = %d %s, want 200", exchange.MaxFailures+1, a.status, a.body)
		}
		if a := post(bad, good, nil); a.status != http.StatusOK {
			t.Fatalf("human exchange from the source of the wrong agent tokens = %d %s, want 200", a.status, a.body)
		}
		if a := post(bad, good, wrongCap); a.status != http.StatusUnauthorized {
			t.Fatalf("wrong cap from that source = %d, want 401 (classes count apart)", a.status)
		}
	})
	t.Run("ok/correct-idp-token-after-bad-ones", func(t *testing.T) {
		const bad = "127.0.0.5"
		forged := []byte(`{"idpToken":"e30.e30.AAAA","actor":"bob"}`)
		spend(t, "unverifiable IdP token", func() answer { return post(bad, forged, nil) })
		if a := post(bad, good, nil); a.status != http.StatusOK {
			t.Fatalf("good IdP token after %d bad ones = %d %s, want 200", exchange.MaxFailures+1, a.status, a.body)
		}
	})
	t.Run("fail/identity-budget-follows-the-identity", func(t *testing.T) {
		// A verified IdP identity with no grant spends its own budget, wherever it calls from;
		// past it, it is 429 before signerd is asked for its owner. Other identities are served.
		nogrant, _ := json.Marshal(map[string]any{"idpToken": e.idpToken("no-grant-user", 30*time.Minute), "actor": "bob"})
		spend(t, "identity without a grant", func() answer { return post("127.0.0.6", nogrant, nil) })
		if a := post("127.0.0.7", nogrant, nil); a.status != http.StatusTooManyRequests {
			t.Fatalf("the spent identity from another address = %d %s, want 429", a.status, a.body)
		}
		if a := post("127.0.0.6", good, nil); a.status != http.StatusOK {
			t.Fatalf("another identity from the same address = %d %s, want 200", a.status, a.body)
		}
	})
	t.Run("ok/window-passes", func(t *testing.T) {
		e.clock.Add(exchange.FailureWindow)
		if a := post("127.0.0.2", good, wrongCap); a.status != http.StatusUnauthorized {
			t.Fatalf("wrong cap a minute later = %d %s, want 401", a.status, a.body)
		}
	})
}

func TestHumanArm(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("alice@example.com")
	row := e.grant(owner, "alice", "spawn")
	adminRow := e.grant(owner, "root", "admin")
	spawnedRow, _ := e.spawn(owner, "worker")
	other := e.owner("mallory")

	t.Run("ok/bearer-from-row", func(t *testing.T) {
		before := time.Now().Unix()
		a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice"})
		if a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
		m := a.json(t)
		b := e.verifyBearer(m["token"].(string))
		if m["owner"] != owner || b.Sub != owner || b.Act.Owner != owner || b.Act.Actor != "alice" {
			t.Fatalf("owner %v, bearer %+v; want %s.alice", m["owner"], b, owner)
		}
		if b.Act.LifecycleUID != row.LifecycleUID || !slices.Equal(b.Act.Scope, []string{"spawn"}) || !slices.Equal(b.Scope, []string{"spawn"}) {
			t.Fatalf("bearer act %+v, want the row's scope and uid %s", b.Act, row.LifecycleUID)
		}
		if b.Iss != "urn:cotal:auth:"+spaceName || b.Ver != 1 || b.Act.View != "" || b.Act.CredentialID != "" {
			t.Fatalf("bearer %+v", b)
		}
		if int64(m["exp"].(float64)) != b.Exp || b.Exp-b.Iat != 900 || b.Iat < before {
			t.Fatalf("exp %v, bearer iat %d exp %d; want a 900 s bearer", m["exp"], b.Iat, b.Exp)
		}
	})
	t.Run("ok/ttl-requested", func(t *testing.T) {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice", "ttlSec": 60})
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Exp-b.Iat != 60 {
			t.Fatalf("bearer lifetime %d, want 60", b.Exp-b.Iat)
		}
	})
	t.Run("ok/ttl-over-cap", func(t *testing.T) {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice", "ttlSec": 3600})
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Exp-b.Iat != 900 {
			t.Fatalf("bearer lifetime %d, want 900", b.Exp-b.Iat)
		}
	})
	t.Run("ok/ttl-capped-by-idp-exp", func(t *testing.T) {
		tok := e.idp.Token(t, e.idp.Claims("alice@example.com", time.Now(), 120*time.Second), nil)
		idpExp := time.Now().Add(120 * time.Second).Unix()
		a := e.exchange(map[string]any{"idpToken": tok, "actor": "alice"})
		if a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Exp > idpExp || b.Exp-b.Iat > 120 {
			t.Fatalf("bearer exp %d (lifetime %d) outlives the IdP token's exp %d", b.Exp, b.Exp-b.Iat, idpExp)
		}
	})
	t.Run("ok/admin-view", func(t *testing.T) {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "root", "view": "admin"})
		if a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Act.View != "admin" || b.Act.LifecycleUID != adminRow.LifecycleUID {
			t.Fatalf("bearer act %+v, want view admin", b.Act)
		}
	})
	for _, tc := range []struct {
		name   string
		req    map[string]any
		status int
		err    string
	}{
		{name: "fail/admin-view-without-admin-scope", req: map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice", "view": "admin"}, status: 401, err: `needs scope "admin"`},
		{name: "fail/no-row", req: map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "carol"}, status: 401, err: "no grant"},
		{name: "fail/other-owners-row", req: map[string]any{"idpToken": e.idpToken("mallory", time.Hour), "actor": "alice"}, status: 401, err: "no grant for actor \"alice\" under your owner " + other},
		{name: "fail/managed-row", req: map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": spawnedRow.Actor}, status: 401, err: "is refused"},
		{name: "fail/expired-idp-token", req: map[string]any{"idpToken": e.idp.Token(t, e.idp.Claims("alice@example.com", time.Now().Add(-time.Hour), time.Minute), nil), "actor": "alice"}, status: 401, err: "expired"},
		{name: "fail/foreign-idp-token", req: map[string]any{"idpToken": e.idp.Token(t, map[string]any{"iss": "https://evil", "aud": e.idp.URL, "sub": "alice@example.com", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}, nil), "actor": "alice"}, status: 401, err: "iss"},
		{name: "fail/garbage-idp-token", req: map[string]any{"idpToken": "not.a.jwt", "actor": "alice"}, status: 401, err: "idp token refused"},
		{name: "fail/actor-grammar", req: map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "al.ice"}, status: 400, err: "actor"},
		{name: "fail/empty-actor", req: map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour)}, status: 400, err: "actor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.exchange(tc.req)
			if a.status != tc.status || !strings.Contains(a.errorText(t), tc.err) {
				t.Fatalf("exchange = %d %s, want %d containing %q", a.status, a.body, tc.status, tc.err)
			}
			if strings.Contains(string(a.body), "token\"") {
				t.Fatalf("refusal carries a token: %s", a.body)
			}
		})
	}
	t.Run("fail/revoked-row", func(t *testing.T) {
		e.grant(owner, "temp")
		if a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "temp"}); a.status != 200 {
			t.Fatalf("before revoke = %d %s", a.status, a.body)
		}
		if err := e.ledger.Revoke("actors", owner, "temp"); err != nil {
			t.Fatal(err)
		}
		if a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "temp"}); a.status != 401 {
			t.Fatalf("after revoke = %d %s, want 401", a.status, a.body)
		}
	})
}

func TestHumanArmWithoutPin(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts envOpts
	}{
		{name: "fail/nil", opts: envOpts{noIdP: true}},
		{name: "fail/typed-nil-verifier", opts: envOpts{idp: func(*env) exchange.IdP { return (*idp.Verifier)(nil) }}},
		{name: "fail/typed-nil-pinned", opts: envOpts{idp: func(*env) exchange.IdP { return (*idp.Pinned)(nil) }}},
		{name: "fail/pinned-empty-state-dir", opts: envOpts{idp: func(e *env) exchange.IdP { return idp.NewPinned(e.ledger.Dir(), idp.Options{}) }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts)
			a := e.exchange(map[string]any{"idpToken": e.idpToken("x", time.Hour), "actor": "alice"})
			if a.status != http.StatusServiceUnavailable || !strings.Contains(a.errorText(t), "authd idp pin") {
				t.Fatalf("exchange without a pin = %d %s", a.status, a.body)
			}
		})
	}
}

// TestHumanArmPinnedAfterStart: with idp.Pinned, a pin written while the exchange runs is used
// without a restart.
func TestHumanArmPinnedAfterStart(t *testing.T) {
	e := newEnv(t, envOpts{idp: func(e *env) exchange.IdP { return idp.NewPinned(e.ledger.Dir(), idp.Options{}) }})
	owner := e.owner("late-user")
	e.grant(owner, "alice")
	if a := e.exchange(map[string]any{"idpToken": e.idpToken("late-user", time.Hour), "actor": "alice"}); a.status != http.StatusServiceUnavailable {
		t.Fatalf("before the pin = %d %s", a.status, a.body)
	}
	if _, err := idp.PinURL(context.Background(), e.ledger.Dir(), e.idp.URL, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("late-user", time.Hour), "actor": "alice"})
		if a.status != http.StatusOK {
			return fmt.Errorf("after the pin = %d %s", a.status, a.body)
		}
		return nil
	})
}

// TestHumanArmIdPDown: an IdP whose JWKS cannot be fetched is 503 (retry later), not a refusal
// that counts toward the 30-a-minute window.
func TestHumanArmIdPDown(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.idp.SetDown(true)
	for range exchange.MaxFailures + 1 {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("x", time.Hour), "actor": "alice"})
		if a.status != http.StatusServiceUnavailable || !strings.Contains(a.errorText(t), "unavailable") {
			t.Fatalf("exchange with the IdP down = %d %s", a.status, a.body)
		}
	}
}

// TestViews: every view but admin and manager-caller maps to no profile, so the exchange refuses
// it by name on both arms, before any token is checked; a string outside the enum is "not a
// view". manager-caller is issued bound to a manager instance (select_test.go).
func TestViews(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("viewer")
	e.grant(owner, "root", "admin", "spawn", "supervise")
	_, actorTok := e.spawn(owner, "agent1", "spawn")
	for _, view := range append(views.All(), "superuser") {
		t.Run("human/"+view, func(t *testing.T) {
			a := e.exchange(map[string]any{"idpToken": e.idpToken("viewer", time.Hour), "actor": "root", "view": view})
			switch {
			case view == views.Admin:
				if a.status != http.StatusOK {
					t.Fatalf("admin view = %d %s", a.status, a.body)
				}
			case view == views.ManagerCaller:
				// Issued, bound to an instance: this exchange has no selector (select_test.go).
				if a.status != http.StatusServiceUnavailable || !strings.Contains(a.errorText(t), "manager selection is not available") {
					t.Fatalf("manager-caller view = %d %s, want 503", a.status, a.body)
				}
			case view == "superuser":
				if a.status != http.StatusBadRequest || !strings.Contains(a.errorText(t), "is not a view") {
					t.Fatalf("unknown view = %d %s", a.status, a.body)
				}
			default:
				if a.status != http.StatusBadRequest || !strings.Contains(a.errorText(t), `view "`+view+`" is not issued`) {
					t.Fatalf("view %s = %d %s, want 400 naming it as not issued", view, a.status, a.body)
				}
			}
		})
		t.Run("agent/"+view, func(t *testing.T) {
			a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": actorTok, "view": view})
			want, status := "takes no view but", http.StatusBadRequest
			if view == views.ManagerCaller {
				want, status = "manager selection is not available", http.StatusServiceUnavailable
			}
			if a.status != status || !strings.Contains(a.errorText(t), want) {
				t.Fatalf("agent view %s = %d %s, want 400 containing %q", view, a.status, a.body, want)
			}
		})
	}
}

func TestAgentArm(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("spawner")
	e.grant(owner, "boss", "spawn")
	row, tok := e.spawn(owner, "agent1", "spawn")
	_, otherTok := e.spawn(owner, "agent2")

	t.Run("ok/bearer-300s", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok, "ttlSec": 900})
		if a.status != http.StatusOK {
			t.Fatalf("agent exchange = %d %s", a.status, a.body)
		}
		b := e.verifyBearer(a.json(t)["token"].(string))
		if b.Exp-b.Iat != 300 || b.Act.Owner != owner || b.Act.Actor != "agent1" || b.Act.LifecycleUID != row.LifecycleUID || !slices.Equal(b.Act.Scope, []string{"spawn"}) {
			t.Fatalf("agent bearer %+v (lifetime %d), want 300 s from the managed row", b.Act, b.Exp-b.Iat)
		}
	})
	t.Run("ok/ttl-requested", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok, "ttlSec": 30})
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Exp-b.Iat != 30 {
			t.Fatalf("lifetime %d, want 30", b.Exp-b.Iat)
		}
	})
	var bodies [][]byte
	for _, tc := range []struct {
		name string
		req  map[string]any
	}{
		{name: "fail/wrong-token", req: map[string]any{"owner": owner, "actor": "agent1", "actorToken": otherTok}},
		{name: "fail/empty-token", req: map[string]any{"owner": owner, "actor": "agent1", "actorToken": ""}},
		{name: "fail/unknown-actor", req: map[string]any{"owner": owner, "actor": "ghost", "actorToken": tok}},
		{name: "fail/interactive-row", req: map[string]any{"owner": owner, "actor": "boss", "actorToken": tok}},
		{name: "fail/other-owner", req: map[string]any{"owner": e.owner("someone"), "actor": "agent1", "actorToken": tok}},
		{name: "fail/malformed-owner", req: map[string]any{"owner": "root", "actor": "agent1", "actorToken": tok}},
		{name: "fail/malformed-actor", req: map[string]any{"owner": owner, "actor": "a.b", "actorToken": tok}},
		{name: "fail/token-as-hash", req: map[string]any{"owner": owner, "actor": "agent1", "actorToken": row.TokenHash}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.exchange(tc.req)
			if a.status != http.StatusUnauthorized || a.errorText(t) != exchange.AgentRefusal {
				t.Fatalf("agent exchange = %d %s, want 401 %q", a.status, a.body, exchange.AgentRefusal)
			}
			bodies = append(bodies, a.body)
		})
	}
	t.Run("fail/one-sentence", func(t *testing.T) {
		for i := range bodies {
			if !bytes.Equal(bodies[i], bodies[0]) {
				t.Fatalf("agent refusal bodies differ: %s vs %s", bodies[i], bodies[0])
			}
		}
	})
	t.Run("fail/revoked", func(t *testing.T) {
		_, tok3 := e.spawn(owner, "agent3")
		if a := e.exchange(map[string]any{"owner": owner, "actor": "agent3", "actorToken": tok3}); a.status != 200 {
			t.Fatalf("before revoke = %d %s", a.status, a.body)
		}
		if err := e.ledger.Revoke("managed-actors", owner, "agent3"); err != nil {
			t.Fatal(err)
		}
		if a := e.exchange(map[string]any{"owner": owner, "actor": "agent3", "actorToken": tok3}); a.status != 401 || a.errorText(t) != exchange.AgentRefusal {
			t.Fatalf("after revoke = %d %s", a.status, a.body)
		}
	})
}

func TestSignerDown(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("downer")
	e.grant(owner, "bob")
	e.signer.Serve.Stop()
	a := e.exchange(map[string]any{"idpToken": e.idpToken("downer", time.Hour), "actor": "bob"})
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.errorText(t), "signer") {
		t.Fatalf("exchange with signerd down = %d %s, want 503", a.status, a.body)
	}
	if a := e.do(http.MethodGet, "/jwks", nil, nil); a.status != http.StatusServiceUnavailable {
		t.Fatalf("/jwks with signerd down and nothing cached = %d", a.status)
	}
}

// TestGrantedRowYieldsBearer: every row the ledger accepts exchanges to a bearer on both arms,
// whatever its scope holds: capability words ride the bearer (row order), role:<r> delegation
// tokens stay in the ledger (signerd's bearer grammar has no ':'; a row with role:reviewer used to
// get 502), and a row at the ledger's capability cap is within signerd's bearer cap.
func TestGrantedRowYieldsBearer(t *testing.T) {
	e := newEnv(t, envOpts{})
	owner := e.owner("scoped")
	words := make([]string, ledger.MaxCapabilities)
	for i := range words {
		words[i] = fmt.Sprintf("cap%02d", i)
	}
	words[0] = "a" + strings.Repeat("z", 31) // the longest scope word
	for i, tc := range []struct {
		name  string
		scope []string
		want  []string
	}{
		{name: "ok/empty", scope: nil, want: []string{}},
		{name: "ok/words", scope: []string{"spawn", "admin"}, want: []string{"spawn", "admin"}},
		{name: "ok/role-only", scope: []string{"role:reviewer"}, want: []string{}},
		{name: "ok/words-and-roles", scope: []string{"role:Review_er-2", "spawn", "role:x", "supervise"}, want: []string{"spawn", "supervise"}},
		{name: "ok/capability-cap", scope: append(append([]string{}, words...), "role:reviewer", "role:"+strings.Repeat("R", 64)), want: words},
	} {
		t.Run(tc.name+"/human", func(t *testing.T) {
			actor := fmt.Sprintf("human%d", i)
			row := e.grant(owner, actor, tc.scope...)
			a := e.exchange(map[string]any{"idpToken": e.idpToken("scoped", time.Hour), "actor": actor})
			if a.status != http.StatusOK {
				t.Fatalf("human exchange of a granted row (scope %q) = %d %s", tc.scope, a.status, a.body)
			}
			b := e.verifyBearer(a.json(t)["token"].(string))
			if !slices.Equal(nonNil(b.Act.Scope), tc.want) || !slices.Equal(row.BearerScope(), tc.want) || b.Act.LifecycleUID != row.LifecycleUID {
				t.Fatalf("bearer act.scope %q (row.BearerScope %q), want %q", b.Act.Scope, row.BearerScope(), tc.want)
			}
		})
		t.Run(tc.name+"/agent", func(t *testing.T) {
			actor := fmt.Sprintf("agent%d", i)
			row, tok := e.spawn(owner, actor, tc.scope...)
			a := e.exchange(map[string]any{"owner": owner, "actor": actor, "actorToken": tok})
			if a.status != http.StatusOK {
				t.Fatalf("agent exchange of a granted row (scope %q) = %d %s", tc.scope, a.status, a.body)
			}
			b := e.verifyBearer(a.json(t)["token"].(string))
			if !slices.Equal(nonNil(b.Act.Scope), tc.want) || b.Act.LifecycleUID != row.LifecycleUID {
				t.Fatalf("bearer act.scope %q, want %q", b.Act.Scope, tc.want)
			}
		})
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// TestBodyLimitChunked: a body over 64 KiB sent without a Content-Length (chunked) is 413 too;
// the limit is on the bytes read, not only on the header.
func TestBodyLimitChunked(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, tc := range []struct {
		name   string
		size   int
		status int
	}{
		{name: "ok/64k-read-then-400", size: exchange.MaxBodyBytes - 64, status: http.StatusBadRequest},
		{name: "fail/over-64k", size: exchange.MaxBodyBytes + 1, status: http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := io.MultiReader(strings.NewReader(`{"actor":"bob","idpToken":"`), strings.NewReader(strings.Repeat("a", tc.size)), strings.NewReader(`"`))
			req, err := http.NewRequest(http.MethodPost, e.url+"/exchange", body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+e.cap)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if req.ContentLength != 0 {
				// Length unknown: net/http sends it chunked.
				t.Fatalf("request has a Content-Length %d", req.ContentLength)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("chunked body of %d bytes = %d, want %d", tc.size, resp.StatusCode, tc.status)
			}
		})
	}
}
