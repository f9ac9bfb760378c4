package authority

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// The retirement barrier (reference lifecycle-hosted.md §1.3), in order, each step resumable:
//
//  1. the intent stage.<opId> (create-only; an existing one is adopted only if it names the same
//     owner, actor and uid);
//  2. the gate open → frozen(retirement): from here on no callout admits the lifecycle, and
//     nothing reopens the gate;
//  3. the head active → retiring, with the op;
//  4. containment (contain.go): the callouts in flight at the freeze answered, then two
//     consecutive CONNZ rounds without a connection of the alias;
//  5. and 6. empty in Go (no obligation drain, no exact-pool cleaner: see the package doc);
//  7. frontier.<uid> (create-only);
//  8. the gate frozen → retired;
//  9. the head retiring → retired.
//
// A step that finds its write already made adopts it, so a restart (Resume) or a second caller
// runs the same steps and finishes the same opId; the rows bind the opId to the uid, so no
// other operation can. Every write is preceded by the plane check (held) and carries the
// revision it replaces. A failure after step 2 leaves the gate frozen: fail closed.

// Barrier steps, as the test hook sees them.
const (
	stepIntent = iota + 1
	stepFreeze
	stepRetiring
	stepContain
	stepDrain
	stepClean
	stepFrontier
	stepGateRetired
	stepHeadRetired
)

// barrierTuning is what tests change: containment's pace and window, a hook after each step
// and a count of the freezes written.
type barrierTuning struct {
	// containPoll is the pause between two CONNZ rounds; containWindow how long after the
	// freeze a connection of the alias may remain before the barrier gives up (unavailable).
	containPoll, containWindow time.Duration
	// sweepWindow and sweepSettle bound one CONNZ round (connz.Sweeper).
	sweepWindow, sweepSettle time.Duration
	// afterStep, when set, runs after each step with its number; an error stops the barrier.
	afterStep func(step int) error
	// freezes counts the step-2 writes this authority made.
	freezes atomic.Int64
	// connzNC, when set, replaces the store's connection for the CONNZ rounds.
	connzNC *nats.Conn
	// rounds counts the CONNZ rounds containment ran.
	rounds atomic.Int64
}

// ContainWindow is how long after the freeze the barrier waits for the alias's connections to
// go: the longest agent bearer (300 s), whose expiry the broker enforces on the connection,
// plus 5 s.
const ContainWindow = 305 * time.Second

func defaultBarrierTuning() barrierTuning {
	return barrierTuning{containPoll: time.Second, containWindow: ContainWindow, sweepWindow: 2 * time.Second, sweepSettle: 200 * time.Millisecond}
}

// maxStepTries bounds the rounds of one step: each round re-reads and writes at the revision it
// read, and another round follows a lost revision or a write whose outcome is unknown.
const maxStepTries = 8

// errRetry marks a write worth another round: a lost expected revision, or no answer (the write
// may have landed; the next round's read tells).
var errRetry = errors.New("retry")

func retryable(err error) error {
	if errors.Is(err, ErrConflict) || errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %w", errRetry, err)
	}
	return err
}

// unavailable wraps a store failure (unreachable or corrupt) as an unavailable refusal.
func unavailable(what string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeUnavailable, Msg: what, Err: err}
}

// step runs one barrier step until it settles: f returns nil when the step's write is stored
// (or adopted), an errRetry error for another round, any other error to stop.
func (a *Authority) step(ctx context.Context, n int, what string, f func() error) error {
	var last error
	for try := range maxStepTries {
		if try > 0 {
			select {
			case <-ctx.Done():
				return &Error{Code: CodeUnavailable, Msg: what + ": stopped", Err: ctx.Err()}
			case <-time.After(time.Duration(try) * 50 * time.Millisecond):
			}
		}
		err := f()
		if err == nil {
			if a.afterStep != nil {
				return a.afterStep(n)
			}
			return nil
		}
		if !errors.Is(err, errRetry) {
			return unavailable(fmt.Sprintf("retirement step %d (%s) failed; the lifecycle store is unavailable or holds a row this step cannot continue from", n, what), err)
		}
		last = err
	}
	return &Error{Code: CodeUnavailable, Msg: fmt.Sprintf("retirement step %d (%s) did not settle in %d rounds", n, what, maxStepTries), Err: last}
}

// write is the plane check, then a create (rev 0) or an update at rev.
func (a *Authority) write(ctx context.Context, kind space.BucketKind, key string, value []byte, rev uint64) error {
	if err := a.held(); err != nil {
		return err
	}
	var err error
	if rev == 0 {
		_, err = a.store.Create(ctx, kind, key, value)
	} else {
		_, err = a.store.Update(ctx, kind, key, value, rev)
	}
	return retryable(err)
}

// retiredBy reports whether op is the retirement opID.
func retiredBy(op *lifecycle.Op, opID string) bool {
	return op != nil && op.Kind == lifecycle.OpRetirement && op.OpID == opID
}

// barrier runs the steps for t under opID (its managed retirement opId).
func (a *Authority) barrier(ctx context.Context, opID string, t target) (RetireResult, error) {
	res := RetireResult{LifecycleUID: t.uid, OpID: opID, EvictedPrincipals: []string{}}
	op := &lifecycle.Op{OpID: opID, Kind: lifecycle.OpRetirement}

	// A head retired at the uid is a finished retirement (step 9 is the last write): nothing
	// is owed and nothing is written.
	h, _, found, err := a.store.Head(ctx, t.owner, t.actor)
	if err != nil {
		return res, unavailable("the lifecycle head could not be read", err)
	}
	if found && h.LifecycleUID == t.uid && h.State == lifecycle.HeadRetired {
		res.AlreadyRetired = true
		return res, nil
	}

	// Step 1: the intent. Before it exists, the head must be current at the uid and the gate
	// open (its generation is the intent's fromGeneration).
	var done bool
	err = a.step(ctx, stepIntent, "retirement intent", func() error {
		st, _, found, err := a.store.Stage(ctx, opID)
		if err != nil {
			return err
		}
		if found {
			if st.Owner != t.owner || st.Actor != t.actor || st.LifecycleUID != t.uid {
				return refuse(CodeConflict, "retirement %s is staged for %s.%s at %s", opID, st.Owner, st.Actor, st.LifecycleUID)
			}
			return nil
		}
		h, _, found, err := a.store.Head(ctx, t.owner, t.actor)
		switch {
		case err != nil:
			return err
		case !found:
			return refuse(CodeFailedPrecondition, "%s has no lifecycle", t.principal())
		case h.LifecycleUID != t.uid:
			return refuse(CodeExpired, "%s is at lifecycle %s, not %s", t.principal(), h.LifecycleUID, t.uid)
		case h.State == lifecycle.HeadRetired:
			done = true // retired at the uid: nothing is owed
			return nil
		case h.State == lifecycle.HeadRetiring:
			return fmt.Errorf("%w: %s is retiring at %s without its intent", ErrCorrupt, t.principal(), t.uid)
		}
		g, _, found, err := a.store.Gate(ctx, t.uid)
		switch {
		case err != nil:
			return err
		case !found:
			return refuse(CodeFailedPrecondition, "lifecycle %s has no gate", t.uid)
		case retiredBy(g.Op, opID):
			return fmt.Errorf("%w: gate %s is %s by %s without its intent", ErrCorrupt, t.uid, g.State, opID)
		case g.State != lifecycle.GateOpen:
			return &Error{Code: CodeConflict, Msg: fmt.Sprintf("gate %s is %s by %s %s", t.uid, g.State, g.Op.Kind, g.Op.OpID), GateState: g.State, BlockedOp: g.Op.Kind}
		}
		b, err := lifecycle.EncodeStage(lifecycle.Stage{Kind: lifecycle.OpRetirement, Owner: t.owner, Actor: t.actor, LifecycleUID: t.uid, FromGeneration: g.Generation})
		if err != nil {
			return err
		}
		key, _ := lifecycle.StageKey(opID)
		return a.write(ctx, space.Auth, key, b, 0)
	})
	if err != nil {
		return res, err
	}
	if done {
		res.AlreadyRetired = true
		return res, nil
	}

	// Step 2: the freeze. The containment window starts here; the stage records no time, so
	// after a restart it starts again at the resumed freeze (a bearer minted before the first
	// freeze has expired by then anyway).
	var gateRetired bool
	err = a.step(ctx, stepFreeze, "gate freeze", func() error {
		g, rev, found, err := a.store.Gate(ctx, t.uid)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("%w: gate %s vanished after its intent", ErrCorrupt, t.uid)
		case retiredBy(g.Op, opID):
			gateRetired = g.State == lifecycle.GateRetired
			return nil
		case g.State != lifecycle.GateOpen:
			return &Error{Code: CodeConflict, Msg: fmt.Sprintf("gate %s is %s by %s %s", t.uid, g.State, g.Op.Kind, g.Op.OpID), GateState: g.State, BlockedOp: g.Op.Kind}
		}
		b, err := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: t.uid, State: lifecycle.GateFrozen, Generation: g.Generation, Op: op})
		if err != nil {
			return err
		}
		key, _ := lifecycle.GateKey(t.uid)
		if err := a.write(ctx, space.Auth, key, b, rev); err != nil {
			return err
		}
		a.freezes.Add(1)
		return nil
	})
	if err != nil {
		return res, err
	}
	frozenAt := a.now()

	// Step 3: the head retiring.
	err = a.step(ctx, stepRetiring, "head retiring", func() error {
		h, rev, found, err := a.store.Head(ctx, t.owner, t.actor)
		switch {
		case err != nil:
			return err
		case !found || h.LifecycleUID != t.uid:
			return fmt.Errorf("%w: the head of %s left %s under a frozen gate", ErrCorrupt, t.principal(), t.uid)
		case h.State != lifecycle.HeadActive:
			return nil // retiring (by this op: the decoder binds it) or retired
		}
		h.State, h.Op = lifecycle.HeadRetiring, op
		b, err := lifecycle.EncodeHead(h)
		if err != nil {
			return err
		}
		key, _ := lifecycle.HeadKey(t.owner, t.actor)
		return a.write(ctx, space.Records, key, b, rev)
	})
	if err != nil {
		return res, err
	}

	// Step 4: containment, unless an earlier run got past it (its frontier is written).
	_, _, frontierDone, err := a.store.Frontier(ctx, t.uid)
	if err != nil {
		return res, unavailable("the retirement frontier could not be read", err)
	}
	if !frontierDone && !gateRetired {
		if err := a.contain(ctx, t, frozenAt); err != nil {
			return res, err
		}
		res.EvictedPrincipals = []string{t.principal()}
	}
	if a.afterStep != nil {
		if err := a.afterStep(stepContain); err != nil {
			return res, err
		}
	}
	// Steps 5 and 6 are upstream's obligation drain and exact-pool cleaner, not built in Go.
	for _, n := range []int{stepDrain, stepClean} {
		if a.afterStep != nil {
			if err := a.afterStep(n); err != nil {
				return res, err
			}
		}
	}

	// Step 7: the frontier, create-only.
	err = a.step(ctx, stepFrontier, "frontier", func() error {
		_, _, found, err := a.store.Frontier(ctx, t.uid)
		if err != nil || found {
			return err
		}
		f, err := a.frontier(ctx, t.uid, opID)
		if err != nil {
			return err
		}
		b, err := lifecycle.EncodeFrontier(f)
		if err != nil {
			return err
		}
		key, _ := lifecycle.FrontierKey(t.uid)
		return a.write(ctx, space.Records, key, b, 0)
	})
	if err != nil {
		return res, err
	}

	// Step 8: the gate retired.
	err = a.step(ctx, stepGateRetired, "gate retired", func() error {
		g, rev, found, err := a.store.Gate(ctx, t.uid)
		switch {
		case err != nil:
			return err
		case !found || !retiredBy(g.Op, opID):
			return fmt.Errorf("%w: gate %s left its retirement", ErrCorrupt, t.uid)
		case g.State == lifecycle.GateRetired:
			return nil
		}
		g.State = lifecycle.GateRetired
		b, err := lifecycle.EncodeGate(g)
		if err != nil {
			return err
		}
		key, _ := lifecycle.GateKey(t.uid)
		return a.write(ctx, space.Auth, key, b, rev)
	})
	if err != nil {
		return res, err
	}

	// Step 9: the head retired; only now may the alias activate at another uid.
	err = a.step(ctx, stepHeadRetired, "head retired", func() error {
		h, rev, found, err := a.store.Head(ctx, t.owner, t.actor)
		switch {
		case err != nil:
			return err
		case !found || h.LifecycleUID != t.uid:
			return fmt.Errorf("%w: the head of %s left %s under a retired gate", ErrCorrupt, t.principal(), t.uid)
		case h.State == lifecycle.HeadRetired:
			return nil
		}
		h.State, h.Op = lifecycle.HeadRetired, nil
		b, err := lifecycle.EncodeHead(h)
		if err != nil {
			return err
		}
		key, _ := lifecycle.HeadKey(t.owner, t.actor)
		return a.write(ctx, space.Records, key, b, rev)
	})
	return res, err
}

// frontier is the row step 7 writes: the records stream at its last sequence, read with
// STREAM.INFO after the head turned retiring. Upstream also records its endpoint streams
// (EPF_, EPW_, EPE_); Go has none of them, and the auth-plane profile reads only the two KV
// streams, so the records stream is the one cutoff: every lifecycle row written before the
// retirement's terminals is at or below it.
func (a *Authority) frontier(ctx context.Context, uid, opID string) (lifecycle.Frontier, error) {
	seq, err := a.store.LastSeq(ctx, space.Records)
	if err != nil {
		return lifecycle.Frontier{}, err
	}
	stream, err := a.names.BucketStream(space.Records)
	if err != nil {
		return lifecycle.Frontier{}, err
	}
	return lifecycle.Frontier{LifecycleUID: uid, OpID: opID, Streams: []lifecycle.StreamCutoff{{Stream: stream, Seq: seq}}}, nil
}
