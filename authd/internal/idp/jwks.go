package idp

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

const (
	// maxJWKSBytes bounds a JWKS response body.
	maxJWKSBytes = 64 << 10
	// maxJWKSKeys bounds the keys kept from one JWKS.
	maxJWKSKeys = 32
	// maxKidLen bounds a key id.
	maxKidLen = 256
	// fetchTimeout bounds one JWKS fetch when the context has no earlier deadline.
	fetchTimeout = 10 * time.Second
)

// ErrNoKeys reports a JWKS that holds no usable Ed25519 key.
var ErrNoKeys = errors.New("idp: JWKS holds no Ed25519 signing key")

// httpClient returns c, or a client with fetchTimeout and no redirects: a JWKS that redirects
// elsewhere is not the pinned JWKS.
func httpClient(c *http.Client) *http.Client {
	if c != nil {
		return c
	}
	return &http.Client{
		Timeout:       fetchTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// jwk is one key of a JWKS as read from the wire.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// ParseJWKS decodes a JWKS and keeps its Ed25519 signing keys by kid: kty OKP, crv Ed25519, a
// 32-byte x, a kid, alg EdDSA or absent, use sig or absent. Other keys (RSA, encryption keys)
// are skipped, not errors, since an IdP may publish them beside its Ed25519 key. It refuses a
// body that is not a JWKS, a duplicate kid, more than maxJWKSKeys keys, and a JWKS with no usable
// key (ErrNoKeys).
func ParseJWKS(body []byte) (map[string]ed25519.PublicKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("idp: JWKS: %w", err)
	}
	if len(set.Keys) > maxJWKSKeys {
		return nil, fmt.Errorf("idp: JWKS: more than %d keys", maxJWKSKeys)
	}
	keys := make(map[string]ed25519.PublicKey)
	for _, raw := range set.Keys {
		var k jwk
		if err := json.Unmarshal(raw, &k); err != nil {
			// A key whose members are not strings is not one we could use.
			continue
		}
		if k.Kty != "OKP" || k.Crv != "Ed25519" || (k.Alg != "" && k.Alg != "EdDSA") || (k.Use != "" && k.Use != "sig") {
			continue
		}
		if k.Kid == "" || len(k.Kid) > maxKidLen {
			continue
		}
		x, err := base64.RawURLEncoding.Strict().DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			continue
		}
		if _, dup := keys[k.Kid]; dup {
			return nil, fmt.Errorf("idp: JWKS: kid %.64q appears twice", k.Kid)
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	if len(keys) == 0 {
		return nil, ErrNoKeys
	}
	return keys, nil
}

// FetchJWKS GETs uri and parses the answer with ParseJWKS. It refuses a status other than 200
// and a body over 64 KiB.
func FetchJWKS(ctx context.Context, client *http.Client, uri string) (map[string]ed25519.PublicKey, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, fmt.Errorf("idp: JWKS %s: %w", uri, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("idp: JWKS %s: %w", uri, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("idp: JWKS %s: status %d", uri, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("idp: JWKS %s: %w", uri, err)
	}
	if len(body) > maxJWKSBytes {
		return nil, fmt.Errorf("idp: JWKS %s: body larger than %d bytes", uri, maxJWKSBytes)
	}
	keys, err := ParseJWKS(body)
	if err != nil {
		return nil, fmt.Errorf("%w (from %s)", err, uri)
	}
	return keys, nil
}
