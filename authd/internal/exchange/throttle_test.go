package exchange

import (
	"fmt"
	"testing"
	"time"
)

// TestThrottleTable: the budget of one source, its window, and the table's bound.
func TestThrottleTable(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	t.Run("ok/budget-and-window", func(t *testing.T) {
		th := NewThrottle(3, time.Minute, 8)
		for i := range 3 {
			if th.Fail("a", t0.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("failure %d reported spent", i+1)
			}
		}
		if !th.Spent("a", t0.Add(3*time.Second)) || !th.Fail("a", t0.Add(3*time.Second)) {
			t.Fatal("the 4th failure within the window is not spent")
		}
		if th.Spent("b", t0) {
			t.Fatal("another source is spent")
		}
		// Failures past the budget are not recorded: the first one leaves the window a minute
		// after it fell, whatever came after.
		if th.Spent("a", t0.Add(time.Minute)) {
			t.Fatal("still spent once the first failure left the window")
		}
	})
	t.Run("ok/bounded-lru", func(t *testing.T) {
		const size = 16
		th := NewThrottle(2, time.Minute, size)
		// Every source fails twice (spends its budget): "keep" first, then size*4 others, with
		// "keep" failing again (refreshing it) every few of them.
		th.Fail("keep", t0)
		th.Fail("keep", t0)
		for i := range size * 4 {
			th.Fail(fmt.Sprintf("src-%d", i), t0)
			th.Fail(fmt.Sprintf("src-%d", i), t0)
			if i%(size/2) == 0 {
				th.Fail("keep", t0)
			}
			if n := th.len(); n > size {
				t.Fatalf("table holds %d sources, bound %d", n, size)
			}
		}
		if n := th.len(); n != size {
			t.Fatalf("table holds %d sources, want %d", n, size)
		}
		if !th.Spent("keep", t0) {
			t.Fatal("a recently failed source was evicted")
		}
		if !th.Spent(fmt.Sprintf("src-%d", size*4-1), t0) {
			t.Fatal("the last source to fail was evicted")
		}
		// src-0 spent its budget and was evicted: it starts again from nothing.
		if th.Spent("src-0", t0) || th.Fail("src-0", t0) {
			t.Fatal("an evicted source came back with its old failures")
		}
	})
	t.Run("ok/keys", func(t *testing.T) {
		if got := PeerKey(ClassCap, "127.0.0.2:5555"); got != "cap 127.0.0.2" {
			t.Fatalf("PeerKey = %q", got)
		}
		if got := PeerKey(ClassAgent, "[::1]:5555"); got != "agent ::1" {
			t.Fatalf("PeerKey = %q", got)
		}
		a, b := IdentityKey("https://idp", "alice"), IdentityKey("https://idp", "bob")
		if a == b || len(a) != len("owner ")+64 {
			t.Fatalf("IdentityKey = %q, %q", a, b)
		}
	})
}
