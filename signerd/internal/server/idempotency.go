package server

import (
	"container/list"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// idemCache remembers Mint answers by (caller, request_id) for a fixed window so a retry returns
// the same credential. Entries are kept in insertion order; with one fixed TTL that is also
// expiry order, so eviction pops from the front. It is per replica (ARCHITECTURE §7).
type idemCache struct {
	ttl time.Duration
	max int

	mu      sync.Mutex // guards order and entries
	order   *list.List // of *idemEntry, oldest first
	entries map[idemKey]*list.Element
}

type idemKey struct{ caller, requestID string }

type idemEntry struct {
	key     idemKey
	digest  [32]byte
	resp    proto.Message
	expires time.Time
}

func newIdemCache(ttl time.Duration, max int) *idemCache {
	return &idemCache{ttl: ttl, max: max, order: list.New(), entries: map[idemKey]*list.Element{}}
}

// get returns the stored answer for key. same reports whether the stored request digest equals
// digest; found is false when nothing live is stored.
func (c *idemCache) get(key idemKey, digest [32]byte, now time.Time) (resp proto.Message, same, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked(now)
	el, ok := c.entries[key]
	if !ok {
		return nil, false, false
	}
	e := el.Value.(*idemEntry)
	return e.resp, e.digest == digest, true
}

// put stores an answer. If an entry for key appeared meanwhile (a concurrent duplicate), the
// first one stays and is returned so both callers get the same credential.
func (c *idemCache) put(key idemKey, digest [32]byte, resp proto.Message, now time.Time) (stored proto.Message, same bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked(now)
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*idemEntry)
		return e.resp, e.digest == digest
	}
	for c.order.Len() >= c.max {
		front := c.order.Front()
		delete(c.entries, front.Value.(*idemEntry).key)
		c.order.Remove(front)
	}
	c.entries[key] = c.order.PushBack(&idemEntry{key: key, digest: digest, resp: resp, expires: now.Add(c.ttl)})
	return resp, true
}

// expireLocked drops expired entries. c.mu must be held.
func (c *idemCache) expireLocked(now time.Time) {
	for front := c.order.Front(); front != nil; front = c.order.Front() {
		e := front.Value.(*idemEntry)
		if now.Before(e.expires) {
			return
		}
		delete(c.entries, e.key)
		c.order.Remove(front)
	}
}
