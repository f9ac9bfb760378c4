// Package watchdog is deliveryd's broker-gone watchdog (reference/delivery.md §3): driven by the
// resident connection's own disconnect and reconnect events, with no second dial, it declares the
// broker gone once the connection has been down for the window (default 15 s,
// COTAL_DELIVERY_BROKER_GONE_MS), or for the backstop (default 4× the window,
// COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS) whatever else holds. A disconnect the broker caused
// because the credential expired is not the broker going away: it waits for a proven renewal
// (which restarts the window) and is fatal only at the backstop. A reconnect clears the clock.
//
// Time is measured on an injected monotonic clock. Upstream also credits event-loop lag so CPU
// starvation does not count; Go's scheduler does not starve a timer the way a busy Node loop
// does, so only the backstop guards that case here.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Defaults and the environment variables that override them.
const (
	DefaultWindow  = 15 * time.Second
	BackstopFactor = 4
	EnvWindow      = "COTAL_DELIVERY_BROKER_GONE_MS"
	EnvBackstop    = "COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS"
	// Tick is how often Run evaluates the clock (upstream's 250 ms).
	Tick = 250 * time.Millisecond
)

// ErrBrokerGone matches every verdict of the watchdog.
var ErrBrokerGone = errors.New("watchdog: broker gone")

// GoneError is the verdict: how long the connection was down and which limit it passed.
type GoneError struct {
	Down  time.Duration
	Limit string // "window" or "backstop"
	Max   time.Duration
	// AwaitingRenewal says the disconnect was a credential expiry still waiting for a renewal.
	AwaitingRenewal bool
}

func (e *GoneError) Error() string {
	what := "no broker"
	if e.AwaitingRenewal {
		what = "credential expired and no renewal was proven"
	}
	return fmt.Sprintf("watchdog: broker gone: %s for %v (the %s is %v)", what, e.Down.Round(time.Millisecond), e.Limit, e.Max)
}

// Is reports whether target is ErrBrokerGone.
func (e *GoneError) Is(target error) bool { return target == ErrBrokerGone }

// Limits resolves the window and backstop: an environment value (whole milliseconds, positive)
// wins over the configured one, a zero configured window is DefaultWindow and a zero backstop is
// BackstopFactor times the window. It refuses a malformed environment value, naming it, and a
// backstop shorter than the window.
func Limits(window, backstop time.Duration, getenv func(string) string) (time.Duration, time.Duration, error) {
	env := func(name string, d *time.Duration) error {
		v := getenv(name)
		if v == "" {
			return nil
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(24*time.Hour/time.Millisecond) {
			return fmt.Errorf("watchdog: %s=%q: want a positive whole number of milliseconds", name, v)
		}
		*d = time.Duration(ms) * time.Millisecond
		return nil
	}
	if err := env(EnvWindow, &window); err != nil {
		return 0, 0, err
	}
	if err := env(EnvBackstop, &backstop); err != nil {
		return 0, 0, err
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if backstop <= 0 {
		backstop = BackstopFactor * window
	}
	if backstop < window {
		return 0, 0, fmt.Errorf("watchdog: backstop %v is shorter than the window %v", backstop, window)
	}
	return window, backstop, nil
}

// Watchdog keeps the clock. Its methods are safe for concurrent use; the event methods are meant
// to be called from the connection's handlers (see Options).
type Watchdog struct {
	window, backstop time.Duration
	now              func() time.Time

	mu sync.Mutex // guards what follows
	// down is when the connection went down; zero while connected.
	down time.Time
	// origin is when the window started: the disconnect, or a proven renewal since.
	origin time.Time
	// awaiting: the disconnect was a credential expiry and no renewal has been proven since.
	awaiting bool
	// expiryPending: the broker said the credential expired; the disconnect that follows is one.
	expiryPending bool
}

// New makes a watchdog with the given limits (see Limits) and clock (nil: time.Now).
func New(window, backstop time.Duration, now func() time.Time) *Watchdog {
	if now == nil {
		now = time.Now
	}
	return &Watchdog{window: window, backstop: backstop, now: now}
}

// Window and Backstop are the limits in force.
func (w *Watchdog) Window() time.Duration   { return w.window }
func (w *Watchdog) Backstop() time.Duration { return w.backstop }

// IsAuthExpired reports whether err is the broker ending a connection whose credential expired.
func IsAuthExpired(err error) bool {
	return err != nil && (errors.Is(err, nats.ErrAuthExpired) || strings.Contains(strings.ToLower(err.Error()), "user authentication expired"))
}

// AsyncError records an asynchronous connection error: an authentication expiry marks the
// disconnect that follows (or the one in progress) as awaiting a renewal.
func (w *Watchdog) AsyncError(err error) {
	if !IsAuthExpired(err) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down.IsZero() {
		w.expiryPending = true
	} else {
		w.awaiting = true
	}
}

// Disconnected starts the clock (a second call while down keeps the first time). It reports
// whether this disconnect awaits a renewal rather than counting against the window.
func (w *Watchdog) Disconnected(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down.IsZero() {
		w.down = w.now()
		w.origin = w.down
		w.awaiting = false
	}
	if w.expiryPending || IsAuthExpired(err) {
		w.awaiting = true
	}
	w.expiryPending = false
	return w.awaiting
}

// Reconnected clears the clock.
func (w *Watchdog) Reconnected() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down, w.origin, w.awaiting, w.expiryPending = time.Time{}, time.Time{}, false, false
}

// Renewed records a proven credential renewal: a disconnect that awaited one now counts against
// the window again, from now (the connection reconnects with the fresh credential at once).
func (w *Watchdog) Renewed() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expiryPending = false
	if w.down.IsZero() {
		return
	}
	w.awaiting = false
	w.origin = w.now()
}

// Down is when the connection went down, zero while it is up: where a stop that waits for the
// broker (the lease release of Close) starts its broker-gone window.
func (w *Watchdog) Down() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.down
}

// Check is the verdict now: nil, or a *GoneError.
func (w *Watchdog) Check() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down.IsZero() {
		return nil
	}
	now := w.now()
	if d := now.Sub(w.down); d >= w.backstop {
		return &GoneError{Down: d, Limit: "backstop", Max: w.backstop, AwaitingRenewal: w.awaiting}
	}
	if w.awaiting {
		return nil
	}
	if now.Sub(w.origin) >= w.window {
		return &GoneError{Down: now.Sub(w.down), Limit: "window", Max: w.window}
	}
	return nil
}

// Run evaluates the clock every tick until ctx ends (nil) or the verdict is gone (the
// *GoneError).
func (w *Watchdog) Run(ctx context.Context, tick time.Duration) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := w.Check(); err != nil {
				return err
			}
		}
	}
}
