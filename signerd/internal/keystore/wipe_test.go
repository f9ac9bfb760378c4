package keystore

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/nats-io/nkeys"
)

// TestSpaceWipe checks what Close relies on, from inside the package: every secret buffer of a
// Space is zeroed, including when openSpace failed halfway and left fields nil.
func TestSpaceWipe(t *testing.T) {
	newKey := func(t *testing.T) *SigningKey {
		t.Helper()
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		defer kp.Wipe()
		seed, _ := kp.Seed()
		k, err := NewSigningKey(seed)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	zero := func(t *testing.T, what string, b []byte) {
		t.Helper()
		if len(b) == 0 || !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s not zeroed (%d bytes)", what, len(b))
		}
	}

	t.Run("ok/wipe-zeroes-everything", func(t *testing.T) {
		_, issuer, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		xkp, err := nkeys.CreateCurveKeys()
		if err != nil {
			t.Fatal(err)
		}
		xpub, _ := xkp.PublicKey()
		sp := &Space{
			DataSigning: newKey(t), AuthSigning: newKey(t), xkey: xkp, issuer: issuer,
			ownerSecret: bytes.Repeat([]byte{7}, SecretLen), macKey: bytes.Repeat([]byte{9}, SecretLen),
		}
		dataPriv, authPriv := sp.DataSigning.priv, sp.AuthSigning.priv
		sp.wipe()
		zero(t, "data signing key", dataPriv)
		zero(t, "auth signing key", authPriv)
		zero(t, "issuer key", issuer)
		zero(t, "owner secret", sp.ownerSecret)
		zero(t, "MAC key", sp.macKey)
		if sp.DataSigning.priv != nil || sp.AuthSigning.priv != nil {
			t.Fatal("signing keys still hold a private key")
		}
		// nkeys wipes a curve key by overwriting its seed with random bytes.
		if after, _ := xkp.PublicKey(); after == xpub {
			t.Fatal("xkey unchanged by wipe")
		}
	})
	t.Run("ok/wipe-partial", func(t *testing.T) {
		sp := &Space{DataSigning: newKey(t)}
		priv := sp.DataSigning.priv
		sp.wipe()
		zero(t, "data signing key", priv)
		sp.wipe() // a second wipe is harmless
	})
}
