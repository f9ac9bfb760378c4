package watchdog

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1_000_000, 0)} }
func gone(t *testing.T, w *Watchdog) *GoneError {
	t.Helper()
	var ge *GoneError
	if err := w.Check(); !errors.As(err, &ge) || !errors.Is(err, ErrBrokerGone) {
		t.Fatalf("Check = %v; want a GoneError", err)
	}
	return ge
}

func alive(t *testing.T, w *Watchdog) {
	t.Helper()
	if err := w.Check(); err != nil {
		t.Fatalf("Check = %v; want nil", err)
	}
}

func TestWatchdog(t *testing.T) {
	const win, back = 15 * time.Second, 60 * time.Second
	t.Run("ok/connected-never-gone", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		c.add(time.Hour)
		alive(t, w)
	})
	t.Run("fail/gone-after-window", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		if w.Disconnected(io.EOF) {
			t.Fatal("a plain disconnect awaits a renewal")
		}
		c.add(win - time.Millisecond)
		alive(t, w)
		c.add(time.Millisecond)
		if ge := gone(t, w); ge.Limit != "window" || ge.Down != win {
			t.Fatalf("verdict %+v", ge)
		}
	})
	t.Run("ok/reconnect-within-window-clears", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.Disconnected(io.EOF)
		c.add(win - time.Second)
		w.Reconnected()
		c.add(time.Hour)
		alive(t, w)
		// A new disconnect starts a new clock.
		w.Disconnected(io.EOF)
		c.add(win - time.Millisecond)
		alive(t, w)
	})
	t.Run("ok/second-disconnect-keeps-first-time", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		if !w.Down().IsZero() {
			t.Fatal("Down is set while connected")
		}
		w.Disconnected(io.EOF)
		first := c.now()
		c.add(10 * time.Second)
		w.Disconnected(io.EOF)
		if !w.Down().Equal(first) {
			t.Fatalf("Down = %v, want the first disconnect %v", w.Down(), first)
		}
		c.add(5 * time.Second)
		gone(t, w)
		w.Reconnected()
		if !w.Down().IsZero() {
			t.Fatal("Down is still set after the reconnect")
		}
	})
	t.Run("ok/expired-credential-waits-until-backstop", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.AsyncError(nats.ErrAuthExpired)
		if !w.Disconnected(io.EOF) {
			t.Fatal("the disconnect after an expiry does not await a renewal")
		}
		c.add(back - time.Millisecond)
		alive(t, w)
		c.add(time.Millisecond)
		if ge := gone(t, w); ge.Limit != "backstop" || !ge.AwaitingRenewal {
			t.Fatalf("verdict %+v", ge)
		}
	})
	t.Run("ok/expiry-error-on-the-disconnect-itself", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		if !w.Disconnected(errors.New("nats: User Authentication Expired")) {
			t.Fatal("an expiry disconnect does not await a renewal")
		}
		c.add(2 * win)
		alive(t, w)
	})
	t.Run("ok/expiry-seen-while-down", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.Disconnected(io.EOF)
		w.AsyncError(nats.ErrAuthExpired)
		c.add(2 * win)
		alive(t, w)
	})
	t.Run("fail/renewal-restarts-the-window", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.AsyncError(nats.ErrAuthExpired)
		w.Disconnected(io.EOF)
		c.add(30 * time.Second)
		w.Renewed()
		c.add(win - time.Millisecond)
		alive(t, w)
		c.add(time.Millisecond)
		if ge := gone(t, w); ge.Limit != "window" || ge.Down != 30*time.Second+win {
			t.Fatalf("verdict %+v", ge)
		}
	})
	t.Run("fail/backstop-bounds-a-renewed-wait", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.Disconnected(nats.ErrAuthExpired)
		c.add(back - 5*time.Second)
		w.Renewed()
		c.add(5 * time.Second)
		if ge := gone(t, w); ge.Limit != "backstop" {
			t.Fatalf("verdict %+v", ge)
		}
	})
	t.Run("ok/expiry-pending-cleared-by-reconnect", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.AsyncError(nats.ErrAuthExpired)
		w.Reconnected()
		if w.Disconnected(io.EOF) {
			t.Fatal("a stale expiry marked a later disconnect")
		}
	})
	t.Run("ok/other-async-errors-ignored", func(t *testing.T) {
		c := newClock()
		w := New(win, back, c.now)
		w.AsyncError(nats.ErrPermissionViolation)
		if w.Disconnected(io.EOF) {
			t.Fatal("a permission error marked the disconnect")
		}
	})
}

func TestLimits(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name              string
		win, back         time.Duration
		env               map[string]string
		wantWin, wantBack time.Duration
		wantErr           bool
	}{
		{"ok/defaults", 0, 0, nil, DefaultWindow, 4 * DefaultWindow, false},
		{"ok/config", 2 * time.Second, 0, nil, 2 * time.Second, 8 * time.Second, false},
		{"ok/config-backstop", 2 * time.Second, 3 * time.Second, nil, 2 * time.Second, 3 * time.Second, false},
		{"ok/env-wins", 2 * time.Second, 0, map[string]string{EnvWindow: "500"}, 500 * time.Millisecond, 2 * time.Second, false},
		{"ok/env-backstop", 0, 0, map[string]string{EnvBackstop: "70000"}, DefaultWindow, 70 * time.Second, false},
		{"fail/env-not-a-number", 0, 0, map[string]string{EnvWindow: "15s"}, 0, 0, true},
		{"fail/env-zero", 0, 0, map[string]string{EnvWindow: "0"}, 0, 0, true},
		{"fail/backstop-below-window", 10 * time.Second, 5 * time.Second, nil, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, b, err := Limits(tc.win, tc.back, env(tc.env))
			if (err != nil) != tc.wantErr || w != tc.wantWin || b != tc.wantBack {
				t.Fatalf("Limits = %v, %v, %v; want %v, %v, err %v", w, b, err, tc.wantWin, tc.wantBack, tc.wantErr)
			}
		})
	}
}
