package authority

// Service registration (issue 24 item 4): a register opens (or finds) the instance's proposal
// and answers approval-required; once the name is bound and the owner approved, the replay of
// the same register runs the endpoint barrier on epgate.<epTok>.<iid> and svc.<epTok>.<iid>:
//
//  1. the ledger entry turns registering (epoch, witness, generation, start), before the freeze,
//     so a frozen gate always names the request that froze it;
//  2. the gate open at epoch e freezes (registration op of e, generation +1); a first
//     registration has no gate to freeze;
//  3. the spec at e+1 carries the witness; 4. the gate reopens at e+1 with the spec's revision
//     (generation +1, the witness's generation); 5. the entry turns registered.
//
// A replay of the request that froze the gate adopts its freeze at any age and goes on from the
// step it stopped at, so the generation advances once. A freeze by another request is 503 while
// it is younger than StaleFreeze; an older one is rolled forward (its spec is written: the gate
// reopens on it) or aborted (the gate reopens at its epoch), then this request goes on. A lost
// revision on the freeze is conflict overtaken if a registration moved the gate's epoch or froze
// it, else gate-moved; the same request running twice in this process is 503.

import (
	"context"
	"errors"
	"fmt"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

func (a *Authority) sepRegister(ctx context.Context, req *serviceaccess.Request, owner string) (*serviceaccess.Answer, error) {
	if err := sepKeys(req); err != nil {
		return nil, err
	}
	if req.Contract == nil {
		return nil, refuse(CodeBadRequest, "register carries the contract")
	}
	if err := a.sepFn().check(req.Contract, req.Endpoint); err != nil {
		return nil, refuse(CodeBadRequest, "contract: %v", err)
	}
	for _, art := range req.Contract.Artifacts {
		if len(art.Bytes) > lifecycle.MaxServiceArtifactBytes {
			return sepDenied(req, serviceaccess.CodeTooLarge, "artifact", fmt.Sprintf("an artifact is over %d bytes", lifecycle.MaxServiceArtifactBytes)), nil
		}
	}
	cd, err := contractDigest(req.Contract)
	if err != nil {
		return nil, refuse(CodeBadRequest, "contract: %v", err)
	}
	digest, err := a.sepFn().bodyDigest(req)
	if err != nil {
		return nil, err
	}

	// Authorization: the name, the proposal and the registration must not name another owner.
	n, _, nfound, err := a.store.ServiceName(ctx, req.Endpoint)
	if err != nil {
		return nil, err
	}
	p, prev, pfound, err := a.store.ServiceProposal(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	s, srev, sfound, err := a.store.Spec(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	g, _, gfound, err := a.store.EndpointGate(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	// Another owner's proposal stands in the way while it is approved, or open and not
	// overridden by this owner's name binding.
	now := a.now().Unix()
	pOther := pfound && p.Owner != owner && (approvalCurrent(p, pfound, now) ||
		(p.State == lifecycle.ProposalOpen && p.ExpiresAt > now && !nfound))
	if (nfound && n.Owner != owner) || pOther || (sfound && (s.Service == nil || s.Service.Owner != owner)) {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "owner", "the endpoint or instance belongs to another owner"), nil
	}
	_, _, rfound, err := a.store.ServiceRoot(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}

	l, _, _, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	e, i := l.Find(req.RequestID)
	if i >= 0 {
		if e.Operation != string(req.Kind) || e.Digest != digest {
			return sepConflict(req, serviceaccess.ReasonBodyChanged, "", "the requestId is bound to another request body"), nil
		}
		if e.Outcome.Kind == lifecycle.OutcomeRegistered {
			return a.sepRegistered(req, owner, e.Outcome.Witness, e.Outcome.Generation)
		}
	} else {
		if rfound {
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "activated", "the instance has activated; its registration cannot change"), nil
		}
		// Under a registration's freeze the barrier checks expected once the freeze is resolved.
		midBarrier := gfound && g.State == lifecycle.GateFrozen && g.Op != nil && g.Op.Kind == lifecycle.OpRegistration
		if ans := sepExpected(req, sepCurrentWitness(s, srev, sfound, g, gfound)); ans != nil && !midBarrier {
			return ans, nil
		}
		reuse := pfound && p.Owner == owner && p.ContractDigest == cd &&
			((p.State == lifecycle.ProposalOpen && p.ExpiresAt > now) || approvalCurrent(p, pfound, now))
		if !reuse {
			if p, err = a.sepPropose(ctx, req, owner, cd, prev); err != nil {
				return nil, err
			}
		}
		var ans *serviceaccess.Answer
		e, _, ans, err = a.sepBind(ctx, req, digest, lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeProposed, Proposal: p.Proposal, ExpiresAt: p.ExpiresAt})
		if ans != nil || err != nil {
			return ans, err
		}
		if e.Outcome.Kind == lifecycle.OutcomeRegistered {
			return a.sepRegistered(req, owner, e.Outcome.Witness, e.Outcome.Generation)
		}
		if p, _, pfound, err = a.store.ServiceProposal(ctx, req.Endpoint, req.Instance); err != nil {
			return nil, err
		}
	}

	// A barrier this request began finishes whatever its proposal became meanwhile; otherwise
	// the request's proposal decides what it may do.
	if e.Outcome.Kind == lifecycle.OutcomeRegistering {
		return a.sepBarrier(ctx, req, owner, e.Outcome.Proposal)
	}
	switch {
	case !pfound || p.Proposal != e.Outcome.Proposal || p.Owner != owner:
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-superseded", "the request's proposal was superseded; propose again under a new requestId"), nil
	case p.State == lifecycle.ProposalRefused || p.State == lifecycle.ProposalRevoked:
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-"+p.State, "the proposal is "+p.State+"; propose again under a new requestId"), nil
	case p.State == lifecycle.ProposalOpen && p.ExpiresAt <= now:
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-expired", "the proposal expired; propose again under a new requestId"), nil
	case p.State == lifecycle.ProposalOpen:
		return &serviceaccess.Answer{Kind: serviceaccess.AnswerApprovalRequired, RequestID: req.RequestID, Proposal: p.Proposal, ExpiresAt: p.ExpiresAt}, nil
	case !approvalCurrent(p, pfound, now):
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "approval-expired", "the approval expired; propose again under a new requestId"), nil
	case p.ContractDigest != cd:
		return nil, fmt.Errorf("%w: the proposal %s bound to the request pins another contract", ErrCorrupt, p.Proposal)
	case rfound:
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "activated", "the instance has activated; its registration cannot change"), nil
	}
	return a.sepBarrier(ctx, req, owner, p.Proposal)
}

// sepCurrentWitness is the witness of the registration the gate stands on: the spec's, when the
// gate is open at the spec's epoch and revision ("" otherwise: none, or a barrier in between).
func sepCurrentWitness(s lifecycle.Spec, srev uint64, sfound bool, g lifecycle.EndpointGate, gfound bool) string {
	if sfound && gfound && s.Service != nil && g.State == lifecycle.GateOpen && g.ProcessEpoch == s.ProcessEpoch && g.RegistrationRevision == srev {
		return s.Service.Witness
	}
	return ""
}

// sepExpected checks a new register's precondition against the current registration's witness:
// none without expected, the expected witness with it.
func sepExpected(req *serviceaccess.Request, current string) *serviceaccess.Answer {
	switch {
	case req.Expected == nil && current == "":
		return nil
	case req.Expected == nil:
		return sepConflict(req, serviceaccess.ReasonExpected, current, "the instance is registered; a re-registration sends expected {state: registered, witness}")
	case req.Expected.State != "registered" || current == "" || req.Expected.Witness != current:
		return sepConflict(req, serviceaccess.ReasonExpected, current, "the instance is not in the expected state")
	}
	return nil
}

// sepPropose opens a new proposal in place of the current one (prev its revision, 0: none).
func (a *Authority) sepPropose(ctx context.Context, req *serviceaccess.Request, owner, cd string, prev uint64) (lifecycle.ServiceProposal, error) {
	id, err := newSepID("p_")
	if err != nil {
		return lifecycle.ServiceProposal{}, err
	}
	now := a.now().Unix()
	p := lifecycle.ServiceProposal{Proposal: id, Endpoint: req.Endpoint, InstanceID: req.Instance, Owner: owner, ContractDigest: cd,
		RequestID: req.RequestID, State: lifecycle.ProposalOpen, CreatedAt: now, ExpiresAt: now + int64(ProposalLifetime.Seconds())}
	b, err := lifecycle.EncodeServiceProposal(p)
	if err != nil {
		return p, err
	}
	key, _ := lifecycle.ServiceProposalKey(req.Endpoint, req.Instance)
	if _, err := a.sepWrite(ctx, "propose", key, b, prev, lifecycle.MaxServiceRowBytes); err != nil {
		return p, err // a lost revision too: the replay reads the proposal that won
	}
	return p, nil
}

// sepRegistered is the registered answer for witness at generation, with its snapshot.
func (a *Authority) sepRegistered(req *serviceaccess.Request, owner, witness string, gen uint64) (*serviceaccess.Answer, error) {
	snap, w, err := a.sepSnapshot(req, owner, gen)
	if err != nil {
		return nil, err
	}
	if w != witness {
		return nil, fmt.Errorf("%w: the bound witness is not the snapshot's", ErrCorrupt)
	}
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerRegistered, RequestID: req.RequestID, Witness: witness, Generation: gen, Snapshot: snap}, nil
}

// sepSnapshot is the canonical snapshot of req's registration at gen and its witness.
func (a *Authority) sepSnapshot(req *serviceaccess.Request, owner string, gen uint64) ([]byte, string, error) {
	snap := serviceaccess.Snapshot{V: 1, Account: a.cfg.Account, Space: a.cfg.Space, Owner: owner, Endpoint: req.Endpoint,
		Instance: req.Instance, Generation: gen, Contract: *req.Contract}
	b, err := a.sepFn().canonical(snap)
	if err != nil {
		return nil, "", err
	}
	w := a.sepFn().witnessOf(b)
	if w == "" {
		return nil, "", errors.New("authority: no witness for the snapshot")
	}
	return b, w, nil
}

// sepFreezeOwner finds the ledger entry whose barrier froze g (registering toward its next
// epoch and generation), or false.
func sepFreezeOwner(l lifecycle.ServiceLedger, g lifecycle.EndpointGate) (lifecycle.ServiceLedgerEntry, bool) {
	var best lifecycle.ServiceLedgerEntry
	ok := false
	for _, e := range l.Entries {
		o := e.Outcome
		if o.Kind == lifecycle.OutcomeRegistering && o.Epoch == g.ProcessEpoch+1 && o.Generation == g.Generation+1 &&
			(!ok || o.StartedAt > best.Outcome.StartedAt) {
			best, ok = e, true
		}
	}
	return best, ok
}

// sepBarrier runs req's registration barrier under its approved proposal.
func (a *Authority) sepBarrier(ctx context.Context, req *serviceaccess.Request, owner, proposal string) (*serviceaccess.Answer, error) {
	fkey := req.Endpoint + "/" + req.Instance
	a.sep.mu.Lock()
	if a.sep.flights == nil {
		a.sep.flights = map[string]bool{}
	}
	if a.sep.flights[fkey] {
		a.sep.mu.Unlock()
		return sepBusy(req, "a registration of the instance is in flight; replay the same request"), nil
	}
	a.sep.flights[fkey] = true
	a.sep.mu.Unlock()
	defer func() {
		a.sep.mu.Lock()
		delete(a.sep.flights, fkey)
		a.sep.mu.Unlock()
	}()

	principal := lifecycle.ServicePrincipal(owner, req.Instance)
	if _, err := space.PrincipalKey(owner, lifecycle.ServiceActorPrefix+req.Instance); err != nil {
		return nil, refuse(CodeBadRequest, "principal: %v", err)
	}
	gkey, _ := lifecycle.EndpointGateKey(req.Endpoint, req.Instance)
	skey, _ := lifecycle.SpecKey(req.Endpoint, req.Instance)

	for range 4 {
		g, grev, gfound, err := a.store.EndpointGate(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return nil, err
		}
		s, srev, sfound, err := a.store.Spec(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return nil, err
		}
		l, _, _, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return nil, err
		}
		me, i := l.Find(req.RequestID)
		if i < 0 {
			return nil, fmt.Errorf("%w: the ledger lost %s", ErrCorrupt, req.RequestID)
		}
		if me.Outcome.Kind == lifecycle.OutcomeRegistered {
			return a.sepRegistered(req, owner, me.Outcome.Witness, me.Outcome.Generation)
		}
		switch {
		case gfound && g.Principal != principal:
			return sepDenied(req, serviceaccess.CodePermissionDenied, "principal", "the instance's gate admits another principal"), nil
		case gfound && (g.State == lifecycle.GateRetired || (g.State == lifecycle.GateFrozen && g.Op.Kind != lifecycle.OpRegistration)):
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "retired", "the instance is retiring or retired"), nil
		case gfound && !sfound:
			return nil, fmt.Errorf("%w: %s is absent under an existing gate", ErrCorrupt, skey)
		}

		// This request's own earlier barrier: finished, or adopted from where it stopped.
		var epoch, gen uint64
		var witness string
		adopt := false
		if mo := me.Outcome; mo.Kind == lifecycle.OutcomeRegistering {
			if gfound && g.State == lifecycle.GateOpen && g.ProcessEpoch == mo.Epoch && s.Service != nil &&
				s.Service.Witness == mo.Witness && g.RegistrationRevision == srev {
				return a.sepCommit(ctx, req, owner, mo)
			}
			if (!gfound && mo.Epoch == 0 && mo.Generation == 1) ||
				(gfound && g.State == lifecycle.GateFrozen && g.ProcessEpoch+1 == mo.Epoch && g.Generation+1 == mo.Generation) {
				adopt, epoch, gen, witness = true, mo.Epoch, mo.Generation, mo.Witness
			}
		}

		if !adopt {
			if gfound && g.State == lifecycle.GateFrozen {
				// Another request's barrier holds the freeze.
				o, ok := sepFreezeOwner(l, g)
				if ok && a.now().Unix()-o.Outcome.StartedAt <= int64(StaleFreeze.Seconds()) {
					return sepBusy(req, "another registration of the instance holds its barrier; replay the same request"), nil
				}
				if err := a.sepRecoverFreeze(ctx, req, g, grev, s, srev, o, ok); err != nil {
					return nil, err
				}
				continue
			}
			if ans := sepExpected(req, sepCurrentWitness(s, srev, sfound, g, gfound)); ans != nil {
				return ans, nil
			}
			// A fresh barrier stands on the request's proposal, approved and current.
			p, _, pfound, err := a.store.ServiceProposal(ctx, req.Endpoint, req.Instance)
			if err != nil {
				return nil, err
			}
			if !approvalCurrent(p, pfound, a.now().Unix()) || p.Proposal != proposal || p.Owner != owner {
				return sepDenied(req, serviceaccess.CodeFailedPrecondition, "approval", "the request's proposal is no longer approved; propose again under a new requestId"), nil
			}
			if gfound {
				epoch, gen = g.ProcessEpoch+1, g.Generation+2
			} else {
				epoch, gen = 0, 1
			}
			if epoch > lifecycle.MaxSafeInteger || gen > lifecycle.MaxSafeInteger {
				return sepDenied(req, serviceaccess.CodeFailedPrecondition, "exhausted", "the instance's epoch or generation is exhausted"), nil
			}
			if _, witness, err = a.sepSnapshot(req, owner, gen); err != nil {
				return nil, err
			}
			o := lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeRegistering, Proposal: proposal, Witness: witness, Generation: gen,
				Epoch: epoch, StartedAt: max(a.now().Unix(), 1)}
			if _, err := a.sepSetOutcome(ctx, "ledger-registering", req, o, func(c lifecycle.ServiceOutcome) bool {
				return c.Kind == lifecycle.OutcomeProposed || c.Kind == lifecycle.OutcomeRegistering
			}); err != nil {
				return nil, err
			}
			if gfound {
				op, err := lifecycle.RegistrationOpID(req.Endpoint, req.Instance, g.ProcessEpoch)
				if err != nil {
					return nil, err
				}
				frozen := g
				frozen.State, frozen.Generation, frozen.Op = lifecycle.GateFrozen, g.Generation+1, &lifecycle.Op{OpID: op, Kind: lifecycle.OpRegistration}
				if grev, err = a.sepWriteGate(ctx, "freeze", gkey, frozen, grev); err != nil {
					if errors.Is(err, ErrConflict) {
						return a.sepLost(ctx, req, g, s)
					}
					return nil, err
				}
				g = frozen
				// An activate may have created the root since the register read it: the
				// registration cannot change any more, so the freeze is undone.
				if _, _, rfound, err := a.store.ServiceRoot(ctx, req.Endpoint, req.Instance); err != nil {
					return nil, err
				} else if rfound {
					reopen := g
					reopen.State, reopen.Op, reopen.ProcessEpoch, reopen.Generation = lifecycle.GateOpen, nil, epoch-1, g.Generation+1
					if _, err := a.sepWriteGate(ctx, "abort", gkey, reopen, grev); err != nil {
						return nil, err
					}
					return sepDenied(req, serviceaccess.CodeFailedPrecondition, "activated", "the instance has activated; its registration cannot change"), nil
				}
			}
		}

		// The spec at the new epoch, unless an earlier run of this request wrote it.
		if !(sfound && s.ProcessEpoch == epoch && s.Service != nil && s.Service.Witness == witness) {
			cd, err := contractDigest(req.Contract)
			if err != nil {
				return nil, err
			}
			sb, err := lifecycle.EncodeSpec(lifecycle.Spec{Endpoint: req.Endpoint, InstanceID: req.Instance, Principal: principal, ProcessEpoch: epoch,
				Service: &lifecycle.SpecService{Witness: witness, Owner: owner, Generation: gen, Contract: cd}})
			if err != nil {
				return nil, refuse(CodeBadRequest, "%v", err)
			}
			if err := a.sepFault("spec"); err != nil {
				return nil, err
			}
			if err := a.held(); err != nil {
				return nil, err
			}
			if sfound {
				srev, err = a.store.Update(ctx, space.Records, skey, sb, srev)
			} else {
				srev, err = a.store.Create(ctx, space.Records, skey, sb)
			}
			if errors.Is(err, ErrConflict) {
				return sepConflict(req, serviceaccess.ReasonOvertaken, "", "another registration wrote the instance's spec"), nil
			}
			if err != nil {
				return nil, err
			}
		}

		// The gate open at the new epoch on the spec's revision.
		open := lifecycle.EndpointGate{State: lifecycle.GateOpen, Principal: principal, ProcessEpoch: epoch, RegistrationRevision: srev, Generation: gen}
		if !gfound {
			_, err = a.sepWriteGate(ctx, "reopen", gkey, open, 0)
		} else {
			_, err = a.sepWriteGate(ctx, "reopen", gkey, open, grev)
		}
		if errors.Is(err, ErrConflict) {
			c, _, _, rerr := a.store.EndpointGate(ctx, req.Endpoint, req.Instance)
			if rerr != nil {
				return nil, rerr
			}
			if c.State != lifecycle.GateOpen || c.ProcessEpoch != epoch || c.RegistrationRevision != srev {
				return sepConflict(req, serviceaccess.ReasonOvertaken, "", "another registration moved the instance's gate"), nil
			}
			// Another register rolled this barrier forward: it is committed.
		} else if err != nil {
			return nil, err
		}
		return a.sepCommit(ctx, req, owner, lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeRegistering, Proposal: proposal,
			Witness: witness, Generation: gen, Epoch: epoch})
	}
	return sepBusy(req, "the instance's gate kept moving; replay the same request"), nil
}

// sepCommit turns the request's entry registered and answers it.
func (a *Authority) sepCommit(ctx context.Context, req *serviceaccess.Request, owner string, mo lifecycle.ServiceOutcome) (*serviceaccess.Answer, error) {
	done := lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeRegistered, Proposal: mo.Proposal, Witness: mo.Witness, Generation: mo.Generation, Epoch: mo.Epoch}
	if _, err := a.sepSetOutcome(ctx, "ledger-registered", req, done, nil); err != nil {
		return nil, err
	}
	return a.sepRegistered(req, owner, mo.Witness, mo.Generation)
}

// sepLost answers a freeze that lost its revision: overtaken if a registration moved the gate's
// epoch or holds it frozen, else gate-moved (the witness as the request read it).
func (a *Authority) sepLost(ctx context.Context, req *serviceaccess.Request, read lifecycle.EndpointGate, s lifecycle.Spec) (*serviceaccess.Answer, error) {
	c, _, _, err := a.store.EndpointGate(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	cs, _, _, err := a.store.Spec(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	witness := ""
	if cs.Service != nil {
		witness = cs.Service.Witness
	}
	if c.ProcessEpoch != read.ProcessEpoch || (c.State == lifecycle.GateFrozen && c.Op != nil && c.Op.Kind == lifecycle.OpRegistration) {
		return sepConflict(req, serviceaccess.ReasonOvertaken, witness, "another registration overtook the request before its freeze"), nil
	}
	if s.Service != nil {
		witness = s.Service.Witness
	}
	return sepConflict(req, serviceaccess.ReasonGateMoved, witness, "the instance's gate moved under the request without a new registration"), nil
}

// sepRecoverFreeze ends a stale freeze of another request: rolled forward when its spec is
// written (the spec at the next epoch carries the freeze's next generation and, if the freeze's
// entry is known, its witness: the gate reopens on it), else aborted (the gate reopens at its
// epoch of before, on the spec it stood on).
func (a *Authority) sepRecoverFreeze(ctx context.Context, req *serviceaccess.Request, g lifecycle.EndpointGate, grev uint64,
	s lifecycle.Spec, srev uint64, o lifecycle.ServiceLedgerEntry, owned bool) error {
	gkey, _ := lifecycle.EndpointGateKey(req.Endpoint, req.Instance)
	open := g
	open.State, open.Op, open.Generation = lifecycle.GateOpen, nil, g.Generation+1
	point := "abort"
	if s.ProcessEpoch == g.ProcessEpoch+1 && s.Service != nil && s.Service.Generation == g.Generation+1 &&
		(!owned || s.Service.Witness == o.Outcome.Witness) {
		open.ProcessEpoch, open.RegistrationRevision, point = g.ProcessEpoch+1, srev, "roll-forward"
	}
	_, err := a.sepWriteGate(ctx, point, gkey, open, grev)
	if errors.Is(err, ErrConflict) {
		return nil // another writer ended it: the next round reads what it left
	}
	if err == nil {
		a.log.Warn("service registration barrier recovered a stale freeze", "gate", gkey, "how", point, "owner", o.RequestID)
	}
	return err
}

// sepWriteGate writes an endpoint gate (rev 0: create) after the fault hook and the plane check.
func (a *Authority) sepWriteGate(ctx context.Context, point, key string, g lifecycle.EndpointGate, rev uint64) (uint64, error) {
	b, err := lifecycle.EncodeEndpointGate(g)
	if err != nil {
		return 0, err
	}
	if err := a.sepFault(point); err != nil {
		return 0, err
	}
	if err := a.held(); err != nil {
		return 0, err
	}
	if rev == 0 {
		return a.store.Create(ctx, space.Auth, key, b)
	}
	return a.store.Update(ctx, space.Auth, key, b, rev)
}
