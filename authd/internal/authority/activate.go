package authority

// Activation (reference lifecycle-hosted.md §1.3; seed "A separate host activates one exact
// managed lifecycle"): the saga that makes uid the current incarnation of owner.actor.
//
//  1. reserve uid.<uid> (records, create-only; mintedBy this authd's ManagerInstance);
//  2. create gate.<uid> (auth) born frozen by the uid's activation opId at generation 0;
//  3. move the head lifecycle.<owner>.<actor> (records) to active at uid, process epoch 1, by
//     create or by update at the revision read;
//  4. reopen the gate at generation 1, last: only an open gate lets the callout admit the
//     lifecycle, and it opens only once the head names it.
//
// Every step adopts what an earlier run left (the opId is a pure function of the uid, so a
// retry, a second caller or a restarted authd recognises its own frozen(activation) gate), so a
// crash at any point is finished by the next call and a finished one answers AlreadyActive.
// Every write carries the revision it replaces; a lost race re-reads and decides again, never
// overwrites. The plane claim is re-checked (Config.Held) before the first read and before every
// write.
//
// Refusals, decided on the reads before any write:
//
//	head active at another uid              already-exists
//	head retiring (at any uid)              failed-precondition, BlockedOp retirement
//	head retired at this uid, gate retired  permission-denied, GateState retired
//	gate frozen by its retirement           failed-precondition, BlockedOp retirement
//	uid reserved for another owner.actor    conflict (a uid names one alias for the life of
//	                                        the space: that uid is burnt for this alias)
//	a row that contradicts the saga         failed-precondition (an open gate whose head does
//	                                        not name it, a head at uid with no gate)
//	a store unreachable or a corrupt row    unavailable
//
// A head retired at another uid is replaceable: the new incarnation starts at epoch 1.

import (
	"context"
	"errors"
	"fmt"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Outcome says what a call that did not succeed left behind (the activate door's "outcome").
type Outcome string

const (
	// OutcomeNotExecuted: no write was sent; nothing changed.
	OutcomeNotExecuted Outcome = "not-executed"
	// OutcomeUnknown: a write was sent and the saga did not finish (a write whose answer was
	// lost may have landed); a retry adopts whatever it left.
	OutcomeUnknown Outcome = "unknown"
)

// ActivateResult is an activation's answer.
type ActivateResult struct {
	Owner, Actor, LifecycleUID string
	// AlreadyActive: the head was already active at the uid with its gate open; nothing was
	// written.
	AlreadyActive bool
	// HeadRevision and GateRevision are the revisions of the active head and the open gate.
	HeadRevision, GateRevision uint64
	// Outcome is set when Activate returns an error: whether it wrote anything.
	Outcome Outcome
}

// maxActivateRounds bounds the re-reads after lost races: each round either finishes, refuses,
// or lost a write to another writer, and a writer that keeps winning is a conflict, not a loop.
const maxActivateRounds = 8

// Activate runs the activation saga at uid for owner.actor (see the top of this file). On an
// error, the result's Outcome says whether a write was sent, and the error is an *Error (CodeOf).
func (a *Authority) Activate(ctx context.Context, owner, actor, uid string) (ActivateResult, error) {
	res := ActivateResult{Owner: owner, Actor: actor, LifecycleUID: uid}
	wrote := false
	fail := func(err error) (ActivateResult, error) {
		res.Outcome = OutcomeNotExecuted
		if wrote {
			res.Outcome = OutcomeUnknown
		}
		var e *Error
		if !errors.As(err, &e) {
			err = &Error{Code: CodeUnavailable, Msg: "the lifecycle store", Err: err}
		}
		a.log.Info("activate: refused", "owner", owner, "actor", actor, "uid", uid, "code", CodeOf(err), "outcome", res.Outcome, "err", err)
		return res, err
	}
	if err := CheckTokens(owner, actor, uid); err != nil {
		return fail(&Error{Code: CodeBadRequest, Msg: "the lifecycle coordinate", Err: err})
	}
	if err := a.held(); err != nil {
		return fail(err)
	}
	seen := false // a contradiction was seen once: a second one refuses
	for range maxActivateRounds {
		done, err := a.activateRound(ctx, owner, actor, uid, &res, &wrote, &seen)
		if err != nil {
			return fail(err)
		}
		if done {
			a.log.Info("activate: active", "owner", owner, "actor", actor, "uid", uid, "already", res.AlreadyActive,
				"head_rev", res.HeadRevision, "gate_rev", res.GateRevision)
			return res, nil
		}
	}
	return fail(refuse(CodeConflict, "the lifecycle of %s.%s kept changing under the activation", owner, actor))
}

// activateRound reads the head and the gate, refuses or takes the next step(s) of the saga, and
// reports done, or not done after a lost race (the caller reads again).
//
// The head and the gate are two reads, not one snapshot: a head read before a concurrent
// activation wrote it and a gate read after that activation reopened it look like an open gate
// the head does not name. Rows only move forward, so such a pair is read again once, and only a
// contradiction seen twice (contradicted, set after the first) is refused.
func (a *Authority) activateRound(ctx context.Context, owner, actor, uid string, res *ActivateResult, wrote, contradicted *bool) (bool, error) {
	head, hrev, hok, err := a.store.Head(ctx, owner, actor)
	if err != nil {
		return false, err
	}
	gate, grev, gok, err := a.store.Gate(ctx, uid)
	if err != nil {
		return false, err
	}
	if err := checkHead(head, hok, uid); err != nil {
		return false, err
	}
	if err := checkGate(gate, gok); err != nil {
		return false, err
	}
	headHere := hok && head.LifecycleUID == uid && head.State == lifecycle.HeadActive
	if gok && gate.State == lifecycle.GateOpen {
		if !headHere {
			if !*contradicted {
				*contradicted = true
				return false, nil
			}
			return false, refuse(CodeFailedPrecondition, "gate.%s is open but the head of %s.%s does not name it", uid, owner, actor)
		}
		res.AlreadyActive, res.HeadRevision, res.GateRevision = true, hrev, grev
		return true, nil
	}
	if headHere && !gok {
		if !*contradicted {
			*contradicted = true
			return false, nil
		}
		return false, refuse(CodeFailedPrecondition, "the head of %s.%s is active at %s but gate.%s does not exist", owner, actor, uid, uid)
	}
	// From here the gate is absent or frozen by this uid's activation.

	// 1. The reservation.
	if !gok {
		ok, err := a.reserve(ctx, owner, actor, uid, wrote)
		if err != nil || !ok {
			return false, err
		}
		// 2. The gate, born frozen(activation).
		born, err := lifecycle.BornGate(uid)
		if err != nil {
			return false, err
		}
		rev, err := a.create(ctx, space.Auth, gateKey(uid), encodeGate(born), wrote)
		if errors.Is(err, ErrConflict) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		grev = rev
	} else if ok, err := a.reserve(ctx, owner, actor, uid, wrote); err != nil || !ok {
		// A frozen(activation) gate follows its reservation; reading it again refuses a
		// reservation another alias holds all the same.
		return false, err
	}

	// 3. The head.
	if !headHere {
		next := lifecycle.Head{Owner: owner, Actor: actor, LifecycleUID: uid, ManagerInstance: a.ManagerInstance(),
			ProcessEpoch: 1, State: lifecycle.HeadActive}
		b, err := lifecycle.EncodeHead(next)
		if err != nil {
			return false, err
		}
		key, err := lifecycle.HeadKey(owner, actor)
		if err != nil {
			return false, err
		}
		if hok {
			hrev, err = a.update(ctx, space.Records, key, b, hrev, wrote)
		} else {
			hrev, err = a.create(ctx, space.Records, key, b, wrote)
		}
		if errors.Is(err, ErrConflict) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}

	// 4. Reopen the gate, last.
	open := lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateOpen, Generation: 1}
	rev, err := a.update(ctx, space.Auth, gateKey(uid), encodeGate(open), grev, wrote)
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	res.AlreadyActive, res.HeadRevision, res.GateRevision = false, hrev, rev
	return true, nil
}

// checkHead refuses a head the activation at uid may not replace or adopt.
func checkHead(h lifecycle.Head, found bool, uid string) error {
	if !found {
		return nil
	}
	switch h.State {
	case lifecycle.HeadRetiring:
		return &Error{Code: CodeFailedPrecondition, BlockedOp: lifecycle.OpRetirement,
			Msg: fmt.Sprintf("the lifecycle of %s.%s is retiring at %s: not replaceable", h.Owner, h.Actor, h.LifecycleUID)}
	case lifecycle.HeadActive:
		if h.LifecycleUID != uid {
			return refuse(CodeAlreadyExists, "%s.%s is active at another lifecycle uid", h.Owner, h.Actor)
		}
	case lifecycle.HeadRetired:
		if h.LifecycleUID == uid {
			return &Error{Code: CodePermissionDenied, GateState: lifecycle.GateRetired,
				Msg: fmt.Sprintf("lifecycle %s of %s.%s is retired", uid, h.Owner, h.Actor)}
		}
	}
	return nil
}

// checkGate refuses a gate that is not absent, open, or frozen by its own activation.
func checkGate(g lifecycle.Gate, found bool) error {
	if !found {
		return nil
	}
	switch {
	case g.State == lifecycle.GateRetired:
		return &Error{Code: CodePermissionDenied, GateState: lifecycle.GateRetired,
			Msg: fmt.Sprintf("gate.%s is retired", g.LifecycleUID)}
	case g.State == lifecycle.GateFrozen && g.Op != nil && g.Op.Kind == lifecycle.OpRetirement:
		return &Error{Code: CodeFailedPrecondition, GateState: lifecycle.GateFrozen, BlockedOp: lifecycle.OpRetirement,
			Msg: fmt.Sprintf("gate.%s is frozen by its retirement", g.LifecycleUID)}
	case g.State == lifecycle.GateFrozen && (g.Op == nil || g.Op.Kind != lifecycle.OpActivation):
		// The decoder admits no other op on a lifecycle gate; refuse rather than adopt.
		return &Error{Code: CodeFailedPrecondition, GateState: lifecycle.GateFrozen, Msg: fmt.Sprintf("gate.%s is frozen by a foreign operation", g.LifecycleUID)}
	}
	return nil
}

// reserve makes sure uid.<uid> is owner.actor's: adopted when it already is (whoever minted
// it), created when absent. ok is false after a lost create race (read again).
func (a *Authority) reserve(ctx context.Context, owner, actor, uid string, wrote *bool) (bool, error) {
	r, _, found, err := a.store.Reservation(ctx, uid)
	if err != nil {
		return false, err
	}
	if found {
		if r.Owner != owner || r.Actor != actor {
			return false, refuse(CodeConflict, "lifecycle uid %s is reserved for another alias", uid)
		}
		return true, nil
	}
	b, err := lifecycle.EncodeReservation(lifecycle.Reservation{Owner: owner, Actor: actor, MintedBy: a.ManagerInstance()})
	if err != nil {
		return false, err
	}
	key, err := lifecycle.UIDKey(uid)
	if err != nil {
		return false, err
	}
	if _, err := a.create(ctx, space.Records, key, b, wrote); err != nil {
		if errors.Is(err, ErrConflict) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// create and update are the saga's writes: the plane claim re-checked first, wrote set once
// the write is sent.
func (a *Authority) create(ctx context.Context, kind space.BucketKind, key string, value []byte, wrote *bool) (uint64, error) {
	if err := a.held(); err != nil {
		return 0, err
	}
	*wrote = true
	return a.store.Create(ctx, kind, key, value)
}

func (a *Authority) update(ctx context.Context, kind space.BucketKind, key string, value []byte, rev uint64, wrote *bool) (uint64, error) {
	if err := a.held(); err != nil {
		return 0, err
	}
	*wrote = true
	return a.store.Update(ctx, kind, key, value, rev)
}

// gateKey and encodeGate are for a uid CheckTokens accepted and a gate built here, which the
// builders cannot refuse.
func gateKey(uid string) string {
	k, _ := lifecycle.GateKey(uid)
	return k
}

func encodeGate(g lifecycle.Gate) []byte {
	b, _ := lifecycle.EncodeGate(g)
	return b
}
