package service

// The lifecycle authority's wiring (issue 23): the Authority is built on the plane connection
// once the plane claim is held, before the callout subscribes, and feeds the callout's gate
// read (a managed row connects only while its gate is open), the exchange's agent arm (a
// managed agent's exchange activates its lifecycle) and the loopback activate door.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/msadoor"
	"github.com/cotalgo/cotal/authd/internal/sepdoor"
	"github.com/cotalgo/cotal/pkg/space"
)

var (
	_ callout.GateReader = (*authority.Store)(nil)
	_ exchange.Activator = (*authority.Authority)(nil)
)

// ActivateResult is ActivateManagedLifecycle's answer: the coordinate, whether it was already
// active (nothing written), and on an error whether anything was written (Outcome).
type ActivateResult = authority.ActivateResult

// LifecycleError is a lifecycle authority refusal (errors.As): its Code, and for a lifecycle a
// retirement has begun on GateState/BlockedOp (RetirementBegun reports it).
type LifecycleError = authority.Error

// LifecycleCode is a LifecycleError's code.
type LifecycleCode = authority.Code

// The lifecycle refusal codes.
const (
	LifecycleBadRequest         = authority.CodeBadRequest
	LifecycleAlreadyExists      = authority.CodeAlreadyExists
	LifecycleFailedPrecondition = authority.CodeFailedPrecondition
	LifecyclePermissionDenied   = authority.CodePermissionDenied
	LifecycleConflict           = authority.CodeConflict
	LifecycleUnavailable        = authority.CodeUnavailable
)

// startAuthority builds the lifecycle authority on the plane connection. The data account is
// GetSpace's (the activate door's accountPublicKey must equal it), and must be the plane
// credential's own. Called once the plane claim is held (s.plane, s.gate set). now is
// RuntimeOptions.Now, the clock every other part runs on: approvals, roots and service token
// bounds are judged on it. natsOpts are RuntimeOptions.NatsOptions, for the enrollment
// provisioner's one-shot connections.
func (s *Service) startAuthority(ctx context.Context, n space.Names, led *ledger.Ledger, now func() time.Time, natsOpts []nats.Option) error {
	gs, err := s.signer.GetSpace(ctx, s.cfg.Space)
	if err != nil {
		return &StartError{Code: CodeSigner, Reason: "signerd did not serve the space's public facts", Err: err}
	}
	account := gs.GetAccountPublicKey()
	if got := s.planeRail.Account(); got != account {
		return &StartError{Code: CodeAccount, Reason: fmt.Sprintf("the auth-plane credential belongs to account %s, not the space's data account %s", got, account)}
	}
	s.account = account
	st, err := authority.NewStore(s.dataNC, n, 0)
	if err != nil {
		return &StartError{Code: CodeConfig, Reason: "lifecycle store refused", Err: err}
	}
	s.authority, err = authority.New(authority.Config{
		Store: st, Ledger: led, Space: s.cfg.Space, Account: account, Signer: s.signer.API(),
		Held: s.planeHeld, Logger: s.log, Context: s.retire.plane, Callouts: &s.retire.idle, Now: now,
		PublicURL: s.enrollPublicURL(), Provisioner: s.newProvisioner(natsOpts), Footprint: s.footprint(n, natsOpts),
	})
	if err != nil {
		return &StartError{Code: CodeConfig, Reason: "lifecycle authority refused", Err: err}
	}
	return nil
}

// startRails subscribes the auth rails on the plane connection, in the queue group every authd
// of the space serves them in: register-manager (a manager's registration, answered only for the
// holder of the instance's lease) and retire-lifecycle (a remote manager's retirement request,
// joining the flight boot resume may have registered). Each request runs under runCtx.
func (s *Service) startRails(runCtx context.Context) error {
	sub, err := s.authority.ServeRegisterManager(runCtx, s.dataNC)
	if err != nil {
		return fmt.Errorf("register-manager: %w", err)
	}
	s.rails = append(s.rails, sub)
	if sub, err = s.authority.ServeRetireRail(runCtx, s.dataNC); err != nil {
		return fmt.Errorf("retire-lifecycle: %w", err)
	}
	s.rails = append(s.rails, sub)
	return nil
}

// closeRails unsubscribes the rails, so no request is taken once the service stops.
func (s *Service) closeRails() {
	for _, sub := range s.rails {
		_ = sub.Unsubscribe()
	}
	s.rails = nil
}

// errPlaneNotProven: the plane connection reconnected and no claim write has followed yet.
var errPlaneNotProven = errors.New("authd: the plane claim is not proven on the current plane connection")

// planeHeld is authority.Config.Held, evaluated afresh at every call (nothing cached): the
// claim is held while it is not fenced and was written after the plane connection's latest
// reconnect on a connected plane connection (the gate the callout answers behind), and while
// the service is not stopping.
func (s *Service) planeHeld() error {
	switch {
	case s.plane == nil || s.gate == nil:
		return errors.New("authd: no plane claim")
	case s.plane.Fenced():
		return ErrPlaneLost
	case !s.gate.open():
		return errPlaneNotProven
	}
	s.rmu.Lock()
	closing := s.closing
	s.rmu.Unlock()
	if closing {
		return errors.New("authd: stopping")
	}
	return nil
}

// lifecycleDoors is exchange.Config.Lifecycle: the activate door on ManagedActivatePath, the
// retire door on ManagedRetirePath (retire.go) and the verify-enrollment door on
// VerifyEnrollmentPath; any other path is 404.
func (s *Service) lifecycleDoors(capHex string) (http.Handler, error) {
	door, err := authority.NewActivateDoor(s.authority, capHex, s.refuseUnlessReady)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(exchange.ManagedActivatePath, door)
	mux.Handle(exchange.ManagedRetirePath, s.retireDoor(capHex))
	mux.Handle(exchange.VerifyEnrollmentPath, s.authority.VerifyEnrollmentDoor([]byte("Bearer "+capHex)))
	return mux, nil
}

// serviceEndpoints is the service endpoint door of one face (authd/internal/sepdoor), nil when
// service_endpoints is off; call it once per face. The loopback door takes the cap (operator
// proofs; s.capHex must be set); a door counts its failed proofs in throttle, the failure
// window its face's /exchange counts in. It needs the authority and the callout's bearer JWKS
// cache.
func (s *Service) serviceEndpoints(idpv exchange.IdP, led *ledger.Ledger, throttle *exchange.Throttle, loopback bool, now func() time.Time) (http.Handler, error) {
	if !s.cfg.ServiceEndpoints {
		return nil, nil
	}
	cfg := sepdoor.Config{
		Space: s.cfg.Space, Account: s.account, Signer: s.signer.API(), IdP: idpv, Ledger: led,
		Keys: s.callout.keys, Authority: s.authority, Loopback: loopback, Throttle: throttle, Now: now, Logger: s.log,
	}
	if loopback {
		cfg.Cap = s.capHex
	}
	d, err := sepdoor.New(cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// managerAuthority is the manager-service authority door of one face (authd/internal/msadoor);
// call it once per face. The loopback door takes the cap (s.capHex must be set); a door counts its
// failed proofs in throttle, the failure window its face's /exchange counts in.
func (s *Service) managerAuthority(idpv exchange.IdP, throttle *exchange.Throttle, loopback bool, now func() time.Time) (http.Handler, error) {
	cfg := msadoor.Config{
		Space: s.cfg.Space, Account: s.account, Signer: s.signer.API(), IdP: idpv, Authority: s.authority,
		Loopback: loopback, Throttle: throttle, Now: now, Logger: s.log,
	}
	if loopback {
		cfg.Cap = s.capHex
	}
	return msadoor.New(cfg)
}

// refuseUnlessReady answers the lifecycle operations' readiness check.
func (s *Service) refuseUnlessReady() error {
	if !s.Ready() {
		return fmt.Errorf("authd is %s, not ready", s.State())
	}
	return nil
}

// ActivateManagedLifecycle activates the managed lifecycle of owner.actor at uid (the
// in-process twin of POST /managed-lifecycle/activate, upstream activateManagedLifecycle): the
// activation saga at the host-chosen uid, adopting its own partial progress. It refuses with a
// *LifecycleError: LifecycleUnavailable (Outcome not-executed) unless the service is ready;
// LifecycleBadRequest for a coordinate outside its grammar; LifecycleAlreadyExists when the
// alias is active at another uid; LifecycleFailedPrecondition or LifecyclePermissionDenied for
// a lifecycle a retirement has begun on (RetirementBegun); LifecycleConflict for a uid reserved
// for another alias; LifecycleUnavailable when the plane claim is not held or the store cannot
// be read. On success the head is active at uid and its gate open; AlreadyActive says nothing
// was written.
func (s *Service) ActivateManagedLifecycle(ctx context.Context, owner, actor, uid string) (ActivateResult, error) {
	if err := s.refuseUnlessReady(); err != nil || s.authority == nil {
		return ActivateResult{Owner: owner, Actor: actor, LifecycleUID: uid, Outcome: authority.OutcomeNotExecuted},
			&LifecycleError{Code: LifecycleUnavailable, Msg: "authd is not ready", Err: err}
	}
	return s.authority.Activate(ctx, owner, actor, uid)
}
