package manager

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/pkg/daemon"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// AdminAuthorizer is the seed's remoteAuthority.authorizeAdmin (seed 001 "Remote administration
// authorization", lifecycle-hosted.md §2.7), an optional hook of a RemoteAuthority. The stock
// HTTPAuthority does not have it: authd serves the admin kind as 501.
//
// Mapping. The seed gates a remote manager's manager.admin handlers, whose caller is a tuple the
// broker authenticated. managerd has no broker-facing admin surface: ManagerService is served on
// a Unix socket that admits the configured peer uids (SO_PEERCRED), and its one administrative
// operation is Shutdown (it ends the manager, and every agent when with_agents is set; Spawn,
// Stop, List, Inspect, Attach and Input act on the agents the manager was asked to run, Status
// reads). So on a remote managerd the Shutdown RPC (Backend().Shutdown, which the socket server
// calls) is admitted only when this hook answers true for the caller: the manager's owner and
// the socket peer. It fails closed: no hook, a refusal, an error, a panic or false refuses
// PERMISSION_DENIED (REASON_PEER_NOT_ALLOWED), and the manager keeps serving. The host process's
// own Manager.Shutdown and Close (in process, on a signal) are not gated; a signer-mode manager
// is not gated (its socket's uid check is its admin authorization).
type AdminAuthorizer interface {
	AuthorizeAdmin(ctx context.Context, caller AdminCaller) (bool, error)
}

// AdminCaller is the caller an AdminAuthorizer decides on.
type AdminCaller struct {
	// Owner is the manager's owner (Config.Owner): a socket peer has no owner of its own.
	Owner string
	// Operation is the administrative RPC, "Shutdown".
	Operation string
	// PeerKnown is false when the call came through no ManagerService socket (a host driving
	// Backend() in process); then PeerUID and PeerPID are zero.
	PeerKnown bool
	// PeerUID and PeerPID are the socket peer's, as the kernel reported them.
	PeerUID uint32
	PeerPID int32
	// Declared is true when the uid was declared (an in-memory listener), not kernel-reported.
	Declared bool
}

// MsgAdminUnavailable is a remote managerd's refusal of an administrative RPC when its
// RemoteAuthority has no AdminAuthorizer.
const MsgAdminUnavailable = "administrative operations are refused: a remote managerd admits them only when its authority authorizes the caller, and this authority has no authorizeAdmin hook"

// authorizeAdmin admits op on a remote managerd (see AdminAuthorizer); it is nil in signer mode.
func (m *Manager) authorizeAdmin(ctx context.Context, op string) error {
	if !m.cfg.Remote() {
		return nil
	}
	hook, ok := m.remoteAuth.(AdminAuthorizer)
	if m.remote != nil {
		hook, ok = m.remote.auth.(AdminAuthorizer)
	}
	if !ok {
		m.log.Warn("an administrative operation was refused: the authority has no authorizeAdmin hook", "operation", op)
		return api.Refuse(codes.PermissionDenied, managerv1.Reason_REASON_PEER_NOT_ALLOWED, "%s", MsgAdminUnavailable)
	}
	caller := AdminCaller{Owner: m.cfg.Owner, Operation: op}
	if p, ok := api.PeerFromContext(ctx); ok {
		caller.PeerKnown, caller.PeerUID, caller.PeerPID, caller.Declared = true, p.UID, p.PID, p.Declared
	}
	var allowed bool
	err := daemon.Guard("the remote authority's AuthorizeAdmin", func() error {
		var herr error
		allowed, herr = hook.AuthorizeAdmin(ctx, caller)
		return herr
	})
	if err = m.hookFailed(err); err != nil {
		m.log.Warn("an administrative operation was refused: the authority did not authorize it", "operation", op, "uid", caller.PeerUID, "err", err)
		return api.Refuse(codes.PermissionDenied, managerv1.Reason_REASON_PEER_NOT_ALLOWED,
			"%s is refused: the authority could not authorize the caller: %s", op, RejectionText(err))
	}
	if !allowed {
		m.log.Warn("an administrative operation was refused by the authority", "operation", op, "uid", caller.PeerUID)
		return api.Refuse(codes.PermissionDenied, managerv1.Reason_REASON_PEER_NOT_ALLOWED,
			"%s is refused: the authority does not authorize this caller (uid %d) for administration", op, caller.PeerUID)
	}
	m.log.Info("an administrative operation was authorized by the authority", "operation", op, "uid", caller.PeerUID)
	return nil
}
