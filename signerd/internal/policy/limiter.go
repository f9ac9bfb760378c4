package policy

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter enforces each caller's Rate: one token bucket per caller identity (not per entry, so
// the many managerd instances one pattern matches do not starve each other).
//
// It is kept out of Decide so Decide stays pure. The server calls Decide first and then, for
// every request whose caller matched an entry (Decision.Caller != ""), Limiter.Allow, charging
// denied requests too so that a known caller cannot flood the audit log with denials; a denial
// keeps Decide's reason, and an allowed request that finds the bucket empty is refused with
// ReasonRateLimited. A caller that matches no entry never gets a bucket.
//
// The Limiter reads the current policy on each call, so a policy swap retunes a caller's bucket
// (rate and burst) the next time it is used, keeping its tokens; buckets of other callers are
// not touched. A caller the new policy no longer lists loses its bucket.
type Limiter struct {
	policy func() *Policy
	now    func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket // by caller identity; mu must be held
	// pruneAt is the map size at which full buckets are next dropped; mu must be held.
	pruneAt int
}

type bucket struct {
	lim    *rate.Limiter
	policy *Policy // the policy the bucket was last tuned from
	rate   Rate
}

// minPrune is the bucket count below which the Limiter never prunes.
const minPrune = 1024

// NewLimiter returns a Limiter that takes rates from policy (typically Store.Current) and time
// from now (time.Now when nil). It panics if policy is nil: a limiter with no policy cannot
// fail closed meaningfully, and that is a programming error.
func NewLimiter(policy func() *Policy, now func() time.Time) *Limiter {
	if policy == nil {
		panic("policy: NewLimiter with nil policy source")
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{policy: policy, now: now, buckets: make(map[string]*bucket), pruneAt: minPrune}
}

// Allow takes one token from caller's bucket and reports whether there was one. It refuses a
// caller that the current policy does not match.
func (l *Limiter) Allow(caller string) bool {
	p := l.policy()
	now := l.now()

	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[caller]
	if b == nil || b.policy != p {
		ps, burst, ok := p.Rate(caller)
		if !ok {
			delete(l.buckets, caller)
			return false
		}
		r := Rate{PerSecond: ps, Burst: burst}
		switch {
		case b == nil:
			l.prune(now)
			b = &bucket{lim: rate.NewLimiter(rate.Limit(ps), burst), rate: r}
			l.buckets[caller] = b
		case b.rate != r:
			// Retune in place: the caller keeps the tokens it has (up to the new burst), so a
			// reload neither refills an exhausted caller nor empties a quiet one.
			b.lim.SetLimitAt(now, rate.Limit(ps))
			b.lim.SetBurstAt(now, burst)
			b.rate = r
		}
		b.policy = p
	}
	return b.lim.AllowN(now, 1)
}

// prune drops buckets that are full: a full bucket behaves exactly like a new one, so dropping
// it changes no decision and bounds memory by the callers active within one refill period.
// l.mu must be held.
func (l *Limiter) prune(now time.Time) {
	if len(l.buckets) < l.pruneAt {
		return
	}
	for k, b := range l.buckets {
		if b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(l.buckets, k)
		}
	}
	l.pruneAt = max(minPrune, 2*len(l.buckets))
}
