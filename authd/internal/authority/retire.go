package authority

import (
	"context"
	"errors"
	"net/http"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
)

// RetireRequest is the retire door's closed body.
type RetireRequest struct {
	Owner        string `json:"owner"`
	Actor        string `json:"actor"`
	LifecycleUID string `json:"lifecycleUid"`
}

// RetireAnswer is the retire door's 200 body, in upstream's shapes:
// {retired:false, lifecycleUid, notStarted:true}, {retired:true, lifecycleUid,
// alreadyRetired:true} and {retired:true, lifecycleUid}. Only retired:true confirms the
// retirement; notStarted means the lifecycle is not current at this uid (restart from prepare).
type RetireAnswer struct {
	Retired        bool   `json:"retired"`
	LifecycleUID   string `json:"lifecycleUid"`
	NotStarted     bool   `json:"notStarted,omitempty"`
	AlreadyRetired bool   `json:"alreadyRetired,omitempty"`
}

// doorRefusal is a door refusal's body.
type doorRefusal struct {
	Error string `json:"error"`
	Code  Code   `json:"code,omitempty"`
}

// RetireDoor is POST /managed-lifecycle/retire (reference lifecycle-hosted.md §2.2; seed
// "Managed lifecycle retirement"), for the loopback face only. auth is the whole expected
// Authorization value, "Bearer <cap>". In order:
//
//  1. the loopback guards (ReadDoor, CheckTokens): 405, 403, 415, 401, 413, 400;
//  2. a plane this authd does not hold (fenced): 503 (upstream answers 400 for every
//     non-conflict error; 503 tells a caller to retry);
//  3. the managed ledger row of owner.actor still at this uid: 409, the grant must be revoked
//     first (a row at another uid is ignored; a row that cannot be read is 409 too: it cannot
//     be proven revoked);
//  4. the head: absent or retired at another uid, 200 notStarted; active or retiring at another
//     uid, 409; retired at this uid, 200 alreadyRetired; active or retiring at this uid, the
//     barrier (Retire, joining any flight of the uid's opId), then 200 retired.
//
// Only conflict is 409; unavailable (a store or CONNZ failure, containment not done in its
// window) is 503; any other refusal is 400. A caller that goes away does not stop the barrier.
func (a *Authority) RetireDoor(auth []byte) http.Handler {
	want := append([]byte(nil), auth...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req RetireRequest
		if de := ReadDoor(r, want, &req); de != nil {
			if de.Status == http.StatusMethodNotAllowed {
				w.Header().Set("Allow", http.MethodPost)
			}
			writeDoor(w, de.Status, doorRefusal{Error: de.Msg})
			return
		}
		if err := CheckTokens(req.Owner, req.Actor, req.LifecycleUID); err != nil {
			writeDoor(w, http.StatusBadRequest, doorRefusal{Error: err.Error(), Code: CodeBadRequest})
			return
		}
		ans, err := a.retireDoor(r.Context(), req)
		if err != nil {
			code := CodeOf(err)
			status := http.StatusBadRequest
			switch code {
			case CodeConflict:
				status = http.StatusConflict
			case CodeUnavailable:
				status = http.StatusServiceUnavailable
			}
			a.log.Info("retire door refused", "principal", req.Owner+"."+req.Actor, "uid", req.LifecycleUID, "code", code, "err", err)
			writeDoor(w, status, doorRefusal{Error: publicMessage(err), Code: code})
			return
		}
		writeDoor(w, http.StatusOK, ans)
	})
}

// retireDoor is the door after its guards: steps 2-4.
func (a *Authority) retireDoor(ctx context.Context, req RetireRequest) (RetireAnswer, error) {
	if err := a.held(); err != nil {
		return RetireAnswer{}, err
	}
	row, kind, err := a.cfg.Ledger.Get(req.Owner, req.Actor)
	switch {
	case errors.Is(err, ledger.ErrNoRow):
	case err != nil:
		var le *ledger.Error
		msg := "the actor ledger could not be read"
		if errors.As(err, &le) {
			msg = le.Err.Error()
		}
		return RetireAnswer{}, &Error{Code: CodeConflict, Msg: "the managed grant cannot be proven revoked: " + msg, Err: err}
	case kind == ledger.Managed && row.LifecycleUID == req.LifecycleUID:
		return RetireAnswer{}, refuse(CodeConflict, "the managed grant of %s.%s is still at lifecycle %s: revoke it first", req.Owner, req.Actor, req.LifecycleUID)
	}
	h, _, found, err := a.store.Head(ctx, req.Owner, req.Actor)
	if err != nil {
		return RetireAnswer{}, unavailable("the lifecycle head could not be read", err)
	}
	switch {
	case !found, h.LifecycleUID != req.LifecycleUID && h.State == lifecycle.HeadRetired:
		return RetireAnswer{LifecycleUID: req.LifecycleUID, NotStarted: true}, nil
	case h.LifecycleUID != req.LifecycleUID:
		return RetireAnswer{}, refuse(CodeConflict, "%s.%s is %s at lifecycle %s", req.Owner, req.Actor, h.State, h.LifecycleUID)
	case h.State == lifecycle.HeadRetired:
		return RetireAnswer{Retired: true, LifecycleUID: req.LifecycleUID, AlreadyRetired: true}, nil
	}
	if _, err := a.Retire(ctx, req.Owner, req.Actor, req.LifecycleUID); err != nil {
		return RetireAnswer{}, err
	}
	return RetireAnswer{Retired: true, LifecycleUID: req.LifecycleUID}, nil
}

// publicMessage is the sentence a caller reads: an *Error's own message, never its cause (which
// goes to the log).
func publicMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return string(e.Code) + ": " + e.Msg
	}
	return string(CodeUnavailable) + ": the lifecycle store is unavailable"
}
