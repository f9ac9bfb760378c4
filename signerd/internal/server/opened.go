package server

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// Bounds of the opened-request cache.
const (
	// OpenedCacheBytes bounds the sealed bytes the opened-request cache accounts for; the oldest
	// entries go first when a new one would pass it.
	OpenedCacheBytes = 8 << 20
	// OpenedCacheTTL is how long an opened request is kept for the SignCalloutResponse that
	// follows its OpenCalloutRequest (authd asks for both within one callout round trip).
	OpenedCacheTTL = 10 * time.Second
)

// openedCache remembers the authorization requests OpenCalloutRequest opened and verified, so
// the SignCalloutResponse for the same sealed bytes takes the verified claims instead of
// decrypting and verifying the box a second time. An entry is keyed by the space it was opened
// for and the SHA-256 of the server xkey and the sealed bytes, so a hit is the same server-signed
// request signerd verified itself: the answer stays bound to it, never to what authd says. A
// take removes the entry (one answer per open); a miss falls back to a full open. The request's
// own expiry is checked again on every use (verifyCalloutRequest's last case).
type openedCache struct {
	mu      sync.Mutex
	budget  int
	ttl     time.Duration
	used    int
	entries map[openedKey]*list.Element
	order   *list.List // of *openedEntry, oldest first
}

type openedKey struct {
	sp  *keystore.Space
	sum [sha256.Size]byte
}

type openedEntry struct {
	key   openedKey
	ac    *jwt.AuthorizationRequestClaims
	size  int
	added time.Time
}

func newOpenedCache(budget int, ttl time.Duration) *openedCache {
	return &openedCache{budget: budget, ttl: ttl, entries: make(map[openedKey]*list.Element), order: list.New()}
}

func openedKeyOf(sp *keystore.Space, sealed []byte, serverXKey string) openedKey {
	h := sha256.New()
	h.Write([]byte(serverXKey))
	h.Write([]byte{0})
	h.Write(sealed)
	k := openedKey{sp: sp}
	h.Sum(k.sum[:0])
	return k
}

// put remembers ac, opened and verified from sealed, first dropping the entries older than the
// TTL and then the oldest while the budget would be passed.
func (c *openedCache) put(k openedKey, ac *jwt.AuthorizationRequestClaims, size int, now time.Time) {
	if size > c.budget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		return
	}
	for front := c.order.Front(); front != nil; front = c.order.Front() {
		if e := front.Value.(*openedEntry); c.used+size <= c.budget && now.Sub(e.added) <= c.ttl {
			break
		}
		c.removeLocked(front)
	}
	c.entries[k] = c.order.PushBack(&openedEntry{key: k, ac: ac, size: size, added: now})
	c.used += size
}

// take returns and forgets the claims cached under k, or nil when there are none younger than
// the cache's TTL.
func (c *openedCache) take(k openedKey, now time.Time) *jwt.AuthorizationRequestClaims {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil
	}
	e := c.removeLocked(el)
	if now.Sub(e.added) > c.ttl || now.Before(e.added) {
		return nil
	}
	return e.ac
}

func (c *openedCache) removeLocked(el *list.Element) *openedEntry {
	e := c.order.Remove(el).(*openedEntry)
	delete(c.entries, e.key)
	c.used -= e.size
	return e
}

// len reports how many entries the cache holds (for tests).
func (c *openedCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
