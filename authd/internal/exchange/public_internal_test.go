package exchange

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestPeerLimiterBounded: the peer table never holds more than its size; the least recently seen
// peer is the one evicted (and comes back with a fresh burst), a recently seen one keeps its
// spent bucket.
func TestPeerLimiterBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newPeerLimiter(rate.Limit(0.001), 1, 4, func() time.Time { return now })
	for i := range 4 {
		if _, ok := l.allow(fmt.Sprintf("10.0.0.%d", i)); !ok {
			t.Fatalf("peer %d refused its first request", i)
		}
	}
	// 10.0.0.0 is seen again (spent, refused) and so becomes the most recent.
	if wait, ok := l.allow("10.0.0.0"); ok || wait <= 0 {
		t.Fatalf("spent peer = %v, %v; want refused with a wait", wait, ok)
	}
	for i := 4; i < 100; i++ {
		l.allow(fmt.Sprintf("10.0.1.%d", i))
		if n := l.len(); n > 4 {
			t.Fatalf("table holds %d peers, bound 4", n)
		}
	}
	if _, ok := l.allow("10.0.0.1"); !ok {
		t.Fatal("an evicted peer did not come back with a fresh bucket")
	}
}
