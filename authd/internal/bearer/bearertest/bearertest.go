// Package bearertest signs Cotal bearers with a test key for tests of the bearer verifier and of
// the callout: a hand-held Ed25519 key served as a JWKS by a fake GetJWKS, and the table of
// tokens signerd would never sign, one per check of reference/auth.md §3 steps 9-12.
package bearertest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// Key is a hand-held issuer key.
type Key struct {
	priv ed25519.PrivateKey
	JWK  *signerv1.JWK
}

// NewKey generates a key and its JWK (kid the RFC 7638 thumbprint).
func NewKey(t testing.TB) *Key {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	x := base64.RawURLEncoding.EncodeToString(pub)
	return &Key{priv: priv, JWK: &signerv1.JWK{Kty: "OKP", Crv: "Ed25519", X: x, Kid: bearer.Thumbprint(x), Alg: "EdDSA", Use: "sig"}}
}

// Header is the header signerd writes, with k's kid.
func (k *Key) Header() string { return `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT"}` }

// Sign signs header and claims (JSON text) as a compact JWS.
func (k *Key) Sign(header, claims string) string {
	enc := base64.RawURLEncoding
	in := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
	return in + "." + enc.EncodeToString(ed25519.Sign(k.priv, []byte(in)))
}

// JWKS is a fake GetJWKS that serves keys and counts calls.
type JWKS struct {
	mu    sync.Mutex
	keys  []*signerv1.JWK
	err   error
	calls int
}

// NewJWKS serves keys.
func NewJWKS(keys ...*signerv1.JWK) *JWKS { return &JWKS{keys: keys} }

// GetJWKS implements bearer.JWKSFetcher.
func (f *JWKS) GetJWKS(_ context.Context, _ *signerv1.GetJWKSRequest, _ ...grpc.CallOption) (*signerv1.GetJWKSResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &signerv1.GetJWKSResponse{Keys: f.keys}, nil
}

// Set replaces what the next call returns.
func (f *JWKS) Set(keys []*signerv1.JWK, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys, f.err = keys, err
}

// Count is the number of calls so far.
func (f *JWKS) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Principal is who the hand-signed bearers name, at which instant.
type Principal struct {
	Space, Owner, Owner2, Actor, UID string
	Now                              time.Time
}

// claims is a valid payload for p with edit applied to the top level and actEdit to act (a nil
// value deletes the key).
func (p Principal) claims(t testing.TB, edit, actEdit map[string]any) string {
	t.Helper()
	act := map[string]any{"owner": p.Owner, "actor": p.Actor, "scope": []string{"spawn"}, "lifecycleUid": p.UID}
	for k, v := range actEdit {
		if v == nil {
			delete(act, k)
		} else {
			act[k] = v
		}
	}
	m := map[string]any{
		"scope": []string{"spawn"}, "ver": 1, "act": act, "sub": p.Owner, "iss": bearer.IssuerPrefix + p.Space,
		"aud": p.Space, "iat": p.Now.Unix(), "nbf": p.Now.Unix(), "exp": p.Now.Unix() + 600, "jti": "abc",
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

// Case is one hand-signed bearer and the check that refuses it ("" when it is accepted).
// Boundary cases sit within a second of a time limit: they hold only for a verifier whose clock
// reads exactly Principal.Now.
type Case struct {
	Name     string
	Token    string
	Want     bearer.Check
	Boundary bool
}

type spec struct {
	Name           string
	Header, Claims string
	Edit, ActEdit  map[string]any
	Want           bearer.Check
	Boundary       bool
}

// Cases is the table: bearers signed by k for p, each accepted ("ok/...") or refused by exactly
// one check ("fail/..."). The principal holds scope [spawn] and p.UID.
func Cases(t testing.TB, k *Key, p Principal) []Case {
	t.Helper()
	mi := "manager000000000000000000001"
	session := map[string]any{"endpoint": "ep", "sessionId": strings.Repeat("s", 22), "epoch": 1, "exp": p.Now.Unix() + 60}
	tw := map[string]any{"instanceId": mi, "hex": strings.Repeat("a", 64)}
	specs := []spec{
		{Name: "ok/hand-signed baseline"},
		{Name: "ok/aud one-element list", Edit: map[string]any{"aud": []string{p.Space}}},
		{Name: "ok/exp at cap", Edit: map[string]any{"exp": p.Now.Unix() + 900}},
		{Name: "ok/manager-caller with instance", ActEdit: map[string]any{"view": "manager-caller", "managerInstanceId": mi}},
		{Name: "ok/session-caller with session", ActEdit: map[string]any{"view": "session-caller", "session": session}},
		{Name: "ok/transfer-writer within 300 s", Edit: map[string]any{"exp": p.Now.Unix() + 300}, ActEdit: map[string]any{"view": "transfer-writer", "transferWriter": tw}},

		{Name: "fail/header jku", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT","jku":"https://evil/jwks"}`, Want: bearer.CheckEmbeddedKey},
		{Name: "fail/header jwk", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT","jwk":{"kty":"OKP"}}`, Want: bearer.CheckEmbeddedKey},
		{Name: "fail/header x5u", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT","x5u":"https://evil"}`, Want: bearer.CheckEmbeddedKey},
		{Name: "fail/header x5c", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT","x5c":["MII"]}`, Want: bearer.CheckEmbeddedKey},
		{Name: "fail/header unknown field", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT","crit":["b64"]}`, Want: bearer.CheckHeader},
		{Name: "fail/header duplicate alg", Header: `{"alg":"none","alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"JWT"}`, Want: bearer.CheckHeader},
		{Name: "fail/header typ", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"at+jwt"}`, Want: bearer.CheckHeader},
		{Name: "fail/header no typ", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `"}`, Want: bearer.CheckHeader},
		{Name: "fail/header typ null", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":null}`, Want: bearer.CheckHeader},
		{Name: "fail/header typ in another case", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"jwt"}`, Want: bearer.CheckHeader},
		{Name: "fail/header typ service access", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"cotal-service-access+jwt"}`, Want: bearer.CheckHeader},
		{Name: "fail/header typ service renewal", Header: `{"alg":"EdDSA","kid":"` + k.JWK.Kid + `","typ":"cotal-service-renewal+jwt"}`, Want: bearer.CheckHeader},
		{Name: "fail/alg none", Header: `{"alg":"none","kid":"` + k.JWK.Kid + `","typ":"JWT"}`, Want: bearer.CheckAlg},
		{Name: "fail/alg HS256", Header: `{"alg":"HS256","kid":"` + k.JWK.Kid + `","typ":"JWT"}`, Want: bearer.CheckAlg},
		{Name: "fail/alg missing", Header: `{"kid":"` + k.JWK.Kid + `","typ":"JWT"}`, Want: bearer.CheckAlg},
		{Name: "fail/kid missing", Header: `{"alg":"EdDSA","typ":"JWT"}`, Want: bearer.CheckKID},
		{Name: "fail/kid unknown", Header: `{"alg":"EdDSA","kid":"nope","typ":"JWT"}`, Want: bearer.CheckKID},
		{Name: "fail/iss other space", Edit: map[string]any{"iss": bearer.IssuerPrefix + "beta"}, Want: bearer.CheckIssuer},
		{Name: "fail/iss missing", Edit: map[string]any{"iss": nil}, Want: bearer.CheckIssuer},
		{Name: "fail/aud other space", Edit: map[string]any{"aud": "beta"}, Want: bearer.CheckAudience},
		{Name: "fail/aud two spaces", Edit: map[string]any{"aud": []string{p.Space, "beta"}}, Want: bearer.CheckAudience},
		{Name: "fail/aud missing", Edit: map[string]any{"aud": nil}, Want: bearer.CheckAudience},
		{Name: "fail/exp missing", Edit: map[string]any{"exp": nil}, Want: bearer.CheckTimes},
		{Name: "fail/iat missing", Edit: map[string]any{"iat": nil}, Want: bearer.CheckTimes},
		{Name: "fail/nbf missing", Edit: map[string]any{"nbf": nil}, Want: bearer.CheckTimes},
		{Name: "fail/exp fractional", Edit: map[string]any{"exp": float64(p.Now.Unix()) + 0.5}, Want: bearer.CheckTimes},
		{Name: "fail/exp string", Edit: map[string]any{"exp": "1800000600"}, Want: bearer.CheckTimes},
		{Name: "fail/iat in the future", Edit: map[string]any{"iat": p.Now.Unix() + 60, "nbf": p.Now.Unix()}, Want: bearer.CheckIssuedAt},
		{Name: "fail/nbf in the future", Edit: map[string]any{"nbf": p.Now.Unix() + 60}, Want: bearer.CheckNotBefore},
		{Name: "ok/iat at the tolerance", Edit: map[string]any{"iat": p.Now.Unix() + 5, "nbf": p.Now.Unix() + 5}, Boundary: true},
		{Name: "fail/iat 6 s in the future", Edit: map[string]any{"iat": p.Now.Unix() + 6, "nbf": p.Now.Unix()}, Want: bearer.CheckIssuedAt, Boundary: true},
		{Name: "fail/nbf 6 s in the future", Edit: map[string]any{"nbf": p.Now.Unix() + 6}, Want: bearer.CheckNotBefore, Boundary: true},
		{Name: "fail/expired", Edit: map[string]any{"exp": p.Now.Unix()}, Want: bearer.CheckExpiry},
		{Name: "fail/exp beyond cap from now", Edit: map[string]any{"iat": p.Now.Unix() + 5, "nbf": p.Now.Unix(), "exp": p.Now.Unix() + 906}, Want: bearer.CheckLifetime},
		{Name: "fail/lifetime over cap", Edit: map[string]any{"iat": p.Now.Unix() - 10, "exp": p.Now.Unix() + 900}, Want: bearer.CheckLifetime},
		{Name: "fail/transfer-writer over 300 s", Edit: map[string]any{"exp": p.Now.Unix() + 301}, ActEdit: map[string]any{"view": "transfer-writer", "transferWriter": tw}, Want: bearer.CheckLifetime},
		{Name: "fail/ver 2", Edit: map[string]any{"ver": 2}, Want: bearer.CheckVersion},
		{Name: "fail/ver missing", Edit: map[string]any{"ver": nil}, Want: bearer.CheckVersion},
		{Name: "fail/sub not derived", Edit: map[string]any{"sub": "alice"}, ActEdit: map[string]any{"owner": "alice"}, Want: bearer.CheckSubject},
		{Name: "fail/act.owner not sub", ActEdit: map[string]any{"owner": p.Owner2}, Want: bearer.CheckSubject},
		{Name: "fail/act missing", Edit: map[string]any{"act": nil}, Want: bearer.CheckActor},
		{Name: "fail/actor grammar", ActEdit: map[string]any{"actor": "a.b"}, Want: bearer.CheckActor},
		{Name: "fail/actor missing", ActEdit: map[string]any{"actor": nil}, Want: bearer.CheckActor},
		{Name: "fail/act unknown member", ActEdit: map[string]any{"admin": true}, Want: bearer.CheckActor},
		{Name: "fail/act.scope wider than scope", ActEdit: map[string]any{"scope": []string{"spawn", "admin"}}, Want: bearer.CheckScope},
		{Name: "fail/scope word grammar", Edit: map[string]any{"scope": []string{"role:x"}}, ActEdit: map[string]any{"scope": []string{"role:x"}}, Want: bearer.CheckScope},
		{Name: "fail/scope duplicate", Edit: map[string]any{"scope": []string{"a", "a"}}, ActEdit: map[string]any{"scope": []string{"a", "a"}}, Want: bearer.CheckScope},
		{Name: "fail/parent chain", ActEdit: map[string]any{"parent": p.Owner2 + ".a." + p.Owner + ".b"}, Want: bearer.CheckParent},
		{Name: "fail/parent plain owner", ActEdit: map[string]any{"parent": "alice.bot"}, Want: bearer.CheckParent},
		{Name: "fail/parent list", ActEdit: map[string]any{"parent": []string{p.Owner2 + ".a"}}, Want: bearer.CheckParent},
		{Name: "fail/view unknown", ActEdit: map[string]any{"view": "observer"}, Want: bearer.CheckView},
		{Name: "fail/view empty", ActEdit: map[string]any{"view": ""}, Want: bearer.CheckView},
		{Name: "fail/managerInstanceId without view", ActEdit: map[string]any{"managerInstanceId": mi}, Want: bearer.CheckViewClaims},
		{Name: "fail/manager-caller without instance", ActEdit: map[string]any{"view": "manager-caller"}, Want: bearer.CheckViewClaims},
		{Name: "fail/managerInstanceId grammar", ActEdit: map[string]any{"view": "manager-caller", "managerInstanceId": "X"}, Want: bearer.CheckViewClaims},
		{Name: "fail/session without view", ActEdit: map[string]any{"session": session}, Want: bearer.CheckViewClaims},
		{Name: "fail/session-caller without session", ActEdit: map[string]any{"view": "session-caller"}, Want: bearer.CheckViewClaims},
		{Name: "fail/session unknown field", ActEdit: map[string]any{"view": "session-caller", "session": map[string]any{"endpoint": "ep", "sessionId": strings.Repeat("s", 22), "epoch": 1, "exp": 1, "x": 1}}, Want: bearer.CheckViewClaims},
		{Name: "fail/transferWriter without view", ActEdit: map[string]any{"transferWriter": tw}, Want: bearer.CheckViewClaims},
		{Name: "fail/transfer-writer without transferWriter", Edit: map[string]any{"exp": p.Now.Unix() + 300}, ActEdit: map[string]any{"view": "transfer-writer"}, Want: bearer.CheckViewClaims},
		{Name: "fail/lifecycleUid grammar", ActEdit: map[string]any{"lifecycleUid": "UPPER000000000000000000000"}, Want: bearer.CheckLifecycleUID},
		{Name: "fail/credentialId grammar", ActEdit: map[string]any{"credentialId": "a.b"}, Want: bearer.CheckCredentialID},
		{Name: "fail/unknown claim", Edit: map[string]any{"admin": true}, Want: bearer.CheckPayload},
		{Name: "fail/claim in another case", Edit: map[string]any{"ISS": bearer.IssuerPrefix + p.Space, "iss": nil}, Want: bearer.CheckPayload},
		{Name: "fail/duplicate claim", Claims: `{"iss":"` + bearer.IssuerPrefix + `beta","iss":"` + bearer.IssuerPrefix + p.Space + `"}`, Want: bearer.CheckPayload},
		{Name: "fail/payload not an object", Claims: `[1]`, Want: bearer.CheckPayload},
		{Name: "fail/trailing payload data", Claims: p.claims(t, nil, nil) + `{}`, Want: bearer.CheckPayload},
	}
	out := make([]Case, 0, len(specs))
	for _, s := range specs {
		h := s.Header
		if h == "" {
			h = k.Header()
		}
		c := s.Claims
		if c == "" {
			c = p.claims(t, s.Edit, s.ActEdit)
		}
		out = append(out, Case{Name: s.Name, Token: k.Sign(h, c), Want: s.Want, Boundary: s.Boundary})
	}
	return out
}
