package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func TestWatchdogInterval(t *testing.T) {
	for _, tt := range []struct {
		name, usec, pid string
		want            time.Duration
		on, err         bool
	}{
		{"ok/unset", "", "", 0, false, false},
		{"ok/half", "2000000", "", time.Second, true, false},
		{"ok/this pid", "1000000", strconv.Itoa(os.Getpid()), 500 * time.Millisecond, true, false},
		{"ok/another pid", "1000000", "1", 0, false, false},
		{"fail/garbage", "x", "", 0, false, true},
		{"fail/zero", "0", "", 0, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			got, on, err := WatchdogInterval()
			if got != tt.want || on != tt.on || (err != nil) != tt.err {
				t.Fatalf("got %v %v %v, want %v %v err=%v", got, on, err, tt.want, tt.on, tt.err)
			}
		})
	}
}

// TestWatchdog: pings while healthy, none while not (counted against the health checks made
// since), pings again once healthy, and returns when the context ends.
func TestWatchdog(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "40000") // a ping every 20 ms
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var sick atomic.Bool
	var checks atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watchdog(ctx, func() error {
			checks.Add(1)
			if sick.Load() {
				return errors.New("lease lost")
			}
			return nil
		}, nil)
	}()
	read := func(d time.Duration) (string, bool) {
		_ = conn.SetReadDeadline(time.Now().Add(d))
		b := make([]byte, 64)
		n, err := conn.Read(b)
		if err != nil {
			return "", false
		}
		return string(b[:n]), true
	}
	for i := 0; i < 3; i++ {
		if msg, ok := read(5 * time.Second); !ok || msg != "WATCHDOG=1" {
			t.Fatalf("ping %d: %q %v", i, msg, ok)
		}
	}
	sick.Store(true)
	// Drain what was sent before the switch took effect, then require 5 checks without a ping.
	start := checks.Load()
	for checks.Load() < start+2 {
		read(10 * time.Millisecond)
	}
	from := checks.Load()
	for checks.Load() < from+5 {
		if msg, ok := read(10 * time.Millisecond); ok {
			t.Fatalf("pinged %q while unhealthy", msg)
		}
	}
	sick.Store(false)
	if msg, ok := read(5 * time.Second); !ok || msg != "WATCHDOG=1" {
		t.Fatalf("no ping once healthy again: %q %v", msg, ok)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watchdog did not return when its context ended")
	}
}
