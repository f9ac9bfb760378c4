package keystore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// FuzzNewSigningKey feeds arbitrary bytes as a seed: either a refusal that does not quote the
// input, or a key that signs exactly as nkeys does for the same seed.
func FuzzNewSigningKey(f *testing.F) {
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateAccount, nkeys.CreateUser, nkeys.CreateOperator, nkeys.CreateCurveKeys, nkeys.CreateServer} {
		kp, err := create()
		if err != nil {
			f.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		f.Add(bytes.Clone(seed))
		f.Add([]byte(pub))
	}
	f.Add([]byte(""))
	f.Add([]byte("SA"))
	f.Add([]byte("SAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"))
	f.Fuzz(func(t *testing.T, seed []byte) {
		k, err := keystore.NewSigningKey(seed)
		if err != nil {
			if k != nil {
				t.Fatal("key returned with an error")
			}
			if len(seed) >= 16 && bytes.Contains([]byte(err.Error()), seed) {
				t.Fatal("the error quotes the input")
			}
			return
		}
		defer k.Wipe()
		pub := k.Public()
		if !nkeys.IsValidPublicAccountKey(pub) && !nkeys.IsValidPublicUserKey(pub) && !nkeys.IsValidPublicOperatorKey(pub) {
			t.Fatalf("accepted a seed whose public key %s cannot sign JWTs", pub)
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			t.Fatalf("accepted a seed nkeys refuses: %v", err)
		}
		defer kp.Wipe()
		want, _ := kp.Sign([]byte("m"))
		got, err := k.Sign([]byte("m"))
		if kpub, _ := kp.PublicKey(); kpub != pub || err != nil || !bytes.Equal(got, want) {
			t.Fatalf("key %s differs from nkeys' %s", pub, kpub)
		}
	})
}

// FuzzReadPublicSpace feeds arbitrary bytes as a space's public facts file: a refusal, or facts
// of version 1 for the space the file name says.
func FuzzReadPublicSpace(f *testing.F) {
	fx := newFixture(f, "alpha")
	f.Add(readFile(f, keystore.PublicSpacePath(fx.publicDir(), "alpha")))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"ver":1,"space":"alpha"}`))
	f.Add([]byte(`{"ver":1,"space":"alpha"} {}`))
	f.Add([]byte(`{"ver":1,"space":"beta"}`))
	f.Add([]byte(`{"ver":2,"space":"alpha","seed":"x"}`))
	dir := f.TempDir()
	path := keystore.PublicSpacePath(dir, "alpha")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		ps, err := keystore.ReadPublicSpace(path)
		if err != nil {
			return
		}
		if ps.Ver != 1 || ps.Space != "alpha" {
			t.Fatalf("accepted ver %d space %q from %s", ps.Ver, ps.Space, filepath.Base(path))
		}
	})
}

// FuzzReadPublicBroker does the same for broker.json.
func FuzzReadPublicBroker(f *testing.F) {
	fx := newFixture(f, "alpha")
	f.Add(readFile(f, filepath.Join(fx.publicDir(), keystore.BrokerFile)))
	f.Add([]byte(`{"ver":1}`))
	f.Add([]byte(`{"ver":1,"operator_jwt":"x","extra":1}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, keystore.BrokerFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
		pb, err := keystore.ReadPublicBroker(dir)
		if err == nil && pb.Ver != 1 {
			t.Fatalf("accepted ver %d", pb.Ver)
		}
	})
}
