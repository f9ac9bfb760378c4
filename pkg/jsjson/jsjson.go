// Package jsjson writes strings as ECMAScript's JSON.stringify does, for the bytes Cotal hashes
// or MACs that upstream's TypeScript computes over JSON.stringify output (the owner derivation,
// the hosted runtime key, the manager registration proof). Go's encoding/json differs: it escapes
// U+2028 and U+2029 always and '<', '>' and '&' by default, so using it would give some inputs
// another hash than upstream's.
package jsjson

// AppendString appends s as JSON.stringify writes a string: '"' and '\' escaped with a
// backslash; \b \t \n \f \r by their short forms; every other byte below 0x20 as \u00xx in
// lower-case hex; everything else, including '<', '>', '&', DEL, U+2028 and U+2029, raw. s must
// be valid UTF-8 (the callers check it); it is copied byte for byte.
func AppendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}
