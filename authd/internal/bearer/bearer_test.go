package bearer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	testSpace = "alpha"
	owner     = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	owner2    = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	uid       = "lifecycle0000000000000000001"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// signerEnv is a real signerd and authd's client of it.
type signerEnv struct {
	s      *signerdtest.Signer
	client *signerclient.Client
}

func startSigner(t *testing.T, spaces ...string) *signerEnv {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: spaces})
	c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindAuthd, testSpace),
		ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &signerEnv{s: s, client: c}
}

func (e *signerEnv) sign(t *testing.T, edit func(*signerv1.SignBearerRequest)) string {
	t.Helper()
	req := &signerv1.SignBearerRequest{Space: testSpace, Owner: owner, Actor: "laptop", Scope: []string{"spawn"},
		LifecycleUid: uid, Ttl: durationpb.New(600 * time.Second)}
	if edit != nil {
		edit(req)
	}
	resp, err := e.client.API().SignBearer(ctxT(t), req)
	if err != nil {
		t.Fatalf("SignBearer: %v", err)
	}
	return resp.GetToken()
}

func (e *signerEnv) verifier(t *testing.T, now func() time.Time) *Verifier {
	t.Helper()
	c, err := NewCache(CacheConfig{Space: testSpace, Signer: e.client.API(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(testSpace, c, now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantCheck(t *testing.T, err error, c Check) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Check != c {
		t.Fatalf("err = %v, want check %s", err, c)
	}
}

// Bearers really signed by signerd: the accepted shapes, and every check a signerd bearer can fail.
func TestVerifySignerdBearers(t *testing.T) {
	e := startSigner(t)
	v := e.verifier(t, nil)
	t.Run("ok/agent bearer", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Owner != owner || c.Actor != "laptop" || c.LifecycleUID != uid || len(c.Scope) != 1 || c.Scope[0] != "spawn" || c.View != "" || c.ID == "" {
			t.Fatalf("claims = %+v", c)
		}
		if d := c.Expires.Sub(c.IssuedAt); d != 600*time.Second {
			t.Fatalf("lifetime %v", d)
		}
	})
	t.Run("ok/every optional claim", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, func(r *signerv1.SignBearerRequest) {
			r.Parent, r.CredentialId, r.View, r.Scope = owner2+".boss", "cred-1", "admin", []string{"admin", "spawn"}
		}))
		if err != nil {
			t.Fatal(err)
		}
		if c.Parent != owner2+".boss" || c.CredentialID != "cred-1" || c.View != "admin" {
			t.Fatalf("claims = %+v", c)
		}
	})
	t.Run("ok/no scope", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, func(r *signerv1.SignBearerRequest) { r.Scope = nil }))
		if err != nil || c.Scope == nil || len(c.Scope) != 0 {
			t.Fatalf("claims = %+v, %v", c, err)
		}
	})
	t.Run("fail/iat in the future", func(t *testing.T) {
		past := e.verifier(t, func() time.Time { return time.Now().Add(-time.Minute) })
		_, err := past.Verify(ctxT(t), e.sign(t, nil))
		wantCheck(t, err, CheckIssuedAt)
	})
	t.Run("fail/expired", func(t *testing.T) {
		later := e.verifier(t, func() time.Time { return time.Now().Add(601 * time.Second) })
		_, err := later.Verify(ctxT(t), e.sign(t, nil))
		wantCheck(t, err, CheckExpiry)
	})
	t.Run("fail/signature", func(t *testing.T) {
		tok := e.sign(t, nil)
		parts := strings.Split(tok, ".")
		payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
		payload = []byte(strings.Replace(string(payload), `"laptop"`, `"laptoq"`, 2))
		forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2]
		_, err := v.Verify(ctxT(t), forged)
		wantCheck(t, err, CheckSignature)
	})
	t.Run("fail/kid of another space", func(t *testing.T) {
		other := startSigner(t, testSpace)
		_, err := v.Verify(ctxT(t), other.sign(t, nil))
		wantCheck(t, err, CheckKID)
	})
	t.Run("fail/format", func(t *testing.T) {
		for _, tok := range []string{"", "a.b", "a.b.c.d", strings.Repeat("a", MaxTokenBytes+1)} {
			_, err := v.Verify(ctxT(t), tok)
			wantCheck(t, err, CheckFormat)
		}
	})
}

// testKey is a hand-held issuer key served as a JWKS by a fake GetJWKS.
type testKey struct {
	priv ed25519.PrivateKey
	jwk  *signerv1.JWK
}

func newTestKey(t *testing.T) *testKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	x := base64.RawURLEncoding.EncodeToString(pub)
	return &testKey{priv: priv, jwk: &signerv1.JWK{Kty: "OKP", Crv: "Ed25519", X: x, Kid: Thumbprint(x), Alg: "EdDSA", Use: "sig"}}
}

// fakeJWKS serves keys and counts calls.
type fakeJWKS struct {
	mu    sync.Mutex
	keys  []*signerv1.JWK
	err   error
	calls int
}

func (f *fakeJWKS) GetJWKS(_ context.Context, in *signerv1.GetJWKSRequest, _ ...grpc.CallOption) (*signerv1.GetJWKSResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &signerv1.GetJWKSResponse{Keys: f.keys}, nil
}

func (f *fakeJWKS) set(keys []*signerv1.JWK, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys, f.err = keys, err
}

func (f *fakeJWKS) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// handSign signs header and claims (JSON text) with k.
func (k *testKey) handSign(header, claims string) string {
	enc := base64.RawURLEncoding
	in := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
	return in + "." + enc.EncodeToString(ed25519.Sign(k.priv, []byte(in)))
}

// claimsJSON is a valid payload at now with edit applied to the decoded map (a nil value
// deletes the key).
func claimsJSON(t *testing.T, now time.Time, edit map[string]any, actEdit map[string]any) string {
	t.Helper()
	act := map[string]any{"owner": owner, "actor": "laptop", "scope": []string{"spawn"}, "lifecycleUid": uid}
	for k, v := range actEdit {
		if v == nil {
			delete(act, k)
		} else {
			act[k] = v
		}
	}
	m := map[string]any{
		"scope": []string{"spawn"}, "ver": 1, "act": act, "sub": owner, "iss": IssuerPrefix + testSpace,
		"aud": testSpace, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Unix() + 600, "jti": "abc",
	}
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

// Hand-signed bearers for every check signerd would never sign a violation of.
func TestVerifyHandSigned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	k := newTestKey(t)
	fake := &fakeJWKS{keys: []*signerv1.JWK{k.jwk}}
	cache, err := NewCache(CacheConfig{Space: testSpace, Signer: fake, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(testSpace, cache, clock)
	if err != nil {
		t.Fatal(err)
	}
	hdr := `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","typ":"JWT"}`
	mi := "manager000000000000000000001"
	session := map[string]any{"endpoint": "ep", "sessionId": strings.Repeat("s", 22), "epoch": 1, "exp": now.Unix() + 60}
	tw := map[string]any{"instanceId": mi, "hex": strings.Repeat("a", 64)}
	for _, tc := range []struct {
		name    string
		header  string
		claims  string // overrides edit when set
		edit    map[string]any
		actEdit map[string]any
		want    Check // "" = accepted
	}{
		{name: "ok/hand-signed baseline"},
		{name: "ok/aud one-element list", edit: map[string]any{"aud": []string{testSpace}}},
		{name: "ok/no typ", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `"}`},
		{name: "ok/exp at cap", edit: map[string]any{"exp": now.Unix() + 900}},
		{name: "ok/manager-caller with instance", actEdit: map[string]any{"view": "manager-caller", "managerInstanceId": mi}},
		{name: "ok/session-caller with session", actEdit: map[string]any{"view": "session-caller", "session": session}},
		{name: "ok/transfer-writer within 300 s", edit: map[string]any{"exp": now.Unix() + 300}, actEdit: map[string]any{"view": "transfer-writer", "transferWriter": tw}},

		{name: "fail/header jku", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","jku":"https://evil/jwks"}`, want: CheckEmbeddedKey},
		{name: "fail/header jwk", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","jwk":{"kty":"OKP"}}`, want: CheckEmbeddedKey},
		{name: "fail/header x5u", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","x5u":"https://evil"}`, want: CheckEmbeddedKey},
		{name: "fail/header x5c", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","x5c":["MII"]}`, want: CheckEmbeddedKey},
		{name: "fail/header unknown field", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","crit":["b64"]}`, want: CheckHeader},
		{name: "fail/header duplicate alg", header: `{"alg":"none","alg":"EdDSA","kid":"` + k.jwk.Kid + `"}`, want: CheckHeader},
		{name: "fail/header typ", header: `{"alg":"EdDSA","kid":"` + k.jwk.Kid + `","typ":"at+jwt"}`, want: CheckHeader},
		{name: "fail/alg none", header: `{"alg":"none","kid":"` + k.jwk.Kid + `"}`, want: CheckAlg},
		{name: "fail/alg HS256", header: `{"alg":"HS256","kid":"` + k.jwk.Kid + `"}`, want: CheckAlg},
		{name: "fail/alg missing", header: `{"kid":"` + k.jwk.Kid + `"}`, want: CheckAlg},
		{name: "fail/kid missing", header: `{"alg":"EdDSA"}`, want: CheckKID},
		{name: "fail/kid unknown", header: `{"alg":"EdDSA","kid":"nope"}`, want: CheckKID},
		{name: "fail/iss other space", edit: map[string]any{"iss": IssuerPrefix + "beta"}, want: CheckIssuer},
		{name: "fail/iss missing", edit: map[string]any{"iss": nil}, want: CheckIssuer},
		{name: "fail/aud other space", edit: map[string]any{"aud": "beta"}, want: CheckAudience},
		{name: "fail/aud two spaces", edit: map[string]any{"aud": []string{testSpace, "beta"}}, want: CheckAudience},
		{name: "fail/aud missing", edit: map[string]any{"aud": nil}, want: CheckAudience},
		{name: "fail/exp missing", edit: map[string]any{"exp": nil}, want: CheckTimes},
		{name: "fail/iat missing", edit: map[string]any{"iat": nil}, want: CheckTimes},
		{name: "fail/nbf missing", edit: map[string]any{"nbf": nil}, want: CheckTimes},
		{name: "fail/exp fractional", edit: map[string]any{"exp": float64(now.Unix()) + 0.5}, want: CheckTimes},
		{name: "fail/exp string", edit: map[string]any{"exp": "1800000600"}, want: CheckTimes},
		{name: "fail/iat in the future", edit: map[string]any{"iat": now.Unix() + 6, "nbf": now.Unix()}, want: CheckIssuedAt},
		{name: "fail/nbf in the future", edit: map[string]any{"nbf": now.Unix() + 6}, want: CheckNotBefore},
		{name: "fail/expired", edit: map[string]any{"exp": now.Unix()}, want: CheckExpiry},
		{name: "fail/exp beyond cap from now", edit: map[string]any{"iat": now.Unix() + 5, "nbf": now.Unix(), "exp": now.Unix() + 906}, want: CheckLifetime},
		{name: "fail/lifetime over cap", edit: map[string]any{"iat": now.Unix() - 10, "exp": now.Unix() + 900}, want: CheckLifetime},
		{name: "fail/transfer-writer over 300 s", edit: map[string]any{"exp": now.Unix() + 301}, actEdit: map[string]any{"view": "transfer-writer", "transferWriter": tw}, want: CheckLifetime},
		{name: "fail/ver 2", edit: map[string]any{"ver": 2}, want: CheckVersion},
		{name: "fail/ver missing", edit: map[string]any{"ver": nil}, want: CheckVersion},
		{name: "fail/sub not derived", edit: map[string]any{"sub": "alice"}, actEdit: map[string]any{"owner": "alice"}, want: CheckSubject},
		{name: "fail/act.owner not sub", actEdit: map[string]any{"owner": owner2}, want: CheckSubject},
		{name: "fail/act missing", edit: map[string]any{"act": nil}, want: CheckActor},
		{name: "fail/actor grammar", actEdit: map[string]any{"actor": "a.b"}, want: CheckActor},
		{name: "fail/actor missing", actEdit: map[string]any{"actor": nil}, want: CheckActor},
		{name: "fail/act unknown member", actEdit: map[string]any{"admin": true}, want: CheckActor},
		{name: "fail/act.scope wider than scope", actEdit: map[string]any{"scope": []string{"spawn", "admin"}}, want: CheckScope},
		{name: "fail/scope word grammar", edit: map[string]any{"scope": []string{"role:x"}}, actEdit: map[string]any{"scope": []string{"role:x"}}, want: CheckScope},
		{name: "fail/scope duplicate", edit: map[string]any{"scope": []string{"a", "a"}}, actEdit: map[string]any{"scope": []string{"a", "a"}}, want: CheckScope},
		{name: "fail/parent chain", actEdit: map[string]any{"parent": owner2 + ".a." + owner + ".b"}, want: CheckParent},
		{name: "fail/parent plain owner", actEdit: map[string]any{"parent": "alice.bot"}, want: CheckParent},
		{name: "fail/parent list", actEdit: map[string]any{"parent": []string{owner2 + ".a"}}, want: CheckParent},
		{name: "fail/view unknown", actEdit: map[string]any{"view": "observer"}, want: CheckView},
		{name: "fail/view empty", actEdit: map[string]any{"view": ""}, want: CheckView},
		{name: "fail/managerInstanceId without view", actEdit: map[string]any{"managerInstanceId": mi}, want: CheckViewClaims},
		{name: "fail/manager-caller without instance", actEdit: map[string]any{"view": "manager-caller"}, want: CheckViewClaims},
		{name: "fail/managerInstanceId grammar", actEdit: map[string]any{"view": "manager-caller", "managerInstanceId": "X"}, want: CheckViewClaims},
		{name: "fail/session without view", actEdit: map[string]any{"session": session}, want: CheckViewClaims},
		{name: "fail/session-caller without session", actEdit: map[string]any{"view": "session-caller"}, want: CheckViewClaims},
		{name: "fail/session unknown field", actEdit: map[string]any{"view": "session-caller", "session": map[string]any{"endpoint": "ep", "sessionId": strings.Repeat("s", 22), "epoch": 1, "exp": 1, "x": 1}}, want: CheckViewClaims},
		{name: "fail/transferWriter without view", actEdit: map[string]any{"transferWriter": tw}, want: CheckViewClaims},
		{name: "fail/transfer-writer without transferWriter", edit: map[string]any{"exp": now.Unix() + 300}, actEdit: map[string]any{"view": "transfer-writer"}, want: CheckViewClaims},
		{name: "fail/lifecycleUid grammar", actEdit: map[string]any{"lifecycleUid": "UPPER000000000000000000000"}, want: CheckLifecycleUID},
		{name: "fail/credentialId grammar", actEdit: map[string]any{"credentialId": "a.b"}, want: CheckCredentialID},
		{name: "fail/unknown claim", edit: map[string]any{"admin": true}, want: CheckPayload},
		{name: "fail/claim in another case", edit: map[string]any{"ISS": IssuerPrefix + testSpace, "iss": nil}, want: CheckPayload},
		{name: "fail/duplicate claim", claims: `{"iss":"` + IssuerPrefix + `beta","iss":"` + IssuerPrefix + testSpace + `"}`, want: CheckPayload},
		{name: "fail/payload not an object", claims: `[1]`, want: CheckPayload},
		{name: "fail/trailing payload data", claims: claimsJSON(t, now, nil, nil) + `{}`, want: CheckPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hdr
			if tc.header != "" {
				h = tc.header
			}
			cl := tc.claims
			if cl == "" {
				cl = claimsJSON(t, now, tc.edit, tc.actEdit)
			}
			c, err := v.Verify(ctxT(t), k.handSign(h, cl))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Owner != owner || c.KID != k.jwk.Kid {
					t.Fatalf("claims = %+v", c)
				}
				return
			}
			wantCheck(t, err, tc.want)
		})
	}
}

func TestCacheRefetch(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	k1, k2 := newTestKey(t), newTestKey(t)
	fake := &fakeJWKS{keys: []*signerv1.JWK{k1.jwk}}
	c, err := NewCache(CacheConfig{Space: testSpace, Signer: fake, Now: clock, MinRefetch: 10 * time.Second, MaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := c.Key(ctx, k1.jwk.Kid); err != nil || fake.count() != 1 {
		t.Fatalf("first lookup: %v after %d fetches", err, fake.count())
	}
	if _, err := c.Key(ctx, k1.jwk.Kid); err != nil || fake.count() != 1 {
		t.Fatalf("cached lookup: %v after %d fetches", err, fake.count())
	}
	// An unknown kid refetches once; a second unknown kid within MinRefetch does not.
	advance(10 * time.Second)
	if _, err := c.Key(ctx, "unknown"); !errors.Is(err, ErrUnknownKey) || fake.count() != 2 {
		t.Fatalf("unknown kid: %v after %d fetches", err, fake.count())
	}
	for range 5 {
		if _, err := c.Key(ctx, "unknown-2"); !errors.Is(err, ErrUnknownKey) {
			t.Fatal(err)
		}
	}
	if fake.count() != 2 {
		t.Fatalf("unknown kids within MinRefetch made %d fetches, want 2", fake.count())
	}
	// A rotated-in key is found after the interval, by the one refetch its kid triggers.
	fake.set([]*signerv1.JWK{k2.jwk, k1.jwk}, nil)
	advance(10 * time.Second)
	if _, err := c.Key(ctx, k2.jwk.Kid); err != nil || fake.count() != 3 {
		t.Fatalf("rotated key: %v after %d fetches", err, fake.count())
	}
	// A retired key stops verifying once the set is older than MaxAge.
	fake.set([]*signerv1.JWK{k2.jwk}, nil)
	advance(time.Minute)
	if _, err := c.Key(ctx, k1.jwk.Kid); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("retired key after MaxAge: %v", err)
	}
	// signerd unreachable: a stale set is kept, an unknown kid stays unknown.
	fake.set(nil, errors.New("unavailable"))
	advance(time.Minute)
	if _, err := c.Key(ctx, k2.jwk.Kid); err != nil {
		t.Fatalf("stale key while signerd is down: %v", err)
	}
}

func TestCacheRefusesBadJWKS(t *testing.T) {
	good := newTestKey(t).jwk
	for _, tc := range []struct {
		name string
		keys []*signerv1.JWK
	}{
		{"fail/empty", nil},
		{"fail/kid not thumbprint", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: good.X, Kid: "mine", Alg: "EdDSA", Use: "sig"}}},
		{"fail/wrong kty", []*signerv1.JWK{{Kty: "EC", Crv: "Ed25519", X: good.X, Kid: good.Kid, Alg: "EdDSA", Use: "sig"}}},
		{"fail/wrong alg", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: good.X, Kid: good.Kid, Alg: "ES256", Use: "sig"}}},
		{"fail/short x", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: "AAAA", Kid: Thumbprint("AAAA"), Alg: "EdDSA", Use: "sig"}}},
		{"fail/duplicate kid", []*signerv1.JWK{good, good}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewCache(CacheConfig{Space: testSpace, Signer: &fakeJWKS{keys: tc.keys}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Refresh(ctxT(t)); err == nil {
				t.Fatal("Refresh accepted a bad JWKS")
			}
			if _, err := c.Key(ctxT(t), good.Kid); !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("Key = %v", err)
			}
		})
	}
}

// The kid signerd publishes is the thumbprint this package computes (RFC 7638), and the cache
// takes signerd's real JWKS.
func TestSignerdJWKS(t *testing.T) {
	e := startSigner(t)
	resp, err := e.client.API().GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: testSpace})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetKeys()) != 1 || resp.GetKeys()[0].GetKid() != Thumbprint(resp.GetKeys()[0].GetX()) {
		t.Fatalf("JWKS = %v", resp.GetKeys())
	}
}
