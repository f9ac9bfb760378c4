package keystore_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// newCurve returns a fresh curve key pair (a NATS server's xkey) and its public key.
func newCurve(t testing.TB) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// seal seals data from kp to recipient or fails the test.
func seal(t testing.TB, kp nkeys.KeyPair, data []byte, recipient string) []byte {
	t.Helper()
	out, err := kp.Seal(data, recipient)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCalloutXKey(t *testing.T) {
	f := newFixture(t, "alpha", "beta")
	st := open(t, f.config())
	alpha, _ := st.Space("alpha")
	beta, _ := st.Space("beta")
	server, serverPub := newCurve(t)
	_, otherPub := newCurve(t)
	msg := []byte("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.request.sig")

	t.Run("ok/open-request-sealed-by-server", func(t *testing.T) {
		got, err := alpha.OpenCallout(seal(t, server, msg, alpha.Trust.XKey()), serverPub)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("opened %q, want %q", got, msg)
		}
	})
	t.Run("ok/sealed-response-opens-only-at-server", func(t *testing.T) {
		out, err := alpha.SealCallout(msg, serverPub)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out, msg) {
			t.Fatal("sealed response contains the plaintext")
		}
		got, err := server.Open(out, alpha.Trust.XKey())
		if err != nil {
			t.Fatalf("server cannot open the response: %v", err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("server opened %q, want %q", got, msg)
		}
		if _, err := server.Open(out, beta.Trust.XKey()); err == nil {
			t.Fatal("response opens as if sealed by another space's xkey")
		}
	})

	for _, tc := range []struct {
		name   string
		sp     *keystore.Space
		sealed []byte
		sender string
		want   error
	}{
		{"fail/wrong-sender", alpha, seal(t, server, msg, alpha.Trust.XKey()), otherPub, nkeys.ErrCouldNotDecrypt},
		{"fail/sealed-to-other-space", alpha, seal(t, server, msg, beta.Trust.XKey()), serverPub, nkeys.ErrCouldNotDecrypt},
		{"fail/tampered", alpha, flipLast(seal(t, server, msg, alpha.Trust.XKey())), serverPub, nkeys.ErrCouldNotDecrypt},
		{"fail/plaintext", alpha, msg, serverPub, nkeys.ErrInvalidEncVersion},
		{"fail/empty", alpha, nil, serverPub, nkeys.ErrInvalidEncrypted},
		{"fail/sender-not-curve-key", alpha, seal(t, server, msg, alpha.Trust.XKey()), alpha.Trust.DataAccountPublicKey(), nkeys.ErrInvalidSender},
		{"fail/sender-empty", alpha, seal(t, server, msg, alpha.Trust.XKey()), "", nkeys.ErrInvalidSender},
		{"fail/zero-space", &keystore.Space{Name: "zero"}, seal(t, server, msg, alpha.Trust.XKey()), serverPub, keystore.ErrNoXKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.sp.OpenCallout(tc.sealed, tc.sender)
			if !errors.Is(err, tc.want) {
				t.Fatalf("OpenCallout error = %v, want %v", err, tc.want)
			}
			if got != nil {
				t.Fatalf("refused open returned %d bytes", len(got))
			}
			if err != nil && strings.Contains(err.Error(), string(msg)) {
				t.Fatalf("error %q echoes the plaintext", err)
			}
		})
	}

	for _, tc := range []struct {
		name      string
		sp        *keystore.Space
		recipient string
		want      error
	}{
		{"fail/seal-recipient-not-curve-key", alpha, alpha.Trust.AuthAccountPublicKey(), nkeys.ErrInvalidRecipient},
		{"fail/seal-recipient-empty", alpha, "", nkeys.ErrInvalidRecipient},
		{"fail/seal-zero-space", &keystore.Space{Name: "zero"}, serverPub, keystore.ErrNoXKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.sp.SealCallout(msg, tc.recipient)
			if !errors.Is(err, tc.want) {
				t.Fatalf("SealCallout error = %v, want %v", err, tc.want)
			}
			if got != nil {
				t.Fatalf("refused seal returned %d bytes", len(got))
			}
		})
	}

	t.Run("fail/error-names-space-and-peer", func(t *testing.T) {
		_, err := alpha.OpenCallout(msg, otherPub)
		var xe *keystore.XKeyError
		if !errors.As(err, &xe) {
			t.Fatalf("error %v is not an *XKeyError", err)
		}
		if xe.Op != "open" || xe.Space != "alpha" || xe.Peer != otherPub || !strings.Contains(err.Error(), otherPub) {
			t.Fatalf("XKeyError = %+v (%q), want op open, space alpha, peer %s", xe, err, otherPub)
		}
	})
}

// TestCalloutXKeyAfterClose: Close wipes the xkey, so a request sealed before cannot be opened:
// the closed store refuses before touching the key, and the wiped key itself no longer opens it.
func TestCalloutXKeyAfterClose(t *testing.T) {
	f := newFixture(t, "alpha")
	st, err := keystore.Open(f.config())
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := st.Space("alpha")
	server, serverPub := newCurve(t)
	sealed := seal(t, server, []byte("request"), sp.Trust.XKey())
	if _, err := sp.OpenCallout(sealed, serverPub); err != nil {
		t.Fatalf("before Close: %v", err)
	}
	st.Close()
	if got, err := sp.OpenCallout(sealed, serverPub); !errors.Is(err, keystore.ErrSpaceClosed) || got != nil {
		t.Fatalf("after Close: %d bytes, error %v; want %v", len(got), err, keystore.ErrSpaceClosed)
	}
	if got, err := keystore.OpenWithWipedKeyForTest(sp, sealed, serverPub); !errors.Is(err, nkeys.ErrCouldNotDecrypt) || got != nil {
		t.Fatalf("wiped xkey: %d bytes, error %v; want %v", len(got), err, nkeys.ErrCouldNotDecrypt)
	}
}

// FuzzOpenCallout feeds arbitrary boxes and sender keys to OpenCallout: it must never panic, and
// only a box the sender sealed to this space opens, to exactly what was sealed.
func FuzzOpenCallout(f *testing.F) {
	fx := newFixture(f, "alpha")
	st := open(f, fx.config())
	sp, _ := st.Space("alpha")
	server, serverPub := newCurve(f)
	good := seal(f, server, []byte("request"), sp.Trust.XKey())
	f.Add(good, serverPub)
	f.Add(flipLast(good), serverPub)
	f.Add(good[:30], serverPub)
	f.Add([]byte("xkv1"), serverPub)
	f.Add([]byte{}, "")
	f.Add(good, "XAAAA")
	f.Fuzz(func(t *testing.T, sealed []byte, sender string) {
		got, err := sp.OpenCallout(sealed, sender)
		if err != nil {
			if got != nil {
				t.Fatalf("error %v with %d bytes", err, len(got))
			}
			return
		}
		if sender != serverPub || !bytes.Equal(got, []byte("request")) {
			t.Fatalf("opened %q from sender %q", got, sender)
		}
	})
}

// flipLast returns a copy of b with its last byte changed.
func flipLast(b []byte) []byte {
	out := bytes.Clone(b)
	out[len(out)-1] ^= 0xff
	return out
}
