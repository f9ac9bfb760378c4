package authority

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/cotalgo/cotal/pkg/nkey"
)

// ActivateDoor serves POST /managed-lifecycle/activate (exchange.ManagedActivatePath) on the
// loopback face: a host activates one exact managed lifecycle at the uid it chose (seed "A
// separate host activates one exact managed lifecycle"; reference lifecycle-hosted.md §2.3).
//
// The request passes ReadDoor's guard set (405, 403 Origin, 415, 401 cap, 413, 400 closed body
// {accountPublicKey, owner, actor, lifecycleUid}), then the coordinate grammar (400), then
// accountPublicKey must be a well-formed account key (400) equal to this authd's data account
// (403: a host routing error must not act on another account's target), then Ready (503). Each
// of these answers {error, outcome:"not-executed"}: nothing was dispatched. After dispatch the
// answer carries the activation's own code and outcome:
//
//	200 {accountPublicKey, owner, actor, lifecycleUid, activated:true[, alreadyActive:true]}
//	409 already-exists (active at another uid), conflict (a uid reserved for another alias),
//	    failed-precondition; a lifecycle a retirement has begun on (retiring, gate frozen by its
//	    retirement, gate retired) adds retirementBegun:true and gateState/blockedOp
//	503 unavailable (the plane claim not held, the store unreachable or corrupt)
//	500 any failure that is not the authority's own, outcome "unknown", never success
//
// A refusal is {error, code, outcome[, retirementBegun, gateState, blockedOp]}. The plane claim
// is re-checked before the saga reads and before each of its writes (Authority.Activate).
type ActivateDoor struct {
	a     *Authority
	auth  []byte
	ready func() error
	log   *slog.Logger
}

// NewActivateDoor returns the door for a, admitting `Authorization: Bearer <capHex>`. ready,
// if set, is asked after the request parsed: an error answers 503 not-executed (the service is
// not ready to act).
func NewActivateDoor(a *Authority, capHex string, ready func() error) (*ActivateDoor, error) {
	if a == nil || capHex == "" {
		return nil, errors.New("authority: the activate door needs an authority and a cap")
	}
	return &ActivateDoor{a: a, auth: []byte("Bearer " + capHex), ready: ready, log: a.log}, nil
}

// activateRequest is the door's closed body.
type activateRequest struct {
	AccountPublicKey string `json:"accountPublicKey"`
	Owner            string `json:"owner"`
	Actor            string `json:"actor"`
	LifecycleUID     string `json:"lifecycleUid"`
}

// check is the grammar step (guard 7) of a decoded body: the coordinate (CheckTokens) and a
// well-formed account public key.
func (req *activateRequest) check() error {
	if err := CheckTokens(req.Owner, req.Actor, req.LifecycleUID); err != nil {
		return err
	}
	if nkey.CheckAccount(req.AccountPublicKey) != nil {
		return errors.New("accountPublicKey is not an account public key")
	}
	return nil
}

// activateAnswer is the door's 200.
type activateAnswer struct {
	AccountPublicKey string `json:"accountPublicKey"`
	Owner            string `json:"owner"`
	Actor            string `json:"actor"`
	LifecycleUID     string `json:"lifecycleUid"`
	Activated        bool   `json:"activated"`
	AlreadyActive    bool   `json:"alreadyActive,omitempty"`
}

// DoorRefusal is a door's refusal body. Code and the blocking fields are set only after
// dispatch; Outcome always.
type DoorRefusal struct {
	Error           string  `json:"error"`
	Code            Code    `json:"code,omitempty"`
	Outcome         Outcome `json:"outcome"`
	RetirementBegun bool    `json:"retirementBegun,omitempty"`
	GateState       string  `json:"gateState,omitempty"`
	BlockedOp       string  `json:"blockedOp,omitempty"`
}

func (d *ActivateDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req activateRequest
	if de := ReadDoor(r, d.auth, &req); de != nil {
		if de.Status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", http.MethodPost)
		}
		writeDoor(w, de.Status, DoorRefusal{Error: de.Msg, Outcome: OutcomeNotExecuted})
		return
	}
	if err := req.check(); err != nil {
		writeDoor(w, http.StatusBadRequest, DoorRefusal{Error: err.Error(), Outcome: OutcomeNotExecuted})
		return
	}
	if req.AccountPublicKey != d.a.cfg.Account {
		d.log.Warn("activate door: another account's target refused", "account", req.AccountPublicKey)
		writeDoor(w, http.StatusForbidden, DoorRefusal{Error: "accountPublicKey is not this auth service's data account", Outcome: OutcomeNotExecuted})
		return
	}
	if d.ready != nil {
		if err := d.ready(); err != nil {
			writeDoor(w, http.StatusServiceUnavailable, DoorRefusal{Error: "the auth service is not ready", Code: CodeUnavailable, Outcome: OutcomeNotExecuted})
			return
		}
	}
	res, err := d.a.Activate(r.Context(), req.Owner, req.Actor, req.LifecycleUID)
	if err != nil {
		status, body := refusalAnswer(res, err)
		writeDoor(w, status, body)
		return
	}
	writeDoor(w, http.StatusOK, activateAnswer{AccountPublicKey: req.AccountPublicKey, Owner: res.Owner, Actor: res.Actor,
		LifecycleUID: res.LifecycleUID, Activated: true, AlreadyActive: res.AlreadyActive})
}

// refusalAnswer maps a dispatched activation's error to the door's status and body. An error
// that is not an *Error is "unknown": nothing is claimed about what it left.
func refusalAnswer(res ActivateResult, err error) (int, DoorRefusal) {
	var e *Error
	if !errors.As(err, &e) {
		return http.StatusInternalServerError, DoorRefusal{Error: "internal error", Outcome: OutcomeUnknown}
	}
	body := DoorRefusal{Error: e.Code.sentence(), Code: e.Code, Outcome: res.Outcome,
		GateState: string(e.GateState), BlockedOp: string(e.BlockedOp), RetirementBegun: e.RetirementBegun()}
	if body.Outcome == "" {
		body.Outcome = OutcomeUnknown
	}
	if e.Msg != "" {
		body.Error = e.Msg
	}
	switch {
	case e.Code == CodeBadRequest:
		return http.StatusBadRequest, body
	case e.Code == CodeUnavailable:
		// The cause (a broker error) stays in the log.
		body.Error = "the lifecycle authority is unavailable; retry"
		return http.StatusServiceUnavailable, body
	case e.Code == CodePermissionDenied && !e.RetirementBegun():
		return http.StatusForbidden, body
	case e.Code == CodeNotFound:
		return http.StatusNotFound, body
	}
	return http.StatusConflict, body
}

// sentence is a code's default public sentence.
func (c Code) sentence() string { return fmt.Sprintf("activation refused: %s", c) }

// writeDoor writes a lifecycle door's JSON answer, never cached.
func writeDoor(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
