package audit

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nkeys"
)

// Decision is the outcome a line records. Only [Granted] and [Denied] exist;
// Append and Verify refuse anything else.
type Decision string

// The two decisions signerd makes.
const (
	Granted Decision = "granted"
	Denied  Decision = "denied"
)

// Valid reports whether d is one of the defined decisions.
func (d Decision) Valid() bool { return d == Granted || d == Denied }

// Record is one audited decision. It deliberately has no field for a JWT, a
// seed or any other credential: the log says who asked for what and what was
// decided, never what was issued. Callers fill the request facts; Append
// overwrites Replica, Seq, Prev and Hash and fills Time when it is zero.
type Record struct {
	// Time is when the decision was made (UTC in the file).
	Time time.Time `json:"time"`
	// Replica is the id of the signerd replica whose chain this line is on.
	Replica string `json:"replica"`
	// Seq is the position of the line on its replica's chain, from 1.
	Seq uint64 `json:"seq"`
	// Caller is the verified caller identity (the client certificate URI SAN).
	Caller string `json:"caller"`
	// RPC is the method that was called.
	RPC string `json:"rpc"`
	// Space is the Cotal space the request named.
	Space string `json:"space"`
	// Profile is the credential profile the request named.
	Profile string `json:"profile"`
	// Subject is the user public key the credential is (or would have been) for.
	Subject string `json:"subject"`
	// JTI is the id of the issued token; empty when nothing was issued.
	JTI string `json:"jti"`
	// Expiry is when the issued credential expires; omitted when zero.
	Expiry time.Time `json:"expiry,omitzero"`
	// RequestID is the caller's idempotency key, if it sent one.
	RequestID string `json:"request_id,omitempty"`
	// Decision is granted or denied.
	Decision Decision `json:"decision"`
	// Reason is a stable reason code; required for a denial.
	Reason string `json:"reason,omitempty"`
	// Count is how many decisions this one line stands for; omitted (0) for a line that
	// records one. signerd sets it on the aggregate line it writes per caller and interval
	// for refusals past a rate limit, which are not written one by one.
	Count uint64 `json:"count,omitempty"`
	// Prev is the lower-case hex hash of the previous line on this chain
	// (the genesis hash for seq 1).
	Prev string `json:"prev"`
	// Hash is the lower-case hex SHA-256 of Prev's bytes and this record's
	// canonical encoding with Hash empty.
	Hash string `json:"hash"`
}

// Redacted replaces a field value that holds a credential.
const Redacted = "REDACTED"

// Limits on what one line may hold. A caller controls some fields (subject,
// request id), so they are bounded to keep a hostile request from bloating the
// log; the line limit is what Verify accepts.
const (
	// MaxFieldBytes is the longest string field Append writes; longer values
	// are cut at a rune boundary and end in "...".
	MaxFieldBytes = 256
	// MaxLineBytes is the longest line Verify accepts, newline excluded.
	MaxLineBytes = 16 << 10
	// maxReplicaBytes bounds the replica id, which is configuration.
	maxReplicaBytes = 64
	// maxReasonBytes bounds a reason code, which is signerd's own constant.
	maxReasonBytes = 64
)

// FieldError reports a record or configuration value Append or New refuses.
// Value is never echoed for fields a caller controls.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "audit: " + e.Field + ": " + e.Reason }

// genesisDomain prefixes the genesis hash so a chain cannot be confused with
// any other SHA-256 use.
const genesisDomain = "cotal-audit/v1\x00"

// genesis returns the raw prev hash of a replica's first line.
func genesis(replica string) [32]byte {
	return sha256.Sum256([]byte(genesisDomain + replica))
}

// GenesisHash returns the hex prev value of replica's first line, for an
// external verifier or an operator's anchor.
func GenesisHash(replica string) string {
	g := genesis(replica)
	return hex.EncodeToString(g[:])
}

// checkReplica refuses replica ids that are empty, long or need escaping: the
// id is configuration and appears in every line and every error.
func checkReplica(id string) error {
	if id == "" {
		return &FieldError{Field: "replica", Reason: "required"}
	}
	if len(id) > maxReplicaBytes {
		return &FieldError{Field: "replica", Reason: fmt.Sprintf("longer than %d bytes", maxReplicaBytes)}
	}
	if looksSecret(id) {
		return &FieldError{Field: "replica", Reason: "looks like a credential"}
	}
	for _, c := range []byte(id) {
		if !isIDByte(c) {
			return &FieldError{Field: "replica", Reason: fmt.Sprintf("%q: only letters, digits, '.', '_', '-' and ':' allowed", id)}
		}
	}
	return nil
}

// checkReason refuses reason codes that are not short identifiers; reasons are
// signerd's constants, so a free-text reason is a programming error.
func checkReason(reason string) error {
	if len(reason) > maxReasonBytes {
		return &FieldError{Field: "reason", Reason: fmt.Sprintf("longer than %d bytes", maxReasonBytes)}
	}
	if looksSecret(reason) {
		return &FieldError{Field: "reason", Reason: "looks like a credential"}
	}
	for _, c := range []byte(reason) {
		if !isIDByte(c) {
			return &FieldError{Field: "reason", Reason: fmt.Sprintf("%q is not a reason code (letters, digits, '.', '_', '-', ':')", reason)}
		}
	}
	return nil
}

func isIDByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == ':'
}

// checkTime refuses times RFC 3339 cannot carry, which would not verify.
func checkTime(field string, t time.Time) error {
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return &FieldError{Field: field, Reason: fmt.Sprintf("year %d outside 1..9999", y)}
	}
	return nil
}

// checkInput validates what the caller of Append is responsible for.
func checkInput(r *Record) error {
	if !r.Decision.Valid() {
		return &FieldError{Field: "decision", Reason: fmt.Sprintf("%q is neither %q nor %q", r.Decision, Granted, Denied)}
	}
	if r.Decision == Denied && r.Reason == "" {
		return &FieldError{Field: "reason", Reason: "required for a denial"}
	}
	if err := checkReason(r.Reason); err != nil {
		return err
	}
	if r.Caller == "" {
		return &FieldError{Field: "caller", Reason: "required"}
	}
	if r.RPC == "" {
		return &FieldError{Field: "rpc", Reason: "required"}
	}
	if r.RPC == ContinueRPC {
		return &FieldError{Field: "rpc", Reason: ContinueRPC + " is reserved for the Log's own continuation lines"}
	}
	if !r.Time.IsZero() {
		if err := checkTime("time", r.Time); err != nil {
			return err
		}
	}
	if !r.Expiry.IsZero() {
		if err := checkTime("expiry", r.Expiry); err != nil {
			return err
		}
	}
	return nil
}

// sanitize makes the free-text fields safe to write: valid UTF-8, no
// credential, bounded length. Denials carry attacker-chosen values, and a
// denial must still be audited, so these are rewritten rather than refused.
// Caller and Space are never redacted: the caller is the verified certificate
// identity and the space a name, and erasing either would hide who asked for
// what (a space "heyJude" is not a JWT).
func sanitize(r *Record) {
	for _, f := range []*string{&r.Caller, &r.Space} {
		*f = bound(strings.ToValidUTF8(*f, "\uFFFD"))
	}
	for _, f := range []*string{&r.RPC, &r.Profile, &r.Subject, &r.JTI, &r.RequestID} {
		*f = clean(*f)
	}
}

// clean is bound with a value that holds a credential replaced by Redacted.
// Only what bound could keep is searched, plus one seed's length so that a
// seed cut in two by bound is caught too: the search is bounded, and a
// credential wholly beyond the cut is never written anyway.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if looksSecret(s[:min(len(s), MaxFieldBytes+seedChars)]) {
		return Redacted
	}
	return bound(s)
}

// bound cuts s to MaxFieldBytes at a rune boundary, ending in "...".
func bound(s string) string {
	if len(s) <= MaxFieldBytes {
		return s
	}
	cut := MaxFieldBytes - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// looksSecret reports whether s holds a credential by its structure, not by
// a look-alike substring: a JWT (three base64url segments whose first decodes
// to a JOSE header), an nkey seed (58 base32 characters from 'S' that decode,
// checksum included, as a seed) or a PEM private key block. A value merely
// containing "eyJ" or a long run of capitals is not one.
func looksSecret(s string) bool {
	if i := strings.Index(s, "-----BEGIN "); i >= 0 && strings.Contains(s[i:], "PRIVATE KEY-----") {
		return true
	}
	return hasJWT(s) || hasSeed(s)
}

// isB64URL reports whether c is in the base64url alphabet.
func isB64URL(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// hasJWT reports whether s contains header.payload.signature where header is
// base64url of a JSON object with an "alg" or "typ" member. The header may be
// glued to text before it, so every "ey" or "ew" in a segment is tried as its
// start.
func hasJWT(s string) bool {
	if strings.Count(s, ".") < 2 {
		return false
	}
	for i := 0; i < len(s); {
		if !isB64URL(s[i]) && s[i] != '.' {
			i++
			continue
		}
		j := i
		for j < len(s) && (isB64URL(s[j]) || s[j] == '.') {
			j++
		}
		segs := strings.Split(s[i:j], ".")
		for k := 0; k+2 < len(segs); k++ {
			if segs[k+1] == "" || segs[k+2] == "" {
				continue
			}
			for h := segs[k]; h != ""; h = h[1:] {
				// '{' followed by '"' or JSON whitespace encodes as "ey"
				// or "ew": every JOSE header starts so.
				if (strings.HasPrefix(h, "ey") || strings.HasPrefix(h, "ew")) && isJOSEHeader(h) {
					return true
				}
			}
		}
		i = j
	}
	return false
}

// isJOSEHeader reports whether seg is unpadded base64url of a JSON object
// with an "alg" or "typ" member.
func isJOSEHeader(seg string) bool {
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return false
	}
	var hdr map[string]json.RawMessage
	if json.Unmarshal(raw, &hdr) != nil {
		return false
	}
	_, alg := hdr["alg"]
	_, typ := hdr["typ"]
	return alg || typ
}

// seedChars is the length of an encoded nkey seed: 2 prefix bytes, 32 seed
// bytes and a 2-byte CRC, 36 bytes in unpadded base32.
const seedChars = 58

// hasSeed reports whether s contains 58 base32 characters starting with 'S'
// that nkeys decodes as a seed (prefix and CRC-16 checked). Any spelling that
// decodes is redacted, canonical or not: Go's base32 ignores the unused
// trailing bits, so a non-canonical spelling is a working seed too.
func hasSeed(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			run = 0
			continue
		}
		run++
		if run < seedChars {
			continue
		}
		w := s[i+1-seedChars : i+1]
		if w[0] == 'S' {
			if _, _, err := nkeys.DecodeSeed([]byte(w)); err == nil {
				return true
			}
		}
	}
	return false
}

// encode appends the canonical encoding of r (see the package doc) to b.
func encode(b []byte, r *Record) []byte {
	b = encodeHead(b, r)
	b = appendString(b, r.Hash)
	return append(b, '}')
}

// hashKey ends the head of every canonical encoding: the hash is the last member.
const hashKey = `,"hash":`

// encodeHead appends the canonical encoding of r up to and including hashKey: all of it but the
// hash value and the closing brace.
func encodeHead(b []byte, r *Record) []byte {
	b = append(b, `{"time":`...)
	b = appendTime(b, r.Time)
	b = appendField(b, "replica", r.Replica)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = appendField(b, "caller", r.Caller)
	b = appendField(b, "rpc", r.RPC)
	b = appendField(b, "space", r.Space)
	b = appendField(b, "profile", r.Profile)
	b = appendField(b, "subject", r.Subject)
	b = appendField(b, "jti", r.JTI)
	if !r.Expiry.IsZero() {
		b = append(b, `,"expiry":`...)
		b = appendTime(b, r.Expiry)
	}
	if r.RequestID != "" {
		b = appendField(b, "request_id", r.RequestID)
	}
	b = appendField(b, "decision", string(r.Decision))
	if r.Reason != "" {
		b = appendField(b, "reason", r.Reason)
	}
	if r.Count != 0 {
		b = append(b, `,"count":`...)
		b = strconv.AppendUint(b, r.Count, 10)
	}
	b = appendField(b, "prev", r.Prev)
	return append(b, hashKey...)
}

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendField(b []byte, key, val string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return appendString(b, val)
}

// appendString writes s as a JSON string with minimal escaping. s must be
// valid UTF-8 (Append sanitizes; Verify compares against what it decoded,
// which encoding/json has already made valid).
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
	}
	return append(b, '"')
}

// seal computes r's hash on top of prev, sets r.Prev and r.Hash, and returns
// the line (with its newline) and the raw hash.
//
// The record is encoded once: the hash is the last member, so the hashed body (hash "") and the
// line differ only after the head. The buffer holds prev's 32 bytes before the head, so that
// SHA-256(prev || body) is one call over one slice; the line is the buffer after them.
func seal(prev [32]byte, r *Record) (line []byte, sum [32]byte) {
	r.Prev = hex.EncodeToString(prev[:])
	r.Hash = ""
	buf := make([]byte, 0, 640)
	buf = append(buf, prev[:]...)
	buf = encodeHead(buf, r)
	head := len(buf)
	buf = append(buf, `""}`...)
	sum = sha256.Sum256(buf)
	buf = append(buf[:head], '"')
	buf = hex.AppendEncode(buf, sum[:])
	r.Hash = string(buf[head+1:])
	buf = append(buf, '"', '}', '\n')
	return buf[len(prev):], sum
}

// chainHash is SHA-256(prev || body), the chain step.
func chainHash(prev [32]byte, body []byte) [32]byte {
	h := sha256.New()
	h.Write(prev[:])
	h.Write(body)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
