package serviceaccess

import (
	"context"
	"crypto/ed25519"
	"errors"
	"time"
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

// Access verifies an access bearer.
func (v *Validator) Access(ctx context.Context, token string) (*AccessClaims, error) {
	return nil, errFloor
}

// Renewal verifies a renewal proof.
func (v *Validator) Renewal(ctx context.Context, token string) (*RenewalClaims, error) {
	return nil, errFloor
}

// TypOf returns a token's header typ without verifying anything, for dispatch only ("" when the
// header has none). A token that is not three base64url segments with a JSON object header is
// an error.
func TypOf(token string) (string, error) { return "", errFloor }
