package serviceaccess

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/space"
)

// Token types (the JOSE header typ) and their claim constants.
const (
	TypAccess  = "cotal-service-access+jwt"
	TypRenewal = "cotal-service-renewal+jwt"
	// TypUser is the typ of a Cotal user bearer (SignBearer); the callout dispatches on typ.
	TypUser = "JWT"

	DutyServe = "serve"
	UseRenew  = "renew"
	Version   = 1

	MaxAccessLifetime  = 60 * time.Second
	MaxRenewalLifetime = 24 * time.Hour
	// IssuedAtTolerance is how far iat may lie ahead of the verifier's clock; exp has none.
	IssuedAtTolerance = 5 * time.Second
	// MaxTokenBytes bounds a token before it is decoded.
	MaxTokenBytes = 8 << 10
)

// Issuer is the iss of both service token types: urn:cotal:service-access:<space>.
func Issuer(space string) string { return "urn:cotal:service-access:" + space }

// RenewalAudience is a renewal proof's aud: urn:cotal:service-renewal:<space>.
func RenewalAudience(space string) string { return "urn:cotal:service-renewal:" + space }

// AccessClaims is an access bearer's payload, exactly these keys: aud is the space, duty
// "serve", lifetime at most 60 s.
type AccessClaims struct {
	Iss  string `json:"iss"`
	Aud  string `json:"aud"`
	Sub  string `json:"sub"`
	Duty string `json:"duty"`
	Wit  string `json:"wit"`
	Ep   string `json:"ep"`
	Iid  string `json:"iid"`
	Root string `json:"root"`
	Ver  int    `json:"ver"`
	Iat  int64  `json:"iat"`
	Nbf  int64  `json:"nbf"`
	Exp  int64  `json:"exp"`
	Jti  string `json:"jti"`
}

// RenewalClaims is a renewal proof's payload, exactly these keys: aud RenewalAudience(space),
// use "renew", lifetime at most 24 h.
type RenewalClaims struct {
	Iss  string `json:"iss"`
	Aud  string `json:"aud"`
	Sub  string `json:"sub"`
	Use  string `json:"use"`
	Wit  string `json:"wit"`
	Ep   string `json:"ep"`
	Iid  string `json:"iid"`
	Root string `json:"root"`
	Ver  int    `json:"ver"`
	Iat  int64  `json:"iat"`
	Nbf  int64  `json:"nbf"`
	Exp  int64  `json:"exp"`
	Jti  string `json:"jti"`
}

// KeySource resolves a kid to the issuer's Ed25519 public key (authd's JWKS cache, or a
// pinned Info's keys).
type KeySource interface {
	Key(ctx context.Context, kid string) (ed25519.PublicKey, error)
}

// ErrNotYetValid is wrapped by a TokenError whose token was issued more than
// IssuedAtTolerance ahead of the verifier's clock (or whose nbf is not reached).
var ErrNotYetValid = errors.New("serviceaccess: token not yet valid")

// TokenError is a refused token: Check names the step (format, header, typ, kid, signature,
// payload, iss, aud, sub, times, iat, nbf, exp, lifetime, ver, claims). It never holds token text.
type TokenError struct {
	Check string
	Err   error
}

func (e *TokenError) Error() string {
	if e.Err == nil {
		return "serviceaccess: token refused: " + e.Check
	}
	return "serviceaccess: token refused: " + e.Check + ": " + e.Err.Error()
}

func (e *TokenError) Unwrap() error { return e.Err }

// Validator is the one validator of service tokens (authd's route and callout, pkg/serve):
// typ, kid, EdDSA signature, closed claims, iat at most IssuedAtTolerance ahead, no grace on exp
// (exp == now fails), lifetime within its cap.
type Validator struct {
	Space string
	Keys  KeySource
	// Now defaults to time.Now.
	Now func() time.Time
}

// The steps a TokenError names.
const (
	CheckFormat    = "format"
	CheckHeader    = "header"
	CheckTyp       = "typ"
	CheckKID       = "kid"
	CheckSignature = "signature"
	CheckPayload   = "payload"
	CheckIss       = "iss"
	CheckAud       = "aud"
	CheckSub       = "sub"
	CheckTimes     = "times"
	CheckIat       = "iat"
	CheckNbf       = "nbf"
	CheckExp       = "exp"
	CheckLifetime  = "lifetime"
	CheckVer       = "ver"
	CheckClaims    = "claims"
	// CheckPurpose is a duty (access) or use (renewal) claim other than the kind's.
	CheckPurpose = "purpose"
)

const maxKIDLen = 128

func refuse(check string, format string, args ...any) *TokenError {
	return &TokenError{Check: check, Err: fmt.Errorf(format, args...)}
}

// Access verifies an access bearer.
func (v *Validator) Access(ctx context.Context, token string) (*AccessClaims, error) {
	c, err := v.verify(ctx, token, TypAccess)
	if err != nil {
		return nil, err
	}
	return &AccessClaims{Iss: c.iss, Aud: c.aud, Sub: c.sub, Duty: c.purpose, Wit: c.wit, Ep: c.ep,
		Iid: c.iid, Root: c.root, Ver: Version, Iat: c.iat, Nbf: c.nbf, Exp: c.exp, Jti: c.jti}, nil
}

// Renewal verifies a renewal proof.
func (v *Validator) Renewal(ctx context.Context, token string) (*RenewalClaims, error) {
	c, err := v.verify(ctx, token, TypRenewal)
	if err != nil {
		return nil, err
	}
	return &RenewalClaims{Iss: c.iss, Aud: c.aud, Sub: c.sub, Use: c.purpose, Wit: c.wit, Ep: c.ep,
		Iid: c.iid, Root: c.root, Ver: Version, Iat: c.iat, Nbf: c.nbf, Exp: c.exp, Jti: c.jti}, nil
}

// claims is a verified payload of either kind; purpose is duty (access) or use (renewal).
type claims struct {
	iss, aud, sub, purpose, wit, ep, iid, root, jti string
	iat, nbf, exp                                   int64
}

// kindRules is what one token kind fixes.
type kindRules struct {
	purposeKey, purpose string
	aud                 func(space string) string
	cap                 time.Duration
}

func rulesOf(typ string) kindRules {
	if typ == TypAccess {
		return kindRules{"duty", DutyServe, func(s string) string { return s }, MaxAccessLifetime}
	}
	return kindRules{"use", UseRenew, RenewalAudience, MaxRenewalLifetime}
}

// segments is a split compact JWS.
type segments struct {
	header       *obj
	signingInput []byte
	payload      []byte
	sig          []byte
}

var b64 = base64.RawURLEncoding.Strict()

func split(token string) (*segments, error) {
	if len(token) > MaxTokenBytes {
		return nil, refuse(CheckFormat, "longer than %d bytes", MaxTokenBytes)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, refuse(CheckFormat, "not three segments")
	}
	hdr, err := b64.DecodeString(parts[0])
	if err != nil {
		return nil, refuse(CheckFormat, "header is not unpadded base64url")
	}
	payload, err := b64.DecodeString(parts[1])
	if err != nil {
		return nil, refuse(CheckFormat, "payload is not unpadded base64url")
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil {
		return nil, refuse(CheckFormat, "signature is not unpadded base64url")
	}
	h, err := object(hdr, "header")
	if err != nil {
		return nil, refuse(CheckHeader, "not one closed JSON object")
	}
	return &segments{header: h, signingInput: []byte(parts[0] + "." + parts[1]), payload: payload, sig: sig}, nil
}

// TypOf returns a token's header typ without verifying anything, for dispatch only ("" when the
// header has none). A token that is not three base64url segments with a JSON object header is
// an error.
func TypOf(token string) (string, error) {
	s, err := split(token)
	if err != nil {
		return "", err
	}
	typ, err := s.header.str("typ")
	if err != nil {
		return "", refuse(CheckHeader, "typ is not a string")
	}
	return typ, nil
}

func (v *Validator) verify(ctx context.Context, token, typ string) (*claims, error) {
	if v == nil || v.Keys == nil {
		return nil, refuse(CheckKID, "the validator has no key source")
	}
	if space.ValidateName(v.Space) != nil {
		return nil, refuse(CheckIss, "the validator has no valid space")
	}
	s, err := split(token)
	if err != nil {
		return nil, err
	}
	if err := s.header.only([]string{"alg", "kid", "typ"}, "alg", "kid", "typ"); err != nil {
		return nil, refuse(CheckHeader, "not exactly alg, kid and typ")
	}
	alg, err := s.header.str("alg")
	if err != nil || alg != "EdDSA" {
		return nil, refuse(CheckHeader, "alg is not EdDSA")
	}
	got, err := s.header.str("typ")
	if err != nil || got != typ {
		return nil, refuse(CheckTyp, "typ is not %s", typ)
	}
	kid, err := s.header.str("kid")
	if err != nil || kid == "" || len(kid) > maxKIDLen {
		return nil, refuse(CheckKID, "kid is not 1 to %d bytes", maxKIDLen)
	}
	key, err := v.Keys.Key(ctx, kid)
	if err != nil {
		return nil, &TokenError{Check: CheckKID, Err: err}
	}
	if len(key) != ed25519.PublicKeySize || len(s.sig) != ed25519.SignatureSize || !ed25519.Verify(key, s.signingInput, s.sig) {
		return nil, refuse(CheckSignature, "does not verify under the named key")
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	return checkPayload(s.payload, v.Space, rulesOf(typ), now())
}

func checkPayload(payload []byte, space string, r kindRules, now time.Time) (*claims, error) {
	p, err := object(payload, "payload")
	if err != nil {
		return nil, refuse(CheckPayload, "not one closed JSON object")
	}
	keys := []string{"iss", "aud", "sub", r.purposeKey, "wit", "ep", "iid", "root", "ver", "iat", "nbf", "exp", "jti"}
	if err := p.only(keys, keys...); err != nil {
		return nil, refuse(CheckPayload, "not exactly the keys of its kind")
	}
	var c claims
	for _, f := range []struct {
		k   string
		dst *string
	}{{"iss", &c.iss}, {"aud", &c.aud}, {"sub", &c.sub}, {r.purposeKey, &c.purpose}, {"wit", &c.wit},
		{"ep", &c.ep}, {"iid", &c.iid}, {"root", &c.root}, {"jti", &c.jti}} {
		if *f.dst, err = p.str(f.k); err != nil {
			return nil, refuse(CheckPayload, "%s is not a string", f.k)
		}
	}
	ver, verErr := p.integer("ver")
	for _, f := range []struct {
		k   string
		dst *int64
	}{{"iat", &c.iat}, {"nbf", &c.nbf}, {"exp", &c.exp}} {
		if *f.dst, err = p.integer(f.k); err != nil {
			return nil, refuse(CheckTimes, "%s is not an integer in 0..2^53-1", f.k)
		}
	}
	switch {
	case c.iss != Issuer(space):
		return nil, refuse(CheckIss, "not this space's service access issuer")
	case c.aud != r.aud(space):
		return nil, refuse(CheckAud, "not this kind's audience for this space")
	case !validDerivedOwner(c.sub):
		return nil, refuse(CheckSub, "not a derived owner")
	case verErr != nil || ver != Version:
		return nil, refuse(CheckVer, "not %d", Version)
	case c.purpose != r.purpose:
		return nil, refuse(CheckPurpose, "%s is not %s", r.purposeKey, r.purpose)
	case !ValidWitness(c.wit):
		return nil, refuse(CheckClaims, "wit is not a witness")
	case !ValidEndpoint(c.ep):
		return nil, refuse(CheckClaims, "ep is not an endpoint name")
	case !validInstance(c.iid):
		return nil, refuse(CheckClaims, "iid is not an instance id")
	case !ValidRoot(c.root):
		return nil, refuse(CheckClaims, "root is not a root id")
	case !ValidJTI(c.jti):
		return nil, refuse(CheckClaims, "jti is not 26 lowercase base32 characters")
	}
	ahead := now.Add(IssuedAtTolerance)
	switch {
	case time.Unix(c.iat, 0).After(ahead):
		return nil, &TokenError{Check: CheckIat, Err: ErrNotYetValid}
	case time.Unix(c.nbf, 0).After(ahead):
		return nil, &TokenError{Check: CheckNbf, Err: ErrNotYetValid}
	case !time.Unix(c.exp, 0).After(now):
		return nil, refuse(CheckExp, "expired")
	case c.exp <= c.iat || time.Duration(c.exp-c.iat)*time.Second > r.cap:
		return nil, refuse(CheckLifetime, "exp-iat is not in 1 s..%s", r.cap)
	}
	return &c, nil
}

// ErrUnknownKey is what StaticKeys answers for a kid it does not hold.
var ErrUnknownKey = errors.New("serviceaccess: unknown key id")

// StaticKeys is a fixed KeySource: kid to Ed25519 public key (a pinned Info's keys).
type StaticKeys map[string]ed25519.PublicKey

var _ KeySource = StaticKeys(nil)

// Key returns the key kid names, or ErrUnknownKey.
func (s StaticKeys) Key(_ context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok := s[kid]; ok {
		return k, nil
	}
	return nil, ErrUnknownKey
}

// KeysOf returns the keys of an Info as a KeySource, refusing a key that is not an OKP Ed25519
// EdDSA signing key with 32 bytes of x under its thumbprint kid (as ParseInfo does).
func KeysOf(in *Info) (StaticKeys, error) {
	if in == nil || len(in.Keys) == 0 {
		return nil, errors.New("serviceaccess: the info publishes no keys")
	}
	out := make(StaticKeys, len(in.Keys))
	for i, k := range in.Keys {
		x, err := b64.DecodeString(k.X)
		if k.Kty != "OKP" || k.Crv != "Ed25519" || k.Alg != "EdDSA" || k.Use != "sig" || err != nil ||
			len(x) != ed25519.PublicKeySize || k.Kid != Thumbprint(k.X) {
			return nil, fmt.Errorf("serviceaccess: info key %d is not an Ed25519 signing key under its thumbprint kid", i)
		}
		out[k.Kid] = ed25519.PublicKey(x)
	}
	return out, nil
}
