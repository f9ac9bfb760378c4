package idp

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

const (
	// MaxTokenBytes bounds an IdP token; real ones are well under 4 KiB.
	MaxTokenBytes = 16 << 10
	// MaxSubjectBytes bounds the sub claim: signerd's DeriveOwner refuses longer input.
	MaxSubjectBytes = 1 << 10
	// ClockTolerance is the skew allowed between the IdP's clock and ours on iat, nbf and exp
	// (upstream's default clockToleranceSec).
	ClockTolerance = 5 * time.Second
	// DefaultJWKSMaxAge is how long fetched keys are used before the JWKS is fetched again.
	DefaultJWKSMaxAge = 5 * time.Minute
	// DefaultRefetchInterval is the least time between two JWKS fetches, so tokens naming unknown
	// kids cannot make authd hammer the IdP: an unknown kid refetches at most this often.
	DefaultRefetchInterval = 10 * time.Second
)

// ErrToken is wrapped by every refusal of an IdP token, so callers can tell a bad token from an
// unreachable IdP.
var ErrToken = errors.New("idp token refused")

// ErrJWKSUnavailable is wrapped when the pinned JWKS cannot be fetched.
var ErrJWKSUnavailable = errors.New("idp: JWKS unavailable")

func refuse(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrToken, fmt.Sprintf(format, a...))
}

// Claims are the verified facts of an IdP token that the exchange uses.
type Claims struct {
	// Issuer is the token's iss, equal to the pin's issuer.
	Issuer string
	// Subject is the token's sub: non-empty, at most MaxSubjectBytes.
	Subject string
	// IssuedAt and Expires are iat and exp in unix seconds (fractions dropped).
	IssuedAt, Expires int64
}

// parsed is a compact JWS split and decoded, before its signature is checked.
type parsed struct {
	kid          string
	signingInput string
	sig          []byte
	claims       map[string]json.RawMessage
}

// forbiddenHeaders name a key or a key location inside the token; keys come only from the pinned
// JWKS. crit is refused too: this verifier understands no extension.
var forbiddenHeaders = []string{"jku", "jwk", "x5u", "x5c", "x5t", "x5t#S256", "crit"}

// decode splits a compact JWS and decodes its header and payload. It checks the header rules
// (alg EdDSA, a kid, no embedded or remote key material, no crit) and that header and payload are
// JSON objects with no duplicate member; it checks no claim and no signature. It is fuzzed
// (FuzzDecode).
func decode(token string) (*parsed, error) {
	if len(token) > MaxTokenBytes {
		return nil, refuse("longer than %d bytes", MaxTokenBytes)
	}
	h64, rest, ok1 := strings.Cut(token, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return nil, refuse("not a compact JWS of three segments")
	}
	hb, err := b64(h64)
	if err != nil {
		return nil, refuse("header: %v", err)
	}
	header, err := object(hb)
	if err != nil {
		return nil, refuse("header: %v", err)
	}
	for _, name := range forbiddenHeaders {
		if _, ok := header[name]; ok {
			return nil, refuse("header %q is refused: keys come only from the pinned JWKS", name)
		}
	}
	var alg, kid string
	if err := stringMember(header, "alg", &alg); err != nil || alg != "EdDSA" {
		return nil, refuse("alg must be EdDSA")
	}
	if err := stringMember(header, "kid", &kid); err != nil || kid == "" || len(kid) > maxKidLen {
		return nil, refuse("kid must be a non-empty string of at most %d bytes", maxKidLen)
	}
	pb, err := b64(p64)
	if err != nil {
		return nil, refuse("payload: %v", err)
	}
	claims, err := object(pb)
	if err != nil {
		return nil, refuse("payload: %v", err)
	}
	sig, err := b64(s64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, refuse("signature is not %d bytes of base64url", ed25519.SignatureSize)
	}
	return &parsed{kid: kid, signingInput: token[:len(h64)+1+len(p64)], sig: sig, claims: claims}, nil
}

func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.Strict().DecodeString(s)
}

// object decodes a JSON object into its members, refusing duplicate member names: two verifiers
// that pick different duplicates would disagree on what the token says.
func object(b []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	m := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := tok.(string)
		if !ok {
			return nil, errors.New("not a JSON object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("member %.64q appears twice", name)
		}
		m[name] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("data after the JSON object")
	}
	return m, nil
}

// stringMember decodes m[name] into *s; a missing member or a non-string is an error.
func stringMember(m map[string]json.RawMessage, name string, s *string) error {
	raw, ok := m[name]
	if !ok {
		return fmt.Errorf("%s is missing", name)
	}
	if err := json.Unmarshal(raw, s); err != nil {
		return fmt.Errorf("%s is not a string", name)
	}
	return nil
}

// numericDate decodes m[name] as a JWT NumericDate, dropping any fraction. ok is false when the
// member is absent; an error means present but not a finite number in range.
func numericDate(m map[string]json.RawMessage, name string) (v int64, ok bool, err error) {
	raw, present := m[name]
	if !present {
		return 0, false, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1<<40 {
		return 0, true, fmt.Errorf("%s is not a NumericDate", name)
	}
	return int64(f), true, nil
}

// checkClaims applies the claim rules of auth.md §4 at time now.
func checkClaims(pin Pin, m map[string]json.RawMessage, now time.Time) (Claims, error) {
	var c Claims
	if err := stringMember(m, "iss", &c.Issuer); err != nil {
		return Claims{}, refuse("%v", err)
	}
	if c.Issuer != pin.Issuer {
		return Claims{}, refuse("iss is not the pinned issuer")
	}
	if err := checkAudience(m["aud"], pin.Audience); err != nil {
		return Claims{}, err
	}
	if err := stringMember(m, "sub", &c.Subject); err != nil {
		return Claims{}, refuse("sub must be a non-empty string")
	}
	if c.Subject == "" || len(c.Subject) > MaxSubjectBytes || !utf8.ValidString(c.Subject) {
		return Claims{}, refuse("sub must be a non-empty UTF-8 string of at most %d bytes", MaxSubjectBytes)
	}
	tol := int64(ClockTolerance / time.Second)
	unix := now.Unix()
	exp, ok, err := numericDate(m, "exp")
	if err != nil || !ok {
		return Claims{}, refuse("exp is required and must be a NumericDate")
	}
	iat, ok, err := numericDate(m, "iat")
	if err != nil || !ok {
		return Claims{}, refuse("iat is required and must be a NumericDate")
	}
	if iat > unix+tol {
		return Claims{}, refuse("iat is in the future")
	}
	if exp <= unix {
		// No tolerance past exp: the bearer's lifetime is capped at exp-now, which must be at
		// least a second.
		return Claims{}, refuse("expired")
	}
	if nbf, ok, err := numericDate(m, "nbf"); err != nil {
		return Claims{}, refuse("%v", err)
	} else if ok && nbf > unix+tol {
		return Claims{}, refuse("not valid yet (nbf)")
	}
	c.IssuedAt, c.Expires = iat, exp
	return c, nil
}

// checkAudience requires aud to be exactly want: the string, or an array of that one string. A
// token minted for several audiences is refused, so a session proof meant for other services too
// cannot be exchanged here.
func checkAudience(raw json.RawMessage, want string) error {
	if raw == nil {
		return refuse("aud is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != want {
			return refuse("aud is not the pinned audience")
		}
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil || len(list) != 1 {
		return refuse("aud must be one string or an array of exactly one")
	}
	if list[0] != want {
		return refuse("aud is not the pinned audience")
	}
	return nil
}

// Options tune a Verifier. The zero value is usable.
type Options struct {
	// Client fetches the JWKS; nil means a client with a 10 s timeout and no redirects.
	Client *http.Client
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxAge is how long fetched keys are used; 0 means DefaultJWKSMaxAge.
	MaxAge time.Duration
	// RefetchInterval is the least time between fetches; 0 means DefaultRefetchInterval.
	RefetchInterval time.Duration
}

// Verifier checks IdP tokens against one pin. It is safe for concurrent use.
type Verifier struct {
	pin    Pin
	client *http.Client
	now    func() time.Time
	maxAge time.Duration
	every  time.Duration

	// mu guards the cache and is held across a fetch, so concurrent verifications that all miss
	// wait for one fetch instead of each starting their own.
	mu        sync.Mutex
	keys      map[string]ed25519.PublicKey
	fetchedAt time.Time // when keys were fetched; zero before the first success
	triedAt   time.Time // when the last fetch, successful or not, started
}

// NewVerifier returns a Verifier for pin. It refuses a pin NewPin would not build. It fetches
// nothing until the first token.
func NewVerifier(pin Pin, opts Options) (*Verifier, error) {
	if err := pin.validate(); err != nil {
		return nil, fmt.Errorf("idp: %w", err)
	}
	v := &Verifier{pin: pin, client: httpClient(opts.Client), now: opts.Now, maxAge: opts.MaxAge, every: opts.RefetchInterval}
	if v.now == nil {
		v.now = time.Now
	}
	if v.maxAge <= 0 {
		v.maxAge = DefaultJWKSMaxAge
	}
	if v.every <= 0 {
		v.every = DefaultRefetchInterval
	}
	return v, nil
}

// Pin returns the pin this verifier checks against.
func (v *Verifier) Pin() Pin { return v.pin }

// Verify checks token and returns its claims. A refusal wraps ErrToken; a JWKS that cannot be
// fetched wraps ErrJWKSUnavailable. The signature is checked before any claim is trusted.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	p, err := decode(token)
	if err != nil {
		return Claims{}, err
	}
	key, err := v.key(ctx, p.kid)
	if err != nil {
		return Claims{}, err
	}
	if !ed25519.Verify(key, []byte(p.signingInput), p.sig) {
		return Claims{}, refuse("bad signature")
	}
	return checkClaims(v.pin, p.claims, v.now())
}

// key returns the pinned key with this kid. Keys older than maxAge are fetched again; an unknown
// kid triggers one more fetch, at most once per RefetchInterval.
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	if v.keys == nil || now.Sub(v.fetchedAt) >= v.maxAge {
		if err := v.fetchLocked(ctx, now); err != nil {
			return nil, err
		}
	}
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	if now.Sub(v.triedAt) >= v.every {
		if err := v.fetchLocked(ctx, now); err != nil {
			return nil, err
		}
		if k, ok := v.keys[kid]; ok {
			return k, nil
		}
	}
	return nil, refuse("kid is not in the pinned JWKS")
}

// fetchLocked fetches the JWKS. Stale keys are dropped on failure: a key the IdP no longer
// publishes must stop verifying, so an unreachable IdP fails closed. mu must be held.
func (v *Verifier) fetchLocked(ctx context.Context, now time.Time) error {
	if !v.triedAt.IsZero() && now.Sub(v.triedAt) < v.every && v.keys == nil {
		return fmt.Errorf("%w: last fetch failed less than %v ago", ErrJWKSUnavailable, v.every)
	}
	v.triedAt = now
	keys, err := FetchJWKS(ctx, v.client, v.pin.JWKSURI)
	if err != nil {
		v.keys = nil
		return fmt.Errorf("%w: %v", ErrJWKSUnavailable, err)
	}
	v.keys, v.fetchedAt = keys, now
	return nil
}
