package idp_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newVerifier(t *testing.T, fake *idptest.IdP, clk *clock) *idp.Verifier {
	t.Helper()
	pin, err := idp.NewPin(fake.URL)
	if err != nil {
		t.Fatal(err)
	}
	v, err := idp.NewVerifier(pin, idp.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerify(t *testing.T) {
	ctx := context.Background()
	fake := idptest.Start(t)
	now := time.Unix(1_800_000_000, 0)
	clk := &clock{t: now}
	v := newVerifier(t, fake, clk)
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)

	with := func(mod func(c map[string]any)) map[string]any {
		c := fake.Claims("user-1", now, 10*time.Minute)
		mod(c)
		return c
	}
	std := fake.Claims("user-1", now, 10*time.Minute)
	for _, tc := range []struct {
		name  string
		token func() string
		err   string
	}{
		{name: "ok/string-aud", token: func() string { return fake.Token(t, std, nil) }},
		{name: "ok/one-element-aud", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["aud"] = []string{fake.URL} }), nil)
		}},
		{name: "ok/iat-within-tolerance", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["iat"] = now.Unix() + 5 }), nil)
		}},
		{name: "ok/fractional-times", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["iat"] = float64(now.Unix()) + 0.5 }), nil)
		}},
		{name: "fail/jku", token: func() string { return fake.Token(t, std, map[string]any{"jku": fake.URL + "/jwks"}) }, err: `"jku"`},
		{name: "fail/jwk", token: func() string { return fake.Token(t, std, map[string]any{"jwk": map[string]string{"kty": "OKP"}}) }, err: `"jwk"`},
		{name: "fail/x5u", token: func() string { return fake.Token(t, std, map[string]any{"x5u": "https://x"}) }, err: `"x5u"`},
		{name: "fail/x5c", token: func() string { return fake.Token(t, std, map[string]any{"x5c": []string{"AA"}}) }, err: `"x5c"`},
		{name: "fail/crit", token: func() string { return fake.Token(t, std, map[string]any{"crit": []string{"b64"}}) }, err: `"crit"`},
		{name: "fail/alg-none", token: func() string { return fake.Token(t, std, map[string]any{"alg": "none"}) }, err: "alg must be EdDSA"},
		{name: "fail/alg-hs256", token: func() string { return fake.Token(t, std, map[string]any{"alg": "HS256"}) }, err: "alg must be EdDSA"},
		{name: "fail/no-kid", token: func() string { return fake.Token(t, std, map[string]any{"kid": ""}) }, err: "kid"},
		{name: "fail/unknown-kid", token: func() string { return fake.Token(t, std, map[string]any{"kid": "other"}) }, err: "not in the pinned JWKS"},
		{name: "fail/foreign-key", token: func() string {
			return idptest.Sign(t, stranger, map[string]any{"alg": "EdDSA", "kid": fake.Kid}, std)
		}, err: "bad signature"},
		{name: "fail/tampered-payload", token: func() string {
			tok := fake.Token(t, std, nil)
			other := fake.Token(t, with(func(c map[string]any) { c["sub"] = "user-2" }), nil)
			p := strings.Split(tok, ".")
			return p[0] + "." + strings.Split(other, ".")[1] + "." + p[2]
		}, err: "bad signature"},
		{name: "fail/iss", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["iss"] = "https://evil" }), nil) }, err: "iss"},
		{name: "fail/no-iss", token: func() string { return fake.Token(t, with(func(c map[string]any) { delete(c, "iss") }), nil) }, err: "iss is missing"},
		{name: "fail/aud", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["aud"] = "https://other" }), nil) }, err: "aud is not"},
		{name: "fail/no-aud", token: func() string { return fake.Token(t, with(func(c map[string]any) { delete(c, "aud") }), nil) }, err: "aud is required"},
		{name: "fail/two-auds", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["aud"] = []string{fake.URL, "https://other"} }), nil)
		}, err: "exactly one"},
		{name: "fail/empty-aud-list", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["aud"] = []string{} }), nil)
		}, err: "exactly one"},
		{name: "fail/no-exp", token: func() string { return fake.Token(t, with(func(c map[string]any) { delete(c, "exp") }), nil) }, err: "exp is required"},
		{name: "fail/string-exp", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["exp"] = "soon" }), nil) }, err: "exp is required"},
		{name: "fail/expired", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["exp"] = now.Unix() }), nil) }, err: "expired"},
		{name: "fail/no-iat", token: func() string { return fake.Token(t, with(func(c map[string]any) { delete(c, "iat") }), nil) }, err: "iat is required"},
		{name: "fail/iat-future", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["iat"] = now.Unix() + 6 }), nil) }, err: "iat is in the future"},
		{name: "fail/nbf-future", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["nbf"] = now.Unix() + 60 }), nil) }, err: "nbf"},
		{name: "fail/empty-sub", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["sub"] = "" }), nil) }, err: "sub"},
		{name: "fail/numeric-sub", token: func() string { return fake.Token(t, with(func(c map[string]any) { c["sub"] = 42 }), nil) }, err: "sub"},
		{name: "fail/no-sub", token: func() string { return fake.Token(t, with(func(c map[string]any) { delete(c, "sub") }), nil) }, err: "sub"},
		{name: "fail/long-sub", token: func() string {
			return fake.Token(t, with(func(c map[string]any) { c["sub"] = strings.Repeat("a", idp.MaxSubjectBytes+1) }), nil)
		}, err: "sub"},
		{name: "fail/two-segments", token: func() string { return "a.b" }, err: "three segments"},
		{name: "fail/four-segments", token: func() string { return fake.Token(t, std, nil) + ".x" }, err: "three segments"},
		{name: "fail/padded-b64", token: func() string {
			p := strings.Split(fake.Token(t, std, nil), ".")
			return p[0] + "=." + p[1] + "." + p[2]
		}, err: "header"},
		{name: "fail/duplicate-claim", token: func() string {
			return signRaw(t, fake, `{"alg":"EdDSA","kid":"`+fake.Kid+`"}`,
				`{"iss":"`+fake.URL+`","aud":"`+fake.URL+`","sub":"a","sub":"b","iat":1800000000,"exp":1800000600}`)
		}, err: "appears twice"},
		{name: "fail/duplicate-alg", token: func() string {
			return signRaw(t, fake, `{"alg":"EdDSA","alg":"none","kid":"`+fake.Kid+`"}`, `{}`)
		}, err: "appears twice"},
		{name: "fail/too-long", token: func() string { return strings.Repeat("a", idp.MaxTokenBytes+1) }, err: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(ctx, tc.token())
			if tc.err == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if c.Subject != "user-1" || c.Issuer != fake.URL || c.Expires != now.Add(10*time.Minute).Unix() {
					t.Fatalf("claims = %+v", c)
				}
				return
			}
			if !errors.Is(err, idp.ErrToken) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Verify = %+v, %v; want ErrToken containing %q", c, err, tc.err)
			}
		})
	}
}

// signRaw signs literal header and payload JSON with the fake IdP's current key.
func signRaw(t *testing.T, fake *idptest.IdP, header, payload string) string {
	t.Helper()
	return idptest.SignRaw(t, fake, header, payload)
}

func TestVerifierJWKSCache(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)

	t.Run("ok/one-fetch-for-many-tokens", func(t *testing.T) {
		fake := idptest.Start(t)
		clk := &clock{t: now}
		v := newVerifier(t, fake, clk)
		for range 5 {
			if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", now, time.Minute), nil)); err != nil {
				t.Fatal(err)
			}
		}
		if n := fake.Fetches.Load(); n != 1 {
			t.Fatalf("fetches = %d, want 1", n)
		}
	})
	t.Run("ok/rotation-refetches-once", func(t *testing.T) {
		fake := idptest.Start(t)
		clk := &clock{t: now}
		v := newVerifier(t, fake, clk)
		if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", now, time.Minute), nil)); err != nil {
			t.Fatal(err)
		}
		clk.Add(idp.DefaultRefetchInterval)
		fake.Rotate(t)
		if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", clk.Now(), time.Minute), nil)); err != nil {
			t.Fatalf("token under rotated key: %v", err)
		}
		if n := fake.Fetches.Load(); n != 2 {
			t.Fatalf("fetches = %d, want 2", n)
		}
	})
	t.Run("fail/unknown-kids-refetch-bounded", func(t *testing.T) {
		fake := idptest.Start(t)
		clk := &clock{t: now}
		v := newVerifier(t, fake, clk)
		if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", now, time.Minute), nil)); err != nil {
			t.Fatal(err)
		}
		clk.Add(idp.DefaultRefetchInterval)
		for i := range 20 {
			_, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", clk.Now(), time.Minute), map[string]any{"kid": "k" + string(rune('a'+i))}))
			if !errors.Is(err, idp.ErrToken) {
				t.Fatalf("unknown kid %d: %v", i, err)
			}
		}
		if n := fake.Fetches.Load(); n != 2 {
			t.Fatalf("fetches = %d after 20 unknown kids, want 2 (one refetch per interval)", n)
		}
	})
	t.Run("fail/stale-keys-with-idp-down", func(t *testing.T) {
		fake := idptest.Start(t)
		clk := &clock{t: now}
		v := newVerifier(t, fake, clk)
		if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", now, time.Hour), nil)); err != nil {
			t.Fatal(err)
		}
		clk.Add(idp.DefaultJWKSMaxAge)
		fake.SetDown(true)
		_, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", clk.Now(), time.Hour), nil))
		if !errors.Is(err, idp.ErrJWKSUnavailable) {
			t.Fatalf("Verify with stale keys and IdP down = %v, want ErrJWKSUnavailable", err)
		}
		fake.SetDown(false)
		clk.Add(idp.DefaultRefetchInterval)
		if _, err := v.Verify(ctx, fake.Token(t, fake.Claims("u", clk.Now(), time.Hour), nil)); err != nil {
			t.Fatalf("after IdP is back: %v", err)
		}
	})
}

func TestPinned(t *testing.T) {
	ctx := context.Background()
	fake := idptest.Start(t)
	dir := stateDir(t)
	p := idp.NewPinned(dir, idp.Options{})
	tok := fake.Token(t, fake.Claims("u", time.Now(), time.Hour), nil)
	if _, err := p.Verify(ctx, tok); !errors.Is(err, idp.ErrNotPinned) {
		t.Fatalf("fail/not-pinned: %v", err)
	}
	if _, err := idp.PinURL(ctx, dir, fake.URL, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		_, err := p.Verify(ctx, tok)
		return err
	})
	t.Run("fail/loose-pin-file", func(t *testing.T) {
		dir := stateDir(t)
		if _, err := idp.PinURL(ctx, dir, fake.URL, nil); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, idp.FileName), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := idp.NewPinned(dir, idp.Options{}).Verify(ctx, tok)
		if err == nil || errors.Is(err, idp.ErrToken) || !strings.Contains(err.Error(), idp.FileName) {
			t.Fatalf("Verify with a 0644 idp.json = %v, want an error naming it", err)
		}
	})
}
