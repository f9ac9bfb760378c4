package exchange

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"sync"
	"time"
)

// Throttle counts refused exchanges per source over a sliding window, in a table of bounded size.
// It is safe for concurrent use, and one Throttle may be shared by several handlers (the
// exchange and the service endpoint doors, Config.Throttle), so their refusals count in one
// window.
//
// A source is a string the handler builds from the class of credential that failed and where the
// request came from (see sourceKey): wrong capabilities per peer address, refused agent tokens per
// peer address, refused IdP tokens per peer address, and refusals of one verified IdP identity
// wherever it calls from. Only failures are recorded, and a request presenting a correct
// credential never consults a budget other callers can fill: the cap is compared before the cap
// budget is looked at, an agent token before the agent budget, an IdP token before the IdP budget.
// The one budget consulted before the work is a verified IdP identity's own, which only the
// holder of that identity's tokens can spend, and it guards the work that costs signerd calls.
//
// The table holds at most size sources; a new source past that evicts the one that failed least
// recently. A loopback caller can pick its source address from all of 127.0.0.0/8, so without
// the bound a caller could grow the table without end; evicting forgets a source's past failures,
// which costs at most another window of refusals from it, never a refused correct credential.
type Throttle struct {
	max    int
	window time.Duration
	size   int

	mu    sync.Mutex
	order *list.List               // of *source; front: most recently failed
	bySrc map[string]*list.Element // key -> element of order
}

// source is one tracked key: the times of its failures in the window, oldest first, at most max.
type source struct {
	key   string
	times []time.Time
}

// NewFailureThrottle is the loopback face's failure window: MaxFailures refusals per source in
// FailureWindow, at most MaxSources sources.
func NewFailureThrottle() *Throttle { return NewThrottle(MaxFailures, FailureWindow, MaxSources) }

// NewThrottle returns a throttle allowing max failures per source in window, tracking at most
// size sources.
func NewThrottle(max int, window time.Duration, size int) *Throttle {
	return &Throttle{max: max, window: window, size: size, order: list.New(), bySrc: map[string]*list.Element{}}
}

// prune drops the failures of s that fell out of the window. t.mu must be held.
func (t *Throttle) prune(s *source, now time.Time) {
	cut := 0
	for cut < len(s.times) && now.Sub(s.times[cut]) >= t.window {
		cut++
	}
	s.times = s.times[cut:]
}

// Spent reports whether key holds max failures in the window, without recording anything.
func (t *Throttle) Spent(key string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.bySrc[key]
	if !ok {
		return false
	}
	s := el.Value.(*source)
	t.prune(s, now)
	return len(s.times) >= t.max
}

// Fail records one failure of key and reports whether key had already spent its budget. A failure
// past the budget is not recorded, so a source is free again one window after the failure that
// spent it, however long it keeps trying.
func (t *Throttle) Fail(key string, now time.Time) (spent bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.bySrc[key]; ok {
		s := el.Value.(*source)
		t.prune(s, now)
		if len(s.times) >= t.max {
			return true
		}
		s.times = append(s.times, now)
		t.order.MoveToFront(el)
		return false
	}
	if t.order.Len() >= t.size {
		oldest := t.order.Back()
		t.order.Remove(oldest)
		delete(t.bySrc, oldest.Value.(*source).key)
	}
	t.bySrc[key] = t.order.PushFront(&source{key: key, times: append(make([]time.Time, 0, 1), now)})
	return false
}

// len is how many sources the table holds.
func (t *Throttle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}

// Classes of failure a source key names (PeerKey). Another handler sharing the throttle may use
// classes of its own.
const (
	ClassCap   = "cap"   // a missing or wrong capability, per peer address
	ClassAgent = "agent" // a refused agent-arm exchange, per peer address
	ClassIdP   = "idp"   // an IdP token that did not verify, per peer address
	classOwner = "owner" // a refused exchange of one verified IdP identity, from anywhere
)

// PeerKey is the failure source of class for a request from remoteAddr (host:port): the host, so
// one caller's many connections share it. An address that does not parse is kept whole.
func PeerKey(class, remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	return class + " " + host
}

// IdentityKey is the failure source of one verified IdP identity: a hash, so a key's size does
// not depend on how long a subject the IdP signs.
func IdentityKey(issuer, subject string) string {
	sum := sha256.Sum256([]byte(issuer + "\x00" + subject))
	return classOwner + " " + hex.EncodeToString(sum[:])
}
