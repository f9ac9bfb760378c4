package keystore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// Run with: go test -run='^$' -bench=. -benchtime=2s ./signerd/internal/keystore/
//
// The Sign pair compares nkeys (which re-derives the Ed25519 key from the seed on every Sign)
// with the cached SigningKey on a typical 400-byte JWT signing input; the Mint pair does the same
// for a whole agent mint (profiles.Build, Claims, Encode).

// jwtSigningInput is 400 bytes shaped like a JWT header and payload.
var jwtSigningInput = []byte(strings.Repeat("eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.", 9)[:400])

// benchKeys returns an nkeys account key pair and a SigningKey for the same seed.
func benchKeys(b *testing.B) (nkeys.KeyPair, *keystore.SigningKey) {
	b.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(kp.Wipe)
	seed, _ := kp.Seed()
	k, err := keystore.NewSigningKey(seed)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(k.Wipe)
	return kp, k
}

func BenchmarkSignNkeys(b *testing.B) {
	kp, _ := benchKeys(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kp.Sign(jwtSigningInput); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignCached(b *testing.B) {
	_, k := benchKeys(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Sign(jwtSigningInput); err != nil {
			b.Fatal(err)
		}
	}
}

// benchMint builds and signs one agent user JWT with signer.
func benchMint(b *testing.B, signer nkeys.KeyPair) {
	b.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		b.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	ukp.Wipe()
	acct, _ := signer.PublicKey() // any account key: the benchmark does not connect
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		spec, err := profiles.Build("alpha", profiles.Agent, agentParams)
		if err != nil {
			b.Fatal(err)
		}
		uc, err := spec.Claims(upub, acct, now, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := uc.Encode(signer); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMintNaive(b *testing.B) {
	kp, _ := benchKeys(b)
	benchMint(b, kp)
}

func BenchmarkMintCached(b *testing.B) {
	_, k := benchKeys(b)
	benchMint(b, k)
}
