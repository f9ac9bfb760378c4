package authority

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAliasLocks: the stock writers' per-alias lock admits one holder per alias at a time, never
// blocks another alias, gives up when the waiter's context ends without leaking the lock, and
// forgets an alias nobody holds or waits for.
func TestAliasLocks(t *testing.T) {
	var l aliasLocks
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	unlockA, err := l.lock(ctx, "u_x.bob")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ok/another alias is not blocked", func(t *testing.T) {
		unlock, err := l.lock(ctx, "u_x.carol")
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	})
	t.Run("fail/a second holder of the alias waits until its context ends", func(t *testing.T) {
		wctx, wcancel := context.WithCancel(ctx)
		wcancel()
		if _, err := l.lock(wctx, "u_x.bob"); !errors.Is(err, context.Canceled) {
			t.Fatalf("lock = %v, want context.Canceled", err)
		}
	})
	t.Run("ok/the next holder enters once the first leaves", func(t *testing.T) {
		got := make(chan func(), 1)
		go func() {
			unlock, err := l.lock(ctx, "u_x.bob")
			if err != nil {
				close(got)
				return
			}
			got <- unlock
		}()
		select {
		case <-got:
			t.Fatal("a second holder entered while the first held the alias")
		default:
		}
		unlockA()
		select {
		case unlock, ok := <-got:
			if !ok {
				t.Fatal("the second holder gave up")
			}
			unlock()
		case <-ctx.Done():
			t.Fatal("the second holder never entered")
		}
	})
	t.Run("ok/an alias nobody holds is forgotten", func(t *testing.T) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			l.mu.Lock()
			n := len(l.m)
			l.mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d aliases still tracked", n)
			}
			time.Sleep(time.Millisecond) // poll: the canceled waiter's release runs in its goroutine
		}
	})
}
