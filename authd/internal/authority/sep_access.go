package authority

// Service access (issue 24 item 4): activate, renew, ready, status and the callout's CheckServe,
// each re-reading what a service credential stands on: the registration (svc.<epTok>.<iid>
// carrying the witness) current under its open gate, the approval, the name binding and, once
// the first activate created it, the root. Activate and renew mint an access bearer (at most
// 60 s) and a renewal proof (at most 24 h) through signerd, neither outliving the root or the
// approval; a revoke ends both, so renew, activate, ready and the callout refuse after it.

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// sepCurrent is what a service credential stands on, read fresh.
type sepCurrent struct {
	spec     lifecycle.Spec
	proposal lifecycle.ServiceProposal
	root     lifecycle.ServiceRoot
	hasRoot  bool
}

// sepStanding reads the registration of endpoint/iid and checks it is current at witness for
// owner ("" skips the owner) with a current approval and name binding. A refusal is
// (code, reason, message); err is a store failure.
func (a *Authority) sepStanding(ctx context.Context, endpoint, iid, witness, owner string) (sepCurrent, [3]string, error) {
	var c sepCurrent
	deny := func(code, reason, msg string) (sepCurrent, [3]string, error) {
		return c, [3]string{code, reason, msg}, nil
	}
	s, srev, sfound, err := a.store.Spec(ctx, endpoint, iid)
	if err != nil {
		return c, [3]string{}, err
	}
	if !sfound || s.Service == nil {
		return deny(serviceaccess.CodeNotFound, "unregistered", "the instance has no service registration")
	}
	c.spec = s
	if s.Service.Witness != witness {
		return deny(serviceaccess.CodeFailedPrecondition, "witness", "the witness is not the current registration's")
	}
	if owner != "" && s.Service.Owner != owner {
		return deny(serviceaccess.CodePermissionDenied, "owner", "the registration belongs to another owner")
	}
	g, _, gfound, err := a.store.EndpointGate(ctx, endpoint, iid)
	if err != nil {
		return c, [3]string{}, err
	}
	switch {
	case !gfound:
		return deny(serviceaccess.CodeFailedPrecondition, "unregistered", "the instance's registration is not committed")
	case g.State == lifecycle.GateFrozen && g.Op != nil && g.Op.Kind == lifecycle.OpRegistration:
		return c, [3]string{}, refuse(CodeUnavailable, "the instance's registration barrier holds its gate")
	case g.State != lifecycle.GateOpen:
		return deny(serviceaccess.CodeFailedPrecondition, "retired", "the instance is retiring or retired")
	case g.ProcessEpoch != s.ProcessEpoch || g.RegistrationRevision != srev || g.Principal != s.Principal:
		return deny(serviceaccess.CodeFailedPrecondition, "witness", "the registration is not the gate's current one")
	}
	now := a.now().Unix()
	p, _, pfound, err := a.store.ServiceProposal(ctx, endpoint, iid)
	if err != nil {
		return c, [3]string{}, err
	}
	if !approvalCurrent(p, pfound, now) || p.Owner != s.Service.Owner || p.ContractDigest != s.Service.Contract {
		return deny(serviceaccess.CodeFailedPrecondition, "approval", "the registration has no current approval")
	}
	c.proposal = p
	n, _, nfound, err := a.store.ServiceName(ctx, endpoint)
	if err != nil {
		return c, [3]string{}, err
	}
	if !nfound || n.Owner != s.Service.Owner {
		return deny(serviceaccess.CodeFailedPrecondition, "name", "the endpoint name is not bound to the registration's owner")
	}
	r, _, rfound, err := a.store.ServiceRoot(ctx, endpoint, iid)
	if err != nil {
		return c, [3]string{}, err
	}
	if rfound {
		if r.Witness != witness {
			return deny(serviceaccess.CodeFailedPrecondition, "root", "the root belongs to another registration")
		}
		if r.ExpiresAt <= now {
			return deny(serviceaccess.CodeFailedPrecondition, "root-ended", "the root has ended")
		}
		c.root, c.hasRoot = r, true
	}
	return c, [3]string{}, nil
}

// sepCredential runs activate (creating the root on the first) and renew, minting anew.
func (a *Authority) sepCredential(ctx context.Context, req *serviceaccess.Request, caller ServiceCaller) (*serviceaccess.Answer, error) {
	if err := sepKeys(req); err != nil {
		return nil, err
	}
	owner := caller.Owner
	c, d, err := a.sepStanding(ctx, req.Endpoint, req.Instance, req.Witness, owner)
	if err != nil {
		return nil, err
	}
	if d[0] != "" {
		return sepDenied(req, d[0], d[1], d[2]), nil
	}
	if caller.Proof == serviceaccess.ProofRenewal && (!c.hasRoot || caller.Renewal.Root != c.root.Root) {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "root", "the renewal proof names another root"), nil
	}
	if req.Kind == serviceaccess.KindRenew && !c.hasRoot {
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "not-activated", "the instance has not activated"), nil
	}
	digest, err := a.sepFn().bodyDigest(req)
	if err != nil {
		return nil, err
	}
	if _, _, ans, err := a.sepBind(ctx, req, digest, lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeCredential}); ans != nil || err != nil {
		return ans, err
	}
	if !c.hasRoot {
		if c.root, err = a.sepCreateRoot(ctx, req, c); err != nil {
			return nil, err
		}
		// A register may have frozen the registration since it was read: it sees the root and
		// aborts, or it committed first and this root is not the current registration's.
		if _, d, err := a.sepStanding(ctx, req.Endpoint, req.Instance, req.Witness, owner); err != nil {
			return nil, err
		} else if d[0] != "" {
			return sepDenied(req, d[0], d[1], d[2]), nil
		}
	}
	notAfter := min(c.root.ExpiresAt, c.proposal.ApprovalExpiresAt)
	access, err := a.sepMint(ctx, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, c, serviceaccess.MaxAccessLifetime, notAfter)
	if err == nil {
		var renewal *serviceaccess.Token
		if renewal, err = a.sepMint(ctx, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL, c, serviceaccess.MaxRenewalLifetime, notAfter); err == nil {
			return &serviceaccess.Answer{Kind: serviceaccess.AnswerCredential, RequestID: req.RequestID, Witness: req.Witness, Root: c.root.Root,
				Access: access, Renewal: renewal, ApprovalExpiresAt: c.proposal.ApprovalExpiresAt}, nil
		}
	}
	if signerclient.ReasonOf(err) == signerv1.Reason_REASON_TTL_INVALID {
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "ended", "the root or the approval has ended"), nil
	}
	return nil, err
}

// sepCreateRoot creates the instance's root, expiring with the approval (a concurrent first
// activate's root is adopted).
func (a *Authority) sepCreateRoot(ctx context.Context, req *serviceaccess.Request, c sepCurrent) (lifecycle.ServiceRoot, error) {
	id, err := newSepID("r_")
	if err != nil {
		return lifecycle.ServiceRoot{}, err
	}
	r := lifecycle.ServiceRoot{Root: id, Witness: c.spec.Service.Witness, Generation: c.spec.Service.Generation,
		CreatedAt: max(a.now().Unix(), 1), ExpiresAt: c.proposal.ApprovalExpiresAt}
	b, err := lifecycle.EncodeServiceRoot(r)
	if err != nil {
		return r, err
	}
	key, _ := lifecycle.ServiceRootKey(req.Endpoint, req.Instance)
	if _, err = a.sepWrite(ctx, "root", key, b, 0, lifecycle.MaxServiceRowBytes); err == nil {
		return r, nil
	}
	if !errors.Is(err, ErrConflict) {
		return r, err
	}
	got, _, found, err := a.store.ServiceRoot(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return r, err
	}
	if !found || got.Witness != r.Witness || got.ExpiresAt <= a.now().Unix() {
		return r, refuse(CodeUnavailable, "%s moved under the first activate", key)
	}
	return got, nil
}

// sepMint has signerd sign one service token for c's registration and root.
func (a *Authority) sepMint(ctx context.Context, kind signerv1.ServiceCredentialKind, c sepCurrent, ttl time.Duration, notAfter int64) (*serviceaccess.Token, error) {
	if a.cfg.Signer == nil {
		return nil, refuse(CodeUnavailable, "no signer is configured for service credentials")
	}
	resp, err := a.cfg.Signer.SignServiceCredential(ctx, &signerv1.SignServiceCredentialRequest{
		Space: a.cfg.Space, Kind: kind, Owner: c.spec.Service.Owner, Witness: c.spec.Service.Witness,
		Endpoint: c.spec.Endpoint, InstanceId: c.spec.InstanceID, Root: c.root.Root,
		Ttl: durationpb.New(ttl), NotAfter: timestamppb.New(time.Unix(notAfter, 0)),
	})
	if err != nil {
		return nil, err
	}
	exp := resp.GetExpiresAt().AsTime().Unix()
	if resp.GetToken() == "" || exp > notAfter || exp <= a.now().Unix()-int64(serviceaccess.IssuedAtTolerance.Seconds()) {
		return nil, refuse(CodeUnavailable, "signerd answered a %s token outside its bounds", kind)
	}
	return &serviceaccess.Token{Token: resp.GetToken(), Exp: exp}, nil
}

// sepReady binds a ready to the access bearer's current registration.
func (a *Authority) sepReady(ctx context.Context, req *serviceaccess.Request, caller ServiceCaller) (*serviceaccess.Answer, error) {
	if err := sepKeys(req); err != nil {
		return nil, err
	}
	digest, err := a.sepFn().bodyDigest(req)
	if err != nil {
		return nil, err
	}
	ready := &serviceaccess.Answer{Kind: serviceaccess.AnswerReady, RequestID: req.RequestID, Witness: req.Witness}
	l, _, _, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	if e, i := l.Find(req.RequestID); i >= 0 {
		if e.Operation != string(req.Kind) || e.Digest != digest {
			return sepConflict(req, serviceaccess.ReasonBodyChanged, "", "the requestId is bound to another request body"), nil
		}
		return ready, nil // the bound outcome
	}
	if d, err := a.sepServeCheck(ctx, caller.Access); err != nil {
		return nil, err
	} else if d[0] != "" {
		return sepDenied(req, d[0], d[1], d[2]), nil
	}
	if _, _, ans, err := a.sepBind(ctx, req, digest, lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeReady, Witness: req.Witness}); ans != nil || err != nil {
		return ans, err
	}
	return ready, nil
}

// sepServeCheck is CheckServe's reading: the access claims' registration, gate, root, approval
// and name, all current.
func (a *Authority) sepServeCheck(ctx context.Context, x *serviceaccess.AccessClaims) ([3]string, error) {
	if x == nil {
		return [3]string{serviceaccess.CodePermissionDenied, "proof", "no access claims"}, nil
	}
	if _, err := lifecycle.EndpointGateKey(x.Ep, x.Iid); err != nil {
		return [3]string{serviceaccess.CodePermissionDenied, "claims", "the claims name no endpoint instance"}, nil
	}
	c, d, err := a.sepStanding(ctx, x.Ep, x.Iid, x.Wit, x.Sub)
	if err != nil || d[0] != "" {
		return d, err
	}
	if !c.hasRoot || c.root.Root != x.Root {
		return [3]string{serviceaccess.CodePermissionDenied, "root", "the bearer names another root"}, nil
	}
	return [3]string{}, nil
}

// sepStatus reads an instance or one bound request.
func (a *Authority) sepStatus(ctx context.Context, req *serviceaccess.Request, caller ServiceCaller) (*serviceaccess.Answer, error) {
	if err := sepKeys(req); err != nil {
		return nil, err
	}
	if req.Target == nil {
		return nil, refuse(CodeBadRequest, "status carries a target")
	}
	s, srev, sfound, err := a.store.Spec(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	p, _, pfound, err := a.store.ServiceProposal(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	owner := ""
	switch {
	case sfound && s.Service != nil:
		owner = s.Service.Owner
	case pfound:
		owner = p.Owner
	}
	if caller.Proof != serviceaccess.ProofOperator && owner != caller.Owner {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "owner", "the instance belongs to another owner"), nil
	}
	l, _, _, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	current := ""
	if sfound && s.Service != nil {
		g, _, gfound, err := a.store.EndpointGate(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return nil, err
		}
		if gfound && g.State == lifecycle.GateOpen && g.ProcessEpoch == s.ProcessEpoch && g.RegistrationRevision == srev {
			current = s.Service.Witness
		}
	}
	ans := &serviceaccess.Answer{Kind: serviceaccess.AnswerStatus}
	if req.Target.Kind == serviceaccess.TargetOperation {
		op := &serviceaccess.OperationStatus{Operation: req.Target.Operation, RequestID: req.Target.RequestID}
		if e, i := l.Find(req.Target.RequestID); i >= 0 && e.Operation == string(req.Target.Operation) {
			op.Outcome = sepOutcomeKind(e.Outcome, current)
		}
		ans.Operation = op
		return ans, nil
	}
	if req.Target.Kind != serviceaccess.TargetInstance {
		return nil, refuse(CodeBadRequest, "target kind is not instance or operation")
	}
	now := a.now().Unix()
	st := &serviceaccess.InstanceStatus{State: "absent"}
	if pfound {
		st.Proposal = p.Proposal
		switch {
		case p.State == lifecycle.ProposalOpen && p.ExpiresAt > now:
			st.State = "proposed"
		case p.State == lifecycle.ProposalRefused || p.State == lifecycle.ProposalRevoked:
			st.State = "revoked"
		}
		if approvalCurrent(p, pfound, now) {
			st.ApprovalExpiresAt = p.ApprovalExpiresAt
		}
	}
	if current != "" && st.State != "revoked" {
		st.State, st.Witness, st.Generation = "registered", current, s.Service.Generation
		r, _, rfound, err := a.store.ServiceRoot(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return nil, err
		}
		switch {
		case rfound && (r.ExpiresAt <= now || !approvalCurrent(p, pfound, now)):
			st.State = "revoked"
		case rfound:
			st.State = "active"
			for _, e := range l.Entries {
				if e.Outcome.Kind == lifecycle.OutcomeReady && e.Outcome.Witness == current {
					st.State = "ready"
				}
			}
		}
	}
	ans.Instance = st
	return ans, nil
}

// sepOutcomeKind is the answer kind a bound outcome stands for ("" while unbound or in its
// barrier); registered and ready only while their registration is current.
func sepOutcomeKind(o lifecycle.ServiceOutcome, current string) serviceaccess.AnswerKind {
	switch o.Kind {
	case lifecycle.OutcomeProposed:
		return serviceaccess.AnswerApprovalRequired
	case lifecycle.OutcomeRegistered, lifecycle.OutcomeReady:
		if o.Witness != current {
			return serviceaccess.AnswerConflict
		}
		if o.Kind == lifecycle.OutcomeReady {
			return serviceaccess.AnswerReady
		}
		return serviceaccess.AnswerRegistered
	case lifecycle.OutcomeDecided:
		return serviceaccess.AnswerDecided
	case lifecycle.OutcomeCredential:
		return serviceaccess.AnswerCredential
	}
	return ""
}
