package sepdoor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/sepdoor"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/nats-io/nkeys"
)

var (
	kinds  = []serviceaccess.Kind{serviceaccess.KindRegister, serviceaccess.KindActivate, serviceaccess.KindRenew, serviceaccess.KindReady, serviceaccess.KindStatus, serviceaccess.KindNameBind, serviceaccess.KindDecide}
	proofs = []serviceaccess.ProofKind{serviceaccess.ProofIDP, serviceaccess.ProofRenewal, serviceaccess.ProofAccess, serviceaccess.ProofOperator}
	// accepted is the seed's kind x proof matrix.
	accepted = map[serviceaccess.Kind][]serviceaccess.ProofKind{
		serviceaccess.KindRegister: {serviceaccess.ProofIDP},
		serviceaccess.KindActivate: {serviceaccess.ProofIDP, serviceaccess.ProofRenewal},
		serviceaccess.KindRenew:    {serviceaccess.ProofRenewal},
		serviceaccess.KindReady:    {serviceaccess.ProofAccess},
		serviceaccess.KindStatus:   {serviceaccess.ProofIDP, serviceaccess.ProofRenewal, serviceaccess.ProofAccess, serviceaccess.ProofOperator},
		serviceaccess.KindNameBind: {serviceaccess.ProofOperator},
		serviceaccess.KindDecide:   {serviceaccess.ProofIDP},
	}
)

func isAccepted(k serviceaccess.Kind, p serviceaccess.ProofKind) bool {
	for _, q := range accepted[k] {
		if q == p {
			return true
		}
	}
	return false
}

func TestNewRefuses(t *testing.T) {
	e := newEnv(t)
	base := func() sepdoor.Config {
		return sepdoor.Config{Space: spaceName, Account: e.account, Signer: e.client.API(), IdP: e.verify, Ledger: e.ledger, Keys: e.keys, Authority: e.auth}
	}
	for _, tc := range []struct {
		name string
		edit func(*sepdoor.Config)
		err  string
	}{
		{name: "fail/space", edit: func(c *sepdoor.Config) { c.Space = "" }, err: "space"},
		{name: "fail/account", edit: func(c *sepdoor.Config) { c.Account = "UABC" }, err: "account"},
		{name: "fail/no-signer", edit: func(c *sepdoor.Config) { c.Signer = nil }, err: "required"},
		{name: "fail/no-ledger", edit: func(c *sepdoor.Config) { c.Ledger = nil }, err: "required"},
		{name: "fail/no-keys", edit: func(c *sepdoor.Config) { c.Keys = nil }, err: "required"},
		{name: "fail/no-authority", edit: func(c *sepdoor.Config) { c.Authority = nil }, err: "required"},
		{name: "fail/loopback-without-cap", edit: func(c *sepdoor.Config) { c.Loopback = true }, err: "cap"},
		{name: "fail/loopback-upper-cap", edit: func(c *sepdoor.Config) { c.Loopback, c.Cap = true, strings.ToUpper(e.cap) }, err: "cap"},
		{name: "fail/public-with-cap", edit: func(c *sepdoor.Config) { c.Cap = e.cap }, err: "no cap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.edit(&cfg)
			if _, err := sepdoor.New(cfg); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.err)
			}
		})
	}
	t.Run("ok/both-faces", func(t *testing.T) {
		cfg := base()
		if _, err := sepdoor.New(cfg); err != nil {
			t.Fatalf("public door: %v", err)
		}
		cfg.Loopback, cfg.Cap = true, e.cap
		if _, err := sepdoor.New(cfg); err != nil {
			t.Fatalf("loopback door: %v", err)
		}
	})
}

// TestAccepts: the matrix as a table, every one of the 28 cells.
func TestAccepts(t *testing.T) {
	for _, k := range kinds {
		for _, p := range proofs {
			if got, want := sepdoor.Accepts(k, p), isAccepted(k, p); got != want {
				t.Errorf("Accepts(%s, %s) = %v, want %v", k, p, got, want)
			}
		}
		if sepdoor.Accepts(k, "bogus") {
			t.Errorf("Accepts(%s, bogus) = true", k)
		}
	}
	if sepdoor.Accepts("bogus", serviceaccess.ProofIDP) {
		t.Error("Accepts(bogus, idp) = true")
	}
}

// TestRouteOff: without a door the route is an unknown path on the exchange face.
func TestRouteOff(t *testing.T) {
	e := newEnv(t)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		a := e.do(e.offURL, method, serviceaccess.Path, []byte("{}"), nil)
		var m map[string]string
		if a.status != http.StatusNotFound || json.Unmarshal(a.body, &m) != nil || m["error"] != "no such route" {
			t.Fatalf("%s with service endpoints off = %d %s, want 404 no such route", method, a.status, a.body)
		}
	}
	if n := len(e.auth.take()); n != 0 {
		t.Fatalf("the authority saw %d requests", n)
	}
}

func TestInfo(t *testing.T) {
	e := newEnv(t)
	want, err := e.client.API().GetJWKS(context.Background(), &signerv1.GetJWKSRequest{Space: spaceName})
	if err != nil {
		t.Fatal(err)
	}
	jwks := e.do(e.loopURL, http.MethodGet, "/jwks", nil, nil)
	var published struct {
		Keys []serviceaccess.JWK `json:"keys"`
	}
	if err := json.Unmarshal(jwks.body, &published); err != nil || len(published.Keys) == 0 {
		t.Fatalf("/jwks = %s", jwks.body)
	}
	for _, face := range []struct{ name, url string }{{"ok/loopback", e.loopURL}, {"ok/public", e.pubURL}} {
		t.Run(face.name, func(t *testing.T) {
			a := e.do(face.url, http.MethodGet, serviceaccess.Path, nil, nil)
			if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET = %d %q %s", a.status, a.header.Get("Content-Type"), a.body)
			}
			parsed, err := serviceaccess.ParseInfo(a.body)
			if err != nil {
				t.Fatalf("ParseInfo(%s): %v", a.body, err)
			}
			info := *parsed
			if info.V != 1 || info.Account != e.account || info.Space != spaceName || info.Issuer != "urn:cotal:service-access:"+spaceName {
				t.Fatalf("info = %+v", info)
			}
			if len(info.Keys) != len(want.GetKeys()) || len(info.Keys) != len(published.Keys) {
				t.Fatalf("info keys %d, signerd %d, /jwks %d", len(info.Keys), len(want.GetKeys()), len(published.Keys))
			}
			for i, k := range info.Keys {
				w := want.GetKeys()[i]
				if k != published.Keys[i] || k.Kid != w.GetKid() || k.X != w.GetX() || k.Kty != "OKP" || k.Crv != "Ed25519" || k.Alg != "EdDSA" || k.Use != "sig" {
					t.Fatalf("info key %d = %+v, /jwks %+v, signerd %v", i, k, published.Keys[i], w)
				}
			}
			var raw map[string]json.RawMessage
			_ = json.Unmarshal(a.body, &raw)
			if len(raw) != 5 {
				t.Fatalf("info has keys %v, want exactly v, account, space, issuer, keys", raw)
			}
		})
	}
	if e.verify.calls.Load() != 0 || len(e.auth.take()) != 0 {
		t.Fatal("GET asked the IdP or the authority")
	}
}

func TestGuards(t *testing.T) {
	e := newEnv(t)
	sub := "guard-user"
	e.grant(e.owner(sub), "cli")
	tg := newTarget(e.owner(sub))
	idpProof := serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}
	good, _ := json.Marshal(serviceaccess.Envelope{Request: e.request(serviceaccess.KindRegister, tg), Proof: idpProof})

	// big is a well-formed envelope padded (in the token) to exactly n bytes.
	big := func(n int) []byte {
		head := `{"request":{"kind":"status","account":"` + e.account + `","space":"` + spaceName + `","endpoint":"svc.echo","instance":"` + tg.instance + `","target":{"kind":"instance"}},"proof":{"kind":"idp","token":"`
		tail := `"}}`
		return []byte(head + strings.Repeat("a", n-len(head)-len(tail)) + tail)
	}
	over := big(serviceaccess.MaxEnvelopeBytes + 1)
	if len(over) != 2<<20+1 {
		t.Fatalf("over is %d bytes", len(over))
	}

	t.Run("ok/charset-param", func(t *testing.T) {
		a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, good, map[string]string{"Content-Type": "application/json; charset=utf-8"})
		if a.status != http.StatusOK || len(e.auth.take()) != 1 {
			t.Fatalf("POST = %d %s", a.status, a.body)
		}
	})
	for _, face := range []struct{ name, url string }{{"loopback", e.loopURL}, {"public", e.pubURL}} {
		t.Run("fail/origin-post-"+face.name, func(t *testing.T) {
			a := e.do(face.url, http.MethodPost, serviceaccess.Path, good, map[string]string{"Origin": "https://evil.example"})
			wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonOrigin)
		})
		t.Run("fail/origin-get-"+face.name, func(t *testing.T) {
			a := e.do(face.url, http.MethodGet, serviceaccess.Path, nil, map[string]string{"Origin": "null"})
			wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonOrigin)
		})
		t.Run("fail/method-"+face.name, func(t *testing.T) {
			a := e.do(face.url, http.MethodPut, serviceaccess.Path, good, nil)
			wantDenied(t, a, 405, serviceaccess.CodeBadRequest, sepdoor.ReasonMethod)
			if a.header.Get("Allow") != "GET, POST" {
				t.Fatalf("Allow = %q", a.header.Get("Allow"))
			}
		})
	}
	// The door's own order: the Origin check comes before the method's.
	t.Run("fail/origin-before-method", func(t *testing.T) {
		a := e.do(e.loopURL, http.MethodDelete, serviceaccess.Path, nil, map[string]string{"Origin": "null"})
		wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonOrigin)
	})
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		t.Run("fail/content-type-"+strings.ReplaceAll(ct, "/", "-"), func(t *testing.T) {
			a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, good, map[string]string{"Content-Type": ct})
			wantDenied(t, a, 415, serviceaccess.CodeUnsupportedMedia, sepdoor.ReasonContentType)
		})
	}
	verified, fetched := e.verify.calls.Load(), e.idp.Fetches.Load()
	t.Run("fail/2MiB+1-before-parsing", func(t *testing.T) {
		a := e.do(e.pubURL, http.MethodPost, serviceaccess.Path, over, nil)
		wantDenied(t, a, 413, serviceaccess.CodeTooLarge, sepdoor.ReasonTooLarge)
		a = e.do(e.loopURL, http.MethodPost, serviceaccess.Path, over, nil)
		wantDenied(t, a, 413, serviceaccess.CodeTooLarge, sepdoor.ReasonTooLarge)
	})
	t.Run("fail/2MiB+1-chunked", func(t *testing.T) {
		// No Content-Length: the reader, not the header, stops it.
		req, _ := http.NewRequest(http.MethodPost, e.pubURL+serviceaccess.Path, io.MultiReader(bytes.NewReader(over)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if req.ContentLength != 0 {
			t.Fatalf("the request carried a Content-Length")
		}
		wantDenied(t, answer{status: resp.StatusCode, header: resp.Header, body: b}, 413, serviceaccess.CodeTooLarge, sepdoor.ReasonTooLarge)
	})
	if e.verify.calls.Load() != verified || e.idp.Fetches.Load() != fetched {
		t.Fatalf("an oversized body reached the IdP: %d verifications, %d JWKS fetches, want %d and %d",
			e.verify.calls.Load(), e.idp.Fetches.Load(), verified, fetched)
	}
	t.Run("ok/2MiB-is-parsed", func(t *testing.T) {
		// Exactly the limit passes the size guard and reaches the parser, which refuses a token
		// of 2 MiB (400, not 413).
		a := e.do(e.pubURL, http.MethodPost, serviceaccess.Path, big(serviceaccess.MaxEnvelopeBytes), nil)
		wantDenied(t, a, 400, serviceaccess.CodeBadRequest, sepdoor.ReasonEnvelope)
	})
	t.Run("fail/unknown-key", func(t *testing.T) {
		body := bytes.Replace(good, []byte(`"request":{`), []byte(`"request":{"bogus":1,`), 1)
		a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, body, nil)
		wantDenied(t, a, 400, serviceaccess.CodeBadRequest, sepdoor.ReasonEnvelope)
	})
	t.Run("fail/unknown-top-level-key", func(t *testing.T) {
		body := bytes.Replace(good, []byte(`{"request":`), []byte(`{"extra":true,"request":`), 1)
		a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, body, nil)
		wantDenied(t, a, 400, serviceaccess.CodeBadRequest, sepdoor.ReasonEnvelope)
	})
	t.Run("fail/trailing-data", func(t *testing.T) {
		a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, append(append([]byte{}, good...), []byte(`{}`)...), nil)
		wantDenied(t, a, 400, serviceaccess.CodeBadRequest, sepdoor.ReasonEnvelope)
	})
	t.Run("fail/not-json", func(t *testing.T) {
		a := e.do(e.loopURL, http.MethodPost, serviceaccess.Path, []byte("request=1"), nil)
		wantDenied(t, a, 400, serviceaccess.CodeBadRequest, sepdoor.ReasonEnvelope)
	})
	t.Run("fail/other-account", func(t *testing.T) {
		req := e.request(serviceaccess.KindRegister, tg)
		acct, _ := nkeys.CreateAccount()
		req.Account, _ = acct.PublicKey()
		a := e.post(e.loopURL, req, idpProof, nil)
		ans := wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonAccount)
		if ans.RequestID != req.RequestID {
			t.Fatalf("requestId %q not echoed: %s", req.RequestID, a.body)
		}
	})
	t.Run("fail/other-space", func(t *testing.T) {
		req := e.request(serviceaccess.KindRegister, tg)
		req.Space = "beta"
		wantDenied(t, e.post(e.loopURL, req, idpProof, nil), 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonAccount)
	})
	if n := len(e.auth.take()); n != 0 {
		t.Fatalf("the authority saw %d refused requests", n)
	}
	e.noTokenLogged(nil, idpProof.Token)
}

// proofFor is a valid proof of kind p for tg on the loopback face, with the header it needs.
func (e *env) proofFor(p serviceaccess.ProofKind, sub string, tg target) (serviceaccess.Proof, map[string]string) {
	switch p {
	case serviceaccess.ProofIDP:
		return serviceaccess.Proof{Kind: p, Token: e.idpToken(sub)}, nil
	case serviceaccess.ProofRenewal:
		return serviceaccess.Proof{Kind: p, Token: e.serviceToken(serviceaccess.TypRenewal, tg, nil)}, nil
	case serviceaccess.ProofAccess:
		return serviceaccess.Proof{Kind: p, Token: e.serviceToken(serviceaccess.TypAccess, tg, nil)}, nil
	}
	return serviceaccess.Proof{Kind: p}, map[string]string{"Authorization": "Bearer " + e.cap}
}

// TestMatrix: every kind x proof cell, each with a valid proof of its kind: an accepted cell
// reaches the authority with the caller the proof proves, a refused one is 403 and reaches
// nothing.
func TestMatrix(t *testing.T) {
	e := newEnv(t)
	sub := "matrix-user"
	owner := e.owner(sub)
	e.grant(owner, "web")
	tg := newTarget(owner)
	for _, k := range kinds {
		for _, p := range proofs {
			ok := isAccepted(k, p)
			name := fmt.Sprintf("fail/%s-%s", k, p)
			if ok {
				name = fmt.Sprintf("ok/%s-%s", k, p)
			}
			t.Run(name, func(t *testing.T) {
				req := e.request(k, tg)
				proof, hdr := e.proofFor(p, sub, tg)
				a := e.post(e.loopURL, req, proof, hdr)
				calls := e.auth.take()
				if !ok {
					ans := wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonProofKind)
					if ans.RequestID != req.RequestID || len(calls) != 0 {
						t.Fatalf("refused cell: requestId %q, %d authority calls", ans.RequestID, len(calls))
					}
					return
				}
				if a.status != http.StatusOK || len(calls) != 1 {
					t.Fatalf("accepted cell = %d %s, %d authority calls", a.status, a.body, len(calls))
				}
				c := calls[0]
				if c.req.Kind != k || c.req.RequestID != req.RequestID || c.req.Instance != req.Instance || c.caller.Proof != p {
					t.Fatalf("authority got %+v from %+v", c.req, c.caller)
				}
				switch p {
				case serviceaccess.ProofIDP:
					if c.caller.Owner != owner || c.caller.Renewal != nil || c.caller.Access != nil {
						t.Fatalf("idp caller = %+v, want owner %s", c.caller, owner)
					}
				case serviceaccess.ProofRenewal:
					if c.caller.Owner != owner || c.caller.Renewal == nil || c.caller.Access != nil || c.caller.Renewal.Iid != tg.instance || c.caller.Renewal.Wit != tg.witness || c.caller.Renewal.Use != "renew" {
						t.Fatalf("renewal caller = %+v", c.caller)
					}
				case serviceaccess.ProofAccess:
					if c.caller.Owner != owner || c.caller.Access == nil || c.caller.Renewal != nil || c.caller.Access.Ep != tg.endpoint || c.caller.Access.Duty != "serve" {
						t.Fatalf("access caller = %+v", c.caller)
					}
				case serviceaccess.ProofOperator:
					if c.caller != (authority.ServiceCaller{Proof: serviceaccess.ProofOperator}) {
						t.Fatalf("operator caller = %+v", c.caller)
					}
				}
				e.noTokenLogged(a.body, proof.Token)
			})
		}
	}
}

// TestRows: an idp proof's owner needs exactly one current interactive cli or web row.
func TestRows(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name  string
		setup func(owner string)
		ok    bool
	}{
		{name: "ok/cli", setup: func(o string) { e.grant(o, "cli") }, ok: true},
		{name: "ok/web", setup: func(o string) { e.grant(o, "web") }, ok: true},
		{name: "ok/cli-and-another-actor", setup: func(o string) { e.grant(o, "cli"); e.grant(o, "bob") }, ok: true},
		{name: "fail/missing", setup: func(string) {}},
		{name: "fail/other-actor-only", setup: func(o string) { e.grant(o, "bob") }},
		{name: "fail/managed-cli", setup: func(o string) { e.spawn(o, "cli") }},
		{name: "fail/managed-web-beside-cli", setup: func(o string) { e.grant(o, "cli"); e.spawn(o, "web") }},
		{name: "fail/doubled-cli", setup: func(o string) { e.grant(o, "cli"); e.double(o, "cli") }},
		{name: "fail/cli-and-web", setup: func(o string) { e.grant(o, "cli"); e.grant(o, "web") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := "rows-" + strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(tc.name, "ok/"), "fail/"), "/", "-")
			owner := e.owner(sub)
			tc.setup(owner)
			tg := newTarget(owner)
			for _, k := range []serviceaccess.Kind{serviceaccess.KindRegister, serviceaccess.KindStatus} {
				a := e.post(e.pubURL, e.request(k, tg), serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
				calls := e.auth.take()
				if tc.ok {
					if a.status != http.StatusOK || len(calls) != 1 || calls[0].caller.Owner != owner {
						t.Fatalf("%s = %d %s, calls %+v", k, a.status, a.body, calls)
					}
					continue
				}
				wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonRow)
				if len(calls) != 0 {
					t.Fatalf("%s reached the authority without a row", k)
				}
			}
		})
	}
}

// TestTokenKinds: no token kind passes as another.
func TestTokenKinds(t *testing.T) {
	e := newEnv(t)
	sub := "kinds-user"
	owner := e.owner(sub)
	e.grant(owner, "cli")
	tg := newTarget(owner)
	renewal := e.serviceToken(serviceaccess.TypRenewal, tg, nil)
	access := e.serviceToken(serviceaccess.TypAccess, tg, nil)
	user := e.userBearer(sub)
	// A renewal-shaped token under the access typ (and the reverse) fails the claims check.
	renewalAsAccessTyp := e.serviceToken(serviceaccess.TypAccess, tg, func(c map[string]any) {
		delete(c, "duty")
		c["use"], c["aud"] = serviceaccess.UseRenew, serviceaccess.RenewalAudience(spaceName)
	})
	accessAsRenewalTyp := e.serviceToken(serviceaccess.TypRenewal, tg, func(c map[string]any) {
		delete(c, "use")
		c["duty"], c["aud"] = serviceaccess.DutyServe, spaceName
	})
	status := e.request(serviceaccess.KindStatus, tg)
	for _, tc := range []struct {
		name  string
		kind  serviceaccess.Kind
		proof serviceaccess.Proof
	}{
		{"fail/renewal-as-access", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewal}},
		{"fail/renewal-as-access-ready", serviceaccess.KindReady, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewal}},
		{"fail/access-as-renewal", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: access}},
		{"fail/access-as-renewal-renew", serviceaccess.KindRenew, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: access}},
		{"fail/user-bearer-as-access", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: user}},
		{"fail/user-bearer-as-renewal", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: user}},
		{"fail/renewal-claims-under-access-typ", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewalAsAccessTyp}},
		{"fail/access-claims-under-renewal-typ", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: accessAsRenewalTyp}},
		{"fail/renewal-as-idp", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: renewal}},
		{"fail/access-as-idp", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: access}},
		{"fail/user-bearer-as-idp", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: user}},
		{"fail/idp-token-as-renewal", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: e.idpToken(sub)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := status
			if tc.kind != serviceaccess.KindStatus {
				req = e.request(tc.kind, tg)
			}
			a := e.post(e.pubURL, req, tc.proof, nil)
			wantDenied(t, a, 401, serviceaccess.CodeUnauthenticated, sepdoor.ReasonProof)
			if n := len(e.auth.take()); n != 0 {
				t.Fatalf("a token of another kind reached the authority")
			}
			e.noTokenLogged(a.body, tc.proof.Token)
		})
	}
	t.Run("ok/each-as-itself", func(t *testing.T) {
		for _, p := range []serviceaccess.Proof{{Kind: serviceaccess.ProofRenewal, Token: renewal}, {Kind: serviceaccess.ProofAccess, Token: access}} {
			if a := e.post(e.pubURL, status, p, nil); a.status != http.StatusOK {
				t.Fatalf("%s as itself = %d %s", p.Kind, a.status, a.body)
			}
		}
		if n := len(e.auth.take()); n != 2 {
			t.Fatalf("authority calls = %d, want 2", n)
		}
	})
}

// TestServiceClaims: a service proof reads and acts on its own instance only, and activate,
// renew and ready need its witness.
func TestServiceClaims(t *testing.T) {
	e := newEnv(t)
	owner := e.owner("claims-user")
	tg := newTarget(owner)
	other := tg
	other.instance = randB32(26)
	otherEp := tg
	otherEp.endpoint = "svc.other"
	otherWit := tg
	otherWit.witness = "w_" + b32Of(32)
	for _, tc := range []struct {
		name  string
		kind  serviceaccess.Kind
		typ   string
		token target // what the token names
	}{
		{"fail/status-renewal-other-instance", serviceaccess.KindStatus, serviceaccess.TypRenewal, other},
		{"fail/status-access-other-instance", serviceaccess.KindStatus, serviceaccess.TypAccess, other},
		{"fail/status-access-other-endpoint", serviceaccess.KindStatus, serviceaccess.TypAccess, otherEp},
		{"fail/activate-renewal-other-witness", serviceaccess.KindActivate, serviceaccess.TypRenewal, otherWit},
		{"fail/renew-other-witness", serviceaccess.KindRenew, serviceaccess.TypRenewal, otherWit},
		{"fail/renew-other-instance", serviceaccess.KindRenew, serviceaccess.TypRenewal, other},
		{"fail/ready-other-witness", serviceaccess.KindReady, serviceaccess.TypAccess, otherWit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind := serviceaccess.ProofRenewal
			if tc.typ == serviceaccess.TypAccess {
				kind = serviceaccess.ProofAccess
			}
			a := e.post(e.pubURL, e.request(tc.kind, tg), serviceaccess.Proof{Kind: kind, Token: e.serviceToken(tc.typ, tc.token, nil)}, nil)
			wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonClaims)
			if n := len(e.auth.take()); n != 0 {
				t.Fatal("reached the authority")
			}
		})
	}
	t.Run("ok/status-ignores-witness", func(t *testing.T) {
		// A status names no witness: a service reads its instance after a re-registration.
		a := e.post(e.pubURL, e.request(serviceaccess.KindStatus, tg), serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: e.serviceToken(serviceaccess.TypRenewal, otherWit, nil)}, nil)
		if a.status != http.StatusOK || len(e.auth.take()) != 1 {
			t.Fatalf("status = %d %s", a.status, a.body)
		}
	})
	t.Run("fail/expired", func(t *testing.T) {
		tok := e.serviceToken(serviceaccess.TypRenewal, tg, func(c map[string]any) {
			c["iat"], c["nbf"], c["exp"] = c["iat"].(int64)-100, c["nbf"].(int64)-100, c["iat"].(int64)
		})
		wantDenied(t, e.post(e.pubURL, e.request(serviceaccess.KindRenew, tg), serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: tok}, nil),
			401, serviceaccess.CodeUnauthenticated, sepdoor.ReasonProof)
	})
	t.Run("fail/forged", func(t *testing.T) {
		tok := e.serviceToken(serviceaccess.TypAccess, tg, nil)
		tok = tok[:strings.LastIndexByte(tok, '.')+1] + strings.Repeat("A", 86)
		wantDenied(t, e.post(e.pubURL, e.request(serviceaccess.KindReady, tg), serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: tok}, nil),
			401, serviceaccess.CodeUnauthenticated, sepdoor.ReasonProof)
	})
}

// TestOperator: the operator proof is the loopback face's, with the cap, and only there.
func TestOperator(t *testing.T) {
	e := newEnv(t)
	tg := newTarget(e.owner("op-user"))
	bind := e.request(serviceaccess.KindNameBind, tg)
	op := serviceaccess.Proof{Kind: serviceaccess.ProofOperator}
	t.Run("fail/public-face", func(t *testing.T) {
		// With the right cap, too: the public face never takes an operator proof.
		a := e.post(e.pubURL, bind, op, map[string]string{"Authorization": "Bearer " + e.cap})
		wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonLoopback)
		a = e.post(e.pubURL, e.request(serviceaccess.KindStatus, tg), op, nil)
		wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonLoopback)
	})
	for _, tc := range []struct{ name, auth string }{
		{"fail/no-cap", ""},
		{"fail/wrong-cap", "Bearer " + newCap(t)},
		{"fail/cap-without-scheme", e.cap},
		{"fail/cap-basic-scheme", "Basic " + e.cap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.post(e.loopURL, bind, op, map[string]string{"Authorization": tc.auth})
			wantDenied(t, a, 401, serviceaccess.CodeUnauthenticated, sepdoor.ReasonCap)
		})
	}
	if n := len(e.auth.take()); n != 0 {
		t.Fatalf("refused operator proofs reached the authority %d times", n)
	}
	t.Run("ok/loopback-with-cap", func(t *testing.T) {
		a := e.post(e.loopURL, bind, op, map[string]string{"Authorization": "Bearer " + e.cap})
		calls := e.auth.take()
		if a.status != http.StatusOK || len(calls) != 1 || calls[0].caller.Proof != serviceaccess.ProofOperator || calls[0].req.Owner != tg.owner {
			t.Fatalf("name-bind = %d %s, calls %+v", a.status, a.body, calls)
		}
	})
	t.Run("ok/idp-needs-no-cap", func(t *testing.T) {
		sub := "op-owner"
		e.grant(e.owner(sub), "cli")
		a := e.post(e.loopURL, e.request(serviceaccess.KindRegister, newTarget(e.owner(sub))), serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
		if a.status != http.StatusOK || len(e.auth.take()) != 1 {
			t.Fatalf("register without the cap = %d %s", a.status, a.body)
		}
	})
	if strings.Contains(e.logs.String(), e.cap) {
		t.Fatal("the cap was logged")
	}
}

// TestFailureWindow: failed proofs count in /exchange's window, 30 a minute per source; past it
// a refusal is 429, a correct proof still passes, and another source is not affected.
func TestFailureWindow(t *testing.T) {
	e := newEnv(t)
	tg := newTarget(e.owner("window-user"))
	status := e.request(serviceaccess.KindStatus, tg)
	bad := serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: e.serviceToken(serviceaccess.TypRenewal, tg, nil)}
	const from = "127.0.0.2"
	send := func(from string, p serviceaccess.Proof) answer {
		b, _ := json.Marshal(serviceaccess.Envelope{Request: status, Proof: p})
		return e.doFrom(from, e.pubURL, http.MethodPost, serviceaccess.Path, b, nil)
	}
	for i := range exchange.MaxFailures {
		if a := send(from, bad); a.status != http.StatusUnauthorized {
			t.Fatalf("failure %d = %d %s, want 401", i+1, a.status, a.body)
		}
	}
	wantDenied(t, send(from, bad), 429, serviceaccess.CodeRateLimited, sepdoor.ReasonThrottled)
	if a := send(from, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: e.serviceToken(serviceaccess.TypAccess, tg, nil)}); a.status != http.StatusOK {
		t.Fatalf("a correct proof from the throttled source = %d %s", a.status, a.body)
	}
	if a := send("127.0.0.3", bad); a.status != http.StatusUnauthorized {
		t.Fatalf("another source = %d, want 401", a.status)
	}

	// The operator's cap shares its budget with /exchange's: 15 wrong caps at /exchange and 15
	// at the route spend it.
	const capFrom = "127.0.0.4"
	wrong := map[string]string{"Authorization": "Bearer " + newCap(t)}
	body, _ := json.Marshal(map[string]any{"idpToken": "x", "actor": "cli"})
	for i := range exchange.MaxFailures / 2 {
		if a := e.doFrom(capFrom, e.loopURL, http.MethodPost, "/exchange", body, wrong); a.status != http.StatusUnauthorized {
			t.Fatalf("exchange failure %d = %d", i+1, a.status)
		}
	}
	bind, _ := json.Marshal(serviceaccess.Envelope{Request: e.request(serviceaccess.KindNameBind, tg), Proof: serviceaccess.Proof{Kind: serviceaccess.ProofOperator}})
	for i := range exchange.MaxFailures - exchange.MaxFailures/2 {
		if a := e.doFrom(capFrom, e.loopURL, http.MethodPost, serviceaccess.Path, bind, wrong); a.status != http.StatusUnauthorized {
			t.Fatalf("route failure %d = %d %s", i+1, a.status, a.body)
		}
	}
	wantDenied(t, e.doFrom(capFrom, e.loopURL, http.MethodPost, serviceaccess.Path, bind, wrong), 429, serviceaccess.CodeRateLimited, sepdoor.ReasonThrottled)
	if a := e.doFrom(capFrom, e.loopURL, http.MethodPost, "/exchange", body, wrong); a.status != http.StatusTooManyRequests {
		t.Fatalf("/exchange after the route spent the window = %d, want 429", a.status)
	}

	// A verified IdP identity without a row spends its own budget, wherever it calls from.
	sub := "window-norow"
	idpReq := e.request(serviceaccess.KindRegister, newTarget(e.owner(sub)))
	for i := range exchange.MaxFailures {
		b, _ := json.Marshal(serviceaccess.Envelope{Request: idpReq, Proof: serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}})
		a := e.doFrom(fmt.Sprintf("127.0.1.%d", i+1), e.pubURL, http.MethodPost, serviceaccess.Path, b, nil)
		wantDenied(t, a, 403, serviceaccess.CodePermissionDenied, sepdoor.ReasonRow)
	}
	b, _ := json.Marshal(serviceaccess.Envelope{Request: idpReq, Proof: serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}})
	wantDenied(t, e.doFrom("127.0.2.1", e.pubURL, http.MethodPost, serviceaccess.Path, b, nil), 429, serviceaccess.CodeRateLimited, sepdoor.ReasonThrottled)
	if n := len(e.auth.take()); n != 1 {
		t.Fatalf("authority calls = %d, want 1 (the correct proof)", n)
	}
}

// TestRegisteredSnapshot: a registered answer's snapshot travels as the exact canonical bytes its
// witness hashes.
func TestRegisteredSnapshot(t *testing.T) {
	e := newEnv(t)
	sub := "snapshot-user"
	owner := e.owner(sub)
	e.grant(owner, "cli")
	tg := newTarget(owner)
	snap := serviceaccess.Snapshot{V: 1, Account: e.account, Space: spaceName, Owner: owner, Endpoint: tg.endpoint, Instance: tg.instance,
		Generation: 3, Contract: *contract(tg.endpoint)}
	canonical, err := snap.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	witness := serviceaccess.WitnessOf(canonical)
	e.auth.setAnswer(func(*serviceaccess.Request) (*serviceaccess.Answer, error) {
		return &serviceaccess.Answer{Kind: serviceaccess.AnswerRegistered, Witness: witness, Generation: 3, Snapshot: canonical}, nil
	})
	req := e.request(serviceaccess.KindRegister, tg)
	a := e.post(e.loopURL, req, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
	ans, err := serviceaccess.ParseAnswer(a.body)
	if err != nil || a.status != http.StatusOK {
		t.Fatalf("registered = %d %s: %v", a.status, a.body, err)
	}
	if ans.Kind != serviceaccess.AnswerRegistered || ans.RequestID != req.RequestID || ans.Witness != witness || !bytes.Equal(ans.Snapshot, canonical) {
		t.Fatalf("registered answer = %s, want snapshot %s", a.body, canonical)
	}
	if !bytes.Contains(a.body, canonical) {
		t.Fatalf("the snapshot did not travel byte for byte: %s", a.body)
	}
}

// TestAnswers: the authority's answer travels with its status and echoes the requestId; an
// authority error is 503 unavailable.
func TestAnswers(t *testing.T) {
	e := newEnv(t)
	sub := "answers-user"
	owner := e.owner(sub)
	e.grant(owner, "cli")
	tg := newTarget(owner)
	proposal := "p_" + b32Of(16)
	for _, tc := range []struct {
		name   string
		ans    *serviceaccess.Answer
		err    error
		status int
	}{
		{"ok/approval-required", &serviceaccess.Answer{Kind: serviceaccess.AnswerApprovalRequired, Proposal: proposal, ExpiresAt: 1_900_000_000}, nil, 202},
		{"ok/conflict", &serviceaccess.Answer{Kind: serviceaccess.AnswerConflict, Reason: serviceaccess.ReasonBodyChanged}, nil, 409},
		{"ok/denied-precondition", &serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, Code: serviceaccess.CodeFailedPrecondition, Reason: "proposal-refused", Message: "refused"}, nil, 412},
		{"ok/denied-rate-limited", &serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, Code: serviceaccess.CodeRateLimited, Reason: "requests", Message: "64"}, nil, 429},
		{"ok/unavailable", &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, Message: "frozen"}, nil, 503},
		{"fail/error", nil, errors.New("store down"), 503},
		{"fail/no-answer", nil, nil, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.auth.setAnswer(func(*serviceaccess.Request) (*serviceaccess.Answer, error) {
				if tc.ans == nil {
					return nil, tc.err
				}
				a := *tc.ans
				return &a, nil
			})
			req := e.request(serviceaccess.KindRegister, tg)
			a := e.post(e.loopURL, req, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
			ans := a.answer(t)
			if _, err := serviceaccess.ParseAnswer(a.body); err != nil {
				t.Fatalf("ParseAnswer(%s): %v", a.body, err)
			}
			if a.status != tc.status || ans.RequestID != req.RequestID || len(e.auth.take()) != 1 {
				t.Fatalf("answer = %d %s, want %d echoing %s", a.status, a.body, tc.status, req.RequestID)
			}
			want := tc.ans
			if want == nil {
				want = &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable}
			}
			if ans.Kind != want.Kind || ans.Code != want.Code || ans.Reason != want.Reason || ans.Proposal != want.Proposal {
				t.Fatalf("answer = %s, want %+v", a.body, want)
			}
			if tc.ans == nil && (ans.Message == "" || strings.Contains(ans.Message, "store down")) {
				t.Fatalf("unavailable message %q", ans.Message)
			}
		})
	}
}

// TestSignerdTokens: renewal proofs and access bearers signerd signs (SignServiceCredential,
// under the bearer issuer key GetJWKS publishes) pass the door as themselves and as nothing
// else, verified through authd's bearer JWKS cache alone.
func TestSignerdTokens(t *testing.T) {
	e := newEnv(t)
	tg := newTarget(e.owner("signerd-user"))
	sign := func(kind signerv1.ServiceCredentialKind, ttl time.Duration) string {
		t.Helper()
		resp, err := e.client.API().SignServiceCredential(context.Background(), &signerv1.SignServiceCredentialRequest{
			Space: spaceName, Kind: kind, Owner: tg.owner, Witness: tg.witness, Endpoint: tg.endpoint, InstanceId: tg.instance,
			Root: "r_" + b32Of(16), Ttl: durationpb.New(ttl), NotAfter: timestamppb.New(time.Now().Add(time.Hour)),
		})
		if err != nil {
			t.Fatalf("SignServiceCredential: %v", err)
		}
		return resp.GetToken()
	}
	renewal := sign(signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL, time.Hour)
	access := sign(signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
	// The door of this test knows signerd's keys only.
	d, err := sepdoor.New(sepdoor.Config{Space: spaceName, Account: e.account, Signer: e.client.API(), IdP: e.verify, Ledger: e.ledger,
		Keys: e.keys.cache, Authority: e.auth, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name  string
		kind  serviceaccess.Kind
		proof serviceaccess.Proof
		ok    bool
	}{
		{"ok/renew-renewal", serviceaccess.KindRenew, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: renewal}, true},
		{"ok/activate-renewal", serviceaccess.KindActivate, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: renewal}, true},
		{"ok/ready-access", serviceaccess.KindReady, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: access}, true},
		{"ok/status-access", serviceaccess.KindStatus, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: access}, true},
		{"fail/renewal-as-access", serviceaccess.KindReady, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewal}, false},
		{"fail/access-as-renewal", serviceaccess.KindRenew, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: access}, false},
		{"fail/renewal-as-idp", serviceaccess.KindActivate, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: renewal}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.post(srv.URL, e.request(tc.kind, tg), tc.proof, nil)
			calls := e.auth.take()
			if !tc.ok {
				wantDenied(t, a, 401, serviceaccess.CodeUnauthenticated, sepdoor.ReasonProof)
				if len(calls) != 0 {
					t.Fatal("reached the authority")
				}
				return
			}
			if a.status != http.StatusOK || len(calls) != 1 || calls[0].caller.Owner != tg.owner || calls[0].caller.Proof != tc.proof.Kind {
				t.Fatalf("%s = %d %s, calls %+v", tc.name, a.status, a.body, calls)
			}
		})
	}
}

// TestIdPUnavailable: an idp proof with no IdP pinned, or while the IdP's keys cannot be
// fetched, is 503 (replay later), counted nowhere; no other proof needs the IdP.
func TestIdPUnavailable(t *testing.T) {
	e := newEnv(t)
	sub := "unpinned-user"
	owner := e.owner(sub)
	e.grant(owner, "cli")
	tg := newTarget(owner)
	d, err := sepdoor.New(sepdoor.Config{Space: spaceName, Account: e.account, Signer: e.client.API(), Ledger: e.ledger,
		Keys: e.keys, Authority: e.auth, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	req := e.request(serviceaccess.KindStatus, tg)
	for i := range exchange.MaxFailures + 1 {
		a := e.post(srv.URL, req, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
		if ans := a.answer(t); a.status != http.StatusServiceUnavailable || ans.Kind != serviceaccess.AnswerUnavailable || ans.Message == "" {
			t.Fatalf("idp proof #%d without an IdP = %d %s, want 503 unavailable (never 429)", i+1, a.status, a.body)
		}
	}
	if a := e.post(srv.URL, req, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: e.serviceToken(serviceaccess.TypAccess, tg, nil)}, nil); a.status != http.StatusOK {
		t.Fatalf("an access proof without an IdP = %d %s", a.status, a.body)
	}
	t.Run("fail/idp-keys-down", func(t *testing.T) {
		e.idp.SetDown(true)
		defer e.idp.SetDown(false)
		a := e.post(e.pubURL, req, serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: e.idpToken(sub)}, nil)
		if ans := a.answer(t); a.status != http.StatusServiceUnavailable || ans.Kind != serviceaccess.AnswerUnavailable {
			t.Fatalf("idp proof while the IdP is down = %d %s", a.status, a.body)
		}
	})
	if n := len(e.auth.take()); n != 1 {
		t.Fatalf("authority calls = %d, want 1", n)
	}
}
