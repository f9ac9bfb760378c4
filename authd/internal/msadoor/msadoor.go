// Package msadoor is authd's POST /manager-service-authority door (issue 25; seed 001
// "Managed-agent authority transport"; wire in pkg/managerauthority), served on both faces: the
// loopback face's door (Loopback true) also needs `Authorization: Bearer <cap>`, the public
// face's takes none. The body is the closed {idpToken, request}; the idpToken is /exchange's
// human proof (exchange.VerifyHuman: the IdP token, the owner signerd derives), and the
// authority (authd/internal/authority, remote_manager.go) reads the interactive row
// (owner, request.actor) fresh and requires its scope word supervise.
//
// A request is refused, in this order:
//   - any Origin header: 403 (no caller is a browser page);
//   - a method other than POST: 405;
//   - on the loopback face, a missing or wrong cap: 401;
//   - a Content-Type other than application/json: 415;
//   - a body over managerauthority.MaxBodyBytes: 413, before anything parses it;
//   - a body or request the wire refuses (unknown, duplicate or re-cased key, a value of another
//     type or outside its grammar, an operation's missing or extra field): 400;
//   - an IdP token that does not verify: 401 (no IdP pinned or its keys unreadable: 503);
//   - a kind or operation this project does not serve (session, renewStandingBundle,
//     renewRunDriver; the retained-agent, goal-index, admin, maintenance and delegated kinds; the
//     runtime kinds, which the stock dispatch refuses as upstream's does): 501;
//   - another space or account than this authd's: 403;
//   - the authority's refusals: bad-request 400, permission-denied 403 (no supervise row, a
//     wrong activation or registration proof, a foreign instance or target), not-found 404,
//     conflict, already-exists and expired 409 (a later registration committed: the manager's
//     epoch is stale), failed-precondition 412, unavailable 503.
//
// The managed-agent enrollment kind runs the stock enrollment writer
// (authority.EnrollManagedAgent: the decision, then the managed row, the durables and the ACL
// row) and answers managerauthority.Enrollment. The prepare-retirement kind runs the stock writer
// (authority.PrepareManagedAgentRetirement: fence, inventory, footprint removal, revoke) and
// answers managerauthority.PrepareRetirementAnswer; an unreadable inventory or a partial removal
// is 503 unavailable with the grant kept for a retry.
//
// Failed proofs count in the failure window the face's /exchange counts in (Config.Throttle, 30
// a minute per source): a wrong cap per peer address, an IdP token that does not verify per peer
// address, and every 401 or 403 after the IdP proof verified against that identity; a source
// past its budget is answered 429, and a verified identity past its budget is 429 before signerd
// derives its owner. Every refusal is {"error", "code"}; answers and log lines never hold a token,
// a JWT or the cap. It sends no CORS headers.
package msadoor

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/space"
)

// Codes of the refusals the door writes itself (the authority's carry its own codes).
const (
	CodeOrigin          = "forbidden"
	CodeMethod          = "method-not-allowed"
	CodeUnauthenticated = "unauthenticated"
	CodeContentType     = "unsupported-media-type"
	CodeTooLarge        = "too-large"
	CodeBadRequest      = "bad-request"
	CodePermission      = "permission-denied"
	CodeUnimplemented   = "unimplemented"
	CodeRateLimited     = "rate-limited"
	CodeUnavailable     = "unavailable"
)

// Authority is what the door asks of the lifecycle authority. *authority.Authority satisfies it.
type Authority interface {
	PrepareRemoteManager(ctx context.Context, m authority.RemoteManager) (*signerv1.Credential, error)
	ActivateRemoteManager(ctx context.Context, m authority.RemoteManager) (authority.Registration, string, error)
	RenewRemoteManager(ctx context.Context, m authority.RemoteManager, epoch uint64, proof string) (*signerv1.Credential, error)
	RetirementRequester(ctx context.Context, m authority.RemoteManager, serveEpoch uint64, proof string, target managerauthority.Target, opID, requesterKey string) (*signerv1.Credential, error)
	EnrollManagedAgent(ctx context.Context, owner string, r *managerauthority.EnrollmentRequest) (managerauthority.Enrollment, error)
	AuthorizeRemoteManagedAgentPrepareRetirement(ctx context.Context, owner string, r *managerauthority.PrepareRetirementRequest) (authority.ManagedAgentDecision, error)
	PrepareManagedAgentRetirement(ctx context.Context, owner string, r *managerauthority.PrepareRetirementRequest) (*managerauthority.PrepareRetirementAnswer, error)
}

var _ Authority = (*authority.Authority)(nil)

// Config is what a Door needs. Space, Account, Signer and Authority are required; Cap is
// required on the loopback face and refused on the public one.
type Config struct {
	// Space is the space this authd serves; Account its data account public key.
	Space, Account string
	// Signer derives owners from IdP proofs.
	Signer signerv1.SignerServiceClient
	// IdP verifies idpTokens; nil (or an IdP answering idp.ErrNotPinned) answers 503.
	IdP exchange.IdP
	// Authority runs the authorized requests.
	Authority Authority
	// Cap is the loopback face's capability (64 lowercase hex characters).
	Cap string
	// Loopback says which face this door serves.
	Loopback bool
	// Throttle is the failure window shared with the face's /exchange; nil makes one of its own.
	Throttle *exchange.Throttle
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives one line per request (never a token); nil discards.
	Logger *slog.Logger
}

// Door serves managerauthority.Path on one face. Construct it with New.
type Door struct {
	cfg      Config
	cap      []byte
	now      func() time.Time
	log      *slog.Logger
	throttle *exchange.Throttle
	face     string
}

// New checks cfg and returns the door.
func New(cfg Config) (*Door, error) {
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("msadoor: %w", err)
	}
	if !nkeys.IsValidPublicAccountKey(cfg.Account) {
		return nil, fmt.Errorf("msadoor: account %.64q is not an account public key", cfg.Account)
	}
	if cfg.Signer == nil || cfg.Authority == nil {
		return nil, errors.New("msadoor: a signer and an authority are required")
	}
	f, err := exchange.NewDoorFace(cfg.Loopback, cfg.Cap, cfg.Now, cfg.Logger, cfg.Throttle)
	if err != nil {
		return nil, fmt.Errorf("msadoor: %w", err)
	}
	d := &Door{cfg: cfg, now: f.Now, log: f.Log, throttle: f.Throttle, face: f.Name, cap: f.Auth}
	return d, nil
}

// refusal is an answer other than success: status, code, public message, the cause for the log
// only, and the throttle source it counts against ("" counts nowhere).
type refusal struct {
	status       int
	code, public string
	cause        error
	source       string
}

func refused(status int, code, public string, cause error) *refusal {
	return &refusal{status: status, code: code, public: public, cause: cause}
}

// ServeHTTP answers POST managerauthority.Path.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if _, ok := r.Header["Origin"]; ok {
		d.reject(w, r, refused(http.StatusForbidden, CodeOrigin, "requests with an Origin header are refused", nil))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		d.reject(w, r, refused(http.StatusMethodNotAllowed, CodeMethod, "method not allowed: POST", nil))
		return
	}
	if d.cap != nil && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), d.cap) != 1 {
		rf := refused(http.StatusUnauthorized, CodeUnauthenticated, "missing or wrong capability (Authorization: Bearer <cap>)", nil)
		rf.source = exchange.PeerKey(exchange.ClassCap, r.RemoteAddr)
		d.reject(w, r, rf)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		d.reject(w, r, refused(http.StatusUnsupportedMediaType, CodeContentType, "the body must be application/json", nil))
		return
	}
	tooLarge := refused(http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the body is larger than %d bytes", managerauthority.MaxBodyBytes), nil)
	if r.ContentLength > managerauthority.MaxBodyBytes {
		d.reject(w, r, tooLarge)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, managerauthority.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			d.reject(w, r, tooLarge)
			return
		}
		d.reject(w, r, refused(http.StatusBadRequest, CodeBadRequest, "the body could not be read", err))
		return
	}
	p, rf := parse(body)
	if rf != nil {
		d.reject(w, r, rf)
		return
	}
	hu, err := exchange.VerifyHuman(r.Context(), exchange.HumanProof{IdP: d.cfg.IdP, Throttle: d.throttle, Signer: d.cfg.Signer, Space: d.cfg.Space, Now: d.now},
		p.env.IdPToken, r.RemoteAddr)
	if err != nil {
		var xr *exchange.Refusal
		if !errors.As(err, &xr) {
			d.reject(w, r, refused(http.StatusServiceUnavailable, CodeUnavailable, "the IdP proof could not be checked", err))
			return
		}
		d.reject(w, r, &refusal{status: xr.Status, code: statusCode(xr.Status), public: xr.Public, cause: xr.Cause, source: xr.Source}, "kind", p.kind)
		return
	}
	ans, rf := d.dispatch(r.Context(), p, hu.Owner)
	if rf != nil {
		if rf.status == http.StatusUnauthorized || rf.status == http.StatusForbidden {
			rf.source = hu.Source
		}
		d.reject(w, r, rf, "kind", p.kind, "operation", p.op, "owner", hu.Owner)
		return
	}
	d.log.Info("manager service authority: answered", "face", d.face, "peer", r.RemoteAddr, "kind", p.kind, "operation", p.op, "owner", hu.Owner)
	writeJSON(w, http.StatusOK, ans)
}

// parsed is a body the wire accepted: the envelope, the kind and operation, and the decoded
// request of a served kind.
type parsed struct {
	env      *managerauthority.Envelope
	kind     string
	op       managerauthority.Operation
	req      *managerauthority.Request
	enroll   *managerauthority.EnrollmentRequest
	prepare  *managerauthority.PrepareRetirementRequest
	runtime  *managerauthority.RuntimeRequest
	unserved bool
}

// parse decodes body: the envelope, the kind, and the request of a served kind (an unserved
// kind's request is not parsed further: it is answered 501 once its IdP proof verified).
func parse(body []byte) (*parsed, *refusal) {
	p := &parsed{}
	var err error
	if p.env, err = managerauthority.DecodeEnvelope(body); err != nil {
		return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
	}
	if p.kind, p.op, err = managerauthority.Peek(p.env.Request); err != nil {
		return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
	}
	switch {
	case managerauthority.Unserved(p.kind, p.op):
		p.unserved = true
	case p.kind == managerauthority.KindAuthority:
		p.req, err = managerauthority.DecodeRequest(p.env.Request)
	case p.kind == managerauthority.KindEnrollment:
		p.enroll, err = managerauthority.DecodeEnrollment(p.env.Request)
	case p.kind == managerauthority.KindPrepareRetirement:
		p.prepare, err = managerauthority.DecodePrepareRetirement(p.env.Request)
	default: // the runtime kinds
		p.runtime, err = managerauthority.DecodeRuntime(p.env.Request, p.kind)
	}
	if err != nil {
		return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
	}
	return p, nil
}

func (d *Door) dispatch(ctx context.Context, p *parsed, owner string) (any, *refusal) {
	switch {
	case p.unserved:
		what := p.kind
		if p.kind == managerauthority.KindAuthority {
			what = "operation " + string(p.op)
		}
		return nil, refused(http.StatusNotImplemented, CodeUnimplemented, fmt.Sprintf("%s is not served by this authority", what), nil)
	case p.runtime != nil:
		return nil, refused(http.StatusNotImplemented, CodeUnimplemented,
			fmt.Sprintf("%s is not served by the stock authority: a host that runs managed agents on its own runtime decides it at the verify-enrollment door", p.kind), nil)
	case p.enroll != nil:
		ans, err := d.cfg.Authority.EnrollManagedAgent(ctx, owner, p.enroll)
		if err != nil {
			return nil, authorityRefusal(err)
		}
		return ans, nil
	case p.prepare != nil:
		ans, err := d.cfg.Authority.PrepareManagedAgentRetirement(ctx, owner, p.prepare)
		if err != nil {
			rf := authorityRefusal(err)
			// An incomplete release says what it released and that the grant is kept (counts
			// and names only, never a secret); any other outage stays generic.
			var ae *authority.Error
			if errors.Is(err, authority.ErrReleaseIncomplete) && errors.As(err, &ae) {
				rf.public = ae.Msg
			}
			return nil, rf
		}
		return ans, nil
	}
	return d.serveAuthority(ctx, p.req, owner)
}

// serveAuthority runs a manager-service-authority operation for owner.
func (d *Door) serveAuthority(ctx context.Context, req *managerauthority.Request, owner string) (*managerauthority.Material, *refusal) {
	if req.Space != d.cfg.Space {
		return nil, refused(http.StatusForbidden, CodePermission, fmt.Sprintf("this authority serves space %s only", d.cfg.Space), nil)
	}
	if req.AccountPublicKey != "" && req.AccountPublicKey != d.cfg.Account {
		return nil, refused(http.StatusForbidden, CodePermission, fmt.Sprintf("this authority serves account %s only", d.cfg.Account), nil)
	}
	actors, err := managerauthority.ActorsOf(req.InstanceID)
	if err != nil {
		return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
	}
	m := authority.RemoteManager{Owner: owner, Actor: req.Actor, InstanceID: req.InstanceID, LifecycleUID: req.ManagerLifecycleUID,
		Identities: req.Identities.Lifecycle()}
	mat := &managerauthority.Material{V: 1, Kind: managerauthority.KindAuthority, Operation: req.Operation, Space: d.cfg.Space,
		Owner: owner, Actor: req.Actor, InstanceID: req.InstanceID, LifecycleUID: req.ManagerLifecycleUID, RequestID: req.RequestID,
		IssuedAt: d.now().Unix(), Actors: actors, Identities: req.Identities}
	switch req.Operation {
	case managerauthority.OpPrepare:
		proof, err := managerauthority.ActivationProof(d.cfg.Space, owner, req)
		if err != nil {
			return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
		}
		cred, err := d.cfg.Authority.PrepareRemoteManager(ctx, m)
		if err != nil {
			return nil, authorityRefusal(err)
		}
		mat.NextRegistrationProof = proof
		mat.Credentials.Supervisor = credential(cred)
	case managerauthority.OpActivate:
		want, err := managerauthority.ActivationProof(d.cfg.Space, owner, req)
		if err != nil {
			return nil, refused(http.StatusBadRequest, CodeBadRequest, err.Error(), nil)
		}
		if !lifecycle.ProofEqual(req.RegistrationProof, want) {
			return nil, refused(http.StatusForbidden, CodePermission, "the registration proof is not this manager lifecycle's activation proof (prepare answers it)", nil)
		}
		reg, proof, err := d.cfg.Authority.ActivateRemoteManager(ctx, m)
		if err != nil {
			return nil, authorityRefusal(err)
		}
		if proof == want {
			// Never: the current proof is a keyed MAC. Refuse rather than hand back a proof the
			// caller could compute.
			return nil, refused(http.StatusServiceUnavailable, CodeUnavailable, "the registration proof could not be issued", errors.New("current proof equals the activation proof"))
		}
		epoch, rev := reg.ProcessEpoch, reg.RegistrationRevision
		mat.ProcessEpoch, mat.RegistrationRevision, mat.AccountPublicKey, mat.NextRegistrationProof = &epoch, &rev, d.cfg.Account, proof
	case managerauthority.OpRenew:
		cred, err := d.cfg.Authority.RenewRemoteManager(ctx, m, *req.ProcessEpoch, req.RegistrationProof)
		if err != nil {
			return nil, authorityRefusal(err)
		}
		epoch := *req.ProcessEpoch
		mat.RegistrationProof, mat.ProcessEpoch, mat.AccountPublicKey = req.RegistrationProof, &epoch, d.cfg.Account
		mat.Credentials.Supervisor = credential(cred)
	case managerauthority.OpRetire:
		ret := req.Retirement
		cred, err := d.cfg.Authority.RetirementRequester(ctx, m, ret.ServeEpoch, req.RegistrationProof, ret.Target, ret.OpID, ret.ID)
		if err != nil {
			return nil, authorityRefusal(err)
		}
		echo := *ret
		mat.RegistrationProof, mat.Retirement = req.RegistrationProof, &echo
		mat.Credentials.RetirementRequester = credential(cred)
	}
	for _, c := range []*managerauthority.Credential{mat.Credentials.Supervisor, mat.Credentials.RetirementRequester} {
		if c != nil && (mat.ExpiresAt == 0 || c.Exp < mat.ExpiresAt) {
			mat.ExpiresAt = c.Exp
		}
	}
	return mat, nil
}

func credential(c *signerv1.Credential) *managerauthority.Credential {
	return &managerauthority.Credential{JWT: c.GetJwt(), Exp: c.GetExpiresAt().AsTime().Unix()}
}

// authorityRefusal maps an authority refusal to its status; its message is the authority's.
func authorityRefusal(err error) *refusal {
	code := authority.CodeOf(err)
	msg := "the authority refused"
	var ae *authority.Error
	if errors.As(err, &ae) {
		msg = ae.Msg
	}
	status := http.StatusServiceUnavailable
	switch code {
	case authority.CodeBadRequest:
		status = http.StatusBadRequest
	case authority.CodePermissionDenied:
		status = http.StatusForbidden
	case authority.CodeNotFound:
		status = http.StatusNotFound
	case authority.CodeConflict, authority.CodeAlreadyExists, authority.CodeExpired:
		status = http.StatusConflict
	case authority.CodeFailedPrecondition:
		status = http.StatusPreconditionFailed
	default:
		code, msg = authority.CodeUnavailable, "the authority is unavailable; retry"
	}
	return refused(status, string(code), msg, err)
}

// statusCode is the code of a status the door or VerifyHuman chose.
func statusCode(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermission
	case http.StatusTooManyRequests:
		return CodeRateLimited
	case http.StatusBadRequest:
		return CodeBadRequest
	}
	return CodeUnavailable
}

// throttledRefusal is the 429 of a source past its budget.
func throttledRefusal() *refusal {
	return refused(http.StatusTooManyRequests, CodeRateLimited,
		fmt.Sprintf("%d refused proofs from this source in the last minute; try again later", exchange.MaxFailures), nil)
}

// reject writes rf. A 401 or 403 with a source counts in the failure window first, and one past
// it is answered 429 instead.
func (d *Door) reject(w http.ResponseWriter, r *http.Request, rf *refusal, attrs ...any) {
	a := append([]any{"face", d.face, "peer", r.RemoteAddr}, attrs...)
	if rf.source != "" && (rf.status == http.StatusUnauthorized || rf.status == http.StatusForbidden) && d.throttle.Fail(rf.source, d.now()) {
		d.log.Debug("manager service authority: throttled", append(a, "source", rf.source)...)
		rf = throttledRefusal()
	} else {
		d.log.Info("manager service authority: refused", append(a, "status", rf.status, "code", rf.code, "source", rf.source, "why", rf.public, "cause", rf.cause)...)
	}
	if rf.status >= 500 && rf.status != http.StatusNotImplemented {
		rf.status = http.StatusServiceUnavailable
	}
	writeJSON(w, rf.status, map[string]string{"error": rf.public, "code": rf.code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
