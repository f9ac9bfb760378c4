// Package bearer verifies Cotal user bearers, the EdDSA JWTs signerd's SignBearer issues and
// clients present to the auth callout as their auth_token (upstream token.ts validateUserToken;
// reference/auth.md §3 checks 9-12), against the issuer keys signerd's GetJWKS publishes.
//
// It refuses, each with a *Error naming the check: a token that is not three unpadded base64url
// segments or is longer than MaxTokenBytes; a header that is not a JSON object of alg, kid and typ
// only (jku, jwk, x5u and x5c are refused by name: a key never comes from the token), alg other
// than EdDSA, typ missing or other than JWT (a service access bearer or renewal proof, signed by
// the same issuer key, is never a user bearer); a kid the issuer's JWKS does not hold after one
// refetch; a bad signature; a payload with a duplicated key, a key spelled in another case, or any
// field signerd does not write; iss other than urn:cotal:auth:<space>; aud other than exactly the
// space (a string or a one-element list); exp, iat or nbf missing or not integers; iat more than
// 5 s in the future, nbf not yet reached, exp reached, exp more than cap+5 s from now or exp-iat
// over the cap (900 s, 300 s for transfer-writer); ver other than 1; sub not a derived owner or
// not act.owner; act.actor outside the actor grammar; act.scope not equal to the top-level scope;
// scope words outside signerd's grammar; act.parent not one <u_...>.<actor>; act.view outside the
// closed enum (pkg authd/internal/views); managerInstanceId, session or transferWriter without
// their view, or that view without them; lifecycleUid or credentialId outside their grammars.
//
// Verification is pure apart from the key lookup: no ledger, no profile. The callout applies the
// ledger and view decisions to the Claims it returns.
package bearer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/views"
	"github.com/cotalgo/cotal/pkg/space"
)

// Wire constants shared with signerd's SignBearer.
const (
	Version      = 1
	IssuerPrefix = "urn:cotal:auth:"
	// Typ is the header typ every user bearer carries (required since service tokens share the
	// issuer key: serviceaccess.TypUser).
	Typ            = "JWT"
	ClockTolerance = 5 * time.Second
	// MaxLifetime is the longest any bearer lives (views.MaxBearerTTL).
	MaxLifetime = views.MaxBearerTTL
	// MaxTokenBytes bounds a token before it is decoded; signerd's bearers are under 2 KiB.
	MaxTokenBytes = 8 << 10
	// MaxScopes is signerd's limit on scope words (their grammar is space.IsScopeWord).
	MaxScopes = space.MaxScopeWords
	maxJTILen = 64
	maxKIDLen = 128
)

// Check names one verification step; an *Error carries the one that failed.
type Check string

// The checks, in the order Verify applies them.
const (
	CheckFormat       Check = "format"
	CheckHeader       Check = "header"
	CheckEmbeddedKey  Check = "embedded-key"
	CheckAlg          Check = "alg"
	CheckKID          Check = "kid"
	CheckSignature    Check = "signature"
	CheckPayload      Check = "payload"
	CheckIssuer       Check = "iss"
	CheckAudience     Check = "aud"
	CheckTimes        Check = "times"
	CheckIssuedAt     Check = "iat"
	CheckNotBefore    Check = "nbf"
	CheckExpiry       Check = "exp"
	CheckLifetime     Check = "lifetime"
	CheckVersion      Check = "ver"
	CheckSubject      Check = "sub"
	CheckActor        Check = "act.actor"
	CheckScope        Check = "scope"
	CheckParent       Check = "act.parent"
	CheckView         Check = "act.view"
	CheckViewClaims   Check = "view-claims"
	CheckLifecycleUID Check = "act.lifecycleUid"
	CheckCredentialID Check = "act.credentialId"
)

// Error is a refused bearer. Check is stable (for tests and metrics); Detail is for the log and
// never holds the token.
type Error struct {
	Check  Check
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "bearer refused: " + string(e.Check)
	}
	return "bearer refused: " + string(e.Check) + ": " + e.Detail
}

func refuse(c Check, format string, args ...any) *Error {
	return &Error{Check: c, Detail: fmt.Sprintf(format, args...)}
}

// Session is the one session a session-caller bearer may open.
type Session struct {
	Endpoint  string `json:"endpoint"`
	SessionID string `json:"sessionId"`
	Epoch     int64  `json:"epoch"`
	Exp       int64  `json:"exp"`
}

// TransferWriter is the one object a transfer-writer bearer may upload.
type TransferWriter struct {
	InstanceID string `json:"instanceId"`
	Hex        string `json:"hex"`
}

// Claims is a verified bearer, reduced to what the callout decides on.
type Claims struct {
	Owner, Actor      string
	Scope             []string // act.scope (equal to the top-level scope)
	Parent            string
	LifecycleUID      string
	CredentialID      string
	View              string
	ManagerInstanceID string
	Session           *Session
	TransferWriter    *TransferWriter
	IssuedAt          time.Time
	NotBefore         time.Time
	Expires           time.Time
	ID                string // jti, when present
	KID               string
}

// KeySource resolves a kid to an issuer key; *Cache implements it.
type KeySource interface {
	Key(ctx context.Context, kid string) (ed25519.PublicKey, error)
}

var _ KeySource = (*Cache)(nil)

// Verifier checks bearers for one space.
type Verifier struct {
	space string
	keys  KeySource
	now   func() time.Time
}

// NewVerifier returns a Verifier for bearers of spaceName whose keys come from keys; now nil
// means time.Now.
func NewVerifier(spaceName string, keys KeySource, now func() time.Time) (*Verifier, error) {
	if err := space.ValidateName(spaceName); err != nil {
		return nil, fmt.Errorf("bearer: %w", err)
	}
	if keys == nil {
		return nil, errors.New("bearer: no key source")
	}
	if now == nil {
		now = time.Now
	}
	return &Verifier{space: spaceName, keys: keys, now: now}, nil
}

// Verify checks token (see the package doc for everything it refuses) and returns its claims.
// A failure is a *Error; a key lookup that fails for another reason than an unknown kid is a
// *Error with CheckKID as well, so every failure denies.
func (v *Verifier) Verify(ctx context.Context, token string) (*Claims, error) {
	tok, err := split(token)
	if err != nil {
		return nil, err
	}
	key, err := v.keys.Key(ctx, tok.kid)
	if err != nil {
		return nil, refuse(CheckKID, "%v", err)
	}
	if !ed25519.Verify(key, tok.signingInput, tok.sig) {
		return nil, refuse(CheckSignature, "does not verify under kid %.64q", tok.kid)
	}
	p, err := decodePayload(tok.payload)
	if err != nil {
		return nil, err
	}
	c, err := p.check(v.space, v.now())
	if err != nil {
		return nil, err
	}
	c.KID = tok.kid
	return c, nil
}

// token is a split compact JWS whose header has passed its checks.
type token struct {
	kid          string
	signingInput []byte
	payload      []byte
	sig          []byte
}

var b64 = base64.RawURLEncoding.Strict()

// split decodes the three segments and checks the header. It is the first half of the decoder
// FuzzVerify exercises.
func split(s string) (*token, error) {
	if len(s) > MaxTokenBytes {
		return nil, refuse(CheckFormat, "longer than %d bytes", MaxTokenBytes)
	}
	parts := strings.Split(s, ".")
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
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, refuse(CheckFormat, "signature is not 64 bytes of unpadded base64url")
	}
	fields, err := object(hdr, CheckHeader)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"jku", "jwk", "x5u", "x5c"} {
		if _, ok := fields[k]; ok {
			return nil, refuse(CheckEmbeddedKey, "header carries %s; keys resolve only through the issuer's JWKS", k)
		}
	}
	for k := range fields {
		if k != "alg" && k != "kid" && k != "typ" {
			return nil, refuse(CheckHeader, "unknown header field %.64q", k)
		}
	}
	var alg, kid, typ string
	if err := str(fields, "alg", &alg, true); err != nil || alg != "EdDSA" {
		return nil, refuse(CheckAlg, "alg %.32q is not EdDSA", alg)
	}
	if err := str(fields, "kid", &kid, true); err != nil || kid == "" || len(kid) > maxKIDLen {
		return nil, refuse(CheckKID, "kid missing or not 1 to %d bytes", maxKIDLen)
	}
	// typ is required: the callout dispatches on it, and a service token (typ
	// cotal-service-access+jwt, cotal-service-renewal+jwt) or a token without one never passes
	// as a user bearer.
	if err := str(fields, "typ", &typ, true); err != nil || typ != Typ {
		return nil, refuse(CheckHeader, "typ is not %s", Typ)
	}
	return &token{kid: kid, signingInput: []byte(parts[0] + "." + parts[1]), payload: payload, sig: sig}, nil
}

// object decodes one JSON object into its raw members, refusing anything else, a duplicated
// key, and trailing data. Keys are exact: the caller looks members up by their exact spelling,
// so "ISS" never stands in for "iss" as it would with encoding/json's struct matching.
func object(data []byte, c Check) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, refuse(c, "not a JSON object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, refuse(c, "not a JSON object")
		}
		k, _ := t.(string)
		if _, dup := out[k]; dup {
			return nil, refuse(c, "field %.64q appears twice", k)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, refuse(c, "not a JSON object")
		}
		out[k] = raw
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, refuse(c, "not a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, refuse(c, "trailing data")
	}
	return out, nil
}

// str reads member k as a string; a missing member is an error only when required. A null is
// never a string.
func str(m map[string]json.RawMessage, k string, dst *string, required bool) error {
	raw, ok := m[k]
	if !ok {
		if required {
			return fmt.Errorf("missing %s", k)
		}
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return fmt.Errorf("%s is not a string", k)
	}
	return nil
}

// integer reads member k as a JSON integer (no fraction or exponent) that fits int64.
func integer(m map[string]json.RawMessage, k string) (int64, bool, error) {
	raw, ok := m[k]
	if !ok {
		return 0, false, nil
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		// json.Number would also take a string holding digits.
		return 0, true, fmt.Errorf("%s is not a number", k)
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return 0, true, fmt.Errorf("%s is not a number", k)
	}
	if strings.ContainsAny(string(n), ".eE") {
		return 0, true, fmt.Errorf("%s is not an integer", k)
	}
	v, err := n.Int64()
	if err != nil {
		return 0, true, fmt.Errorf("%s is out of range", k)
	}
	return v, true, nil
}

// stringList reads member k as a list of strings (not null).
func stringList(m map[string]json.RawMessage, k string) ([]string, bool, error) {
	raw, ok := m[k]
	if !ok {
		return nil, false, nil
	}
	var out []string
	if err := json.Unmarshal(raw, &out); err != nil || out == nil {
		return nil, true, fmt.Errorf("%s is not a list of strings", k)
	}
	return out, true, nil
}

var (
	payloadKeys = []string{"scope", "ver", "act", "sub", "iss", "aud", "iat", "nbf", "exp", "jti"}
	actKeys     = []string{"owner", "actor", "scope", "parent", "lifecycleUid", "credentialId", "view", "managerInstanceId", "session", "transferWriter"}
)

// payload is a decoded payload whose members have their JSON types; check applies the rules.
type payload struct {
	m, act                 map[string]json.RawMessage
	iss, sub, jti          string
	aud                    []string
	ver, iat, nbf, exp     int64
	hasIat, hasNbf, hasExp bool
	hasVer                 bool
	scope                  []string
}

// decodePayload is the second half of the decoder: JSON shape only, no policy.
func decodePayload(data []byte) (*payload, error) {
	m, err := object(data, CheckPayload)
	if err != nil {
		return nil, err
	}
	for k := range m {
		if !slices.Contains(payloadKeys, k) {
			return nil, refuse(CheckPayload, "unknown claim %.64q", k)
		}
	}
	p := &payload{m: m}
	if err := str(m, "iss", &p.iss, true); err != nil {
		return nil, refuse(CheckIssuer, "%v", err)
	}
	if err := str(m, "sub", &p.sub, true); err != nil {
		return nil, refuse(CheckSubject, "%v", err)
	}
	if err := str(m, "jti", &p.jti, false); err != nil || len(p.jti) > maxJTILen {
		return nil, refuse(CheckPayload, "jti is not a string of at most %d bytes", maxJTILen)
	}
	if raw, ok := m["aud"]; ok {
		var one string
		if json.Unmarshal(raw, &one) == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			p.aud = []string{one}
		} else if list, _, err := stringList(m, "aud"); err == nil {
			p.aud = list
		} else {
			return nil, refuse(CheckAudience, "aud is neither a string nor a list of strings")
		}
	}
	for _, f := range []struct {
		k   string
		dst *int64
		has *bool
		c   Check
	}{{"iat", &p.iat, &p.hasIat, CheckTimes}, {"nbf", &p.nbf, &p.hasNbf, CheckTimes}, {"exp", &p.exp, &p.hasExp, CheckTimes}, {"ver", &p.ver, &p.hasVer, CheckVersion}} {
		v, has, err := integer(m, f.k)
		if err != nil {
			return nil, refuse(f.c, "%v", err)
		}
		*f.dst, *f.has = v, has
	}
	if p.scope, _, err = stringList(m, "scope"); err != nil {
		return nil, refuse(CheckScope, "%v", err)
	}
	raw, ok := m["act"]
	if !ok {
		return nil, refuse(CheckActor, "act claim is missing")
	}
	if p.act, err = object(raw, CheckActor); err != nil {
		return nil, err
	}
	for k := range p.act {
		if !slices.Contains(actKeys, k) {
			return nil, refuse(CheckActor, "unknown act member %.64q", k)
		}
	}
	return p, nil
}

// check applies §3 checks 10-12 at now.
func (p *payload) check(spaceName string, now time.Time) (*Claims, error) {
	if p.iss != IssuerPrefix+spaceName {
		return nil, refuse(CheckIssuer, "iss is not %s<space>", IssuerPrefix)
	}
	if len(p.aud) != 1 || p.aud[0] != spaceName {
		return nil, refuse(CheckAudience, "aud is not exactly the space")
	}
	if !p.hasExp || !p.hasIat || !p.hasNbf {
		return nil, refuse(CheckTimes, "exp, iat and nbf are required")
	}
	c := &Claims{}
	act := p.act
	if err := str(act, "view", &c.View, false); err != nil {
		return nil, refuse(CheckView, "%v", err)
	}
	if c.View != "" && !views.Known(c.View) {
		return nil, refuse(CheckView, "view %.64q is not a known view", c.View)
	}
	if _, ok := act["view"]; ok && c.View == "" {
		return nil, refuse(CheckView, "view is empty")
	}
	nowS := now.Unix()
	tol := int64(ClockTolerance / time.Second)
	capS := int64(views.MaxTTL(c.View) / time.Second)
	switch {
	case p.iat > nowS+tol:
		return nil, refuse(CheckIssuedAt, "iat is in the future")
	case p.nbf > nowS+tol:
		return nil, refuse(CheckNotBefore, "not valid yet")
	case p.exp <= nowS:
		return nil, refuse(CheckExpiry, "expired")
	case p.exp > nowS+capS+tol:
		return nil, refuse(CheckLifetime, "exp is more than the %d s cap past now", capS)
	case p.exp-p.iat > capS || p.iat < 0 || p.nbf < 0:
		return nil, refuse(CheckLifetime, "lifetime exceeds the %d s cap", capS)
	}
	if !p.hasVer || p.ver != Version {
		return nil, refuse(CheckVersion, "ver is not %d", Version)
	}
	if err := space.ValidateDerivedOwner(p.sub); err != nil {
		return nil, refuse(CheckSubject, "sub is not a derived owner")
	}
	if err := str(act, "owner", &c.Owner, true); err != nil || c.Owner != p.sub {
		return nil, refuse(CheckSubject, "act.owner is not sub")
	}
	if err := str(act, "actor", &c.Actor, true); err != nil {
		return nil, refuse(CheckActor, "%v", err)
	}
	if err := space.ValidateActor(c.Actor); err != nil {
		return nil, refuse(CheckActor, "%v", err)
	}
	actScope, _, err := stringList(act, "scope")
	if err != nil {
		return nil, refuse(CheckScope, "act.%v", err)
	}
	if !slices.Equal(nonNil(actScope), nonNil(p.scope)) {
		return nil, refuse(CheckScope, "act.scope is not the top-level scope")
	}
	if err := checkScope(actScope); err != nil {
		return nil, err
	}
	c.Scope = nonNil(actScope)
	if err := str(act, "parent", &c.Parent, false); err != nil {
		return nil, refuse(CheckParent, "%v", err)
	}
	if _, ok := act["parent"]; ok {
		if _, _, err := ledger.SplitPrincipal(c.Parent); err != nil {
			return nil, refuse(CheckParent, "%v", err)
		}
	}
	if err := p.viewClaims(c); err != nil {
		return nil, err
	}
	if _, ok := act["lifecycleUid"]; ok {
		if err := str(act, "lifecycleUid", &c.LifecycleUID, true); err != nil {
			return nil, refuse(CheckLifecycleUID, "%v", err)
		}
		if err := space.ValidateUID(c.LifecycleUID); err != nil {
			return nil, refuse(CheckLifecycleUID, "%v", err)
		}
	}
	if _, ok := act["credentialId"]; ok {
		if err := str(act, "credentialId", &c.CredentialID, true); err != nil || !space.IsCredentialID(c.CredentialID) {
			return nil, refuse(CheckCredentialID, "not 1 to %d characters of [A-Za-z0-9_-]", space.MaxCredentialIDLen)
		}
	}
	c.IssuedAt, c.NotBefore, c.Expires = time.Unix(p.iat, 0), time.Unix(p.nbf, 0), time.Unix(p.exp, 0)
	c.ID = p.jti
	return c, nil
}

// viewClaims checks managerInstanceId, session and transferWriter: each only with its view, and
// that view only with it.
func (p *payload) viewClaims(c *Claims) error {
	act := p.act
	_, hasMI := act["managerInstanceId"]
	_, hasSession := act["session"]
	_, hasTW := act["transferWriter"]
	if hasMI != (c.View == views.ManagerCaller) {
		return refuse(CheckViewClaims, "managerInstanceId comes with view manager-caller, and only with it")
	}
	if hasSession != (c.View == views.SessionCaller) {
		return refuse(CheckViewClaims, "session comes with view session-caller, and only with it")
	}
	if hasTW != (c.View == views.TransferWriter) {
		return refuse(CheckViewClaims, "transferWriter comes with view transfer-writer, and only with it")
	}
	if hasMI {
		if err := str(act, "managerInstanceId", &c.ManagerInstanceID, true); err != nil {
			return refuse(CheckViewClaims, "%v", err)
		}
		if err := space.ValidateUID(c.ManagerInstanceID); err != nil {
			return refuse(CheckViewClaims, "managerInstanceId: %v", err)
		}
	}
	if hasSession {
		s, err := object(act["session"], CheckViewClaims)
		if err != nil {
			return err
		}
		c.Session = &Session{}
		for k := range s {
			if k != "endpoint" && k != "sessionId" && k != "epoch" && k != "exp" {
				return refuse(CheckViewClaims, "session carries the unknown field %.64q", k)
			}
		}
		if str(s, "endpoint", &c.Session.Endpoint, true) != nil || !tokenOf(c.Session.Endpoint, 1, 64) {
			return refuse(CheckViewClaims, "session.endpoint is not an endpoint token")
		}
		if str(s, "sessionId", &c.Session.SessionID, true) != nil || !tokenOf(c.Session.SessionID, 22, 128) {
			return refuse(CheckViewClaims, "session.sessionId is not a session id")
		}
		var has bool
		for _, f := range []struct {
			k   string
			dst *int64
		}{{"epoch", &c.Session.Epoch}, {"exp", &c.Session.Exp}} {
			if *f.dst, has, err = integer(s, f.k); err != nil || !has || *f.dst < 0 {
				return refuse(CheckViewClaims, "session.%s is not an unsigned integer", f.k)
			}
		}
	}
	if hasTW {
		tw, err := object(act["transferWriter"], CheckViewClaims)
		if err != nil {
			return err
		}
		c.TransferWriter = &TransferWriter{}
		for k := range tw {
			if k != "instanceId" && k != "hex" {
				return refuse(CheckViewClaims, "transferWriter carries the unknown field %.64q", k)
			}
		}
		if str(tw, "instanceId", &c.TransferWriter.InstanceID, true) != nil || space.ValidateUID(c.TransferWriter.InstanceID) != nil {
			return refuse(CheckViewClaims, "transferWriter.instanceId is not an instance id")
		}
		if str(tw, "hex", &c.TransferWriter.Hex, true) != nil || !isSHA256Hex(c.TransferWriter.Hex) {
			return refuse(CheckViewClaims, "transferWriter.hex is not a sha256 hex digest")
		}
	}
	return nil
}

// checkScope applies signerd's scope rule: at most MaxScopes words of [a-z][a-z0-9_-]{0,31}, no
// duplicates.
func checkScope(scope []string) error {
	if len(scope) > MaxScopes {
		return refuse(CheckScope, "more than %d scope words", MaxScopes)
	}
	for i, w := range scope {
		if !space.IsScopeWord(w) {
			return refuse(CheckScope, "scope[%d] is not a scope word", i)
		}
		if slices.Contains(scope[:i], w) {
			return refuse(CheckScope, "scope[%d] is a duplicate", i)
		}
	}
	return nil
}

// tokenOf reports whether s is min to max characters of [A-Za-z0-9_-].
func tokenOf(s string, min, max int) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
