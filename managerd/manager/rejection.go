package manager

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/provision"
)

// Rejection handling (seed 001, "Rejection handling"). Every call the manager makes into code its
// host supplied (RuntimeOptions.Launcher and .Provisioner, the Events, OnFirstSeen and Now
// callbacks, the Logger's handler) goes through a guard: a panic, with any value, nil included,
// is recovered, and an error whose text or chain cannot be read (a typed nil pointer whose Error
// dereferences it, say) is replaced; either becomes a *Rejection carrying RejectionText of the
// value. The manager logs it, raises a HOOK warning (Event.Err is the *Rejection), and refuses
// the request it was serving with that text (a spawn: LAUNCH_FAILED or PROVISION_FAILED,
// INTERNAL; a stop: STOP_UNPROVEN or PROVISION_FAILED), or, for background work (a renewal, the
// reaping at start), counts it as that work's failure, and keeps serving. A panicking Events
// callback drops that event and is logged; a panicking logger drops that line and raises one
// HOOK warning at a time; a panicking clock is replaced by time.Now for that reading.

// UnreadableRejection is what a rejection value whose text cannot be read reports as.
const UnreadableRejection = daemon.UnreadableRejection

// Rejection is a host-supplied call that panicked or returned an unreadable error, as the
// manager logs it, raises it (the Err of a HOOK warning) and refuses with it (daemon.Rejection).
type Rejection = daemon.Rejection

// RejectionText is the text of a rejection value: "nil" for nil, an error's Error(), a
// fmt.Stringer's String(), else fmt.Sprint's; UnreadableRejection when reading it panics. It
// never panics.
func RejectionText(v any) string { return daemon.RejectionText(v) }

// hookFailed logs err and raises a HOOK warning when it is a *Rejection, and returns it.
func (m *Manager) hookFailed(err error) error {
	var rj *Rejection
	if !errors.As(err, &rj) {
		return err
	}
	m.log.Error("a host-supplied call was rejected; the manager goes on", "hook", rj.Hook, "panicked", rj.Panicked, "rejection", rj.Text)
	m.tr.Warn(CodeHook, "a host-supplied call was rejected; the manager goes on", rj)
	return err
}

// guardedLauncher is the host's Launcher behind the guard.
type guardedLauncher struct {
	l Launcher
	m *Manager
}

func (g guardedLauncher) Launch(ctx context.Context, req LaunchRequest) (child Child, master *os.File, err error) {
	err = daemon.Guard("the launcher's Launch", func() error {
		var e error
		child, master, e = g.l.Launch(ctx, req)
		return e
	})
	return child, master, g.m.hookFailed(err)
}

func (g guardedLauncher) Signal(ctx context.Context, child Child, sig syscall.Signal) error {
	return g.m.hookFailed(daemon.Guard("the launcher's Signal", func() error { return g.l.Signal(ctx, child, sig) }))
}

func (g guardedLauncher) ReplaceMaterial(ctx context.Context, child Child, material []byte) error {
	return g.m.hookFailed(daemon.Guard("the launcher's ReplaceMaterial", func() error { return g.l.ReplaceMaterial(ctx, child, material) }))
}

// guardedProvisioner is the host's Provisioner behind the guard.
type guardedProvisioner struct {
	p Provisioner
	m *Manager
}

func (g guardedProvisioner) Provision(ctx context.Context, a AgentSpec) (names []string, err error) {
	err = daemon.Guard("the provisioner's Provision", func() error {
		var e error
		names, e = g.p.Provision(ctx, a)
		return e
	})
	return names, g.m.hookFailed(err)
}

func (g guardedProvisioner) Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (res provision.Result, err error) {
	err = daemon.Guard("the provisioner's Deprovision", func() error {
		var e error
		res, e = g.p.Deprovision(ctx, owner, actor, uid, memberChannels)
		return e
	})
	return res, g.m.hookFailed(err)
}

// guardedClock is RuntimeOptions.Now behind the guard: a panic reads time.Now instead, logged.
func (m *Manager) guardedClock(now func() time.Time) func() time.Time {
	return func() time.Time {
		var t time.Time
		if err := daemon.Guard("the clock (Now)", func() error { t = now(); return nil }); err != nil {
			m.log.Error("the host's clock panicked; time.Now is read instead", "err", err)
			return time.Now()
		}
		return t
	}
}

// onFirstSeen calls RuntimeOptions.OnFirstSeen behind the guard.
func (m *Manager) onFirstSeen(name string, at time.Time) {
	_ = m.hookFailed(daemon.Guard("the OnFirstSeen callback", func() error { m.opts.OnFirstSeen(name, at); return nil }))
}

// guardedHandler is the host's slog.Handler behind the guard: a panicking handler drops that
// line (there is no other log to write it to) and raises a HOOK warning, one at a time (the
// warning's own reporting may log).
type guardedHandler struct {
	h         slog.Handler
	m         *Manager
	reporting *atomic.Bool
}

func (g guardedHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			ok = false
			g.failed(daemon.Recovered("the logger's Enabled", v))
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedHandler) Handle(ctx context.Context, r slog.Record) error {
	err := daemon.Guard("the logger's Handle", func() error { return g.h.Handle(ctx, r) })
	var rj *Rejection
	if errors.As(err, &rj) {
		g.failed(rj)
		return nil
	}
	return err
}

func (g guardedHandler) WithAttrs(attrs []slog.Attr) (h slog.Handler) {
	defer func() {
		if v := recover(); v != nil {
			h = g
			g.failed(daemon.Recovered("the logger's WithAttrs", v))
		}
	}()
	return guardedHandler{h: g.h.WithAttrs(attrs), m: g.m, reporting: g.reporting}
}

func (g guardedHandler) WithGroup(name string) (h slog.Handler) {
	defer func() {
		if v := recover(); v != nil {
			h = g
			g.failed(daemon.Recovered("the logger's WithGroup", v))
		}
	}()
	return guardedHandler{h: g.h.WithGroup(name), m: g.m, reporting: g.reporting}
}

func (g guardedHandler) failed(rj *Rejection) {
	if g.m.tr == nil || !g.reporting.CompareAndSwap(false, true) {
		return
	}
	defer g.reporting.Store(false)
	g.m.tr.Warn(CodeHook, "the host's logger was rejected; a log line was dropped", rj)
}
