package authority

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/space"
)

// verifyRequest is the verify-enrollment door's closed body: the owner the host authenticated on
// its own route, and the manager's request as it was sent.
type verifyRequest struct {
	Owner   string          `json:"owner"`
	Request json.RawMessage `json:"request"`
}

// VerifyEnrollmentDoor is POST /manager-service-authority/verify-enrollment
// (exchange.VerifyEnrollmentPath; seed 001 "Managed-agent authority transport"), for the loopback
// face only: a platform that keeps the managed-agent writers in its own storage terminates its own
// public route, authenticates the human there, and asks this door for the decision with only
// {owner, request}. auth is the whole expected Authorization value, "Bearer <cap>". In order:
//
//  1. the retire door's guards (ReadDoor): 405 (a method other than POST), 403 (an Origin
//     header), 415 (not application/json), 401 (a missing or wrong cap), 413 (a body over
//     MaxDoorBody), 400 (not the closed object {owner, request});
//  2. owner a derived owner and request one of the four managed-agent kinds, parsed closed by
//     pkg/managerauthority (enrollment, prepare-retirement, runtime-create, runtime-status; a
//     provider reference, handle or name is an unknown field): 400 otherwise;
//  3. the decision (AuthorizeRemoteManagedAgentEnrollment, …PrepareRetirement, …RuntimeCreate,
//     …RuntimeStatus): the host space, the manager actor's own interactive row with supervise
//     (read from the local ledger, never from the body), the open gate, the serve principal, the
//     serve epoch and the registration proof. Its refusals: bad-request 400, permission-denied
//     403, not-found 404, conflict and expired 409, failed-precondition 412, unavailable 503.
//
// It answers 200 {authorized:true, owner, actor, instanceId, serveEpoch} for the enrollment and
// prepare-retirement kinds and {owner, instanceId, actor, target} for the runtime kinds. It
// writes nothing: no ledger row, no lifecycle row, no broker state. A refusal is {error, code}.
func (a *Authority) VerifyEnrollmentDoor(auth []byte) http.Handler {
	want := append([]byte(nil), auth...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req verifyRequest
		if de := ReadDoor(r, want, &req); de != nil {
			if de.Status == http.StatusMethodNotAllowed {
				w.Header().Set("Allow", http.MethodPost)
			}
			writeDoor(w, de.Status, doorRefusal{Error: de.Msg})
			return
		}
		ans, err := a.verifyEnrollment(r.Context(), req)
		if err != nil {
			code := CodeOf(err)
			a.log.Info("verify-enrollment door refused", "owner", req.Owner, "code", code, "err", err)
			writeDoor(w, verifyStatus(code), doorRefusal{Error: publicMessage(err), Code: code})
			return
		}
		writeDoor(w, http.StatusOK, ans)
	})
}

// verifyEnrollment is the door after its guards: steps 2 and 3.
func (a *Authority) verifyEnrollment(ctx context.Context, req verifyRequest) (any, error) {
	if err := space.ValidateDerivedOwner(req.Owner); err != nil {
		return nil, refuse(CodeBadRequest, "owner: %v", err)
	}
	if len(req.Request) == 0 || string(req.Request) == "null" {
		return nil, refuse(CodeBadRequest, "request is required and must be an object")
	}
	kind, _, err := managerauthority.Peek(req.Request)
	if err != nil {
		return nil, refuse(CodeBadRequest, "request: %v", err)
	}
	switch kind {
	case managerauthority.KindEnrollment:
		r, err := managerauthority.DecodeEnrollment(req.Request)
		if err != nil {
			return nil, refuse(CodeBadRequest, "request: %v", err)
		}
		return a.AuthorizeRemoteManagedAgentEnrollment(ctx, req.Owner, r)
	case managerauthority.KindPrepareRetirement:
		r, err := managerauthority.DecodePrepareRetirement(req.Request)
		if err != nil {
			return nil, refuse(CodeBadRequest, "request: %v", err)
		}
		return a.AuthorizeRemoteManagedAgentPrepareRetirement(ctx, req.Owner, r)
	case managerauthority.KindRuntimeCreate, managerauthority.KindRuntimeStatus:
		r, err := managerauthority.DecodeRuntime(req.Request, kind)
		if err != nil {
			return nil, refuse(CodeBadRequest, "request: %v", err)
		}
		if kind == managerauthority.KindRuntimeCreate {
			return a.AuthorizeRemoteManagedAgentRuntimeCreate(ctx, req.Owner, r)
		}
		return a.AuthorizeRemoteManagedAgentRuntimeStatus(ctx, req.Owner, r)
	}
	return nil, refuse(CodeBadRequest, "request.kind %.60q is not a managed-agent kind this door decides (enrollment, prepare-retirement, runtime-create, runtime-status)", kind)
}

// verifyStatus is the verify door's status for an authority refusal code.
func verifyStatus(code Code) int {
	switch code {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict, CodeAlreadyExists, CodeExpired:
		return http.StatusConflict
	case CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	}
	return http.StatusServiceUnavailable
}
