package authority

import (
	"context"
	"fmt"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Resume is the boot resume of retirements (upstream resumeOpenOperations), which authd runs
// after its plane claim and before its callout subscribes. It lists every stage.<opId> of the
// auth bucket (STREAM.INFO with subjects_filter $KV.<auth bucket>.stage.>), reads each, and owes
// a retirement when
//
//   - its gate is frozen by its opId, or
//   - its gate is retired by its opId but the head is not retired at its uid (upstream #878).
//
// It registers a flight for every owed retirement before it returns (so a door or rail call
// after the start joins it rather than racing it) and finishes them in the background on the
// plane's context. owed is their opIds. An intent that does not decode (garbled, a marker, a
// TTL, a key that is not an opId), or a store that cannot be read, is an error: authd refuses
// to start rather than serve beside a retirement it cannot see.
//
// An intent whose gate is still open (a barrier stopped between steps 1 and 2) is not owed, as
// upstream: the lifecycle was never frozen, and the next door or rail call for it adopts the
// intent and runs the barrier.
func (a *Authority) Resume(ctx context.Context) (owed []string, err error) {
	keys, err := a.store.Keys(ctx, space.Auth, "stage.")
	if err != nil {
		return nil, fmt.Errorf("authority: resume: listing intents: %w", err)
	}
	type owedOp struct {
		opID string
		t    target
	}
	var todo []owedOp
	for _, key := range keys {
		opID, err := lifecycle.ParseStageKey(key)
		if err != nil {
			return nil, fmt.Errorf("authority: resume: %w: %w", ErrCorrupt, err)
		}
		st, _, found, err := a.store.Stage(ctx, opID)
		if err != nil {
			return nil, fmt.Errorf("authority: resume: intent %s: %w", opID, err)
		}
		if !found {
			return nil, fmt.Errorf("authority: resume: %w: %s is listed but holds no message", ErrCorrupt, key)
		}
		g, _, found, err := a.store.Gate(ctx, st.LifecycleUID)
		if err != nil {
			return nil, fmt.Errorf("authority: resume: gate of %s: %w", opID, err)
		}
		if !found || !retiredBy(g.Op, opID) {
			continue
		}
		if g.State == lifecycle.GateRetired {
			h, _, found, err := a.store.Head(ctx, st.Owner, st.Actor)
			if err != nil {
				return nil, fmt.Errorf("authority: resume: head of %s: %w", opID, err)
			}
			if found && h.LifecycleUID == st.LifecycleUID && h.State == lifecycle.HeadRetired {
				continue
			}
		}
		todo = append(todo, owedOp{opID, target{st.Owner, st.Actor, st.LifecycleUID}})
	}
	for _, o := range todo {
		if _, err := a.join(o.opID, o.t); err != nil {
			return owed, fmt.Errorf("authority: resume %s: %w", o.opID, err)
		}
		owed = append(owed, o.opID)
		a.log.Info("resuming retirement", "op", o.opID, "principal", o.t.principal(), "uid", o.t.uid)
	}
	return owed, nil
}

// Wait waits for the flight of opID, if one is in flight: its result, or found false.
func (a *Authority) Wait(ctx context.Context, opID string) (res RetireResult, found bool, err error) {
	a.flights.mu.Lock()
	f, ok := a.flights.m[opID]
	a.flights.mu.Unlock()
	if !ok {
		return RetireResult{}, false, nil
	}
	res, err = f.wait(ctx)
	return res, true, err
}
