// Package creds holds secret material on disk and in memory: the Seed type that redacts itself
// and refuses serialisation, checks that secret files and directories are private to the
// effective uid, atomic 0600 writes, and NATS .nk seed files and .creds files.
//
// Nothing in this package logs, prints or returns a seed in an error. Buffers that held seed
// text or raw seed bytes are wiped after use; DecodeSeed decodes a seed without the copies
// nkeys.DecodeSeed leaves behind.
package creds

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nkeys"
)

// Redacted is what every textual form of a Seed prints.
const Redacted = "REDACTED"

// ErrNoSeed reports a nil, empty or wiped Seed.
var ErrNoSeed = errors.New("creds: no seed (nil, empty or wiped)")

// ErrSerialize is returned by every marshalling method of Seed: a seed is never serialised by
// accident (JSON, text, YAML through encoding.TextMarshaler). Write it on purpose with
// WriteSeedFile or WriteCreds.
var ErrSerialize = errors.New("creds: refusing to serialise a seed")

// Seed holds an encoded nkey seed ("SU…", "SA…", "SO…", "SX…"). Its bytes are private: every
// formatting, logging and marshalling path prints REDACTED or fails, and Wipe zeroes them.
//
// The formatting methods have value receivers so that a Seed copied by value into another
// struct still redacts itself when that struct is printed.
type Seed struct {
	b []byte
}

// NewSeed returns a Seed holding a copy of b. The caller should wipe b when done with it.
// NewSeed does not validate; KeyPair and Public refuse bytes that are not a valid seed.
func NewSeed(b []byte) *Seed {
	return &Seed{b: append([]byte(nil), b...)}
}

// SeedFromKeyPair copies the seed out of kp. kp is left untouched; the caller still owns it
// and should Wipe it when done.
func SeedFromKeyPair(kp nkeys.KeyPair) (*Seed, error) {
	if kp == nil {
		return nil, ErrNoSeed
	}
	b, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("creds: key pair has no seed: %w", err)
	}
	s := NewSeed(b)
	// kp.Seed returns the key pair's own buffer for signing keys, which kp still needs, but a
	// freshly encoded one for curve keys, which only we hold: wipe that one.
	if pub, err := kp.PublicKey(); err == nil && nkeys.IsValidPublicCurveKey(pub) {
		wipe(b)
	}
	return s, nil
}

// KeyPair decodes the seed into a new key pair. The key pair holds its own copy: the caller
// should Wipe it when done. It refuses a nil, empty or wiped Seed and a seed that is not
// canonically encoded.
//
// nkeys.FromSeed decodes the seed once more to check it, and Go's base32 decoder copies the text
// to do so; that copy and nkeys' decode buffer are left to the garbage collector, unwiped. Code
// that only needs a key derived from the seed (signerd's key store) uses UseRaw instead.
func (s *Seed) KeyPair() (nkeys.KeyPair, error) {
	if _, err := s.Prefix(); err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed(s.b)
	if err != nil {
		// The nkeys errors never quote the seed.
		return nil, fmt.Errorf("creds: invalid seed: %w", err)
	}
	return kp, nil
}

// Public returns the public key of the seed (for example "UA…" for a user seed), decoding it
// once with UseRaw (see PublicKey for the one copy crypto/ecdh keeps of a curve seed).
func (s *Seed) Public() (string, error) {
	var pub string
	err := s.UseRaw(func(kind nkeys.PrefixByte, raw []byte) (err error) {
		pub, err = PublicKey(kind, raw)
		return err
	})
	return pub, err
}

// Prefix returns the kind of key the seed encodes (nkeys.PrefixByteUser, …Account, …Operator,
// …Curve), so callers can refuse a seed of the wrong kind before using it.
func (s *Seed) Prefix() (nkeys.PrefixByte, error) {
	var kind nkeys.PrefixByte
	err := s.UseRaw(func(k nkeys.PrefixByte, _ []byte) error { kind = k; return nil })
	return kind, err
}

// UseRaw decodes the seed once with DecodeSeed and calls f with its kind and raw bytes, which
// are wiped when f returns. f must not retain raw. UseRaw refuses a nil, empty or wiped Seed
// and a seed that is not canonically encoded.
func (s *Seed) UseRaw(f func(kind nkeys.PrefixByte, raw []byte) error) error {
	if s.empty() {
		return ErrNoSeed
	}
	if err := DecodeSeed(s.b, f); err != nil {
		if errors.Is(err, ErrSeedEncoding) {
			return fmt.Errorf("creds: invalid seed: %w", err)
		}
		return err
	}
	return nil
}

// Use calls f with the seed bytes. This is the one way the raw bytes leave the type, for
// writing files and building key pairs. f must not retain, print or log the slice; it is the
// Seed's own buffer. Use refuses a nil, empty or wiped Seed.
func (s *Seed) Use(f func(seed []byte) error) error {
	if s.empty() {
		return ErrNoSeed
	}
	return f(s.b)
}

// Wipe zeroes the seed bytes; afterwards every accessor returns ErrNoSeed. Wipe on nil is a
// no-op.
func (s *Seed) Wipe() {
	if s == nil {
		return
	}
	wipe(s.b)
	s.b = nil
}

func (s *Seed) empty() bool { return s == nil || len(s.b) == 0 }

// String returns REDACTED.
func (Seed) String() string { return Redacted }

// GoString returns REDACTED, so %#v does not print the bytes.
func (Seed) GoString() string { return Redacted }

// Format prints REDACTED for every verb (%v %+v %#v %s %q %x %d …).
func (Seed) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(Redacted)) }

// LogValue makes slog print REDACTED whatever the handler.
func (Seed) LogValue() slog.Value { return slog.StringValue(Redacted) }

// MarshalJSON refuses: a seed never goes into JSON.
func (Seed) MarshalJSON() ([]byte, error) { return nil, ErrSerialize }

// MarshalText refuses: a seed never goes into a text encoding (YAML, TOML, map keys).
func (Seed) MarshalText() ([]byte, error) { return nil, ErrSerialize }

// wipe zeroes b in place.
func wipe(b []byte) { clear(b) }

var (
	_ fmt.Stringer   = Seed{}
	_ fmt.GoStringer = Seed{}
	_ fmt.Formatter  = Seed{}
	_ slog.LogValuer = Seed{}
)
