// Package nkey accepts a public nkey only in its one canonical spelling.
//
// nkeys.IsValidPublicUserKey and its siblings decode with Go's base32 decoder, which skips '\r'
// and '\n' anywhere in its input, and nkeys.IsValidPublicCurveKey does not check the key length.
// So "U…\r\n…" passes as the user key "U……", yet it is a different string: a JWT issued to it
// carries that string as its subject, the broker accepts it, and a revocation of the clean key
// does not match it. Every key signerd reads from a caller, a request or a file goes through
// Check, and so does every subject put into claims.
//
// Check refuses anything but exactly the canonical encoding for the expected prefix: 56
// characters of [A-Z2-7] (no padding, no lower case, no whitespace) that decode, with a valid
// CRC and the expected prefix, to a 32-byte key (not a small-order Ed25519 point for signing
// keys) and encode back to the same string.
package nkey

import (
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
)

// Len is the length of every canonical public nkey: base32 (no padding) of a prefix byte, a
// 32-byte key and a 2-byte CRC.
const Len = 56

// ErrNotCanonical marks a string that is not the canonical spelling of a public nkey of the
// expected kind. Every error Check returns matches it.
var ErrNotCanonical = errors.New("not a canonical public nkey")

// Error says why a string is not a canonical public key of the expected kind. It never quotes
// the string: an operator or caller may have pasted a seed by mistake.
type Error struct {
	// Kind names the expected key kind ("user", "account", ...).
	Kind string
	// Reason says which rule the string breaks.
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("not a canonical %s public nkey: %s", e.Kind, e.Reason)
}

// Is reports whether target is ErrNotCanonical.
func (e *Error) Is(target error) bool { return target == ErrNotCanonical }

// kinds names the public prefixes Check accepts.
var kinds = map[nkeys.PrefixByte]string{
	nkeys.PrefixByteOperator: "operator",
	nkeys.PrefixByteServer:   "server",
	nkeys.PrefixByteCluster:  "cluster",
	nkeys.PrefixByteAccount:  "account",
	nkeys.PrefixByteUser:     "user",
	nkeys.PrefixByteCurve:    "curve",
}

// Check returns nil only if s is exactly the canonical encoding of a public key with prefix. It
// refuses a prefix that is not a public key prefix (a seed or private prefix), a wrong length,
// any byte outside [A-Z2-7], a bad CRC, another prefix, a small-order signing key, and any
// string that does not encode back to itself.
func Check(s string, prefix nkeys.PrefixByte) error {
	kind, ok := kinds[prefix]
	if !ok {
		return &Error{Kind: prefix.String(), Reason: "not a public key prefix"}
	}
	bad := func(format string, args ...any) error {
		return &Error{Kind: kind, Reason: fmt.Sprintf(format, args...)}
	}
	if len(s) != Len {
		return bad("%d bytes, want %d", len(s), Len)
	}
	// Checked before decoding so that nothing the decoder would skip or fold reaches it.
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return bad("byte %d is outside [A-Z2-7]", i)
		}
	}
	raw, err := nkeys.Decode(prefix, []byte(s))
	if err != nil {
		return bad("%v", err)
	}
	if len(raw) != 32 {
		return bad("decodes to %d key bytes, want 32", len(raw))
	}
	// IsValidPublicKey adds the small-order point check for signing keys (not for curve keys).
	if prefix != nkeys.PrefixByteCurve && !nkeys.IsValidPublicKey(s) {
		return bad("not a usable Ed25519 public key")
	}
	enc, err := nkeys.Encode(prefix, raw)
	if err != nil || string(enc) != s {
		return bad("does not encode back to itself")
	}
	return nil
}

// CheckUser is Check for a user key (U…).
func CheckUser(s string) error { return Check(s, nkeys.PrefixByteUser) }

// CheckAccount is Check for an account key (A…).
func CheckAccount(s string) error { return Check(s, nkeys.PrefixByteAccount) }

// CheckServer is Check for a server key (N…).
func CheckServer(s string) error { return Check(s, nkeys.PrefixByteServer) }

// CheckOperator is Check for an operator key (O…).
func CheckOperator(s string) error { return Check(s, nkeys.PrefixByteOperator) }

// CheckCurve is Check for a curve (xkey) key (X…).
func CheckCurve(s string) error { return Check(s, nkeys.PrefixByteCurve) }

// IsUser reports whether s is a canonical user public key.
func IsUser(s string) bool { return CheckUser(s) == nil }

// IsAccount reports whether s is a canonical account public key.
func IsAccount(s string) bool { return CheckAccount(s) == nil }

// IsServer reports whether s is a canonical server public key.
func IsServer(s string) bool { return CheckServer(s) == nil }

// IsOperator reports whether s is a canonical operator public key.
func IsOperator(s string) bool { return CheckOperator(s) == nil }

// IsCurve reports whether s is a canonical curve (xkey) public key.
func IsCurve(s string) bool { return CheckCurve(s) == nil }
