package profiles

import (
	"bytes"
	"crypto/sha512"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// EncodeUserClaims signs uc with kp and returns the JWT: the same bytes as uc.Encode(kp) at the
// same wall-clock second (TestEncodeUserClaimsMatchesLibrary, FuzzEncodeUserClaims), and the same
// changes to uc (type, issuer, iat from the wall clock, jti, version).
//
// It keeps nats-io/jwt's steps and their order and drops only the waste around them: the header
// is serialized once per process, not per token; the jti's JSON and the payload's JSON are
// written into one pooled buffer and hashed or base64-encoded from there, not copied into
// intermediate strings; and the token is assembled in one pooled buffer instead of two
// fmt.Sprintf calls. The claims are still serialized by encoding/json from the library's own
// types, so a field the library adds is encoded as the library would.
func EncodeUserClaims(uc *jwt.UserClaims, kp nkeys.KeyPair) (string, error) {
	return encodeUserClaims(uc, kp, time.Now())
}

// encodeUserClaims is EncodeUserClaims with the wall clock given (jwt's Encode reads it itself).
func encodeUserClaims(uc *jwt.UserClaims, kp nkeys.KeyPair, wall time.Time) (string, error) {
	if uc == nil {
		return "", errors.New("profiles: nil claims")
	}
	// UserClaims.EncodeWithSigner, then ClaimsData.doEncode, in their order and with their errors.
	if !nkeys.IsValidPublicUserKey(uc.Subject) {
		return "", errors.New("expected subject to be user public key")
	}
	uc.Type = jwt.UserClaim
	if kp == nil {
		return "", errors.New("keypair is required")
	}
	if uc.Subject == "" {
		return "", errors.New("subject is not set")
	}
	issuer, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	if !nkeys.IsValidPublicAccountKey(issuer) {
		return "", errors.New("unable to validate expected prefixes - [account]")
	}
	uc.Issuer = issuer
	uc.IssuedAt = wall.UTC().Unix()

	e := encoders.Get().(*encoder)
	defer e.release()

	// jti: base32 (no padding) of SHA-512/256 over the JSON of ClaimsData with jti empty
	// (ClaimsData.hash).
	uc.ID = ""
	if err := e.json(&uc.ClaimsData); err != nil {
		return "", err
	}
	sum := sha512.Sum512_256(e.body)
	var jti [52]byte // base32 of 32 bytes, unpadded
	b32.Encode(jti[:], sum[:])
	uc.ID = string(jti[:b32.EncodedLen(len(sum))])

	// UserClaims.updateVersion.
	uc.Version = libVersion
	if err := e.json(uc); err != nil {
		return "", err
	}

	// header "." base64url(payload), signed; then "." base64url(signature).
	e.out = append(e.out[:0], jwtHeader...)
	e.out = append(e.out, '.')
	e.out = b64.AppendEncode(e.out, e.body)
	sig, err := kp.Sign(e.out)
	if err != nil {
		return "", err
	}
	e.out = append(e.out, '.')
	e.out = b64.AppendEncode(e.out, sig)
	return string(e.out), nil
}

// libVersion is nats-io/jwt's claim version (its unexported libVersion) that UserClaims.Encode
// writes into nats.version; TestEncodeUserClaimsMatchesLibrary fails if the library moves on.
const libVersion = 2

var (
	b32 = base32.StdEncoding.WithPadding(base32.NoPadding)
	b64 = base64.RawURLEncoding
	// jwtHeader is serialize(&Header{TokenTypeJwt, AlgorithmNkey}) as doEncode computes it.
	jwtHeader = func() string {
		j, err := json.Marshal(&jwt.Header{Type: jwt.TokenTypeJwt, Algorithm: jwt.AlgorithmNkey})
		if err != nil {
			panic(err)
		}
		return b64.EncodeToString(j)
	}()
)

// encoder holds the reusable buffers of one encoding.
type encoder struct {
	buf  bytes.Buffer
	enc  *json.Encoder
	body []byte // the last json result, aliasing buf
	out  []byte
}

// maxPooledBytes bounds the buffers kept for reuse: the largest profiles (128 channels) give
// tokens of about 70 KB, and a buffer far past that is not kept.
const maxPooledBytes = 256 << 10

var encoders = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = json.NewEncoder(&e.buf) // HTML escaping on, as json.Marshal
	return e
}}

// json encodes v as json.Marshal does into e.body.
func (e *encoder) json(v any) error {
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return err
	}
	// Encoder.Encode is json.Marshal plus a newline.
	e.body = bytes.TrimSuffix(e.buf.Bytes(), []byte{'\n'})
	return nil
}

// release returns e to the pool. Its buffers hold nothing the returned token does not (the
// claims and the signature, never key material).
func (e *encoder) release() {
	e.buf.Reset()
	e.body, e.out = nil, e.out[:0]
	if e.buf.Cap() > maxPooledBytes || cap(e.out) > maxPooledBytes {
		return
	}
	encoders.Put(e)
}
