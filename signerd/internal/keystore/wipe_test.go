package keystore

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
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
		xraw, err := xkp.PrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		_, xseed, err := nkeys.DecodeSeed(must(nkeys.EncodeSeed(nkeys.PrefixByteCurve, must(nkeys.Decode(nkeys.PrefixBytePrivate, xraw)))))
		if err != nil {
			t.Fatal(err)
		}
		xk, err := newCurveKey(nkeys.PrefixByteCurve, xseed)
		if err != nil {
			t.Fatal(err)
		}
		sp := &Space{
			DataSigning: newKey(t), AuthSigning: newKey(t), xkey: xk, issuer: issuer,
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
		zero(t, "xkey", sp.xkey.seed[:])
	})
	t.Run("ok/wipe-partial", func(t *testing.T) {
		sp := &Space{DataSigning: newKey(t)}
		priv := sp.DataSigning.priv
		sp.wipe()
		zero(t, "data signing key", priv)
		sp.wipe() // a second wipe is harmless
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// issuerPEM returns a fresh Ed25519 key as the PKCS#8 PEM that setup writes.
func issuerPEM(t testing.TB) (ed25519.PrivateKey, []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// TestSecretFilesWiped is finding 9's file path for the non-seed secrets: the bytes read from
// the issuer key, owner secret and MAC key files are zeroed after parsing, accepted or refused,
// and the parsed key equals what x509 and base64 read.
func TestSecretFilesWiped(t *testing.T) {
	zero := func(t *testing.T, what string, b []byte) {
		t.Helper()
		if len(b) == 0 || !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s not zeroed", what)
		}
	}
	t.Run("ok/issuer", func(t *testing.T) {
		want, data := issuerPEM(t)
		got, err := parseIssuer("issuer.key", data)
		if err != nil {
			t.Fatal(err)
		}
		zero(t, "issuer file bytes", data)
		if !got.Equal(want) {
			t.Fatal("parsed issuer key differs from the one written")
		}
	})
	t.Run("ok/secret32", func(t *testing.T) {
		want := bytes.Repeat([]byte{0x5a}, SecretLen)
		data := []byte(" " + base64.StdEncoding.EncodeToString(want) + "\n")
		got, err := parseSecret32("mac.key", data)
		if err != nil {
			t.Fatal(err)
		}
		zero(t, "secret file bytes", data)
		if !bytes.Equal(got, want) || cap(got) != SecretLen {
			t.Fatalf("parsed %x (cap %d), want %x", got, cap(got), want)
		}
	})
	for name, data := range map[string]func() []byte{
		"fail/issuer-trailing-bytes": func() []byte {
			_, p := issuerPEM(t)
			return bytes.Replace(p, []byte("-----END"), []byte("AAAA\n-----END"), 1)
		},
		"fail/issuer-armour-on-one-line": func() []byte {
			_, p := issuerPEM(t)
			return bytes.ReplaceAll(p, []byte("\n"), nil)
		},
		"fail/issuer-truncated": func() []byte { _, p := issuerPEM(t); return p[:len(p)-20] },
	} {
		t.Run(name, func(t *testing.T) {
			b := data()
			if _, err := parseIssuer("issuer.key", b); err == nil {
				t.Fatal("parseIssuer accepted it")
			}
			zero(t, "refused issuer file bytes", b)
		})
	}
	t.Run("fail/secret32-short", func(t *testing.T) {
		b := []byte(base64.StdEncoding.EncodeToString(make([]byte, SecretLen-1)) + "\n")
		b[0] = 'Q' // not all zero, so the wipe is visible
		if _, err := parseSecret32("mac.key", b); err == nil {
			t.Fatal("parseSecret32 accepted 31 bytes")
		}
		zero(t, "refused secret file bytes", b)
	})
}

// FuzzParseIssuer feeds arbitrary bytes as the issuer key file: a refusal that does not quote
// the input, or an Ed25519 key that x509 reads from the same PEM block identically.
func FuzzParseIssuer(f *testing.F) {
	_, good := issuerPEM(f)
	f.Add(good)
	f.Add(bytes.ReplaceAll(good, []byte("\n"), []byte("\r\n")))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		got, err := parseIssuer("issuer.key", data)
		if !bytes.Equal(data, make([]byte, len(data))) {
			t.Fatal("input not wiped")
		}
		if err != nil {
			if len(in) >= 16 && bytes.Contains([]byte(err.Error()), in) {
				t.Fatal("the error quotes the input")
			}
			return
		}
		block, _ := pem.Decode(in)
		if block == nil || block.Type != "PRIVATE KEY" {
			t.Fatal("accepted what encoding/pem does not read as a PRIVATE KEY block")
		}
		key, perr := x509.ParsePKCS8PrivateKey(block.Bytes)
		want, ok := key.(ed25519.PrivateKey)
		if perr != nil || !ok || !want.Equal(got) {
			t.Fatalf("accepted a key x509 reads differently (%T, %v)", key, perr)
		}
	})
}
