package authority

// Endpoint registration (issue 23 item 8; reference lifecycle-hosted.md §1.2 epgate row; the
// seed's "Host incarnation fencing"): every start of an endpoint instance registers once, and
// each registration commits the next process epoch of that instance's endpoint gate
// epgate.<epTok>.<iid>, so a restart fences its predecessor. One gate family serves every
// endpoint; the manager's endpoint is lifecycle.ManagerEndpoint.
//
// The order, each write by expected revision and each preceded by the plane check (held):
//
//   - no gate yet: the spec svc.<epTok>.<iid> at epoch 0 (its KV revision is the registration
//     revision), then the gate created open at epoch 0 with that revision, generation 1;
//   - a gate open at epoch e: freeze it (frozen, op {RegistrationOpID(endpoint, iid, e),
//     registration}, generation +1), write the spec at e+1, reopen the gate at e+1 with the new
//     spec revision (generation +1);
//   - a gate frozen by the registration of epoch e (a start that crashed or is still running
//     past its freeze): adopt that freeze and go on from the spec write, so the instance never
//     stays frozen;
//   - a gate frozen by a retirement or retired: refused (failed-precondition), nothing written;
//   - a gate admitting another principal: refused (permission-denied), nothing written. An
//     instance id belongs to the principal that first registered it; a manager configured with
//     another owner or actor under the same instance id cannot take its gate over by holding the
//     lease.
//
// Then a confirming read: a gate that is no longer open at this registration's epoch and
// revision (a later start of the same instance registered meanwhile) is conflict, as is a lost
// compare-and-set on any write. A registration retried after an answer was lost commits one more
// epoch: a start that registers twice fences itself once more, which only moves its own epoch.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Registration is what one committed registration answers: the gate's process epoch and
// registration revision (the spec's KV revision) for this start, and the gate's generation after
// the reopen.
type Registration struct {
	ProcessEpoch         uint64
	RegistrationRevision uint64
	Generation           uint64
}

// RegisterEndpoint registers one start of endpoint's instance instanceID, served by principal
// (<owner>.<actor>), and returns the epoch it committed (see the file comment for the order).
// Refusals are *Error: bad-request (a coordinate outside its grammar), permission-denied (the gate
// admits another principal), failed-precondition (a retirement froze or retired the gate),
// conflict (a concurrent or later registration won) and unavailable (the plane claim is not held,
// the store did not answer, or a row is corrupt).
func (a *Authority) RegisterEndpoint(ctx context.Context, endpoint, instanceID, principal string) (Registration, error) {
	if _, err := lifecycle.EndpointGateKey(endpoint, instanceID); err != nil {
		return Registration{}, refuse(CodeBadRequest, "%v", err)
	}
	owner, actor, _ := strings.Cut(principal, ".")
	if _, err := space.PrincipalKey(owner, actor); err != nil {
		return Registration{}, refuse(CodeBadRequest, "principal: %v", err)
	}
	reg, err := a.register(ctx, endpoint, instanceID, principal)
	if err != nil {
		a.log.Warn("endpoint registration refused", "endpoint", endpoint, "instance", instanceID,
			"principal", principal, "code", string(CodeOf(err)), "err", err)
		return Registration{}, err
	}
	a.log.Info("endpoint registered", "endpoint", endpoint, "instance", instanceID, "principal", principal,
		"processEpoch", reg.ProcessEpoch, "registrationRevision", reg.RegistrationRevision, "generation", reg.Generation)
	return reg, nil
}

func (a *Authority) register(ctx context.Context, endpoint, iid, principal string) (Registration, error) {
	gkey, _ := lifecycle.EndpointGateKey(endpoint, iid)
	skey, _ := lifecycle.SpecKey(endpoint, iid)
	g, grev, found, err := a.store.EndpointGate(ctx, endpoint, iid)
	if err != nil {
		return Registration{}, storeRefusal("read "+gkey, err)
	}
	var epoch, gen uint64
	switch {
	case !found:
		// The first registration: epoch 0, created open at generation 1.
	case g.Principal != principal:
		return Registration{}, refuse(CodePermissionDenied, "%s admits another principal than %s", gkey, principal)
	case g.State == lifecycle.GateRetired:
		return Registration{}, &Error{Code: CodeFailedPrecondition, Msg: gkey + " is retired", GateState: lifecycle.GateRetired}
	case g.State == lifecycle.GateFrozen && g.Op.Kind != lifecycle.OpRegistration:
		return Registration{}, &Error{Code: CodeFailedPrecondition, Msg: gkey + " is frozen by a " + string(g.Op.Kind),
			GateState: lifecycle.GateFrozen, BlockedOp: g.Op.Kind}
	case g.State == lifecycle.GateOpen:
		op, err := lifecycle.RegistrationOpID(endpoint, iid, g.ProcessEpoch)
		if err != nil {
			return Registration{}, refuse(CodeUnavailable, "%s: %v", gkey, err)
		}
		frozen := g
		frozen.State, frozen.Generation, frozen.Op = lifecycle.GateFrozen, g.Generation+1, &lifecycle.Op{OpID: op, Kind: lifecycle.OpRegistration}
		if grev, err = a.writeGate(ctx, gkey, frozen, grev); err != nil {
			return Registration{}, err
		}
		epoch, gen = g.ProcessEpoch+1, frozen.Generation
	default:
		// Frozen by the registration of its own epoch (the decoder checked the opId): adopt it.
		epoch, gen = g.ProcessEpoch+1, g.Generation
	}
	if epoch > lifecycle.MaxSafeInteger || gen+1 > lifecycle.MaxSafeInteger {
		return Registration{}, refuse(CodeFailedPrecondition, "%s: the epoch or generation is exhausted", gkey)
	}

	// The spec at the new epoch; its revision is the registration revision.
	_, srev, sfound, err := a.store.Spec(ctx, endpoint, iid)
	if err != nil {
		return Registration{}, storeRefusal("read "+skey, err)
	}
	if found && !sfound {
		return Registration{}, &Error{Code: CodeUnavailable, Msg: skey + " is absent under an existing gate",
			Err: fmt.Errorf("%w: %s", ErrCorrupt, skey)}
	}
	sb, err := lifecycle.EncodeSpec(lifecycle.Spec{Endpoint: endpoint, InstanceID: iid, Principal: principal, ProcessEpoch: epoch})
	if err != nil {
		return Registration{}, refuse(CodeBadRequest, "%v", err)
	}
	if err := a.held(); err != nil {
		return Registration{}, err
	}
	if sfound {
		srev, err = a.store.Update(ctx, space.Records, skey, sb, srev)
	} else {
		srev, err = a.store.Create(ctx, space.Records, skey, sb)
	}
	if err != nil {
		return Registration{}, storeRefusal("write "+skey, err)
	}

	// The gate open at the new epoch and revision.
	open := lifecycle.EndpointGate{State: lifecycle.GateOpen, Principal: principal, ProcessEpoch: epoch,
		RegistrationRevision: srev, Generation: gen + 1}
	if !found {
		open.Generation = 1
		if _, err = a.createGate(ctx, gkey, open); err != nil {
			return Registration{}, err
		}
	} else if _, err = a.writeGate(ctx, gkey, open, grev); err != nil {
		return Registration{}, err
	}

	// The confirming read: a later start may have registered since.
	if a.beforeConfirm != nil {
		a.beforeConfirm()
	}
	c, _, cfound, err := a.store.EndpointGate(ctx, endpoint, iid)
	if err != nil {
		return Registration{}, storeRefusal("confirm "+gkey, err)
	}
	if !cfound || c.State != lifecycle.GateOpen || c.ProcessEpoch != epoch || c.RegistrationRevision != srev {
		return Registration{}, refuse(CodeConflict, "%s: a later registration of the instance committed (the gate is %s at epoch %d)", gkey, c.State, c.ProcessEpoch)
	}
	return Registration{ProcessEpoch: epoch, RegistrationRevision: srev, Generation: c.Generation}, nil
}

func (a *Authority) writeGate(ctx context.Context, key string, g lifecycle.EndpointGate, rev uint64) (uint64, error) {
	b, err := lifecycle.EncodeEndpointGate(g)
	if err != nil {
		return 0, refuse(CodeBadRequest, "%v", err)
	}
	if err := a.held(); err != nil {
		return 0, err
	}
	nrev, err := a.store.Update(ctx, space.Auth, key, b, rev)
	if err != nil {
		return 0, storeRefusal("write "+key, err)
	}
	return nrev, nil
}

func (a *Authority) createGate(ctx context.Context, key string, g lifecycle.EndpointGate) (uint64, error) {
	b, err := lifecycle.EncodeEndpointGate(g)
	if err != nil {
		return 0, refuse(CodeBadRequest, "%v", err)
	}
	if err := a.held(); err != nil {
		return 0, err
	}
	nrev, err := a.store.Create(ctx, space.Auth, key, b)
	if err != nil {
		return 0, storeRefusal("create "+key, err)
	}
	return nrev, nil
}

// storeRefusal maps a store failure: a lost compare-and-set is conflict, anything else (no
// answer, a corrupt row) unavailable.
func storeRefusal(what string, err error) error {
	if errors.Is(err, ErrConflict) {
		return &Error{Code: CodeConflict, Msg: what + ": another writer moved the row", Err: err}
	}
	return &Error{Code: CodeUnavailable, Msg: what, Err: err}
}

// CurrentProof is the registration proof of reg: signerd's Mac of lifecycle.ProofPayload(reg) in
// lifecycle.ProofDomain under this space's MAC key ("sha256:" and 64 hex characters). reg.Space
// must be this authority's space.
func (a *Authority) CurrentProof(ctx context.Context, reg lifecycle.Registration) (string, error) {
	if reg.Space != a.cfg.Space {
		return "", refuse(CodeBadRequest, "a registration of space %q, not %q", reg.Space, a.cfg.Space)
	}
	payload, err := lifecycle.ProofPayload(reg)
	if err != nil {
		return "", refuse(CodeBadRequest, "%v", err)
	}
	if a.cfg.Signer == nil {
		return "", refuse(CodeUnavailable, "no signer is configured for registration proofs")
	}
	resp, err := a.cfg.Signer.Mac(ctx, &signerv1.MacRequest{Space: a.cfg.Space,
		Domain: signerv1.MacDomain_MAC_DOMAIN_MANAGER_CURRENT_REGISTRATION, Payload: payload})
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "signerd did not compute the registration proof", Err: err}
	}
	if !lifecycle.IsProof(resp.GetMac()) {
		return "", refuse(CodeUnavailable, "signerd answered a MAC without a proof's shape")
	}
	return resp.GetMac(), nil
}

// VerifyProof recomputes reg's proof and compares it with presented in constant time
// (lifecycle.ProofEqual): nil when they are equal, permission-denied when they are not (a value
// without a proof's shape included), and CurrentProof's refusal when the proof cannot be
// recomputed.
func (a *Authority) VerifyProof(ctx context.Context, reg lifecycle.Registration, presented string) error {
	want, err := a.CurrentProof(ctx, reg)
	if err != nil {
		return err
	}
	if !lifecycle.ProofEqual(presented, want) {
		return refuse(CodePermissionDenied, "the registration proof is not the current registration's")
	}
	return nil
}
