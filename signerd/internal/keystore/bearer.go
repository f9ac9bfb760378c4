package keystore

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/jsjson"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// This file holds the operations of a Space that use its bearer issuer key, its owner secret and
// its MAC key. Each computes with a key that never leaves the Space and returns only the result:
// a signed token, a public JWK, an owner id or a MAC.

// Owner derivation.
const (
	// OwnerContext prefixes the owner-derivation HMAC input, as upstream's derive.ts does.
	OwnerContext = "cotal-owner-v1:"
	// OwnerPrefix starts every derived owner id.
	OwnerPrefix = "u_"
	// MaxOwnerInputBytes bounds the IdP issuer and the IdP subject, each in UTF-8 bytes.
	MaxOwnerInputBytes = 1 << 10
)

// Registration-proof MAC.
const (
	// MacDomainManagerCurrentRegistration is the only frozen MAC domain: the manager registration
	// proof (upstream remoteManagerCurrentRegistrationProof).
	MacDomainManagerCurrentRegistration = "cotal/manager-current-registration/v1"
	// MacPrefix starts every MAC Mac returns; lower-case hex of HMAC-SHA256 follows.
	MacPrefix = "sha256:"
	// MaxMacPayloadBytes bounds a MAC payload.
	MaxMacPayloadBytes = 64 << 10
)

// Bearer issuer.
const (
	// MaxBearerClaimsBytes bounds the JSON claims SignBearer signs. A bearer travels as a NATS
	// auth_token and an HTTP header; a few hundred bytes is normal.
	MaxBearerClaimsBytes = 8 << 10
	// JWKKeyType, JWKCurve, JWKAlgorithm and JWKUse are the fixed members of every issuer JWK
	// (RFC 8037 OKP keys, used only to sign).
	JWKKeyType   = "OKP"
	JWKCurve     = "Ed25519"
	JWKAlgorithm = "EdDSA"
	JWKUse       = "sig"
)

// ErrSpaceClosed is returned by every key operation of a Space whose store was closed: Close
// zeroes the keys, and an all-zero key must never be used to sign, derive or MAC.
var ErrSpaceClosed = errors.New("keystore: the space's keys were wiped (store closed)")

// InputError is a value a key operation refuses before touching any key. It names the field and
// why; it never quotes a caller's IdP subject or payload.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string { return "keystore: " + e.Field + ": " + e.Reason }

// JWK is one public key of the bearer issuer as RFC 8037 and RFC 7517 describe it. It holds only
// public values.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// CheckOwnerInput refuses an IdP issuer or subject that DeriveOwner would refuse: empty, longer
// than MaxOwnerInputBytes, or not valid UTF-8 (JSON.stringify of a JavaScript string never yields
// invalid UTF-8, so such input has no upstream owner to agree with). It touches no key, so a
// server can validate a request before asking its policy.
func CheckOwnerInput(idpIssuer, subject string) error {
	for _, f := range []struct{ name, v string }{{"idp_issuer", idpIssuer}, {"subject", subject}} {
		switch {
		case f.v == "":
			return &InputError{Field: f.name, Reason: "is empty"}
		case len(f.v) > MaxOwnerInputBytes:
			return &InputError{Field: f.name, Reason: fmt.Sprintf("is longer than %d bytes", MaxOwnerInputBytes)}
		case !utf8.ValidString(f.v):
			return &InputError{Field: f.name, Reason: "is not valid UTF-8"}
		}
	}
	return nil
}

// DeriveOwner returns the owner id of an IdP identity:
//
//	"u_" + base32lower_nopad(HMAC_SHA256(ownerSecret, "cotal-owner-v1:" + JSON.stringify([idpIssuer, subject]))[:16])
//
// which is 26 characters of [a-z2-7] after the prefix and passes space.ValidateDerivedOwner. The
// JSON is JavaScript's JSON.stringify byte for byte (see jsjson.AppendString), so owners equal the ones
// upstream's derive.ts computes under the same secret. It refuses what CheckOwnerInput refuses,
// and every call after the store was closed (ErrSpaceClosed).
func (sp *Space) DeriveOwner(idpIssuer, subject string) (string, error) {
	if err := CheckOwnerInput(idpIssuer, subject); err != nil {
		return "", err
	}
	if sp.isClosed() {
		return "", ErrSpaceClosed
	}
	msg := make([]byte, 0, len(OwnerContext)+len(idpIssuer)+len(subject)+16)
	msg = append(msg, OwnerContext...)
	msg = append(msg, '[')
	msg = jsjson.AppendString(msg, idpIssuer)
	msg = append(msg, ',')
	msg = jsjson.AppendString(msg, subject)
	msg = append(msg, ']')
	// hmac.New keeps the key XORed into its pads in a heap object of its own, which is left
	// unwiped when it is dropped (see the package documentation).
	mac := hmac.New(sha256.New, sp.ownerSecret)
	mac.Write(msg)
	sum := mac.Sum(nil)
	return OwnerPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16])), nil
}

// CheckMacInput refuses a MAC request Mac would refuse: a domain other than
// MacDomainManagerCurrentRegistration, or an empty payload or one longer than MaxMacPayloadBytes.
// It touches no key.
func CheckMacInput(domain string, payload []byte) error {
	if domain != MacDomainManagerCurrentRegistration {
		return &InputError{Field: "domain", Reason: "is not a frozen MAC domain"}
	}
	if len(payload) == 0 {
		return &InputError{Field: "payload", Reason: "is empty"}
	}
	if len(payload) > MaxMacPayloadBytes {
		return &InputError{Field: "payload", Reason: fmt.Sprintf("is longer than %d bytes", MaxMacPayloadBytes)}
	}
	return nil
}

// Mac returns the domain-separated registration MAC of payload:
//
//	"sha256:" + hex(HMAC_SHA256(macKey, domain + "\x00" + payload))
//
// The key is the space's own 32-byte MAC key (mac.key). Upstream keys this HMAC with the UTF-8
// bytes of the data-account signing seed; signerd deliberately does not, because a MAC oracle
// keyed by a signing seed would tie proofs to the one secret that must never be used for anything
// but signing. Proofs made here therefore do not verify against upstream's and vice versa: a
// deployment moves its verifiers to signerd together with its issuers. It refuses what
// CheckMacInput refuses, and every call after the store was closed (ErrSpaceClosed).
func (sp *Space) Mac(domain string, payload []byte) (string, error) {
	if err := CheckMacInput(domain, payload); err != nil {
		return "", err
	}
	if sp.isClosed() {
		return "", ErrSpaceClosed
	}
	mac := hmac.New(sha256.New, sp.macKey)
	mac.Write([]byte(domain))
	mac.Write([]byte{0})
	mac.Write(payload)
	return MacPrefix + hex.EncodeToString(mac.Sum(nil)), nil
}

// IssuerJWKs returns the bearer issuer's public keys, the active key first. A space has one
// issuer key today. It refuses after the store was closed (ErrSpaceClosed), because a wiped key
// has no public half left to publish.
func (sp *Space) IssuerJWKs() ([]JWK, error) {
	if sp.isClosed() {
		return nil, ErrSpaceClosed
	}
	pub := sp.issuer.Public().(ed25519.PublicKey)
	return []JWK{{
		Kty: JWKKeyType, Crv: JWKCurve, X: base64.RawURLEncoding.EncodeToString(pub),
		Kid: sp.issuerKID, Alg: JWKAlgorithm, Use: JWKUse,
	}}, nil
}

// Token types: the closed set of JOSE header typ values SignBearer writes. A user bearer carries
// TypUser; the two service endpoint tokens (seed 002) carry their own, so no token of one kind
// can pass a verifier of another (every verifier requires its typ exactly).
const (
	// TypUser is a Cotal user bearer's typ.
	TypUser = serviceaccess.TypUser
	// TypServiceAccess is a service access bearer's typ.
	TypServiceAccess = serviceaccess.TypAccess
	// TypServiceRenewal is a service renewal proof's typ.
	TypServiceRenewal = serviceaccess.TypRenewal
)

// bearerTyps is the closed typ set; each is JSON-safe as written (no escaping needed).
var bearerTyps = []string{TypUser, TypServiceAccess, TypServiceRenewal}

// SignBearer signs claims, a JSON object the caller built and validated, as a compact JWS with
// the header {"alg":"EdDSA","kid":<issuer thumbprint>,"typ":<typ>}, and returns the token and
// the kid. typ must be one of TypUser, TypServiceAccess and TypServiceRenewal. The header is
// fixed here so no caller can add jku, jwk, x5u or x5c, which verifiers refuse, or a typ outside
// the set. It refuses another typ, claims that are not a single JSON object or exceed
// MaxBearerClaimsBytes, and every call after the store was closed (ErrSpaceClosed).
func (sp *Space) SignBearer(typ string, claims []byte) (token, kid string, err error) {
	if !slices.Contains(bearerTyps, typ) {
		return "", "", &InputError{Field: "typ", Reason: "is not one of " + strings.Join(bearerTyps, ", ")}
	}
	if len(claims) > MaxBearerClaimsBytes {
		return "", "", &InputError{Field: "claims", Reason: fmt.Sprintf("is longer than %d bytes", MaxBearerClaimsBytes)}
	}
	if len(claims) == 0 || claims[0] != '{' || !json.Valid(claims) {
		return "", "", &InputError{Field: "claims", Reason: "is not a JSON object"}
	}
	if sp.isClosed() {
		return "", "", ErrSpaceClosed
	}
	enc := base64.RawURLEncoding
	// The kid is base64url and every typ of the set is plain ASCII without quotes or
	// backslashes, so neither needs JSON escaping.
	header := `{"alg":"` + JWKAlgorithm + `","kid":"` + sp.issuerKID + `","typ":"` + typ + `"}`
	signing := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString(claims)
	sig := ed25519.Sign(sp.issuer, []byte(signing))
	return signing + "." + enc.EncodeToString(sig), sp.issuerKID, nil
}
