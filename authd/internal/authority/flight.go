package authority

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// target is a retirement's coordinates: the alias and the uid it retires.
type target struct {
	owner, actor, uid string
}

func (t target) principal() string { return t.owner + "." + t.actor }

// RetireResult is a finished retirement: the head and the gate are retired at LifecycleUID.
type RetireResult struct {
	LifecycleUID string
	// OpID is the uid's managed retirement opId, the only operation that retires it.
	OpID string
	// AlreadyRetired: the head was retired at the uid when the flight began; it wrote nothing.
	AlreadyRetired bool
	// EvictedPrincipals are the principals whose connections this flight's containment proved
	// gone (the alias's <owner>.<actor>); empty when containment was done by an earlier run.
	EvictedPrincipals []string
}

// flight is one retirement in progress. res and err are written once, before done closes.
type flight struct {
	t    target
	done chan struct{}
	res  RetireResult
	err  error
}

// flights is the one table of retirement flights of this plane (reference §2.5): the door, the
// rail and boot resume share it, so every caller of one opId joins one barrier.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight // by opId; guarded by mu
	// calls counts the callers handed a flight, started or joined (tests wait on it).
	calls atomic.Int64
}

// join returns the flight of opID, starting it on the plane's context when none is in flight.
// A flight of opID for other coordinates is a conflict. The entry is removed when the barrier
// settles, so a later call starts afresh (and adopts what the settled one stored).
func (a *Authority) join(opID string, t target) (*flight, error) {
	a.flights.mu.Lock()
	defer a.flights.mu.Unlock()
	if f, ok := a.flights.m[opID]; ok {
		if f.t != t {
			return nil, refuse(CodeConflict, "retirement %s is in flight for %s at %s, not %s at %s", opID, f.t.principal(), f.t.uid, t.principal(), t.uid)
		}
		a.flights.calls.Add(1)
		return f, nil
	}
	if a.flights.m == nil {
		a.flights.m = map[string]*flight{}
	}
	f := &flight{t: t, done: make(chan struct{})}
	a.flights.m[opID] = f
	a.flights.calls.Add(1)
	go func() {
		res, err := a.barrier(a.ctx, opID, t)
		if err != nil {
			a.log.Warn("retirement not finished; the gate stays frozen once frozen", "op", opID, "principal", t.principal(), "uid", t.uid, "code", CodeOf(err), "err", err)
		} else {
			a.log.Info("retirement finished", "op", opID, "principal", t.principal(), "uid", t.uid, "already", res.AlreadyRetired)
		}
		f.res, f.err = res, err
		a.flights.mu.Lock()
		delete(a.flights.m, opID)
		a.flights.mu.Unlock()
		close(f.done)
	}()
	return f, nil
}

// wait is the flight's result, or unavailable once ctx ends (the flight goes on).
func (f *flight) wait(ctx context.Context) (RetireResult, error) {
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return RetireResult{}, &Error{Code: CodeUnavailable, Msg: "stopped waiting for the retirement; it goes on in this authd", Err: ctx.Err()}
	}
}

// Retire runs the managed retirement of owner.actor at uid (the barrier, barrier.go) under
// opId lifecycle.ManagedRetirementOpID(uid), joining the flight of that opId when one is in
// flight for the same coordinates and refusing conflict when it is in flight for others. The
// barrier runs on the plane's context: ctx bounds only this caller's wait, and a caller that
// stops waiting gets unavailable while the barrier goes on. The caller runs its own checks
// first (the door's head table, the rail's gate and epoch); the barrier re-reads every row.
func (a *Authority) Retire(ctx context.Context, owner, actor, uid string) (RetireResult, error) {
	if _, err := space.PrincipalKey(owner, actor); err != nil {
		return RetireResult{}, refuse(CodeBadRequest, "%v", err)
	}
	opID, err := lifecycle.ManagedRetirementOpID(uid)
	if err != nil {
		return RetireResult{}, refuse(CodeBadRequest, "%v", err)
	}
	f, err := a.join(opID, target{owner, actor, uid})
	if err != nil {
		return RetireResult{}, err
	}
	return f.wait(ctx)
}
