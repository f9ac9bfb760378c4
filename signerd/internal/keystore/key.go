package keystore

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
)

// ErrExportRefused is returned by every method that would hand out key material.
var ErrExportRefused = errors.New("keystore: key material is never exported")

// SigningKey is an Ed25519 nkey parsed once from its seed. nkeys re-derives the private key from
// the seed on every Sign; SigningKey keeps the expanded key, which signs about twice as fast. It
// implements nkeys.KeyPair so jwt/v2 can sign with it, but refuses Seed and PrivateKey: nothing
// that holds a SigningKey can turn it back into a seed.
type SigningKey struct {
	prefix nkeys.PrefixByte
	public string
	priv   ed25519.PrivateKey
}

var (
	_ nkeys.KeyPair  = (*SigningKey)(nil)
	_ fmt.Formatter  = SigningKey{}
	_ slog.LogValuer = SigningKey{}
)

// NewSigningKey parses an nkey seed (operator, account or user) into a SigningKey. The caller
// still owns and must wipe seed; the raw seed bytes decoded here are wiped before returning
// (creds.DecodeSeed, which leaves no unwiped copy, unlike nkeys.DecodeSeed).
func NewSigningKey(seed []byte) (*SigningKey, error) {
	var k *SigningKey
	err := creds.DecodeSeed(seed, func(kind nkeys.PrefixByte, raw []byte) (err error) {
		k, err = newSigningKey(kind, raw)
		return err
	})
	if errors.Is(err, creds.ErrSeedEncoding) {
		return nil, fmt.Errorf("keystore: decode seed: %w", err)
	}
	if err != nil {
		return nil, err
	}
	return k, nil
}

// newSigningKey derives a SigningKey from a raw seed of the given kind. The caller wipes raw;
// the key holds the only copy of the private key, which Wipe zeroes. ed25519.NewKeyFromSeed
// allocates nothing but the key it returns; its intermediate state on the stack is overwritten
// by burnStack.
func newSigningKey(kind nkeys.PrefixByte, raw []byte) (*SigningKey, error) {
	switch kind {
	case nkeys.PrefixByteOperator, nkeys.PrefixByteAccount, nkeys.PrefixByteUser:
	default:
		return nil, fmt.Errorf("keystore: seed of type %s cannot sign JWTs", kind)
	}
	if len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("keystore: seed has %d bytes, want %d", len(raw), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(raw)
	burnStack()
	pub, err := nkeys.Encode(kind, priv.Public().(ed25519.PublicKey))
	if err != nil {
		wipe(priv)
		return nil, fmt.Errorf("keystore: encode public key: %w", err)
	}
	return &SigningKey{prefix: kind, public: string(pub), priv: priv}, nil
}

// PublicKey returns the nkey public key ("A..." for an account signing key).
func (k *SigningKey) PublicKey() (string, error) { return k.public, nil }

// Public returns the nkey public key, computed once from the cached key when it was derived.
func (k *SigningKey) Public() string { return k.public }

// Sign signs input with the cached Ed25519 key.
//
// crypto/ed25519 keeps its own expanded copy of every private key it signs with (a cache keyed
// weakly by the key's address, in Go 1.26), so a key that has signed has one more copy of its
// seed that Wipe cannot reach; the runtime drops it once the wiped key is garbage, without
// zeroing it.
func (k *SigningKey) Sign(input []byte) ([]byte, error) {
	if k.priv == nil {
		return nil, errors.New("keystore: key was wiped")
	}
	return ed25519.Sign(k.priv, input), nil
}

// Verify checks sig over input against this key's public half.
func (k *SigningKey) Verify(input, sig []byte) error {
	if k.priv == nil {
		return errors.New("keystore: key was wiped")
	}
	if !ed25519.Verify(k.priv.Public().(ed25519.PublicKey), input, sig) {
		return nkeys.ErrInvalidSignature
	}
	return nil
}

// Seed refuses: a SigningKey never exports its seed.
func (k *SigningKey) Seed() ([]byte, error) { return nil, ErrExportRefused }

// PrivateKey refuses: a SigningKey never exports its private key.
func (k *SigningKey) PrivateKey() ([]byte, error) { return nil, ErrExportRefused }

// Wipe zeroes the private key. A wiped key refuses to sign.
func (k *SigningKey) Wipe() {
	wipe(k.priv)
	k.priv = nil
}

// Seal is not supported: a SigningKey is not a curve key.
func (k *SigningKey) Seal([]byte, string) ([]byte, error) { return nil, nkeys.ErrInvalidNKeyOperation }

// SealWithRand is not supported: a SigningKey is not a curve key.
func (k *SigningKey) SealWithRand([]byte, string, io.Reader) ([]byte, error) {
	return nil, nkeys.ErrInvalidNKeyOperation
}

// Open is not supported: a SigningKey is not a curve key.
func (k *SigningKey) Open([]byte, string) ([]byte, error) { return nil, nkeys.ErrInvalidNKeyOperation }

// String returns "SigningKey(<public key>)": the private key never prints.
func (k SigningKey) String() string { return "SigningKey(" + k.public + ")" }

// GoString is String, so %#v does not print the private key either.
func (k SigningKey) GoString() string { return k.String() }

// Format prints String for every verb (%v %+v %#v %s %x …). The receiver is a value so that a
// SigningKey copied into another struct still redacts itself.
func (k SigningKey) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }

// LogValue makes slog print only the public key.
func (k SigningKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

// burnStack overwrites the 4 KiB of stack below its caller's frame. ed25519.NewKeyFromSeed
// expands the seed in a struct on the stack (crypto/internal/fips140/ed25519.PrivateKey: the
// seed, the scalar and the nonce prefix), which stays there as garbage after it returns until
// later calls overwrite it; the key derivations call burnStack right after it so that they do
// not leave that copy behind. 4 KiB covers those frames without growing a goroutine's stack
// (growth would move the stack and free the old one with the garbage still in it).
//
//go:noinline
func burnStack() {
	var b [4096]byte
	clear(b[:])
	keepStack(b[:])
}

// keepStack uses b so that the compiler cannot drop the clear in burnStack.
//
//go:noinline
func keepStack(b []byte) { _ = b[len(b)-1] }
