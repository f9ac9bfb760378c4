package nkey_test

import (
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/nkey"
)

// FuzzCheck: a string Check accepts decodes and encodes back to exactly itself, and every key
// nkeys encodes from 32 bytes is accepted. Whatever the input, Check does not panic.
func FuzzCheck(f *testing.F) {
	user := newKey(f, nkeys.CreateUser)
	curve := newKey(f, nkeys.CreateCurveKeys)
	for _, s := range []string{user, curve, user[:20] + "\r\n" + user[20:], "\n" + user, user + "====", ""} {
		f.Add(s, []byte("0123456789abcdef0123456789abcdef"), byte(nkeys.PrefixByteUser))
	}
	f.Add(curve, []byte{1, 2, 3}, byte(nkeys.PrefixByteCurve))
	f.Fuzz(func(t *testing.T, s string, key []byte, prefix byte) {
		p := nkeys.PrefixByte(prefix)
		if nkey.Check(s, p) == nil {
			raw, err := nkeys.Decode(p, []byte(s))
			if err != nil {
				t.Fatalf("accepted %q does not decode: %v", s, err)
			}
			enc, err := nkeys.Encode(p, raw)
			if err != nil || string(enc) != s {
				t.Fatalf("accepted %q encodes back to %q (%v)", s, enc, err)
			}
		}
		if len(key) != 32 {
			return
		}
		enc, err := nkeys.Encode(p, key)
		if err != nil {
			return
		}
		if err := nkey.Check(string(enc), p); err != nil && nkeys.IsValidPublicKey(string(enc)) && p != nkeys.PrefixByteSeed && p != nkeys.PrefixBytePrivate {
			t.Fatalf("canonical %q refused: %v", enc, err)
		}
	})
}
