package keystore

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/nacl/box"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/nkey"
)

// xkeyVersion and xkeyNonceLen frame a sealed callout box as nkeys and nats-server do (nkeys
// XKeyVersionV1): "xkv1", a 24-byte nonce, then the NaCl box.
const (
	xkeyVersion  = nkeys.XKeyVersionV1
	xkeyNonceLen = 24
)

// curveKey is the callout xkey: an X25519 private key derived once from its raw seed. It seals
// and opens boxes exactly as an nkeys curve key pair does. It is not an nkeys key pair because
// nkeys builds one only from the encoded seed text, decoding it with copies that cannot be
// wiped (creds.DecodeSeed explains them).
//
// What this type cannot wipe: each Seal and Open, and the one public-key derivation in
// newCurveKey, go through crypto/ecdh (via x/crypto's curve25519), which copies the scalar into
// a heap object of its own with no way to clear it. Those copies are garbage once the call
// returns and stay in memory until it is reused.
//
// The shared key of each peer (a broker's server xkey) is derived once and kept, so a callout's
// open and seal cost no X25519 multiplication each (it was a fifth of signerd's work per callout).
// A shared key is a secret as strong as the seed for that peer: the cache lives next to the seed,
// holds at most maxSharedKeys peers (a full cache starts again, so a caller naming many keys costs
// only the derivations it forces), and Wipe clears it with the seed.
type curveKey struct {
	seed   [creds.RawSeedLen]byte
	public string

	mu     sync.Mutex
	shared map[[32]byte]*[32]byte
}

// maxSharedKeys bounds the peers whose shared keys are kept: a space has a broker xkey per
// server, a handful in a cluster.
const maxSharedKeys = 64

// newCurveKey derives the xkey from a raw curve seed; the caller wipes raw.
func newCurveKey(kind nkeys.PrefixByte, raw []byte) (*curveKey, error) {
	if kind != nkeys.PrefixByteCurve {
		return nil, fmt.Errorf("keystore: seed of type %s is not a curve (xkey) seed", kind)
	}
	pub, err := creds.PublicKey(kind, raw)
	if err != nil {
		return nil, fmt.Errorf("keystore: xkey: %w", err)
	}
	k := &curveKey{public: pub}
	copy(k.seed[:], raw)
	return k, nil
}

// Public returns the xkey's curve public key ("X…"), computed once when it was derived.
func (k *curveKey) Public() string { return k.public }

// Seal boxes input from k to recipient, a curve public key, with a random nonce.
func (k *curveKey) Seal(input []byte, recipient string) ([]byte, error) {
	return k.sealWithRand(input, recipient, rand.Reader)
}

func (k *curveKey) sealWithRand(input []byte, recipient string, rr io.Reader) ([]byte, error) {
	rpub, err := decodeCurvePublic(recipient)
	if err != nil {
		return nil, nkeys.ErrInvalidRecipient
	}
	var nonce [xkeyNonceLen]byte
	if _, err := io.ReadFull(rr, nonce[:]); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(xkeyVersion)+xkeyNonceLen+box.Overhead+len(input))
	out = append(append(out, xkeyVersion...), nonce[:]...)
	shared, keep := k.sharedWith(&rpub)
	keep()
	return box.SealAfterPrecomputation(out, input, &nonce, shared), nil
}

// Open opens input, a box sealed to k by sender (a curve public key). It refuses a box without
// the xkv1 framing, a sender that is not a curve public key and a box that fails authentication.
func (k *curveKey) Open(input []byte, sender string) ([]byte, error) {
	if len(input) <= len(xkeyVersion)+xkeyNonceLen {
		return nil, nkeys.ErrInvalidEncrypted
	}
	if !bytes.Equal(input[:len(xkeyVersion)], []byte(xkeyVersion)) {
		return nil, nkeys.ErrInvalidEncVersion
	}
	var nonce [xkeyNonceLen]byte
	copy(nonce[:], input[len(xkeyVersion):])
	spub, err := decodeCurvePublic(sender)
	if err != nil {
		return nil, nkeys.ErrInvalidSender
	}
	shared, keep := k.sharedWith(&spub)
	out, ok := box.OpenAfterPrecomputation(nil, input[len(xkeyVersion)+xkeyNonceLen:], &nonce, shared)
	if !ok {
		return nil, nkeys.ErrCouldNotDecrypt
	}
	keep() // only a peer that sealed a valid box is remembered
	return out, nil
}

// sharedWith returns the shared key with peer, cached or derived now, and keep, which caches a
// derived one (a no-op for a cached one). A shared key is never cleared while in use: the cache
// drops its pointers when full (those keys, like crypto/ecdh's scalar copies, stay in memory until
// reused) and only Wipe clears the keys themselves, when the key is being destroyed.
func (k *curveKey) sharedWith(peer *[32]byte) (*[32]byte, func()) {
	k.mu.Lock()
	s, ok := k.shared[*peer]
	k.mu.Unlock()
	if ok {
		return s, func() {}
	}
	s = new([32]byte)
	box.Precompute(s, peer, &k.seed)
	return s, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.shared == nil || len(k.shared) >= maxSharedKeys {
			k.shared = make(map[[32]byte]*[32]byte) // the dropped keys may be in use: not cleared
		}
		k.shared[*peer] = s
	}
}

// Wipe zeroes the scalar and every cached shared key. A wiped key opens nothing it was sealed for.
func (k *curveKey) Wipe() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.seed[:])
	for _, s := range k.shared {
		clear(s[:])
	}
	k.shared = nil
}

// decodeCurvePublic decodes a curve public key ("X…").
func decodeCurvePublic(pub string) ([32]byte, error) {
	var out [32]byte
	if !nkey.IsCurve(pub) {
		return out, nkeys.ErrInvalidCurveKey
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(pub))
	if err != nil || len(raw) != len(out) {
		return out, nkeys.ErrInvalidCurveKey
	}
	copy(out[:], raw)
	return out, nil
}

// ErrNoXKey is returned by OpenCallout and SealCallout on a Space that holds no callout xkey
// (a zero Space, not one made by Open).
var ErrNoXKey = errors.New("keystore: space holds no callout xkey")

// XKeyError says which callout xkey operation failed and with which peer key. The peer key is a
// server's public curve key, never a secret, so the error may name it.
type XKeyError struct {
	// Op is "open" or "seal".
	Op string
	// Space is the space whose xkey was used.
	Space string
	// Peer is the server's curve public key the box was meant to come from or go to.
	Peer string
	// Err is the nkeys cause (for example nkeys.ErrCouldNotDecrypt or nkeys.ErrInvalidSender).
	Err error
}

func (e *XKeyError) Error() string {
	return fmt.Sprintf("keystore: space %q: %s callout box with server xkey %.64q: %v", e.Space, e.Op, e.Peer, e.Err)
}

// Unwrap returns the nkeys cause.
func (e *XKeyError) Unwrap() error { return e.Err }

// OpenCallout opens an authorization request that a NATS server sealed to this space's callout
// xkey; serverXKey is the server's curve public key (the Nats-Server-Xkey header). It refuses a
// serverXKey that is not a curve public key, a box not sealed by that server to this xkey, and
// any box that fails authentication. The xkey itself never leaves the keystore.
func (sp *Space) OpenCallout(sealed []byte, serverXKey string) ([]byte, error) {
	if sp.xkey == nil {
		return nil, ErrNoXKey
	}
	if sp.isClosed() {
		return nil, ErrSpaceClosed
	}
	if !nkey.IsCurve(serverXKey) {
		return nil, &XKeyError{Op: "open", Space: sp.Name, Peer: serverXKey, Err: nkeys.ErrInvalidSender}
	}
	data, err := sp.xkey.Open(sealed, serverXKey)
	if err != nil {
		return nil, &XKeyError{Op: "open", Space: sp.Name, Peer: serverXKey, Err: err}
	}
	return data, nil
}

// SealCallout seals data (an authorization response JWT) from this space's callout xkey to the
// server's curve public key serverXKey, so that only that server can open it. It refuses a
// serverXKey that is not a curve public key.
func (sp *Space) SealCallout(data []byte, serverXKey string) ([]byte, error) {
	if sp.xkey == nil {
		return nil, ErrNoXKey
	}
	if sp.isClosed() {
		return nil, ErrSpaceClosed
	}
	if !nkey.IsCurve(serverXKey) {
		return nil, &XKeyError{Op: "seal", Space: sp.Name, Peer: serverXKey, Err: nkeys.ErrInvalidRecipient}
	}
	out, err := sp.xkey.Seal(data, serverXKey)
	if err != nil {
		return nil, &XKeyError{Op: "seal", Space: sp.Name, Peer: serverXKey, Err: err}
	}
	return out, nil
}
