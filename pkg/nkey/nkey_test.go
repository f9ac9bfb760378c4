package nkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/nkey"
)

func newKey(t testing.TB, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestCheck: only the canonical spelling passes. The fail/ rows that nkeys.IsValidPublicUserKey
// accepts (CR, LF) are finding 1 of issue 7.
func TestCheck(t *testing.T) {
	user := newKey(t, nkeys.CreateUser)
	account := newKey(t, nkeys.CreateAccount)
	server := newKey(t, nkeys.CreateServer)
	operator := newKey(t, nkeys.CreateOperator)
	curve := newKey(t, nkeys.CreateCurveKeys)
	seed := func() string {
		kp, _ := nkeys.CreateUser()
		s, _ := kp.Seed()
		return string(s)
	}()
	// A 'U' key of 16 bytes with a valid CRC: nkeys.Encode does not check the payload length.
	short, err := nkeys.Encode(nkeys.PrefixByteUser, make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	shortCurve, err := nkeys.Encode(nkeys.PrefixByteCurve, []byte("0123456789abcdef0123456789abcdef0123"))
	if err != nil {
		t.Fatal(err)
	}
	smallOrder, err := nkeys.Encode(nkeys.PrefixByteUser, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		s      string
		prefix nkeys.PrefixByte
		ok     bool
		// lenient is what nkeys' own validator says, to show the gap each row closes.
		lenient bool
	}{
		{"ok/user", user, nkeys.PrefixByteUser, true, true},
		{"ok/account", account, nkeys.PrefixByteAccount, true, true},
		{"ok/server", server, nkeys.PrefixByteServer, true, true},
		{"ok/operator", operator, nkeys.PrefixByteOperator, true, true},
		{"ok/curve", curve, nkeys.PrefixByteCurve, true, true},
		{"fail/crlf-inside", user[:20] + "\r\n" + user[20:], nkeys.PrefixByteUser, false, true},
		{"fail/lf-leading", "\n" + user, nkeys.PrefixByteUser, false, true},
		{"fail/cr-trailing", user + "\r", nkeys.PrefixByteUser, false, true},
		{"fail/lf-curve", curve[:10] + "\n" + curve[10:], nkeys.PrefixByteCurve, false, true},
		{"fail/lower-case", strings.ToLower(user), nkeys.PrefixByteUser, false, false},
		{"fail/padding", user + "====", nkeys.PrefixByteUser, false, false},
		{"fail/space", " " + user, nkeys.PrefixByteUser, false, false},
		{"fail/empty", "", nkeys.PrefixByteUser, false, false},
		{"fail/truncated", user[:55], nkeys.PrefixByteUser, false, false},
		{"fail/other-kind", account, nkeys.PrefixByteUser, false, false},
		{"fail/short-payload", string(short), nkeys.PrefixByteUser, false, false},
		{"fail/short-curve", string(shortCurve), nkeys.PrefixByteCurve, false, true},
		{"fail/small-order", string(smallOrder), nkeys.PrefixByteUser, false, false},
		{"fail/seed", seed, nkeys.PrefixByteUser, false, false},
		{"fail/seed-prefix", seed, nkeys.PrefixByteSeed, false, false},
		{"fail/flipped-char", flip(user), nkeys.PrefixByteUser, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := nkey.Check(tc.s, tc.prefix)
			if (err == nil) != tc.ok {
				t.Fatalf("Check = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, nkey.ErrNotCanonical) {
					t.Fatalf("error %v does not match ErrNotCanonical", err)
				}
				if len(tc.s) > 8 && strings.Contains(err.Error(), tc.s[:8]) {
					t.Fatalf("error %q quotes the input", err)
				}
			}
			lenient := false
			switch tc.prefix {
			case nkeys.PrefixByteUser:
				lenient = nkeys.IsValidPublicUserKey(tc.s)
			case nkeys.PrefixByteCurve:
				lenient = nkeys.IsValidPublicCurveKey(tc.s)
			default:
				lenient = tc.lenient
			}
			if lenient != tc.lenient {
				t.Fatalf("nkeys validator says %v, the table says %v", lenient, tc.lenient)
			}
		})
	}
}

func TestPredicates(t *testing.T) {
	user := newKey(t, nkeys.CreateUser)
	account := newKey(t, nkeys.CreateAccount)
	server := newKey(t, nkeys.CreateServer)
	operator := newKey(t, nkeys.CreateOperator)
	curve := newKey(t, nkeys.CreateCurveKeys)
	for _, tc := range []struct {
		name string
		is   func(string) bool
		good string
	}{
		{"user", nkey.IsUser, user},
		{"account", nkey.IsAccount, account},
		{"server", nkey.IsServer, server},
		{"operator", nkey.IsOperator, operator},
		{"curve", nkey.IsCurve, curve},
	} {
		t.Run("ok/"+tc.name, func(t *testing.T) {
			if !tc.is(tc.good) {
				t.Fatal("canonical key refused")
			}
		})
		t.Run("fail/"+tc.name+"-with-lf", func(t *testing.T) {
			if tc.is(tc.good[:1] + "\n" + tc.good[1:]) {
				t.Fatal("key with LF accepted")
			}
		})
	}
}

// flip changes one character in the middle of s to another base32 character, which breaks the CRC.
func flip(s string) string {
	b := []byte(s)
	if b[30] == 'A' {
		b[30] = 'B'
	} else {
		b[30] = 'A'
	}
	return string(b)
}
