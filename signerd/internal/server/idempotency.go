package server

import (
	"container/list"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// Bounds of the idempotency cache.
const (
	// DefaultIdempotencyBytes is the cache's byte budget when Config leaves it 0.
	DefaultIdempotencyBytes = 64 << 20
	// DefaultIdempotencyCallerBytes is one caller's share when Config leaves it 0.
	DefaultIdempotencyCallerBytes = 16 << 20
	// idemEntryOverhead is what an entry costs beyond its response and key bytes: the entry,
	// two list elements and a map slot, rounded up.
	idemEntryOverhead = 256
)

// idemCache remembers Mint answers by (caller, request_id) for a fixed window so a retry returns
// the same credential. It is per replica (ARCHITECTURE §7).
//
// It is bounded in bytes, not entries: each entry is charged its marshalled response plus its
// key plus idemEntryOverhead, because one large agent credential weighs a hundred times a small
// one. A caller over its own quota (callerMax) loses its own oldest entries, never another
// caller's. When the whole budget (max) is reached, the entry that goes is the oldest of the
// caller holding the most bytes, so a caller within its fair share keeps its entries while
// another floods. An entry larger than callerMax is not kept at all.
//
// An entry is tied to the digest of the policy it was granted under: under any other policy it
// is not served (see get), so a replay never hands out a credential the current policy would
// not grant or would grant differently.
type idemCache struct {
	ttl       time.Duration
	max       int64
	callerMax int64

	mu      sync.Mutex // guards everything below
	order   *list.List // of *idemEntry, oldest first; with one fixed TTL, also expiry order
	entries map[idemKey]*idemEntry
	callers map[string]*idemCaller
	bytes   int64
}

type idemKey struct{ caller, requestID string }

type idemEntry struct {
	key     idemKey
	digest  [32]byte // of the request
	policy  string   // digest of the policy the answer was granted under
	resp    proto.Message
	size    int64
	expires time.Time
	el      *list.Element // in idemCache.order
	own     *list.Element // in its caller's order
}

// idemCaller is one caller's share of the cache.
type idemCaller struct {
	order *list.List // of *idemEntry, oldest first
	bytes int64
}

func newIdemCache(ttl time.Duration, max, callerMax int64) *idemCache {
	return &idemCache{ttl: ttl, max: max, callerMax: min(callerMax, max), order: list.New(),
		entries: map[idemKey]*idemEntry{}, callers: map[string]*idemCaller{}}
}

// get returns the stored answer for key. same reports whether the stored request digest equals
// digest; found is false when nothing live is stored under policyDigest. An entry stored under
// another policy is dropped: the request is decided again and answered per the current policy.
func (c *idemCache) get(key idemKey, digest [32]byte, policyDigest string, now time.Time) (resp proto.Message, same, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked(now)
	e, ok := c.entries[key]
	if !ok {
		return nil, false, false
	}
	if e.policy != policyDigest {
		c.removeLocked(e)
		return nil, false, false
	}
	return e.resp, e.digest == digest, true
}

// put stores an answer granted under policyDigest. If an entry for key under the same policy
// appeared meanwhile (a concurrent duplicate), the first one stays and is returned so both
// callers get the same credential; one under another policy is replaced.
func (c *idemCache) put(key idemKey, digest [32]byte, policyDigest string, resp proto.Message, now time.Time) (stored proto.Message, same bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked(now)
	if e, ok := c.entries[key]; ok {
		if e.policy == policyDigest {
			return e.resp, e.digest == digest
		}
		c.removeLocked(e)
	}
	size := int64(proto.Size(resp)+len(key.caller)+len(key.requestID)) + idemEntryOverhead
	if size > c.callerMax {
		// It cannot fit in any share; keeping it would evict everything else of the caller.
		return resp, true
	}
	// Evict first, then look the owner up again: removeLocked drops a caller left empty.
	if owner := c.callers[key.caller]; owner != nil {
		for owner.bytes+size > c.callerMax {
			c.removeLocked(owner.order.Front().Value.(*idemEntry))
		}
	}
	for c.bytes+size > c.max {
		c.removeLocked(c.heaviestLocked().order.Front().Value.(*idemEntry))
	}
	owner := c.callers[key.caller]
	if owner == nil {
		owner = &idemCaller{order: list.New()}
		c.callers[key.caller] = owner
	}
	e := &idemEntry{key: key, digest: digest, policy: policyDigest, resp: resp, size: size, expires: now.Add(c.ttl)}
	e.el = c.order.PushBack(e)
	e.own = owner.order.PushBack(e)
	owner.bytes += size
	c.bytes += size
	c.entries[key] = e
	return resp, true
}

// heaviestLocked returns the caller holding the most bytes; the cache must not be empty.
// c.mu must be held. It scans the callers: they are the identities the policy lets mint, few
// compared with the entries.
func (c *idemCache) heaviestLocked() *idemCaller {
	var top *idemCaller
	for _, o := range c.callers {
		if top == nil || o.bytes > top.bytes {
			top = o
		}
	}
	return top
}

// removeLocked drops e from every index. c.mu must be held.
func (c *idemCache) removeLocked(e *idemEntry) {
	owner := c.callers[e.key.caller]
	owner.order.Remove(e.own)
	owner.bytes -= e.size
	if owner.order.Len() == 0 {
		delete(c.callers, e.key.caller)
	}
	c.order.Remove(e.el)
	c.bytes -= e.size
	delete(c.entries, e.key)
}

// expireLocked drops expired entries. c.mu must be held.
func (c *idemCache) expireLocked(now time.Time) {
	for front := c.order.Front(); front != nil; front = c.order.Front() {
		e := front.Value.(*idemEntry)
		if now.Before(e.expires) {
			return
		}
		c.removeLocked(e)
	}
}
