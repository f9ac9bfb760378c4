package keystore

import (
	"bytes"
	"testing"

	"github.com/nats-io/nkeys"
)

// TestCurveKeySharedCache checks the cache of shared keys per peer: a cached key seals and opens
// exactly as a derived one, a failed open remembers nothing, a full cache starts again, and Wipe
// zeroes every cached key.
func TestCurveKeySharedCache(t *testing.T) {
	newPeer := func(t *testing.T) (nkeys.KeyPair, string, [32]byte) {
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
		raw, err := decodeCurvePublic(pub)
		if err != nil {
			t.Fatal(err)
		}
		return kp, pub, raw
	}
	own, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	ownSeed, err := own.Seed()
	if err != nil {
		t.Fatal(err)
	}
	kind, raw, err := nkeys.DecodeSeed(ownSeed)
	if err != nil {
		t.Fatal(err)
	}
	k, err := newCurveKey(kind, raw)
	if err != nil {
		t.Fatal(err)
	}
	cached := func(peer [32]byte) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		_, ok := k.shared[peer]
		return ok
	}
	server, serverPub, serverRaw := newPeer(t)
	msg := []byte("request")

	t.Run("ok/cached-key-opens-and-seals", func(t *testing.T) {
		for i := range 3 { // the first derives, the rest use the cache
			sealed, err := server.Seal(msg, k.Public())
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.Open(sealed, serverPub)
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("open %d: %q, %v", i, got, err)
			}
			out, err := k.Seal(msg, serverPub)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := server.Open(out, k.Public()); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("server open %d: %q, %v", i, got, err)
			}
		}
		if !cached(serverRaw) {
			t.Fatal("the server's shared key is not cached")
		}
	})
	t.Run("fail/failed-open-caches-nothing", func(t *testing.T) {
		_, otherPub, otherRaw := newPeer(t)
		sealed, err := server.Seal(msg, k.Public())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Open(sealed, otherPub); err == nil {
			t.Fatal("a box opened as if sealed by another peer")
		}
		if cached(otherRaw) {
			t.Fatal("a peer whose box failed is cached")
		}
	})
	t.Run("ok/full-cache-starts-again", func(t *testing.T) {
		for range maxSharedKeys + 1 {
			_, pub, _ := newPeer(t)
			if _, err := k.Seal(msg, pub); err != nil {
				t.Fatal(err)
			}
		}
		k.mu.Lock()
		n := len(k.shared)
		k.mu.Unlock()
		if n == 0 || n > maxSharedKeys {
			t.Fatalf("cache holds %d keys, want 1..%d", n, maxSharedKeys)
		}
		sealed, err := server.Seal(msg, k.Public())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := k.Open(sealed, serverPub); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("open after the cache started again: %q, %v", got, err)
		}
	})
	t.Run("ok/wipe-zeroes-cached-keys", func(t *testing.T) {
		k.mu.Lock()
		var keys []*[32]byte
		for _, s := range k.shared {
			keys = append(keys, s)
		}
		k.mu.Unlock()
		if len(keys) == 0 {
			t.Fatal("nothing cached before the wipe")
		}
		k.Wipe()
		for i, s := range keys {
			if *s != ([32]byte{}) {
				t.Fatalf("cached shared key %d not zeroed", i)
			}
		}
		if k.shared != nil {
			t.Fatal("the cache survived the wipe")
		}
	})
}
