package policy

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter enforces the request rates: one token bucket per caller key, and one global bucket
// over every request.
//
// A caller key is the caller's identity, or for a client certificate that carries no usable
// identity, a key derived from the certificate itself (signerd uses "sha256:" and the hex
// SHA-256 of the leaf). A key the policy matches (Policy.Rate) gets its entry's Rate, one bucket
// per identity, not per entry, so the many managerd instances one pattern matches do not starve
// each other; any other key gets Limits.UnknownCallers. No key goes unlimited: an identity the
// policy does not know, or a certificate without an identity, can only be refused, and every
// refusal costs signerd an audit line.
//
// It is kept out of Decide so Decide stays pure. The server asks Allow right after
// authentication, before it reads the request, and charges every request, denied or not: a
// caller past its rate is refused before its bytes are parsed, validated or audited one by one.
// The caller's own bucket is asked first, so a caller flooding past its rate does not use up the
// global bucket; a request its own bucket allows takes a token from both only if the global
// bucket has one too.
//
// The Limiter reads the current policy on each call, so a policy swap retunes a caller's bucket
// (rate and burst) the next time it is used, keeping its tokens; buckets of other callers are
// not touched. The same holds for the global bucket.
type Limiter struct {
	policy func() *Policy
	now    func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket // by caller key; mu must be held
	global  *bucket            // mu must be held
	// pruneAt is the map size at which full buckets are next dropped; mu must be held.
	pruneAt int
}

type bucket struct {
	lim    *rate.Limiter
	policy *Policy // the policy the bucket was last tuned from
	rate   Rate
}

// ReasonGlobalRateLimited is the audit and metrics reason of a request the global bucket
// refused. It is not one of Reasons: the caller sees ReasonRateLimited either way, and only the
// operator learns which bucket it was.
const ReasonGlobalRateLimited Reason = "global-rate-limited"

// Verdict is what Limiter.Allow decided.
type Verdict int

// The verdicts of Allow.
const (
	// Allowed: a token was taken from the caller's bucket and from the global one.
	Allowed Verdict = iota
	// OverCallerRate: the caller's own bucket was empty.
	OverCallerRate
	// OverGlobalRate: the caller's bucket had a token, the global bucket did not; neither was
	// charged.
	OverGlobalRate
)

// Reason is the reason code of a refusal: ReasonRateLimited for the caller's own rate,
// ReasonGlobalRateLimited for the global cap, "" for Allowed.
func (v Verdict) Reason() Reason {
	switch v {
	case OverCallerRate:
		return ReasonRateLimited
	case OverGlobalRate:
		return ReasonGlobalRateLimited
	default:
		return ""
	}
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

// Allow charges one request to key's bucket and to the global bucket and says whether both had
// a token. It never refuses to rate a key: a key the current policy does not match is limited
// at the policy's unknown-caller rate.
func (l *Limiter) Allow(key string) Verdict {
	p := l.policy()
	now := l.now()
	limits := p.Limits()

	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil || b.policy != p {
		r := limits.UnknownCallers
		if ps, burst, ok := p.Rate(key); ok {
			r = Rate{PerSecond: ps, Burst: burst}
		}
		if b == nil {
			l.prune(now)
			b = &bucket{}
			l.buckets[key] = b
		}
		b.tune(p, r, now)
	}
	if l.global == nil {
		l.global = &bucket{}
	}
	if l.global.policy != p {
		l.global.tune(p, limits.Global, now)
	}
	// Ask both before charging either, so a refusal by the global cap leaves the caller's
	// tokens alone (mu makes the two reads and the two charges one step).
	switch {
	case b.lim.TokensAt(now) < 1:
		return OverCallerRate
	case l.global.lim.TokensAt(now) < 1:
		return OverGlobalRate
	}
	b.lim.AllowN(now, 1)
	l.global.lim.AllowN(now, 1)
	return Allowed
}

// tune sets b to r under policy p. A new bucket starts full; an existing one is retuned in
// place: the caller keeps the tokens it has (up to the new burst), so a reload neither refills
// an exhausted caller nor empties a quiet one.
func (b *bucket) tune(p *Policy, r Rate, now time.Time) {
	switch {
	case b.lim == nil:
		b.lim = rate.NewLimiter(rate.Limit(r.PerSecond), r.Burst)
	case b.rate != r:
		b.lim.SetLimitAt(now, rate.Limit(r.PerSecond))
		b.lim.SetBurstAt(now, r.Burst)
	}
	b.rate, b.policy = r, p
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
