package exchange_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// TestPublicFace: the public face on a real loopback listener serves /health, /jwks and
// /exchange without the cap (both arms), refuses every view 403 before the IdP is asked, keeps
// the loopback face's Origin, media type and size guards, and answers every loopback door 404.
func TestPublicFace(t *testing.T) {
	// A burst for every request of the test from one peer (TestPublicPeerLimit tests the bucket).
	e := newEnv(t, envOpts{public: true, publicCfg: func(_ *env, pc *exchange.PublicConfig) { pc.PeerBurst = 1000 }})
	owner := e.owner("alice@example.com")
	row := e.grant(owner, "alice", "spawn")
	e.grant(owner, "root", "admin")
	_, agentTok := e.spawn(owner, "worker")

	t.Run("ok/health", func(t *testing.T) {
		a := e.do(http.MethodGet, "/health", nil, nil)
		if a.status != http.StatusOK || string(bytes.TrimSpace(a.body)) != `{"ok":true}` {
			t.Fatalf("/health = %d %s", a.status, a.body)
		}
		noCORS(t, a.header)
	})
	t.Run("ok/jwks", func(t *testing.T) {
		a := e.do(http.MethodGet, "/jwks", nil, nil)
		if a.status != http.StatusOK || a.header.Get("Cache-Control") != "max-age=300" {
			t.Fatalf("/jwks = %d %v %s", a.status, a.header, a.body)
		}
		keys, _ := a.json(t)["keys"].([]any)
		if len(keys) == 0 || keys[0].(map[string]any)["crv"] != "Ed25519" {
			t.Fatalf("/jwks keys %v", keys)
		}
	})
	t.Run("ok/human-arm-without-cap", func(t *testing.T) {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice"})
		if a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
		m := a.json(t)
		b := e.verifyBearer(m["token"].(string))
		if m["owner"] != owner || b.Act.Owner != owner || b.Act.Actor != "alice" || b.Act.LifecycleUID != row.LifecycleUID || b.Act.View != "" {
			t.Fatalf("answer %v bearer %+v", m, b.Act)
		}
	})
	t.Run("ok/agent-arm-without-cap", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "worker", "actorToken": agentTok})
		if a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Act.Actor != "worker" || b.Exp-b.Iat != 300 {
			t.Fatalf("agent bearer %+v lifetime %d", b.Act, b.Exp-b.Iat)
		}
	})
	t.Run("ok/cap-header-ignored", func(t *testing.T) {
		// A stray Authorization header is neither needed nor checked.
		b, _ := json.Marshal(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice"})
		if a := e.do(http.MethodPost, "/exchange", b, map[string]string{"Authorization": "Bearer nope"}); a.status != http.StatusOK {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
	})
	for _, view := range []string{"admin", "manager-caller", "session-caller", "no-such-view"} {
		t.Run("fail/view-"+view, func(t *testing.T) {
			// root holds admin: the view is refused for the face, not the row.
			a := e.exchange(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "root", "view": view})
			if a.status != http.StatusForbidden || !strings.Contains(a.errorText(t), "loopback operator surface") {
				t.Fatalf("exchange view %s = %d %s", view, a.status, a.body)
			}
			// Before the token is verified: a token that does not verify is still 403, not 401.
			if a := e.exchange(map[string]any{"idpToken": "not-a-token", "actor": "root", "view": view}); a.status != http.StatusForbidden {
				t.Fatalf("exchange view %s with a bad token = %d %s", view, a.status, a.body)
			}
		})
	}
	t.Run("fail/agent-view", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "worker", "actorToken": agentTok, "view": "manager-caller"})
		if a.status != http.StatusForbidden {
			t.Fatalf("exchange = %d %s", a.status, a.body)
		}
	})
	t.Run("fail/refusals-throttled-per-peer", func(t *testing.T) {
		// The face's own refusal throttle: a peer's refused exchanges count for that peer only.
		bad, _ := json.Marshal(map[string]any{"idpToken": "not-a-token", "actor": "alice"})
		for i := range exchange.MaxFailures {
			if a := e.doFrom("127.0.0.3", http.MethodPost, "/exchange", bad, nil); a.status != http.StatusUnauthorized {
				t.Fatalf("refusal %d = %d %s", i+1, a.status, a.body)
			}
		}
		if a := e.doFrom("127.0.0.3", http.MethodPost, "/exchange", bad, nil); a.status != http.StatusTooManyRequests {
			t.Fatalf("refusal past the budget = %d %s", a.status, a.body)
		}
		if a := e.doFrom("127.0.0.4", http.MethodPost, "/exchange", bad, nil); a.status != http.StatusUnauthorized {
			t.Fatalf("another peer's refusal = %d %s", a.status, a.body)
		}
	})
	t.Run("fail/origin", func(t *testing.T) {
		b, _ := json.Marshal(map[string]any{"idpToken": e.idpToken("alice@example.com", time.Hour), "actor": "alice"})
		for _, p := range []string{"/exchange", "/health", exchange.WellKnownPath} {
			m := http.MethodGet
			if p == "/exchange" {
				m = http.MethodPost
			}
			if a := e.do(m, p, b, map[string]string{"Origin": "https://evil.example"}); a.status != http.StatusForbidden {
				t.Fatalf("%s with Origin = %d %s", p, a.status, a.body)
			}
		}
	})
	t.Run("fail/media-type", func(t *testing.T) {
		if a := e.do(http.MethodPost, "/exchange", []byte(`{}`), map[string]string{"Content-Type": "text/plain"}); a.status != http.StatusUnsupportedMediaType {
			t.Fatalf("text/plain = %d %s", a.status, a.body)
		}
	})
	t.Run("fail/too-large", func(t *testing.T) {
		big := append([]byte(`{"idpToken":"`), bytes.Repeat([]byte("a"), exchange.MaxBodyBytes)...)
		big = append(big, `","actor":"alice"}`...)
		if a := e.do(http.MethodPost, "/exchange", big, nil); a.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("oversized body = %d %s", a.status, a.body)
		}
	})
	t.Run("fail/method", func(t *testing.T) {
		if a := e.do(http.MethodGet, "/exchange", nil, nil); a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != http.MethodPost {
			t.Fatalf("GET /exchange = %d %v", a.status, a.header)
		}
		if a := e.do(http.MethodPost, exchange.WellKnownPath, []byte(`{}`), nil); a.status != http.StatusMethodNotAllowed {
			t.Fatalf("POST well-known = %d", a.status)
		}
	})
	// The loopback doors and every other path: 404 for GET and POST, with or without anything
	// that looks like a cap. /manager-service-authority is 404 on a face built without its door.
	for _, p := range []string{exchange.ManagedActivatePath, exchange.ManagedRetirePath, "/interactive-lifecycle/retire",
		"/managed-lifecycle/verify-enrollment", "/verify-enrollment", exchange.ManagerAuthorityPath, serviceaccess.Path, "/", "/exchange/", "/.well-known/other"} {
		t.Run("fail/no-door"+p, func(t *testing.T) {
			for _, m := range []string{http.MethodGet, http.MethodPost} {
				a := e.do(m, p, []byte(`{}`), map[string]string{"Authorization": "Bearer " + newCap(t)})
				if a.status != http.StatusNotFound {
					t.Fatalf("%s %s = %d %s", m, p, a.status, a.body)
				}
			}
		})
	}
}

// TestPublicServiceEndpoints: serviceaccess.Path is routed to PublicConfig.ServiceEndpoints
// (before the face's Origin guard, so the door's own guards answer), behind the face's limits.
func TestPublicServiceEndpoints(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	door := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("Origin"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte(`{"door":true}`))
	})
	e := newEnv(t, envOpts{public: true, publicCfg: func(_ *env, pc *exchange.PublicConfig) { pc.ServiceEndpoints = door }})
	if a := e.do(http.MethodGet, serviceaccess.Path, nil, nil); a.status != http.StatusTeapot || string(a.body) != `{"door":true}` {
		t.Fatalf("GET door = %d %s", a.status, a.body)
	}
	if a := e.do(http.MethodPost, serviceaccess.Path, []byte(`{}`), map[string]string{"Origin": "https://x.example"}); a.status != http.StatusTeapot {
		t.Fatalf("POST door with Origin = %d %s", a.status, a.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != "GET " || seen[1] != "POST https://x.example" {
		t.Fatalf("door saw %q", seen)
	}
}

// bundle mirrors the well-known body, decoded closed so an extra member fails.
type bundle struct {
	Space       string `json:"space"`
	Server      string `json:"server"`
	TLSRequired bool   `json:"tlsRequired"`
	UserAuth    struct {
		Provider string `json:"provider"`
		IdP      struct {
			URL      string `json:"url"`
			Issuer   string `json:"issuer"`
			Audience string `json:"audience"`
		} `json:"idp"`
		Endpoints struct {
			URL                 string `json:"url"`
			ManagerAuthorityURL string `json:"managerAuthorityUrl"`
		} `json:"endpoints"`
	} `json:"userAuth"`
	SentinelCreds string `json:"sentinelCreds"`
}

// TestPublicWellKnown: the bundle carries exactly {space, server, tlsRequired, userAuth{provider,
// idp, endpoints{url, managerAuthorityUrl}}, sentinelCreds}; the idp is the pin, the endpoints
// are the published URL (tenant path kept), the sentinel creds hold signerd's sentinel JWT and a
// user seed; with no pin the bundle is 503.
func TestPublicWellKnown(t *testing.T) {
	var pinned sync.Map // "off" -> true: the pin reads as not pinned
	e := newEnv(t, envOpts{public: true, publicCfg: func(e *env, pc *exchange.PublicConfig) {
		pc.URL = testPublicURL + "/" // normalized away
		pc.Pin = func() (idp.Pin, error) {
			if _, off := pinned.Load("off"); off {
				return idp.Pin{}, idp.ErrNotPinned
			}
			return idp.NewPin(e.idp.URL)
		}
	}})
	t.Run("ok/body", func(t *testing.T) {
		a := e.do(http.MethodGet, exchange.WellKnownPath, nil, nil)
		if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
			t.Fatalf("well-known = %d %v %s", a.status, a.header, a.body)
		}
		noCORS(t, a.header)
		dec := json.NewDecoder(bytes.NewReader(a.body))
		dec.DisallowUnknownFields()
		var b bundle
		if err := dec.Decode(&b); err != nil {
			t.Fatalf("bundle %s: %v", a.body, err)
		}
		pin, _ := idp.NewPin(e.idp.URL)
		if b.Space != spaceName || b.Server != testPublicServer || !b.TLSRequired || b.UserAuth.Provider != "cotal" {
			t.Fatalf("bundle %+v", b)
		}
		if b.UserAuth.IdP.URL != pin.URL || b.UserAuth.IdP.Issuer != pin.Issuer || b.UserAuth.IdP.Audience != pin.Audience || pin.Issuer == "" {
			t.Fatalf("bundle idp %+v, pin %+v", b.UserAuth.IdP, pin)
		}
		if b.UserAuth.Endpoints.URL != testPublicURL || b.UserAuth.Endpoints.ManagerAuthorityURL != testPublicURL+"/manager-service-authority" {
			t.Fatalf("bundle endpoints %+v", b.UserAuth.Endpoints)
		}
		gs, err := e.client.API().GetSpace(context.Background(), &signerv1.GetSpaceRequest{Space: spaceName})
		if err != nil {
			t.Fatal(err)
		}
		userJWT, err := jwt.ParseDecoratedJWT([]byte(b.SentinelCreds))
		if err != nil || userJWT != gs.GetSentinelJwt() || userJWT == "" {
			t.Fatalf("sentinel creds JWT = %.40q, %v; want signerd's sentinel", userJWT, err)
		}
		uc, err := jwt.DecodeUserClaims(userJWT)
		if err != nil || !uc.BearerToken {
			t.Fatalf("sentinel claims %+v %v", uc, err)
		}
		kp, err := jwt.ParseDecoratedNKey([]byte(b.SentinelCreds))
		if err != nil {
			t.Fatalf("sentinel creds seed: %v", err)
		}
		pub, _ := kp.PublicKey()
		if !nkeys.IsValidPublicUserKey(pub) {
			t.Fatalf("sentinel creds key %s is not a user key", pub)
		}
		// The same bundle every time (the sentinel is asked once, the seed made once).
		if again := e.do(http.MethodGet, exchange.WellKnownPath, nil, nil); !bytes.Equal(again.body, a.body) {
			t.Fatal("the bundle changed between two reads")
		}
	})
	t.Run("fail/not-pinned", func(t *testing.T) {
		pinned.Store("off", true)
		defer pinned.Delete("off")
		a := e.do(http.MethodGet, exchange.WellKnownPath, nil, nil)
		if a.status != http.StatusServiceUnavailable || !strings.Contains(a.errorText(t), "no IdP is pinned") {
			t.Fatalf("well-known unpinned = %d %s", a.status, a.body)
		}
	})
}

// TestPublicPeerLimit: a peer past its token bucket gets 429 with Retry-After while another
// peer still gets through; X-Forwarded-For does not make a new peer unless trusted, and when
// trusted its last hop is the peer.
func TestPublicPeerLimit(t *testing.T) {
	const burst = 3
	limits := func(trust bool) func(*env, *exchange.PublicConfig) {
		return func(_ *env, pc *exchange.PublicConfig) {
			pc.PeerRate, pc.PeerBurst, pc.TrustForwardedFor = 0.001, burst, trust
		}
	}
	t.Run("ok/untrusted-forwarded-for", func(t *testing.T) {
		e := newEnv(t, envOpts{public: true, publicCfg: limits(false)})
		for i := range burst {
			if a := e.doFrom("127.0.0.1", http.MethodGet, "/health", nil, map[string]string{"X-Forwarded-For": fmt.Sprintf("10.0.0.%d", i)}); a.status != http.StatusOK {
				t.Fatalf("request %d = %d %s", i+1, a.status, a.body)
			}
		}
		a := e.doFrom("127.0.0.1", http.MethodGet, "/health", nil, map[string]string{"X-Forwarded-For": "10.0.0.99"})
		if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" {
			t.Fatalf("request past the burst = %d %v %s", a.status, a.header, a.body)
		}
		// The exchange is limited the same way.
		if a := e.doFrom("127.0.0.1", http.MethodPost, "/exchange", []byte(`{}`), nil); a.status != http.StatusTooManyRequests {
			t.Fatalf("exchange past the burst = %d %s", a.status, a.body)
		}
		// Another peer (source address) still gets through.
		if a := e.doFrom("127.0.0.2", http.MethodGet, "/health", nil, nil); a.status != http.StatusOK {
			t.Fatalf("another peer = %d %s", a.status, a.body)
		}
	})
	t.Run("ok/trusted-forwarded-for", func(t *testing.T) {
		e := newEnv(t, envOpts{public: true, publicCfg: limits(true)})
		// The last hop is the peer: earlier hops are the client's to write.
		for i := range burst {
			xff := fmt.Sprintf("192.0.2.%d, 10.0.0.1", i)
			if a := e.doFrom("127.0.0.1", http.MethodGet, "/health", nil, map[string]string{"X-Forwarded-For": xff}); a.status != http.StatusOK {
				t.Fatalf("request %d = %d", i+1, a.status)
			}
		}
		if a := e.doFrom("127.0.0.1", http.MethodGet, "/health", nil, map[string]string{"X-Forwarded-For": "192.0.2.77, 10.0.0.1"}); a.status != http.StatusTooManyRequests {
			t.Fatalf("10.0.0.1 past the burst = %d", a.status)
		}
		if a := e.doFrom("127.0.0.1", http.MethodGet, "/health", nil, map[string]string{"X-Forwarded-For": "10.0.0.2"}); a.status != http.StatusOK {
			t.Fatalf("10.0.0.2 over the same socket address = %d", a.status)
		}
	})
}

// TestPublicInFlight: at most DefaultMaxInFlight requests are served at once; one more is 503
// with Retry-After, and a freed slot serves again.
func TestPublicInFlight(t *testing.T) {
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(exchange.DefaultMaxInFlight)
	door := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			entered.Done()
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	})
	e := newEnv(t, envOpts{public: true, publicCfg: func(_ *env, pc *exchange.PublicConfig) {
		pc.ServiceEndpoints, pc.PeerBurst, pc.PeerRate = door, 10*exchange.DefaultMaxInFlight, 1000
	}})
	var wg sync.WaitGroup
	statuses := make(chan int, exchange.DefaultMaxInFlight)
	for range exchange.DefaultMaxInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, e.url+serviceaccess.Path, strings.NewReader(`{}`))
			resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
			if err != nil {
				statuses <- -1
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	entered.Wait() // every slot is held
	a := e.do(http.MethodGet, "/health", nil, nil)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" || !strings.Contains(a.errorText(t), "busy") {
		t.Fatalf("request %d = %d %v %s", exchange.DefaultMaxInFlight+1, a.status, a.header, a.body)
	}
	close(release)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusNoContent {
			t.Fatalf("a held request answered %d", s)
		}
	}
	if a := e.do(http.MethodGet, "/health", nil, nil); a.status != http.StatusOK {
		t.Fatalf("after the slots freed: %d %s", a.status, a.body)
	}
}

// TestPublicDeadline: a request still unanswered at the deadline gets 503 and its context ends
// with DeadlineExceeded; the server's timeouts follow the deadline.
func TestPublicDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	ctxErr := make(chan error, 1)
	door := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		ctxErr <- r.Context().Err()
	})
	e := newEnv(t, envOpts{public: true, publicCfg: func(_ *env, pc *exchange.PublicConfig) { pc.ServiceEndpoints, pc.Deadline = door, deadline }})
	start := time.Now()
	a := e.do(http.MethodGet, serviceaccess.Path, nil, nil)
	took := time.Since(start)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Content-Type") != "application/json" || !strings.Contains(a.errorText(t), "deadline") {
		t.Fatalf("slow request = %d %v %s", a.status, a.header, a.body)
	}
	if took < deadline || took > deadline+5*time.Second {
		t.Fatalf("answered after %v, want about %v", took, deadline)
	}
	select {
	case err := <-ctxErr:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("handler context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context did not end")
	}

	p := newPublic(t, exchange.PublicConfig{})
	s := exchange.NewPublicServer(p)
	if p.Deadline() != exchange.DefaultDeadline || s.ReadTimeout != exchange.DefaultDeadline || s.WriteTimeout <= exchange.DefaultDeadline ||
		s.ReadHeaderTimeout > exchange.DefaultDeadline || s.MaxHeaderBytes != exchange.MaxHeaderBytes {
		t.Fatalf("public server limits %+v", s)
	}
}

// newPublic builds a public face over a throwaway signer env with pc's limits.
func newPublic(t *testing.T, pc exchange.PublicConfig) *exchange.Public {
	t.Helper()
	e := newEnv(t, envOpts{})
	pc.Exchange = exchange.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger}
	if pc.URL == "" {
		pc.URL = testPublicURL
	}
	if pc.Server == "" {
		pc.Server = testPublicServer
	}
	p, err := exchange.NewPublic(pc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewPublicRefuses(t *testing.T) {
	e := newEnv(t, envOpts{})
	base := func() exchange.PublicConfig {
		return exchange.PublicConfig{Exchange: exchange.Config{Space: spaceName, Signer: e.client, Ledger: e.ledger}, URL: testPublicURL, Server: testPublicServer}
	}
	if _, err := exchange.NewPublic(base()); err != nil {
		t.Fatalf("ok/base: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		edit       func(pc *exchange.PublicConfig)
	}{
		{"fail/cap", "no cap", func(pc *exchange.PublicConfig) { pc.Exchange.Cap = e.cap }},
		{"fail/lifecycle-door", "no loopback door", func(pc *exchange.PublicConfig) { pc.Exchange.Lifecycle = http.NotFoundHandler() }},
		{"fail/no-ledger", "ledger", func(pc *exchange.PublicConfig) { pc.Exchange.Ledger = nil }},
		{"fail/bad-space", "exchange", func(pc *exchange.PublicConfig) { pc.Exchange.Space = "" }},
		{"fail/http-url", "must be https", func(pc *exchange.PublicConfig) { pc.URL = "http://auth.example" }},
		{"fail/no-url", "public url", func(pc *exchange.PublicConfig) { pc.URL = "" }},
		{"fail/https-server", "broker URL", func(pc *exchange.PublicConfig) { pc.Server = "https://mesh.example" }},
		{"fail/negative-limit", "negative", func(pc *exchange.PublicConfig) { pc.MaxInFlight = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := base()
			tc.edit(&pc)
			if _, err := exchange.NewPublic(pc); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewPublic = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckPublicURL(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "https://auth.example", want: "https://auth.example"},
		{in: "https://auth.example/", want: "https://auth.example"},
		{in: "https://auth.example:8443/tenant/a/", want: "https://auth.example:8443/tenant/a"},
		{in: "http://auth.example", err: "must be https"},
		{in: "http://127.0.0.1:8443", err: "must be https"},
		{in: "auth.example", err: "must be https"},
		{in: "https:///path", err: "absolute URL"},
		{in: "https://u:p@auth.example", err: "user info"},
		{in: "https://auth.example/?x=1", err: "query"},
		{in: "https://auth.example/#frag", err: "fragment"},
		{in: "", err: "must be https"},
	} {
		name := "ok/" + tc.in
		if tc.err != "" {
			name = "fail/" + tc.in
		}
		t.Run(name, func(t *testing.T) {
			got, err := exchange.CheckPublicURL(tc.in)
			if tc.err == "" && (err != nil || got != tc.want) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("CheckPublicURL(%q) = %q, %v; want %q / %q", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestCheckAdvertisedServer(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{in: "nats://mesh.example:4222"},
		{in: "tls://mesh.example:4222"},
		{in: "ws://127.0.0.1:8080"},
		{in: "wss://mesh.example/mesh-ws"},
		{in: "https://mesh.example", err: "broker URL"},
		{in: "mesh.example:4222", err: "broker URL"},
		{in: "nats://", err: "no host"},
		{in: "tls://u:p@mesh.example", err: "user info"},
		{in: "wss://mesh.example/?t=1", err: "query"},
	} {
		name := "ok/" + tc.in
		if tc.err != "" {
			name = "fail/" + tc.in
		}
		t.Run(name, func(t *testing.T) {
			err := exchange.CheckAdvertisedServer(tc.in)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("CheckAdvertisedServer(%q) = %v, want %q", tc.in, err, tc.err)
			}
		})
	}
}
