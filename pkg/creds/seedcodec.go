package creds

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
)

// RawSeedLen is the length of a decoded nkey seed: an Ed25519 seed or an X25519 scalar.
const RawSeedLen = 32

// encodedSeedLen is the length of an encoded nkey seed: base32 (RFC 4648 alphabet, no padding)
// of two prefix bytes, the 32-byte seed and a CRC-16.
const (
	binarySeedLen  = 2 + RawSeedLen + 2
	encodedSeedLen = (binarySeedLen*8 + 4) / 5
)

// ErrSeedEncoding reports seed text that is not exactly the canonical encoding of a seed. It
// never quotes the text.
var ErrSeedEncoding = errors.New("creds: not a canonical nkey seed")

// DecodeSeed decodes the encoded seed text once, into a buffer of its own, calls f with the
// seed's kind (nkeys.PrefixByteUser, …Account, …Operator, …Curve, …) and the 32 raw bytes,
// and wipes the buffer when f returns. f must not retain raw; it derives a key from it.
//
// Unlike nkeys.DecodeSeed it makes no copy it cannot wipe: Go's base32 decoder copies its
// input to strip newlines and nkeys returns its decode buffer, and neither copy can be
// reached to wipe it. DecodeSeed also refuses anything but the canonical encoding (58
// characters of A–Z and 2–7, no whitespace, padding or stray trailing bits, a valid CRC-16 and
// a known kind), so no two texts decode to the same seed.
func DecodeSeed(text []byte, f func(kind nkeys.PrefixByte, raw []byte) error) error {
	var raw [RawSeedLen]byte
	defer clear(raw[:])
	kind, err := decodeSeed(text, &raw)
	if err != nil {
		return err
	}
	return f(kind, raw[:])
}

// decodeSeed decodes text into raw without an intermediate copy of the text; its only
// intermediate buffer, bin, is wiped before it returns.
func decodeSeed(text []byte, raw *[RawSeedLen]byte) (nkeys.PrefixByte, error) {
	if len(text) != encodedSeedLen {
		return 0, ErrSeedEncoding
	}
	var bin [binarySeedLen]byte
	defer clear(bin[:])
	var acc uint16 // at most 12 bits are pending: 7 left over plus 5 new
	bits, n := 0, 0
	for _, c := range text {
		var v byte
		switch {
		case 'A' <= c && c <= 'Z':
			v = c - 'A'
		case '2' <= c && c <= '7':
			v = c - '2' + 26
		default:
			return 0, ErrSeedEncoding
		}
		acc = acc<<5 | uint16(v)
		bits += 5
		if bits >= 8 {
			bits -= 8
			bin[n] = byte(acc >> bits)
			n++
			acc &= 1<<bits - 1
		}
	}
	// 58 characters carry 290 bits for 288: the two left over must be zero (canonical).
	if n != binarySeedLen || acc != 0 {
		return 0, ErrSeedEncoding
	}
	if crc16(bin[:binarySeedLen-2]) != uint16(bin[binarySeedLen-2])|uint16(bin[binarySeedLen-1])<<8 {
		return 0, ErrSeedEncoding
	}
	// The first two bytes are PrefixByteSeed (5 bits) then the key's kind (5 bits), then
	// three zero bits.
	if nkeys.PrefixByte(bin[0]&0xf8) != nkeys.PrefixByteSeed || bin[1]&0x07 != 0 {
		return 0, ErrSeedEncoding
	}
	kind := nkeys.PrefixByte((bin[0]&0x07)<<5 | bin[1]>>3)
	switch kind {
	case nkeys.PrefixByteOperator, nkeys.PrefixByteServer, nkeys.PrefixByteCluster,
		nkeys.PrefixByteAccount, nkeys.PrefixByteUser, nkeys.PrefixByteCurve:
	default:
		return 0, ErrSeedEncoding
	}
	copy(raw[:], bin[2:2+RawSeedLen])
	return kind, nil
}

// crc16 is the CRC-16/XMODEM checksum nkeys appends (polynomial 0x1021, initial value 0).
func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// PublicKey returns the encoded public key of a raw seed of the given kind, as DecodeSeed hands
// them to its callback. Ed25519 kinds derive the key pair in a buffer that is wiped before
// returning. A curve key (X25519) goes through crypto/ecdh, which keeps a copy of the scalar in
// its own heap object and offers no way to wipe it: that copy stays until the memory is reused.
func PublicKey(kind nkeys.PrefixByte, raw []byte) (string, error) {
	if len(raw) != RawSeedLen {
		return "", fmt.Errorf("creds: raw seed has %d bytes, want %d", len(raw), RawSeedLen)
	}
	var pub []byte
	switch kind {
	case nkeys.PrefixByteOperator, nkeys.PrefixByteServer, nkeys.PrefixByteCluster,
		nkeys.PrefixByteAccount, nkeys.PrefixByteUser:
		priv := ed25519.NewKeyFromSeed(raw)
		defer clear(priv)
		pub = priv.Public().(ed25519.PublicKey)
	case nkeys.PrefixByteCurve:
		k, err := ecdh.X25519().NewPrivateKey(raw)
		if err != nil {
			return "", fmt.Errorf("creds: curve seed: %w", err)
		}
		pub = k.PublicKey().Bytes()
	default:
		return "", fmt.Errorf("creds: unknown seed kind %s", kind)
	}
	enc, err := nkeys.Encode(kind, pub)
	if err != nil {
		return "", fmt.Errorf("creds: encode public key: %w", err)
	}
	return string(enc), nil
}
