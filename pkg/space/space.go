// Package space owns every wire and on-disk name a Cotal space uses: the space token and disk
// segment, the grammars for owner, actor, lifecycle UID, channel, role and inbox nonce, and the
// builders for subjects, streams, consumers, KV buckets and JetStream API subjects.
//
// Every name the daemons put on the wire or into a permission comes from here, so the grammar is
// enforced in one place. Builders that take caller values validate them and return an error
// rather than rewrite them: a value that would have to be rewritten (a '.', '*', '>' or space in
// an owner, say) is an aliasing or lane-breakout attempt and is refused with a *NameError.
// Builders whose result contains a wildcard say so in their doc comment and put the wildcard
// only where the doc says; no caller value can add one.
package space

import (
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Root is the first token of every Cotal subject.
const Root = "cotal"

// MaxNameLen caps a space name in bytes. The token derived from it appears in every stream,
// bucket and subject name, and JetStream names are capped at 255 bytes.
const MaxNameLen = 128

// Token maps a space name to its upstream wire token: leading and trailing whitespace is trimmed
// (ECMAScript String.prototype.trim semantics) and every character outside [A-Za-z0-9_-] becomes
// '_'. Like the TypeScript original it works on UTF-16 code units, so a character outside the
// Basic Multilingual Plane becomes "__". An empty result becomes "_".
//
// Token is not hex and not injective ("a b" and "a_b" share a token); two spaces whose tokens
// collide must not share a broker. Segment is the injective on-disk form.
func Token(name string) string {
	s := jsTrim(name)
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		switch {
		case tokenByte(r):
			b.WriteRune(r)
		case r > 0xFFFF:
			// A surrogate pair in UTF-16: the upstream regex replaces each half.
			b.WriteString("__")
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}

// Segment is the on-disk and secret-store segment for a space: "space." followed by the lower-case
// hex of the name's UTF-8 bytes. Unlike Token it is injective, so it is safe as a directory or key
// name. It does not validate; call ValidateName first.
func Segment(name string) string {
	return "space." + hex.EncodeToString([]byte(name))
}

// ValidateName checks a space name: non-empty, at most MaxNameLen bytes, valid UTF-8, no control
// characters, and no leading or trailing whitespace (which Token would silently drop, letting
// " a" and "a" share a token).
func ValidateName(name string) error {
	switch {
	case name == "":
		return nameErr(KindSpace, name, "is empty")
	case len(name) > MaxNameLen:
		return nameErr(KindSpace, name, fmt.Sprintf("is longer than %d bytes", MaxNameLen))
	case !utf8.ValidString(name):
		return nameErr(KindSpace, name, "is not valid UTF-8")
	case jsTrim(name) != name:
		return nameErr(KindSpace, name, "has leading or trailing whitespace")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return nameErr(KindSpace, name, fmt.Sprintf("contains control character %U", r))
		}
	}
	return nil
}

// Kinds of name a NameError can report.
const (
	KindSpace        = "space name"
	KindOwner        = "owner"
	KindActor        = "actor"
	KindDerivedOwner = "derived owner"
	KindUID          = "lifecycle uid"
	KindChannel      = "channel"
	KindRole         = "role"
	KindInboxNonce   = "inbox nonce"
	KindKVKey        = "kv key"
	KindBucket       = "bucket kind"
	KindStream       = "stream name"
	KindConsumer     = "consumer name"
	KindFilter       = "filter subject"
)

// NameError reports a value that does not fit its grammar. Value is the offending input; Error
// quotes at most 64 bytes of it so a hostile value cannot flood a log line.
type NameError struct {
	Kind   string
	Value  string
	Reason string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.Kind, clip(e.Value), e.Reason)
}

func nameErr(kind, value, reason string) error {
	return &NameError{Kind: kind, Value: value, Reason: reason}
}

func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// jsTrim removes what ECMAScript's String.prototype.trim removes: WhiteSpace (TAB, VT, FF,
// U+FEFF and category Zs) and LineTerminator (LF, CR, U+2028, U+2029). strings.TrimSpace differs
// (it trims U+0085 and keeps U+FEFF), which would change the upstream token.
func jsTrim(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		switch r {
		case '\t', '\n', '\v', '\f', '\r', 0xFEFF, 0x2028, 0x2029:
			return true
		}
		return unicode.Is(unicode.Zs, r)
	})
}

func tokenByte(r rune) bool {
	return r < utf8.RuneSelf && (isAlnum(byte(r)) || r == '_' || r == '-')
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
