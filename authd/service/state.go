package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// readiness is the handle's side of a Service: the state a host routes on, the events it is
// told, and the discovery file that mirrors the state for a launcher (CLI path).
type readiness struct {
	hosted     *Hosted // nil: the CLI path
	tr         *daemon.Tracker
	brokerGone time.Duration
	capHex     string // the per-start cap; set once by start, before publish

	// rmu guards the fields below. Every state change is made holding it, so the tracker's
	// events and the discovery file's writes follow one order.
	rmu       sync.Mutex
	published bool // publish ran: states other than starting and stopped may be reported
	closing   bool // stop or teardown began: connection events are the teardown's own
	withdrawn bool // the discovery file was removed; it is written no more
	failed    bool // a fence or an expired credential: no way back to ready
	gen       uint64
	down      map[string]outage // connections down, by name
	gone      map[string]bool   // connections down past brokerGone, by name

	releaseErr error // teardown's verdict on the plane release; read after done is closed
}

// outage is one connection's current loss: its generation (so a late window timer of an
// earlier outage does nothing) and the window's timer.
type outage struct {
	gen   uint64
	timer *time.Timer
}

func newReadiness(h *Hosted, opts RuntimeOptions) readiness {
	if h != nil {
		c := *h
		h = &c
	}
	gone := opts.BrokerGone
	if gone <= 0 {
		gone = DefaultBrokerGone
	}
	return readiness{
		hosted: h, tr: daemon.NewTracker("authd", opts.Events, opts.Now), brokerGone: gone,
		down: map[string]outage{}, gone: map[string]bool{},
	}
}

// warn raises a warning event (the caller logs its own line).
func (s *Service) warn(code, msg string, err error) { s.tr.Warn(code, msg, err) }

// calloutWarn is the responder's Config.Warn: its lines are already logged.
func (s *Service) calloutWarn(code, msg string, err error) {
	if code == callout.WarnSigner {
		code = CodeSigner
	}
	s.warn(code, msg, err)
}

// renewFailed is a rail's OnRenewFailed: the rail logged the failure; the host hears of it.
func (s *Service) renewFailed(profile string) func(error, time.Duration) {
	return func(err error, retryIn time.Duration) {
		s.warn(CodeCredential, fmt.Sprintf("%s credential renewal failed; keeping the current one, retrying in %v", profile, retryIn.Round(time.Millisecond)), err)
	}
}

// wantLocked is the state the conditions call for; s.rmu must be held.
func (s *Service) wantLocked() State {
	if s.failed || s.closing || len(s.gone) > 0 {
		return StateUnavailable
	}
	return StateReady
}

// setLocked moves to st: the discovery file first, then the state and its event, so a host told
// of a change finds the file already saying it. Before publish it does nothing (a start reports
// starting, then ready or stopped). s.rmu must be held; every change of state holds it.
func (s *Service) setLocked(st State, code, msg string, err error) {
	if cur := s.tr.State(); !s.published || cur == st || cur == StateStopped {
		return
	}
	s.writeLocked(st)
	s.tr.Set(st, code, msg, err)
}

// writeLocked rewrites the discovery file with st (atomically, daemon.WriteDiscovery), unless
// this is a hosted context or the file was withdrawn. s.rmu must be held.
func (s *Service) writeLocked(st State) {
	if s.hosted != nil || s.withdrawn || st == StateStopped {
		return
	}
	if err := daemon.WriteDiscovery(s.cfg.StateDir, FileName, daemon.Discovery{URL: s.url, PID: s.pid, Cap: s.capHex, State: st, PublicURL: s.publicURL}); err != nil {
		s.log.Warn("discovery file not rewritten", "state", st, "err", err)
		s.warn(CodeDiscovery, "discovery file not rewritten with state "+string(st), err)
	}
}

// publish ends a start: the discovery file written (CLI path) and the state reported, ready
// unless a connection went down past the window meanwhile (or a stop began).
func (s *Service) publish() error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	st := s.wantLocked()
	// Withdrawn: a stop raced the start, and its teardown has removed the file for good.
	if s.hosted == nil && !s.withdrawn {
		if err := daemon.WriteDiscovery(s.cfg.StateDir, FileName, daemon.Discovery{URL: s.url, PID: s.pid, Cap: s.capHex, State: st, PublicURL: s.publicURL}); err != nil {
			return err
		}
	}
	s.published = true
	code, msg := CodeReady, "authd serves"
	switch {
	case s.closing:
		code, msg = CodeStopping, "authd is stopping"
	case st != StateReady:
		code, msg = CodeBroker, "authd started with a broker connection down"
	}
	s.tr.Set(st, code, msg, nil)
	return nil
}

// unavailable reports a condition authd does not come back from (a fence, an expired
// credential); the caller then stops the service.
func (s *Service) unavailable(code, msg string, err error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.failed = true
	s.setLocked(StateUnavailable, code, msg, err)
}

// stopping reports that the service is going away, before its teardown.
func (s *Service) stopping(why error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.closing = true
	s.setLocked(StateUnavailable, CodeStopping, "authd is stopping", why)
}

// stopped reports the final state, once teardown is done (or a start refused).
func (s *Service) stopped(why error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	var se *StartError
	code := CodeFailed
	switch {
	case errors.As(why, &se):
		code = se.Code
	case errors.Is(why, daemon.ErrStopped):
		code = CodeClosed
	case errors.Is(why, context.Canceled):
		code = CodeCanceled
	case errors.Is(why, ErrPlaneLost):
		code = CodeFence
	case errors.Is(why, ErrPlaneTaken):
		code = CodePlaneTaken
	case errors.Is(why, ErrBrokerGone):
		code = CodeBroker
	case errors.Is(why, signerclient.ErrExpired):
		code = CodeCredential
	}
	s.tr.Set(StateStopped, code, "authd stopped", why)
}

// withdraw is teardown's first step: no more connection events or file writes, and the
// discovery file removed (CLI path; only if it still names this pid).
func (s *Service) withdraw() {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.closing, s.withdrawn = true, true
	for name, o := range s.down {
		o.timer.Stop()
		delete(s.down, name)
	}
	if s.hosted != nil {
		return
	}
	if err := daemon.RemoveDiscovery(s.cfg.StateDir, FileName, s.pid); err != nil {
		s.log.Warn("discovery file not removed", "err", err)
	}
}

// connOptions are extra plus the handlers that watch the connection called name.
func (s *Service) connOptions(name string, extra []nats.Option) []nats.Option {
	return append(append([]nats.Option(nil), extra...),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { s.connDown(name, err) }),
		nats.ReconnectHandler(func(*nats.Conn) { s.connUp(name) }),
	)
}

// connDown starts the broker-gone window for name.
func (s *Service) connDown(name string, err error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.closing {
		return
	}
	if _, ok := s.down[name]; ok {
		return
	}
	s.log.Warn("broker connection lost; reconnecting", "conn", name, "err", err, "broker_gone", s.brokerGone)
	s.warn(CodeBroker, name+" connection lost; reconnecting", err)
	s.gen++
	g := s.gen
	s.down[name] = outage{gen: g, timer: time.AfterFunc(s.brokerGone, func() { s.connGone(name, g) })}
}

// connGone is the window's end: if the outage is still the one it timed, authd is unavailable,
// and a hosted context closes.
func (s *Service) connGone(name string, g uint64) {
	s.rmu.Lock()
	if o, ok := s.down[name]; !ok || o.gen != g || s.closing {
		s.rmu.Unlock()
		return
	}
	s.gone[name] = true
	msg := fmt.Sprintf("%s connection down for %v", name, s.brokerGone)
	s.log.Error("broker connection down past the broker-gone window; authd unavailable", "conn", name, "broker_gone", s.brokerGone)
	s.setLocked(StateUnavailable, CodeBroker, msg, nil)
	hosted := s.hosted != nil
	s.rmu.Unlock()
	if hosted {
		s.stop(fmt.Errorf("%w: %s", ErrBrokerGone, msg))
	}
}

// connUp ends name's outage; authd is ready again once no other condition holds.
func (s *Service) connUp(name string) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	o, ok := s.down[name]
	if !ok {
		return
	}
	o.timer.Stop()
	delete(s.down, name)
	delete(s.gone, name)
	if s.closing {
		return
	}
	s.log.Info("broker connection restored", "conn", name)
	s.setLocked(s.wantLocked(), CodeBroker, name+" connection restored", nil)
}
