package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/space"
)

// State is the service's readiness (see the package doc).
func (s *Service) State() State { return s.tracker.State() }

// Ready reports whether the service serves now (State is StateReady).
func (s *Service) Ready() bool { return s.tracker.State() == StateReady }

// Changed returns a channel closed at the next change of State.
func (s *Service) Changed() <-chan struct{} { return s.tracker.Changed() }

// Done is closed when the service has stopped; Err then says why.
func (s *Service) Done() <-chan struct{} { return s.done }

// Err is why the service stopped: ErrStopped after Close or Drain, context.Canceled when its ctx
// ended, or the fatal condition (ErrLeaseTaken, ErrLeaseLost, a *BrokerGoneError, an expired
// credential, a loop that failed); nil while it runs.
func (s *Service) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// Close withdraws serving, releases this instance's lease and closes everything (see the package
// doc): nil when the row is released or was already gone, a *ReleaseError otherwise. ctx bounds
// the wait for a dropped connection; Close returns once everything is down. It is idempotent.
func (s *Service) Close(ctx context.Context) error {
	s.stop(daemon.ErrStopped)
	return s.wait(ctx)
}

// Drain stops intake, lets the requests and passes in flight finish, then closes as Close does,
// with the same result (see the package doc). ctx bounds the whole. It is idempotent.
func (s *Service) Drain(ctx context.Context) error {
	s.drainOnce.Do(func() {
		if s.closing.Swap(true) {
			return // already stopping: nothing is taken in any more
		}
		s.tracker.Set(StateUnavailable, CodeDraining, "draining: no new work; the work in flight finishes, then the lease is released", nil)
		s.log.Info("draining")
		s.drainLoops(ctx)
	})
	return s.Close(ctx)
}

// wait waits for the teardown, cutting its waits for the broker short once ctx ends, and
// returns the release's outcome.
func (s *Service) wait(ctx context.Context) error {
	select {
	case <-s.done:
	case <-ctx.Done():
		s.abortOnce.Do(func() { close(s.abort) })
		<-s.done
	}
	return s.releaseErr
}

// drainLoops unbinds the responders (letting their requests in flight finish) and stops the
// loops' intake, waits for their passes in flight (settled: acked), then stops them, all within
// ctx; no loop is started again afterwards.
func (s *Service) drainLoops(ctx context.Context) {
	s.loopMu.Lock()
	defer s.loopMu.Unlock()
	s.draining = true
	if s.loopCancel == nil {
		return // quiesced: nothing in flight may act
	}
	if d, ok := s.resp.(interface{ Drain(context.Context) }); ok {
		d.Drain(ctx)
	} else if s.resp != nil {
		s.resp.Stop()
	}
	close(s.drainCh)
	finished := make(chan struct{})
	go func() { s.loopWG.Wait(); close(finished) }()
	select {
	case <-finished:
		s.log.Info("drained: the passes in flight are settled")
	case <-ctx.Done():
		s.warn(CodeLease, "drain cut short: what is still in flight redelivers to the next holder", ctx.Err())
	}
	s.quiesced.Store(true)
	s.loopCancel()
	s.loopCancel = nil
	s.loopWG.Wait()
}

// stop records why and tears down once.
func (s *Service) stop(why error) {
	s.stopOnce.Do(func() {
		s.closing.Store(true)
		s.errMu.Lock()
		s.err = why
		s.errMu.Unlock()
		fatal := !errors.Is(why, daemon.ErrStopped) && !errors.Is(why, context.Canceled)
		if fatal {
			s.log.Error("deliveryd stopping", "err", why)
		}
		if s.hosted == nil {
			if _, err := daemon.Notify("STOPPING=1"); err != nil {
				s.log.Warn("sd_notify STOPPING failed", "err", err)
			}
		}
		go func() {
			s.releaseErr = s.teardown(fatal)
			msg := "stopped"
			if fatal {
				msg = "stopped by a fatal condition"
			}
			s.tracker.Set(StateStopped, stopCode(why), msg, why)
			close(s.done)
		}()
	})
}

// teardown undoes whatever start did, in reverse; every part tolerates not having started. It
// returns the release's outcome. After a fatal stop it does not wait for a dropped connection.
func (s *Service) teardown(fatal bool) error {
	s.closing.Store(true)
	s.quiesced.Store(true)
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	s.quiesce()
	s.closeSys()
	s.closeMetrics()
	if s.live != nil {
		_ = s.live.Unsubscribe()
	}
	if s.watch != nil {
		_ = s.watch.Unsubscribe()
	}
	var err error
	if s.lease != nil {
		err = s.release(fatal)
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.railCancel != nil {
		s.railCancel()
		<-s.railDone
	}
	if s.rail != nil {
		s.rail.Close()
	}
	if s.signer != nil {
		_ = s.signer.Close()
	}
	return err
}

// release deletes this instance's row by CAS (pkg/lease Release: only if a fresh read shows it is
// still its own). With the connection down, or dropping while an attempt is in flight, it waits
// up to the broker-gone window from the drop for it to come back (not after a fatal stop) and
// makes one more attempt before it decides. A foreign row found at the key is reported and left
// alone.
func (s *Service) release(fatal bool) error {
	if s.nc == nil {
		return nil
	}
	if !s.nc.IsConnected() {
		if fatal {
			s.log.Warn("delivery lease not released: no broker connection after a fatal stop; it expires with its TTL", "ttl", s.lease.TTL())
			return &ReleaseError{Err: errors.New("no broker connection after a fatal stop")}
		}
		s.waitConnected()
	}
	err := s.releaseOnce()
	var re *ReleaseError
	if errors.As(err, &re) && re.Holder == "" && !fatal {
		s.warn(CodeLease, "delivery lease release failed; waiting for the broker and trying once more", err)
		s.waitConnected()
		err = s.releaseOnce()
	}
	switch {
	case errors.As(err, &re) && re.Holder != "":
		s.log.Warn("delivery lease not released: another instance's row is there", "holder", re.Holder)
	case err != nil:
		s.log.Warn("delivery lease not released; it expires with its TTL", "err", err, "ttl", s.lease.TTL())
	default:
		s.log.Info("delivery lease released")
	}
	return err
}

// releaseOnce is one release attempt, cut short if the connection drops (or Close's ctx ends)
// while it is in flight.
func (s *Service) releaseOnce() error {
	ctx, cancel := s.connectedCtx()
	defer cancel()
	holder, rerr := s.foreignRow(ctx)
	if holder != "" {
		return &ReleaseError{Holder: holder}
	}
	if s.leaseTaken.Load() {
		if rerr != nil {
			return &ReleaseError{Err: fmt.Errorf("the lease was taken by another instance, and its row could not be read: %w", rerr)}
		}
		return nil // the other instance's row is gone too: nothing of this one is left
	}
	if err := s.lease.Release(ctx); err != nil {
		return &ReleaseError{Err: err}
	}
	return nil
}

// connectedCtx is a context canceled as soon as the connection is down (polled every 50 ms) or
// Close's ctx ended.
func (s *Service) connectedCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.abort:
				cancel()
				return
			case <-t.C:
				if !s.nc.IsConnected() {
					cancel()
					return
				}
			}
		}
	}()
	return ctx, cancel
}

// foreignRow reads lease.0: the holder of a row there that is not this instance's (holder
// "(unreadable row)" for one that does not decode), "" when the key holds this instance's row or
// none, and the read's error when the broker did not answer.
func (s *Service) foreignRow(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := s.kv.Get(ctx, space.DeliveryLeaseKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var row lease.Row
	if len(e.Value()) > 4096 || json.Unmarshal(e.Value(), &row) != nil {
		return "(unreadable row)", nil
	}
	mine := s.lease.Row()
	if row.Holder == mine.Holder && row.Incarnation == mine.Incarnation {
		return "", nil
	}
	if row.Holder == "" {
		return "(no holder named)", nil
	}
	return row.Holder, nil
}

// waitConnected polls the connection until it is back, at most the broker-gone window from the
// drop and the shutdown timeout from now, and no longer than Close's ctx.
func (s *Service) waitConnected() {
	if s.nc.IsConnected() {
		return
	}
	down := s.wd.Down()
	if down.IsZero() {
		down = time.Now()
	}
	deadline := down.Add(s.wd.Window())
	if limit := time.Now().Add(s.cfg.ShutdownTimeout.D()); limit.Before(deadline) {
		deadline = limit
	}
	s.warn(CodeBroker, "waiting for the broker connection to release the delivery lease", nil, "until", deadline)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !s.nc.IsConnected() && time.Now().Before(deadline) && !s.nc.IsClosed() {
		select {
		case <-s.abort:
			return
		case <-t.C:
		}
	}
}

// warn logs a nonfatal condition and reports it to the host as an EventWarning.
func (s *Service) warn(code, msg string, err error, attrs ...any) {
	attrs = append(attrs, "code", code)
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	s.log.Warn(msg, attrs...)
	s.tracker.Warn(code, msg, err)
}

// markReady moves to StateReady if the service serves now: start-up finished, not stopping,
// the fence up and the connection live. It reports whether it does.
func (s *Service) markReady() bool {
	if !s.started.Load() || s.closing.Load() || !s.MayAct() || !s.nc.IsConnected() {
		return false
	}
	s.tracker.Set(StateReady, CodeReady, "serving", nil)
	return true
}

// unavailable moves to StateUnavailable once start-up finished, unless the service is stopping.
func (s *Service) unavailable(code, msg string, err error) {
	if !s.started.Load() || s.closing.Load() {
		return
	}
	s.tracker.Set(StateUnavailable, code, msg, err)
}

// onEvent is the tracker's callback: on the CLI path, once this instance holds the lease, each
// state is written to the state file; then the host's callback, if any, gets the event.
func (s *Service) onEvent(host func(Event)) func(Event) {
	return func(e Event) {
		if e.Kind == EventState && s.stateFile.Load() {
			if err := daemon.WriteState(s.cfg.StateDir, FileName, s.pid, e.State); err != nil {
				s.log.Warn("state file not written", "state", string(e.State), "err", err)
			}
		}
		if host != nil {
			host(e)
		}
	}
}
