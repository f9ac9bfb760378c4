package authority

// The remote manager authority (issue 25; seed 001 "Managed-agent authority transport",
// reference lifecycle-hosted.md §2.6-2.7): what authd's /manager-service-authority door
// (authd/internal/msadoor) asks once it verified the caller's IdP proof and derived its owner.
// A remote manager instance is served by the principal <owner>.manager_serve_<instanceId>
// (lifecycle.ServePrincipal), on the manager endpoint's gate epgate.manager.<instanceId>.
//
// Every operation first requires the caller's interactive ledger row (owner, actor), read fresh,
// to hold the capability word "supervise" exactly: spawn and admin never imply it (Supervising).
// Then:
//
//   - prepare (PrepareRemoteManager): a gate of the instance admitting another principal is
//     permission-denied and a retired one failed-precondition; otherwise signerd mints a
//     remote-manager credential (the instance's supervisor actor, manager_<instanceId>) for the
//     supervisor nkey;
//   - activate (ActivateRemoteManager): the instance lease must be held by the serve principal
//     (the register-manager rail's rule), then RegisterEndpoint commits the next epoch and
//     CurrentProof computes the registration proof the later operations present;
//   - renew (RenewRemoteManager) and retire (RetirementRequester): CheckCurrentRegistration, then
//     a fresh remote-manager credential, or a retirement-requester for one target of the owner at
//     its managed retirement opId, caller <owner>.manager_serve_<instanceId> at the manager's
//     lifecycle uid.
//
// CheckCurrentRegistration is the one current-registration check, shared by renew, retire and
// the four managed-agent decisions (AuthorizeRemoteManagedAgentEnrollment,
// AuthorizeRemoteManagedAgentPrepareRetirement, AuthorizeRemoteManagedAgentRuntimeCreate,
// AuthorizeRemoteManagedAgentRuntimeStatus): the gate open (else failed-precondition), admitting
// the serve principal (else permission-denied), at the presented serve epoch (else conflict), and
// the presented proof equal, in constant time, to the one recomputed for the gate's registration
// revision and epoch (else permission-denied).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/profiles"
)

// ScopeSupervise is the ledger capability word a remote manager's authenticating row must hold.
const ScopeSupervise = "supervise"

// mintTimeout bounds one signerd Mint.
const mintTimeout = 5 * time.Second

// RemoteManager is one remote manager lifecycle as its requests name it: the owner the IdP proof
// derived, the interactive actor that authenticates it, its instance, its lifecycle uid and the
// public nkeys of its five actors.
type RemoteManager struct {
	Owner, Actor string
	InstanceID   string
	LifecycleUID string
	Identities   lifecycle.Identities
}

// ServePrincipal is the instance's serve principal, <owner>.manager_serve_<instanceId>.
func (m RemoteManager) ServePrincipal() (string, error) {
	return lifecycle.ServePrincipal(m.Owner, m.InstanceID)
}

// registration is m's registration at the gate's revision and epoch.
func (a *Authority) registration(m RemoteManager, g lifecycle.EndpointGate) lifecycle.Registration {
	return lifecycle.Registration{Space: a.cfg.Space, Owner: m.Owner, Actor: m.Actor, InstanceID: m.InstanceID,
		LifecycleUID: m.LifecycleUID, Identities: m.Identities, RegistrationRevision: g.RegistrationRevision,
		ProcessEpoch: g.ProcessEpoch}
}

// Supervising checks, fresh from the ledger, that owner's interactive row actor holds the scope
// word supervise: permission-denied when there is no such row, the row is refused (a managed row,
// a row in both spaces, a broken spawner chain) or it lacks the word (spawn and admin never imply
// it).
func (a *Authority) Supervising(owner, actor string) error {
	row, err := a.cfg.Ledger.AuthorizeGrant(owner, actor)
	switch {
	case errors.Is(err, ledger.ErrNoRow):
		return refuse(CodePermissionDenied, "no interactive grant for actor %q under owner %s", actor, owner)
	case err != nil:
		return &Error{Code: CodePermissionDenied, Msg: fmt.Sprintf("the interactive grant for actor %q is refused", actor), Err: err}
	case !slices.Contains(row.Scope, ScopeSupervise):
		return refuse(CodePermissionDenied, "the grant for actor %q lacks scope %q (spawn and admin do not imply it)", actor, ScopeSupervise)
	}
	return nil
}

// CheckCurrentRegistration is the one current-registration check (see the file comment). It
// returns the gate it checked.
func (a *Authority) CheckCurrentRegistration(ctx context.Context, m RemoteManager, serveEpoch uint64, proof string) (lifecycle.EndpointGate, error) {
	principal, err := m.ServePrincipal()
	if err != nil {
		return lifecycle.EndpointGate{}, refuse(CodeBadRequest, "%v", err)
	}
	g, _, found, err := a.store.EndpointGate(ctx, lifecycle.ManagerEndpoint, m.InstanceID)
	switch {
	case err != nil:
		return lifecycle.EndpointGate{}, storeRefusal("read the manager gate", err)
	case !found:
		return lifecycle.EndpointGate{}, refuse(CodeFailedPrecondition, "manager instance %s is not registered", m.InstanceID)
	case g.State != lifecycle.GateOpen:
		return lifecycle.EndpointGate{}, &Error{Code: CodeFailedPrecondition, Msg: fmt.Sprintf("the gate of manager instance %s is %s", m.InstanceID, g.State),
			GateState: g.State}
	case g.Principal != principal:
		return lifecycle.EndpointGate{}, refuse(CodePermissionDenied, "manager instance %s is served by another principal", m.InstanceID)
	case g.ProcessEpoch != serveEpoch:
		return lifecycle.EndpointGate{}, refuse(CodeConflict, "manager instance %s is at epoch %d, not %d: a later registration committed", m.InstanceID, g.ProcessEpoch, serveEpoch)
	}
	if err := a.VerifyProof(ctx, a.registration(m, g), proof); err != nil {
		return lifecycle.EndpointGate{}, err
	}
	return g, nil
}

// mint asks signerd for a credential of profile for userKey.
func (a *Authority) mint(ctx context.Context, profile signerv1.Profile, userKey string, p *signerv1.ProfileParams) (*signerv1.Credential, error) {
	if a.cfg.Signer == nil {
		return nil, refuse(CodeUnavailable, "no signer is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, mintTimeout)
	defer cancel()
	resp, err := a.cfg.Signer.Mint(ctx, &signerv1.MintRequest{Space: a.cfg.Space, Profile: profile, UserPublicKey: userKey, Params: p})
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Msg: "signerd did not mint the " + profile.String() + " credential", Err: err}
	}
	if resp.GetCredential().GetJwt() == "" || resp.GetCredential().GetExpiresAt() == nil {
		return nil, refuse(CodeUnavailable, "signerd answered an empty credential")
	}
	return resp.GetCredential(), nil
}

// mintSupervisor mints m's remote-manager credential for its supervisor nkey.
func (a *Authority) mintSupervisor(ctx context.Context, m RemoteManager) (*signerv1.Credential, error) {
	return a.mint(ctx, signerv1.Profile_PROFILE_REMOTE_MANAGER, m.Identities.Supervisor, &signerv1.ProfileParams{
		Owner: m.Owner, Actor: profiles.ManagerActorPrefix + m.InstanceID, InstanceId: m.InstanceID})
}

// PrepareRemoteManager is prepare: the supervise row, no foreign or retired gate, then a
// remote-manager credential for m's supervisor nkey.
func (a *Authority) PrepareRemoteManager(ctx context.Context, m RemoteManager) (*signerv1.Credential, error) {
	if err := a.Supervising(m.Owner, m.Actor); err != nil {
		return nil, err
	}
	principal, err := m.ServePrincipal()
	if err != nil {
		return nil, refuse(CodeBadRequest, "%v", err)
	}
	g, _, found, err := a.store.EndpointGate(ctx, lifecycle.ManagerEndpoint, m.InstanceID)
	switch {
	case err != nil:
		return nil, storeRefusal("read the manager gate", err)
	case found && g.Principal != principal:
		return nil, refuse(CodePermissionDenied, "manager instance %s is served by another principal", m.InstanceID)
	case found && g.State == lifecycle.GateRetired:
		return nil, &Error{Code: CodeFailedPrecondition, Msg: fmt.Sprintf("manager instance %s is retired", m.InstanceID), GateState: lifecycle.GateRetired}
	}
	cred, err := a.mintSupervisor(ctx, m)
	if err != nil {
		return nil, err
	}
	a.log.Info("remote manager prepared", "owner", m.Owner, "actor", m.Actor, "instance", m.InstanceID, "exp", cred.GetExpiresAt().AsTime())
	return cred, nil
}

// ActivateRemoteManager is activate once the door checked the activation proof: the supervise
// row, the instance lease held by the serve principal, then RegisterEndpoint and the current
// registration proof of the committed registration.
func (a *Authority) ActivateRemoteManager(ctx context.Context, m RemoteManager) (Registration, string, error) {
	if err := a.Supervising(m.Owner, m.Actor); err != nil {
		return Registration{}, "", err
	}
	principal, err := m.ServePrincipal()
	if err != nil {
		return Registration{}, "", refuse(CodeBadRequest, "%v", err)
	}
	lease, _, found, err := a.store.Lease(ctx, m.InstanceID)
	switch {
	case err != nil:
		return Registration{}, "", &Error{Code: CodeUnavailable, Msg: "the instance lease could not be read", Err: err}
	case !found:
		return Registration{}, "", refuse(CodePermissionDenied, "no manager holds the lease of instance %s: take it (holder %s) before activate", m.InstanceID, principal)
	case lease.Holder != principal:
		return Registration{}, "", refuse(CodePermissionDenied, "the lease of instance %s is not held by %s", m.InstanceID, principal)
	}
	reg, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, m.InstanceID, principal)
	if err != nil {
		return Registration{}, "", err
	}
	proof, err := a.CurrentProof(ctx, a.registration(m, lifecycle.EndpointGate{RegistrationRevision: reg.RegistrationRevision, ProcessEpoch: reg.ProcessEpoch}))
	if err != nil {
		return Registration{}, "", err
	}
	return reg, proof, nil
}

// RenewRemoteManager is renew: the supervise row, the current registration at epoch with proof,
// then a fresh remote-manager credential.
func (a *Authority) RenewRemoteManager(ctx context.Context, m RemoteManager, epoch uint64, proof string) (*signerv1.Credential, error) {
	if err := a.Supervising(m.Owner, m.Actor); err != nil {
		return nil, err
	}
	if _, err := a.CheckCurrentRegistration(ctx, m, epoch, proof); err != nil {
		return nil, err
	}
	return a.mintSupervisor(ctx, m)
}

// RetirementRequester is retire: the supervise row, the target of m's owner at its managed
// retirement opId (permission-denied otherwise), the current registration at serveEpoch with
// proof, then a retirement-requester credential for requesterKey: caller
// <owner>.manager_serve_<instanceId> at m's lifecycle uid, the target pinned.
func (a *Authority) RetirementRequester(ctx context.Context, m RemoteManager, serveEpoch uint64, proof string, target managerauthority.Target, opID, requesterKey string) (*signerv1.Credential, error) {
	if err := a.Supervising(m.Owner, m.Actor); err != nil {
		return nil, err
	}
	if err := ownTarget(m.Owner, target, opID, true); err != nil {
		return nil, err
	}
	if _, err := a.CheckCurrentRegistration(ctx, m, serveEpoch, proof); err != nil {
		return nil, err
	}
	serve, _ := m.ServePrincipal()
	cred, err := a.mint(ctx, signerv1.Profile_PROFILE_RETIREMENT_REQUESTER, requesterKey, &signerv1.ProfileParams{
		Owner: m.Owner, Actor: serve[len(m.Owner)+1:], LifecycleUid: m.LifecycleUID,
		Target: &signerv1.RetirementTarget{Owner: target.Owner, Actor: target.Actor, LifecycleUid: target.LifecycleUID}})
	if err != nil {
		return nil, err
	}
	a.log.Info("remote manager retirement requester", "owner", m.Owner, "instance", m.InstanceID,
		"targetActor", target.Actor, "targetUid", target.LifecycleUID, "opId", opID)
	return cred, nil
}

// ownTarget refuses a target of another owner than owner and, withOp, an opId other than the
// target's managed retirement opId (both permission-denied).
func ownTarget(owner string, t managerauthority.Target, opID string, withOp bool) error {
	if t.Owner != owner {
		return refuse(CodePermissionDenied, "the target belongs to owner %s, not %s", t.Owner, owner)
	}
	if !withOp {
		return nil
	}
	want, err := lifecycle.ManagedRetirementOpID(t.LifecycleUID)
	if err != nil {
		return refuse(CodeBadRequest, "%v", err)
	}
	if opID != want {
		return refuse(CodePermissionDenied, "opId is not the target's managed retirement opId")
	}
	return nil
}

// ManagedAgentDecision is the answer of the enrollment and prepare-retirement decisions (the
// verify-enrollment door's {authorized, owner, actor, instanceId, serveEpoch}).
type ManagedAgentDecision struct {
	Authorized bool   `json:"authorized"`
	Owner      string `json:"owner"`
	Actor      string `json:"actor"`
	InstanceID string `json:"instanceId"`
	ServeEpoch uint64 `json:"serveEpoch"`
}

// RuntimeDecision is the answer of the runtime decisions: {owner, instanceId, actor, target}.
type RuntimeDecision struct {
	Owner      string                  `json:"owner"`
	InstanceID string                  `json:"instanceId"`
	Actor      string                  `json:"actor"`
	Target     managerauthority.Target `json:"target"`
}

// managedCheck is the checks every managed-agent decision makes: the host space, the supervise
// row and the current registration.
func (a *Authority) managedCheck(ctx context.Context, owner string, r *managerauthority.ManagedRequest) (RemoteManager, error) {
	if r.Space != a.cfg.Space {
		return RemoteManager{}, refuse(CodePermissionDenied, "this authority serves space %s only", a.cfg.Space)
	}
	m := RemoteManager{Owner: owner, Actor: r.Actor, InstanceID: r.InstanceID, LifecycleUID: r.ManagerLifecycleUID,
		Identities: r.Identities.Lifecycle()}
	if err := a.Supervising(owner, r.Actor); err != nil {
		return RemoteManager{}, err
	}
	return m, nil
}

// AuthorizeRemoteManagedAgentEnrollment decides an enrollment for the authenticated owner: the
// host space, the manager actor's own row with supervise, and the current registration at the
// request's serve epoch with its proof. It writes nothing.
func (a *Authority) AuthorizeRemoteManagedAgentEnrollment(ctx context.Context, owner string, r *managerauthority.EnrollmentRequest) (ManagedAgentDecision, error) {
	m, err := a.managedCheck(ctx, owner, &r.ManagedRequest)
	if err != nil {
		return ManagedAgentDecision{}, err
	}
	if _, err := a.CheckCurrentRegistration(ctx, m, r.ServeEpoch, r.RegistrationProof); err != nil {
		return ManagedAgentDecision{}, err
	}
	return ManagedAgentDecision{Authorized: true, Owner: owner, Actor: r.Actor, InstanceID: r.InstanceID, ServeEpoch: r.ServeEpoch}, nil
}

// AuthorizeRemoteManagedAgentPrepareRetirement decides a prepare-retirement: the enrollment's
// checks, a target of the owner, and the target's managed retirement opId. It writes nothing.
func (a *Authority) AuthorizeRemoteManagedAgentPrepareRetirement(ctx context.Context, owner string, r *managerauthority.PrepareRetirementRequest) (ManagedAgentDecision, error) {
	m, err := a.managedCheck(ctx, owner, &r.ManagedRequest)
	if err != nil {
		return ManagedAgentDecision{}, err
	}
	if err := ownTarget(owner, r.Target, r.OpID, true); err != nil {
		return ManagedAgentDecision{}, err
	}
	if _, err := a.CheckCurrentRegistration(ctx, m, r.ServeEpoch, r.RegistrationProof); err != nil {
		return ManagedAgentDecision{}, err
	}
	return ManagedAgentDecision{Authorized: true, Owner: owner, Actor: r.Actor, InstanceID: r.InstanceID, ServeEpoch: r.ServeEpoch}, nil
}

// AuthorizeRemoteManagedAgentRuntimeCreate decides a runtime create: the enrollment's checks and
// a target of the owner. It touches no provider and writes nothing.
func (a *Authority) AuthorizeRemoteManagedAgentRuntimeCreate(ctx context.Context, owner string, r *managerauthority.RuntimeRequest) (RuntimeDecision, error) {
	return a.authorizeRuntime(ctx, owner, r, managerauthority.KindRuntimeCreate)
}

// AuthorizeRemoteManagedAgentRuntimeStatus decides a runtime status read, as
// AuthorizeRemoteManagedAgentRuntimeCreate.
func (a *Authority) AuthorizeRemoteManagedAgentRuntimeStatus(ctx context.Context, owner string, r *managerauthority.RuntimeRequest) (RuntimeDecision, error) {
	return a.authorizeRuntime(ctx, owner, r, managerauthority.KindRuntimeStatus)
}

func (a *Authority) authorizeRuntime(ctx context.Context, owner string, r *managerauthority.RuntimeRequest, kind string) (RuntimeDecision, error) {
	if r.Kind != kind {
		return RuntimeDecision{}, refuse(CodeBadRequest, "a %s request, not %s", r.Kind, kind)
	}
	m, err := a.managedCheck(ctx, owner, &r.ManagedRequest)
	if err != nil {
		return RuntimeDecision{}, err
	}
	if err := ownTarget(owner, r.Target, "", false); err != nil {
		return RuntimeDecision{}, err
	}
	if _, err := a.CheckCurrentRegistration(ctx, m, r.ServeEpoch, r.RegistrationProof); err != nil {
		return RuntimeDecision{}, err
	}
	return RuntimeDecision{Owner: owner, InstanceID: r.InstanceID, Actor: r.Actor, Target: r.Target}, nil
}
