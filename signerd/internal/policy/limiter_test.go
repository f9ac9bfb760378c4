package policy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a manually advanced clock.
type fakeClock struct{ t atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.t.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.t.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.t.Add(int64(d)) }

func limiterPolicy(perSecond float64, burst int) string {
	return callers(fmt.Sprintf(`  - id: spiffe://td/m/{space}
    rpcs: [GetSpace]
    spaces: ["{space}"]
    rate: {per_second: %v, burst: %d}
  - id: spiffe://td/other
    rpcs: [GetSpace]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
`, perSecond, burst))
}

// allowN calls Allow n times and returns how many were allowed.
func allowN(l *Limiter, caller string, n int) int {
	ok := 0
	for range n {
		if l.Allow(caller) == Allowed {
			ok++
		}
	}
	return ok
}

func TestLimiterBurstRefuseRefill(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(2, 3)))
	l := NewLimiter(store.Current, clock.Now)
	const a = "spiffe://td/m/alpha"

	if got := allowN(l, a, 5); got != 3 {
		t.Fatalf("burst: allowed %d of 5, want 3", got)
	}
	if v := l.Allow(a); v != OverCallerRate {
		t.Fatalf("empty bucket: verdict %v, want OverCallerRate", v)
	}
	clock.Advance(499 * time.Millisecond)
	if l.Allow(a) == Allowed {
		t.Fatal("allowed before a token refilled (2/s)")
	}
	clock.Advance(time.Millisecond)
	if l.Allow(a) != Allowed {
		t.Fatal("refused after one token refilled")
	}
	if l.Allow(a) == Allowed {
		t.Fatal("allowed a second time after one refill")
	}
	clock.Advance(time.Hour)
	if got := allowN(l, a, 10); got != 3 {
		t.Fatalf("after a long pause allowed %d, want burst 3", got)
	}
}

func TestLimiterPerIdentity(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(1, 2)))
	l := NewLimiter(store.Current, clock.Now)
	// Two identities matched by the same pattern have separate buckets.
	if got := allowN(l, "spiffe://td/m/alpha", 5); got != 2 {
		t.Errorf("alpha allowed %d, want 2", got)
	}
	if got := allowN(l, "spiffe://td/m/beta", 5); got != 2 {
		t.Errorf("beta allowed %d, want 2", got)
	}
	if got := allowN(l, "spiffe://td/other", 5); got != 1 {
		t.Errorf("other allowed %d, want 1", got)
	}
}

// TestLimiterUnknownCallerLimited is finding 3 of issue 7: identities the policy does not
// know, and keys of certificates without an identity, had no bucket at all, so their refusals
// were unbounded. Each now gets its own bucket at the unknown-caller rate.
func TestLimiterUnknownCallerLimited(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(1, 2)))
	l := NewLimiter(store.Current, clock.Now)
	def := DefaultLimits().UnknownCallers
	for _, c := range []string{"spiffe://td/nobody", "sha256:00ff", "-"} {
		if got := allowN(l, c, 100); got != def.Burst {
			t.Errorf("%q: allowed %d of 100, want the unknown-caller burst %d", c, got, def.Burst)
		}
		if v := l.Allow(c); v != OverCallerRate {
			t.Errorf("%q past its burst: verdict %v, want OverCallerRate", c, v)
		}
	}
	// The policy's limits block sets the rate.
	store.cur.Store(mustParse(t, "limits:\n  unknown_callers: {per_second: 1, burst: 1}\n"+limiterPolicy(1, 2)))
	clock.Advance(time.Hour)
	if got := allowN(l, "spiffe://td/nobody", 10); got != 1 {
		t.Errorf("after the swap allowed %d, want the configured burst 1", got)
	}
}

// TestLimiterGlobalCap: one bucket over all callers, asked after the caller's own, which it
// does not charge when it refuses.
func TestLimiterGlobalCap(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, "limits:\n  global: {per_second: 1, burst: 3}\n"+limiterPolicy(100, 100)))
	l := NewLimiter(store.Current, clock.Now)
	const a, b = "spiffe://td/m/alpha", "spiffe://td/m/beta"
	if got := allowN(l, a, 2); got != 2 {
		t.Fatalf("alpha allowed %d, want 2", got)
	}
	if got := allowN(l, b, 1); got != 1 {
		t.Fatalf("beta allowed %d, want 1", got)
	}
	if v := l.Allow(b); v != OverGlobalRate {
		t.Fatalf("past the global burst: verdict %v, want OverGlobalRate", v)
	}
	if r := OverGlobalRate.Reason(); r != ReasonGlobalRateLimited {
		t.Errorf("reason %q, want %q", r, ReasonGlobalRateLimited)
	}
	// The refused request did not take beta's token: beta has 99 left.
	if got := l.buckets[b].lim.TokensAt(clock.Now()); got != 99 {
		t.Errorf("beta has %v tokens after a global refusal, want 99", got)
	}
	// A caller over its own rate does not use up the global bucket.
	store.cur.Store(mustParse(t, "limits:\n  global: {per_second: 1, burst: 3}\n"+limiterPolicy(1, 1)))
	clock.Advance(time.Hour)
	if got := allowN(l, "spiffe://td/other", 1000); got != 1 {
		t.Fatalf("other allowed %d, want 1", got)
	}
	if got := allowN(l, a, 10); got != 1 {
		t.Errorf("after another caller's flood alpha allowed %d, want its burst 1", got)
	}
}

func TestLimiterRetuneOnSwap(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(1, 2)))
	l := NewLimiter(store.Current, clock.Now)
	const a, o = "spiffe://td/m/alpha", "spiffe://td/other"

	if got := allowN(l, a, 2); got != 2 {
		t.Fatalf("alpha allowed %d, want 2", got)
	}
	if got := allowN(l, o, 1); got != 1 {
		t.Fatalf("other allowed %d, want 1", got)
	}
	otherBucket := l.buckets[o]

	// A bigger burst and rate: the exhausted caller is not refilled by the swap, but refills at
	// the new rate.
	store.cur.Store(mustParse(t, limiterPolicy(10, 5)))
	if l.Allow(a) == Allowed {
		t.Fatal("swap refilled an exhausted bucket")
	}
	// The unrelated caller's bucket (same rate in both policies) is kept, still empty.
	if l.Allow(o) == Allowed {
		t.Error("unrelated bucket was reset by the swap")
	}
	if l.buckets[o] != otherBucket {
		t.Error("unrelated bucket was replaced")
	}
	clock.Advance(200 * time.Millisecond) // 2 tokens at 10/s
	if got := allowN(l, a, 5); got != 2 {
		t.Fatalf("after retune allowed %d, want 2", got)
	}
	clock.Advance(time.Second)
	if got := allowN(l, a, 10); got != 5 {
		t.Fatalf("after refill allowed %d, want the new burst 5", got)
	}

	// A smaller burst clamps what a quiet caller has saved.
	clock.Advance(time.Hour)
	store.cur.Store(mustParse(t, limiterPolicy(1, 1)))
	if got := allowN(l, a, 5); got != 1 {
		t.Fatalf("after shrinking burst allowed %d, want 1", got)
	}

	// A caller the new policy drops falls to the unknown-caller rate, keeping its tokens.
	store.cur.Store(mustParse(t, callers(readOnly)))
	if v := l.Allow(a); v != OverCallerRate {
		t.Errorf("caller dropped from the policy with an empty bucket: verdict %v, want OverCallerRate", v)
	}
	clock.Advance(time.Hour)
	if got, want := allowN(l, a, 100), DefaultLimits().UnknownCallers.Burst; got != want {
		t.Errorf("caller dropped from the policy allowed %d, want the unknown-caller burst %d", got, want)
	}
}

func TestLimiterPrunesFullBuckets(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(1, 1)))
	l := NewLimiter(store.Current, clock.Now)
	for i := range minPrune {
		if l.Allow(fmt.Sprintf("spiffe://td/m/s%d", i)) != Allowed {
			t.Fatalf("caller %d refused its first request", i)
		}
	}
	if len(l.buckets) != minPrune {
		t.Fatalf("%d buckets, want %d", len(l.buckets), minPrune)
	}
	clock.Advance(time.Second) // every bucket refills, so every one is prunable
	if l.Allow("spiffe://td/m/new") != Allowed {
		t.Fatal("new caller refused")
	}
	if len(l.buckets) != 1 {
		t.Errorf("%d buckets after pruning, want 1", len(l.buckets))
	}
}

func TestNewLimiterNilPolicyPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewLimiter(nil, ...) did not panic")
		}
	}()
	NewLimiter(nil, nil)
}

// BenchmarkLimiterAllow is the rate limit's cost per request (one caller bucket and the global
// one), to compare with a Mint's ~130 µs (BENCHMARKS.md).
func BenchmarkLimiterAllow(b *testing.B) {
	store := NewStore(mustParse(b, "limits:\n  global: {per_second: 1e12, burst: 1000000000}\n"+limiterPolicy(1e12, 1000000000)))
	l := NewLimiter(store.Current, nil)
	b.ReportAllocs()
	for b.Loop() {
		if l.Allow("spiffe://td/m/alpha") != Allowed {
			b.Fatal("refused")
		}
	}
}
