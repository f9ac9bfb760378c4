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
		if l.Allow(caller) {
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
	if l.Allow(a) {
		t.Fatal("allowed with an empty bucket")
	}
	clock.Advance(499 * time.Millisecond)
	if l.Allow(a) {
		t.Fatal("allowed before a token refilled (2/s)")
	}
	clock.Advance(time.Millisecond)
	if !l.Allow(a) {
		t.Fatal("refused after one token refilled")
	}
	if l.Allow(a) {
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

func TestLimiterUnknownCaller(t *testing.T) {
	store := NewStore(mustParse(t, limiterPolicy(1, 2)))
	l := NewLimiter(store.Current, newFakeClock().Now)
	for _, c := range []string{"spiffe://td/nobody", "", "garbage"} {
		if l.Allow(c) {
			t.Errorf("Allow(%q) = true for a caller no rule matches", c)
		}
	}
	if n := len(l.buckets); n != 0 {
		t.Errorf("%d buckets for unknown callers, want 0", n)
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
	if l.Allow(a) {
		t.Fatal("swap refilled an exhausted bucket")
	}
	// The unrelated caller's bucket (same rate in both policies) is kept, still empty.
	if l.Allow(o) {
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

	// A caller the new policy drops loses its bucket and is refused.
	store.cur.Store(mustParse(t, callers(readOnly)))
	if l.Allow(a) {
		t.Error("caller dropped from the policy is still allowed")
	}
	if _, ok := l.buckets[a]; ok {
		t.Error("bucket of a dropped caller kept")
	}
}

func TestLimiterPrunesFullBuckets(t *testing.T) {
	clock := newFakeClock()
	store := NewStore(mustParse(t, limiterPolicy(1, 1)))
	l := NewLimiter(store.Current, clock.Now)
	for i := range minPrune {
		if !l.Allow(fmt.Sprintf("spiffe://td/m/s%d", i)) {
			t.Fatalf("caller %d refused its first request", i)
		}
	}
	if len(l.buckets) != minPrune {
		t.Fatalf("%d buckets, want %d", len(l.buckets), minPrune)
	}
	clock.Advance(time.Second) // every bucket refills, so every one is prunable
	if !l.Allow("spiffe://td/m/new") {
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
