package daemon

import (
	"fmt"
	"sync"
	"time"
)

// State is an embedded daemon's readiness, as a host routes on it (seed 000, hosted contexts):
// a host sends work only to a daemon whose state is StateReady, and reads the others as "route
// around this one", never as a log line to parse.
type State string

const (
	// StateStarting: Start has not returned yet.
	StateStarting State = "starting"
	// StateReady: every part is bound and this instance may act.
	StateReady State = "ready"
	// StateUnavailable: the daemon is alive but may not serve (its claim or lease is fenced, its
	// broker is gone, its credential has expired); it may come back to StateReady on its own.
	StateUnavailable State = "unavailable"
	// StateStopped: the daemon has stopped for good; Err says why.
	StateStopped State = "stopped"
)

// EventKind says what an Event reports.
type EventKind string

const (
	// EventWarning is a nonfatal condition the daemon is surviving (a failed renewal it will
	// retry, a degraded part, a dropped connection it waits on): what upstream's endpoints emit
	// as `warning`. A host that ignores it loses nothing but the knowledge.
	EventWarning EventKind = "warning"
	// EventState is a change of State; Event.State is the new one.
	EventState EventKind = "state"
)

// Event is what a daemon tells its host besides log lines. It never carries a seed, JWT,
// bearer or capability.
type Event struct {
	Time time.Time
	Kind EventKind
	// Daemon names the daemon: authd, deliveryd or managerd.
	Daemon string
	// State is the new state (EventState), or the state when the warning was raised.
	State State
	// Code is a short stable name for the condition (e.g. "RENEWAL", "BROKER", "FENCE").
	Code string
	// Message says what happened, in a sentence.
	Message string
	// Err is the cause, when there is one.
	Err error
}

func (e Event) String() string {
	s := fmt.Sprintf("%s %s %s", e.Daemon, e.Kind, e.State)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Tracker holds a daemon's State and hands events to the host's callback, in order, one at a
// time. The callback runs on the goroutine that raised the event, under the tracker's lock, so
// it must not block or call back into the daemon; a host that needs to do more hands the event
// to a goroutine of its own. A callback that panics is recovered (the event is dropped, the
// daemon goes on, OnRejection learns of it). The zero Tracker is not usable: use NewTracker.
type Tracker struct {
	daemon string
	now    func() time.Time

	mu      sync.Mutex // guards state and serializes calls to on
	state   State
	on      func(Event)
	changed chan struct{} // closed and replaced at every state change

	// onReject learns of a callback (on, now) that panicked; called without mu held.
	onReject func(*Rejection)
}

// OnRejection sets f to learn of each host callback of the tracker's (the events callback, the
// clock) that panicked: the event is dropped (a panicking clock stamps it with time.Now
// instead) and the tracker goes on. f is called after the tracker's lock is released, on the
// goroutine that raised the event; a daemon logs it (it cannot report it as an event: the
// callback that would carry it is the one that panicked). Set it before the first event.
func (t *Tracker) OnRejection(f func(*Rejection)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onReject = f
}

// NewTracker returns a tracker in StateStarting. on may be nil (events are dropped); now nil
// means time.Now.
func NewTracker(daemon string, on func(Event), now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{daemon: daemon, now: now, state: StateStarting, on: on, changed: make(chan struct{})}
}

// State is the current state.
func (t *Tracker) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}

// Changed returns a channel closed at the next state change: a host waits on it, then reads
// State again.
func (t *Tracker) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Set moves to s and reports it, unless s is the current state. StateStopped is final: nothing
// moves out of it. It reports whether the state changed.
func (t *Tracker) Set(s State, code, msg string, err error) bool {
	t.mu.Lock()
	if t.state == s || t.state == StateStopped {
		t.mu.Unlock()
		return false
	}
	t.state = s
	close(t.changed)
	t.changed = make(chan struct{})
	rejected, report := t.emit(Event{Kind: EventState, State: s, Code: code, Message: msg, Err: err})
	t.mu.Unlock()
	report(rejected)
	return true
}

// Warn reports a nonfatal condition.
func (t *Tracker) Warn(code, msg string, err error) {
	t.mu.Lock()
	rejected, report := t.emit(Event{Kind: EventWarning, State: t.state, Code: code, Message: msg, Err: err})
	t.mu.Unlock()
	report(rejected)
}

// emit calls the host's callback; t.mu must be held. A panicking callback (or clock) is
// recovered: it returns the rejections, and the function to report them with once t.mu is
// released.
func (t *Tracker) emit(e Event) (rejected []*Rejection, report func([]*Rejection)) {
	report = func(rs []*Rejection) {}
	if t.on == nil {
		return nil, report
	}
	if f := t.onReject; f != nil {
		report = func(rs []*Rejection) {
			for _, r := range rs {
				f(r)
			}
		}
	}
	if err := Guard("the clock (Now)", func() error { e.Time = t.now(); return nil }); err != nil {
		e.Time = time.Now()
		rejected = append(rejected, err.(*Rejection))
	}
	e.Daemon = t.daemon
	if err := Guard("the events callback", func() error { t.on(e); return nil }); err != nil {
		rejected = append(rejected, err.(*Rejection))
	}
	return rejected, report
}
