// Package idptest is a fake external IdP for tests: an httptest server on loopback that serves a
// real Ed25519 JWKS at /jwks and signs IdP tokens with the matching key. It is for tests only.
package idptest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// IdP is a running fake IdP.
type IdP struct {
	// URL is the IdP's base URL (http://127.0.0.1:port); its issuer and audience are this origin.
	URL string
	// Kid is the key id of the current key.
	Kid string
	// Fetches counts GET /jwks.
	Fetches atomic.Int64

	srv  *httptest.Server
	mu   sync.Mutex
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
	down bool
}

// Start runs a fake IdP until the test ends.
func Start(t testing.TB) *IdP {
	t.Helper()
	i := &IdP{}
	i.Rotate(t)
	i.srv = httptest.NewServer(http.HandlerFunc(i.serve))
	t.Cleanup(i.srv.Close)
	i.URL = i.srv.URL
	return i
}

func (i *IdP) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/jwks" || r.Method != http.MethodGet {
		http.NotFound(w, r)
		return
	}
	i.Fetches.Add(1)
	i.mu.Lock()
	down, pub, kid := i.down, i.pub, i.Kid
	i.mu.Unlock()
	if down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
		"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub),
		"kid": kid, "alg": "EdDSA", "use": "sig",
	}}})
}

// Rotate replaces the signing key and kid.
func (i *IdP) Rotate(t testing.TB) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("idptest: %v", err)
	}
	kid := make([]byte, 8)
	_, _ = rand.Read(kid)
	i.mu.Lock()
	i.pub, i.priv, i.Kid = pub, priv, base64.RawURLEncoding.EncodeToString(kid)
	i.mu.Unlock()
}

// SetDown makes /jwks answer 503 (true) or serve again (false).
func (i *IdP) SetDown(down bool) {
	i.mu.Lock()
	i.down = down
	i.mu.Unlock()
}

// Claims are the standard claims of a token Token signs; Extra members are added (or override).
func (i *IdP) Claims(sub string, now time.Time, ttl time.Duration) map[string]any {
	return map[string]any{"iss": i.URL, "aud": i.URL, "sub": sub, "iat": now.Unix(), "exp": now.Add(ttl).Unix()}
}

// Token signs claims with the current key under header {alg: EdDSA, kid} plus extra header
// members (which may override alg or kid).
func (i *IdP) Token(t testing.TB, claims map[string]any, header map[string]any) string {
	t.Helper()
	i.mu.Lock()
	priv, kid := i.priv, i.Kid
	i.mu.Unlock()
	h := map[string]any{"alg": "EdDSA", "kid": kid, "typ": "JWT"}
	for k, v := range header {
		h[k] = v
	}
	return Sign(t, priv, h, claims)
}

// Sign builds a compact JWS over header and claims with priv.
func Sign(t testing.TB, priv ed25519.PrivateKey, header, claims map[string]any) string {
	t.Helper()
	hb, err := json.Marshal(header)
	if err != nil {
		t.Fatalf("idptest: %v", err)
	}
	cb, err := json.Marshal(claims)
	if err != nil {
		t.Fatalf("idptest: %v", err)
	}
	in := base64.RawURLEncoding.EncodeToString(hb) + "." + base64.RawURLEncoding.EncodeToString(cb)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(in)))
}

// SignRaw signs literal header and payload JSON (for duplicate members and other shapes a map
// cannot hold) with the IdP's current key.
func SignRaw(t testing.TB, i *IdP, header, payload string) string {
	t.Helper()
	i.mu.Lock()
	priv := i.priv
	i.mu.Unlock()
	in := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(in)))
}
