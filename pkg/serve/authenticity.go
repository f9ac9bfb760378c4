package serve

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

// maxKeys bounds the keys one authority answer may publish (authd's JWKS bound).
const maxKeys = 16

// ErrNotPublished reports an authority answer that publishes no issuer or no keys yet: the
// service must not serve on a bearer it cannot verify.
var ErrNotPublished = errors.New("serve: the authority does not publish its service token issuer and keys yet")

// Authenticity is the pinned issuer of a space's service access bearers and its published
// Ed25519 keys, by kid. Only ServeAuthenticityOf makes a usable one; the zero value refuses
// every grant.
type Authenticity struct {
	account string
	space   string
	issuer  string
	keys    map[string]ed25519.PublicKey
}

// Account is the authority's data account public key.
func (a Authenticity) Account() string { return a.account }

// Space is the authority's space.
func (a Authenticity) Space() string { return a.space }

// Issuer is the exact iss the space's service tokens carry.
func (a Authenticity) Issuer() string { return a.issuer }

// Kids are the published key ids, sorted.
func (a Authenticity) Kids() []string {
	out := make([]string, 0, len(a.keys))
	for k := range a.keys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (a Authenticity) zero() bool { return a.issuer == "" || len(a.keys) == 0 }

// ServeAuthenticityOf pins the issuer and keys of an authority's GET answer. It refuses a nil
// answer, a version other than 1, an invalid space or account, an answer with no issuer or no
// keys (ErrNotPublished: the authority does not publish them yet), an issuer other than
// serviceaccess.Issuer(space), more than 16 keys, a key that is not an OKP Ed25519 EdDSA
// signing key with 32 bytes of base64url x, a kid that is not the RFC 7638 thumbprint of its
// key (recomputed here), and a kid listed twice. A set with one bad key is refused whole.
func ServeAuthenticityOf(info *serviceaccess.Info) (Authenticity, error) {
	if info == nil {
		return Authenticity{}, errors.New("serve: no authority answer")
	}
	if info.V != 1 {
		return Authenticity{}, fmt.Errorf("serve: authority answer version %d, want 1", info.V)
	}
	if info.Issuer == "" || len(info.Keys) == 0 {
		return Authenticity{}, ErrNotPublished
	}
	if err := space.ValidateName(info.Space); err != nil {
		return Authenticity{}, fmt.Errorf("serve: authority answer: %w", err)
	}
	if !nkeys.IsValidPublicAccountKey(info.Account) {
		return Authenticity{}, errors.New("serve: authority answer: account is not an account public key")
	}
	if info.Issuer != serviceaccess.Issuer(info.Space) {
		return Authenticity{}, errors.New("serve: authority answer: issuer is not the space's service access issuer")
	}
	if len(info.Keys) > maxKeys {
		return Authenticity{}, fmt.Errorf("serve: authority answer publishes %d keys, at most %d", len(info.Keys), maxKeys)
	}
	keys := make(map[string]ed25519.PublicKey, len(info.Keys))
	for i, k := range info.Keys {
		if k.Kty != "OKP" || k.Crv != "Ed25519" || k.Alg != "EdDSA" || k.Use != "sig" {
			return Authenticity{}, fmt.Errorf("serve: authority key %d is not an OKP Ed25519 EdDSA signing key", i)
		}
		x, err := base64.RawURLEncoding.Strict().DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return Authenticity{}, fmt.Errorf("serve: authority key %d: x is not 32 bytes of base64url", i)
		}
		if k.Kid != serviceaccess.Thumbprint(k.X) {
			return Authenticity{}, fmt.Errorf("serve: authority key %d: kid is not the key's RFC 7638 thumbprint", i)
		}
		if _, dup := keys[k.Kid]; dup {
			return Authenticity{}, fmt.Errorf("serve: authority key %d: kid listed twice", i)
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	return Authenticity{account: info.Account, space: info.Space, issuer: info.Issuer, keys: keys}, nil
}
