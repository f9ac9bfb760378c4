package term

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// deafChild puts its terminal in raw mode (no echo), says so, and never reads its input again:
// an agent that stopped reading stdin.
var deafChild = []string{"/bin/sh", "-c", "stty raw -echo; echo deaf; exec sleep 600"}

// fill is more than a PTY buffers (the line discipline's 4 KiB and the kernel's 64 KiB).
var fill = bytes.Repeat([]byte("x"), 1<<20)

// within runs f and fails the test when it has not returned after d: a write that ignored its
// context would block for ever.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestWriteTakesTheCallersContext: with a child that never reads its terminal, a write returns
// at its deadline with what it wrote, a writer queued behind a stuck one gives up at its own
// deadline, a cancelled writer returns, and the next writer is not cut short by an earlier
// writer's deadline.
func TestWriteTakesTheCallersContext(t *testing.T) {
	term, cmd := start(t, Options{}, nil, deafChild...)
	// The deaf child reads nothing, so only the hangup's SIGHUP would end it when the terminal
	// closes, and a test run under nohup (SIGHUP ignored, which children inherit) never sends it
	// one that counts. Killed first (cleanups run last-registered first), so start's cleanup
	// still proves the terminal's close and the child's wait.
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	snap, out, _, detach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer detach()
	collect(snap, out).waitFor(t, "deaf")

	t.Run("fail/a write the agent does not take returns at its deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		var n int
		within(t, 10*time.Second, "a write with a deadline", func() { n, err = term.Write(ctx, fill) })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("write = %d, %v; want context.DeadlineExceeded", n, err)
		}
		if n >= len(fill) {
			t.Fatalf("wrote %d bytes, all of them, to a child that does not read", n)
		}
	})
	t.Run("fail/a writer queued behind a stuck one gives up at its own deadline", func(t *testing.T) {
		first, cancelFirst := context.WithCancel(context.Background())
		defer cancelFirst()
		firstErr := make(chan error, 1)
		go func() { _, err := term.Write(first, fill); firstErr <- err }()
		// The first writer holds the lock until it is cancelled (the agent takes no more). Wait
		// until it has it, so the second really queues.
		deadline := time.Now().Add(10 * time.Second)
		for len(term.writing) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the first writer never took the write lock")
			}
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		var n int
		within(t, 10*time.Second, "a queued write with a deadline", func() { n, err = term.Write(ctx, []byte("z")) })
		if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("queued write = %d, %v; want 0, context.DeadlineExceeded", n, err)
		}
		cancelFirst()
		within(t, 10*time.Second, "a cancelled write", func() { err = <-firstErr })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled write = %v; want context.Canceled", err)
		}
	})
	t.Run("ok/Close releases a stuck writer and later writes are refused", func(t *testing.T) {
		stuck := make(chan error, 1)
		go func() { _, err := term.Write(context.Background(), fill); stuck <- err }()
		deadline := time.Now().Add(10 * time.Second)
		for len(term.writing) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the writer never took the write lock")
			}
			time.Sleep(time.Millisecond)
		}
		within(t, 10*time.Second, "Close with a writer blocked", func() { _ = term.Close() })
		within(t, 10*time.Second, "the blocked writer", func() { err = <-stuck })
		if err == nil {
			t.Fatal("a write into a closed terminal succeeded")
		}
		if _, err := term.Write(context.Background(), []byte("x")); !errors.Is(err, ErrClosed) {
			t.Fatalf("write after Close = %v, want ErrClosed", err)
		}
	})
}

// TestWriteNextWriterKeepsItsTime: an earlier writer's deadline, or its cancellation callback,
// never cuts a later write short: a reading child receives every byte of a write made right
// after a timed-out one.
func TestWriteNextWriterKeepsItsTime(t *testing.T) {
	term, _ := start(t, Options{}, nil, "/bin/sh", "-c", "stty raw -echo; echo ready; exec cat")
	snap, out, _, detach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer detach()
	c := collect(snap, out)
	c.waitFor(t, "ready")
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // already done: gives up before writing anything
		if n, err := term.Write(ctx, []byte("lost")); n != 0 || !errors.Is(err, context.Canceled) {
			t.Fatalf("write with a cancelled context = %d, %v", n, err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		want := []byte("kept-" + string(rune('a'+i)) + ";")
		if n, err := term.Write(ctx, want); n != len(want) || err != nil {
			t.Fatalf("write %d = %d, %v", i, n, err)
		}
		cancel()
	}
	c.waitFor(t, "kept-t;")
	if bytes.Contains(c.bytes(), []byte("lost")) {
		t.Fatalf("a cancelled write reached the child: %q", c.bytes())
	}
}
