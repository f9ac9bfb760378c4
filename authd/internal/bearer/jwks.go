package bearer

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults of CacheConfig.
const (
	// DefaultMinRefetch bounds how often an unknown kid (or a stale set) makes the cache ask
	// signerd again: a stream of bearers with made-up kids costs at most one GetJWKS per interval.
	DefaultMinRefetch = 5 * time.Second
	// DefaultMaxAge is how long a fetched key set is used before the next lookup refreshes it,
	// so a key signerd retires stops verifying within it (the JWKS route's max-age).
	DefaultMaxAge = 5 * time.Minute
	// DefaultFetchTimeout bounds one GetJWKS call.
	DefaultFetchTimeout = 5 * time.Second
	// maxKeys bounds a JWKS; signerd publishes one key per space today.
	maxKeys = 16
)

// ErrUnknownKey: no key of the issuer's set has the bearer's kid, even after a refetch (or the
// set could not be fetched at all).
var ErrUnknownKey = errors.New("bearer: no issuer key with this kid")

// JWKSFetcher is the one signerd call the cache makes; signerv1.SignerServiceClient (for
// example signerclient.Client.API()) implements it.
type JWKSFetcher interface {
	GetJWKS(ctx context.Context, in *signerv1.GetJWKSRequest, opts ...grpc.CallOption) (*signerv1.GetJWKSResponse, error)
}

// CacheConfig configures NewCache.
type CacheConfig struct {
	// Space whose issuer keys are cached. Required.
	Space string
	// Signer answers GetJWKS. Required.
	Signer JWKSFetcher
	// MinRefetch, MaxAge and FetchTimeout default to the constants above.
	MinRefetch, MaxAge, FetchTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Cache holds a space's bearer issuer keys as signerd's GetJWKS returns them. A lookup of an
// unknown kid refetches the set once, at most once per MinRefetch across all callers; a set older
// than MaxAge is refetched on the next lookup (and kept if that fails, since signerd being
// unreachable already fails every callout closed). It is safe for concurrent use.
type Cache struct {
	cfg CacheConfig

	mu        sync.Mutex // serializes fetches; guards everything below
	keys      map[string]ed25519.PublicKey
	fetchedAt time.Time // last successful fetch
	triedAt   time.Time // last attempt
}

// NewCache returns an empty cache; the first lookup fetches.
func NewCache(cfg CacheConfig) (*Cache, error) {
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("bearer: %w", err)
	}
	if cfg.Signer == nil {
		return nil, errors.New("bearer: no signer to fetch the JWKS from")
	}
	if cfg.MinRefetch <= 0 {
		cfg.MinRefetch = DefaultMinRefetch
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Cache{cfg: cfg}, nil
}

// Refresh fetches the key set now (not rate-bounded): for start-up, so that a misconfigured
// signerd shows before the first connect.
func (c *Cache) Refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetchLocked(ctx)
}

// Key returns the issuer key with this kid. It refetches the set when the kid is unknown or the
// set is older than MaxAge, unless the last attempt is more recent than MinRefetch.
func (c *Cache) Key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	k, ok := c.keys[kid]
	stale := c.keys == nil || now.Sub(c.fetchedAt) >= c.cfg.MaxAge
	if ok && !stale {
		return k, nil
	}
	if now.Sub(c.triedAt) >= c.cfg.MinRefetch || c.triedAt.IsZero() {
		if err := c.fetchLocked(ctx); err != nil {
			c.cfg.Logger.Warn("bearer: JWKS fetch failed", "space", c.cfg.Space, "err", err)
		}
		k, ok = c.keys[kid]
	}
	if !ok {
		return nil, ErrUnknownKey
	}
	return k, nil
}

// fetchLocked asks signerd for the set and replaces the cached one if every key is valid. c.mu
// must be held.
func (c *Cache) fetchLocked(ctx context.Context) error {
	c.triedAt = c.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.FetchTimeout)
	defer cancel()
	resp, err := c.cfg.Signer.GetJWKS(ctx, &signerv1.GetJWKSRequest{Space: c.cfg.Space})
	if err != nil {
		return err
	}
	keys, err := parseJWKS(resp.GetKeys())
	if err != nil {
		return err
	}
	c.keys, c.fetchedAt = keys, c.cfg.Now()
	return nil
}

// parseJWKS checks every key: kty OKP, crv Ed25519, alg EdDSA, use sig, x 32 bytes of unpadded
// base64url, kid its RFC 7638 thumbprint, no kid twice, at most maxKeys, at least one. A set with
// one bad key is refused whole.
func parseJWKS(in []*signerv1.JWK) (map[string]ed25519.PublicKey, error) {
	if len(in) == 0 || len(in) > maxKeys {
		return nil, fmt.Errorf("bearer: JWKS holds %d keys, want 1 to %d", len(in), maxKeys)
	}
	out := make(map[string]ed25519.PublicKey, len(in))
	for i, k := range in {
		if k.GetKty() != "OKP" || k.GetCrv() != "Ed25519" || k.GetAlg() != "EdDSA" || k.GetUse() != "sig" {
			return nil, fmt.Errorf("bearer: JWKS key %d is not an OKP Ed25519 EdDSA signing key", i)
		}
		x, err := base64.RawURLEncoding.Strict().DecodeString(k.GetX())
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("bearer: JWKS key %d: x is not 32 bytes of base64url", i)
		}
		if k.GetKid() != Thumbprint(k.GetX()) {
			return nil, fmt.Errorf("bearer: JWKS key %d: kid is not the key's RFC 7638 thumbprint", i)
		}
		if _, dup := out[k.GetKid()]; dup {
			return nil, fmt.Errorf("bearer: JWKS lists kid %.64q twice", k.GetKid())
		}
		out[k.GetKid()] = ed25519.PublicKey(x)
	}
	return out, nil
}

// Thumbprint is the RFC 7638 thumbprint of an Ed25519 OKP key with base64url x: the unpadded
// base64url SHA-256 of {"crv":"Ed25519","kty":"OKP","x":x}.
func Thumbprint(x string) string {
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}
