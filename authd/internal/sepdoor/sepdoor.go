// Package sepdoor is authd's /service-endpoint-authority door (seed 002 "Authority routes"):
// GET answers the receiver's serviceaccess.Info, POST takes a {request, proof} envelope, checks
// the proof and the kind x proof matrix, and hands the authorized request with its caller to the
// lifecycle authority (Config.Authority), whose answer it writes with Answer.HTTPStatus. Both of
// authd's faces serve a Door when service_endpoints is on: the loopback face one built with
// Loopback true (the only face an operator proof is accepted on), the public face one with
// Loopback false.
//
// A POST is refused, in this order, before the authority sees it:
//   - any Origin header: 403 (no caller of either face is a browser page);
//   - a method other than GET or POST: 405;
//   - a Content-Type other than application/json: 415;
//   - a body larger than serviceaccess.MaxEnvelopeBytes: 413, before anything parses it or asks
//     the IdP;
//   - a body serviceaccess.ParseEnvelope refuses (unknown, duplicate or re-cased key, trailing
//     data, a field outside its grammar or of another kind): 400;
//   - a request naming another account or space than this authd's: 403;
//   - a proof kind the request kind does not accept (Accepts): 403;
//   - a proof that does not verify: 401; one that verifies but does not authorize: 403. An idp
//     proof is /exchange's human arm (exchange.VerifyHuman: the IdP token, the owner signerd
//     derives) and needs exactly one current interactive row of that owner with actor "cli" or
//     "web" (none, a managed row, a row in both row spaces or a row outside its spawner chain,
//     or both a cli and a web row: 403). A renewal or access proof is checked by the one
//     serviceaccess.Validator, its claims must name the request's endpoint and instance, and for
//     activate, renew and ready its witness. An operator proof is accepted only on the loopback
//     face (403 on the public one) and only with `Authorization: Bearer <cap>` (401 without it
//     or with another); it is the only proof that needs the cap.
//
// Failed proofs (401 and 403) count in the failure window /exchange counts in (Config.Throttle,
// 30 a minute per source); a source past it is answered 429 instead. A token that does not
// verify counts against the peer address, a verified credential's refusal against its identity.
// Every refusal is a serviceaccess denied answer {kind:"denied", requestId?, code, reason,
// message}, and an authority that fails without an answer is 503 {kind:"unavailable"}; the
// door's messages and log lines never hold a token or the cap. It sends no CORS headers.
package sepdoor

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

const (
	// InfoMaxAge is the Cache-Control max-age of GET, and how long the door reuses signerd's
	// JWKS before asking again (as GET /jwks does).
	InfoMaxAge = exchange.JWKSMaxAge
	// signerTimeout bounds one GetJWKS.
	signerTimeout = 5 * time.Second
	// classService is the throttle class of a service token (renewal or access) that did not
	// verify, per peer address.
	classService = "service"
	// classOperator is the throttle class of an operator proof on the public face.
	classOperator = "operator"
)

// InteractiveActors are the actors whose interactive row an idp proof's owner needs (exactly one).
var InteractiveActors = []string{"cli", "web"}

// Refusal reasons (the reason of a denied answer the door writes itself).
const (
	ReasonOrigin      = "origin"       // 403: an Origin header
	ReasonMethod      = "method"       // 405
	ReasonContentType = "content-type" // 415
	ReasonTooLarge    = "too-large"    // 413
	ReasonEnvelope    = "envelope"     // 400: the body does not parse
	ReasonAccount     = "account"      // 403: another account or space
	ReasonProofKind   = "proof-kind"   // 403: the matrix refuses the proof kind
	ReasonProof       = "proof"        // 401: the token does not verify
	ReasonRow         = "row"          // 403: no usable interactive cli or web row
	ReasonClaims      = "claims"       // 403: a service token for another endpoint, instance or witness
	ReasonLoopback    = "loopback"     // 403: an operator proof on the public face
	ReasonCap         = "cap"          // 401: an operator proof without the cap
	ReasonThrottled   = "throttled"    // 429: the source spent its failure budget
)

// Authority runs an authorized request. *authority.Authority satisfies it.
type Authority interface {
	ServiceRequest(ctx context.Context, req *serviceaccess.Request, caller authority.ServiceCaller) (*serviceaccess.Answer, error)
}

var _ Authority = (*authority.Authority)(nil)

// Ledger is the actor ledger as the door reads it. *ledger.Ledger satisfies it.
type Ledger interface {
	// AuthorizeGrant returns the interactive row of owner.actor after checking its parent chain:
	// ledger.ErrNoRow when there is none, another error for a managed, doubled or broken row.
	AuthorizeGrant(owner, actor string) (ledger.Row, error)
}

var _ Ledger = (*ledger.Ledger)(nil)

// Config is what a Door needs. Space, Account, Signer, Ledger, Keys and Authority are required;
// Cap is required on the loopback face and refused on the public one.
type Config struct {
	// Space is the space this authd serves.
	Space string
	// Account is the space's data account public key (GetSpace's).
	Account string
	// Signer derives owners (idp proofs) and serves the JWKS GET publishes.
	Signer signerv1.SignerServiceClient
	// IdP verifies idp proofs; nil (or an IdP answering idp.ErrNotPinned) answers them 503.
	IdP exchange.IdP
	// Ledger holds the interactive rows an idp proof's owner needs.
	Ledger Ledger
	// Keys resolves the issuer keys of renewal and access proofs (authd's bearer JWKS cache).
	Keys serviceaccess.KeySource
	// Authority runs the authorized requests.
	Authority Authority
	// Cap is the loopback face's capability (64 lowercase hex characters); an operator proof
	// presents it as `Authorization: Bearer <cap>`.
	Cap string
	// Loopback says which face this door serves: only the loopback face accepts operator proofs.
	Loopback bool
	// Throttle is the failure window shared with /exchange; nil makes one of its own.
	Throttle *exchange.Throttle
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives one line per request (never a token or the cap); nil discards.
	Logger *slog.Logger
}

// Door serves serviceaccess.Path on one face. Construct it with New.
type Door struct {
	cfg       Config
	cap       []byte
	now       func() time.Time
	log       *slog.Logger
	throttle  *exchange.Throttle
	validator *serviceaccess.Validator
	face      string

	keysMu sync.Mutex
	keys   []serviceaccess.JWK
	keysAt time.Time
}

// New checks cfg and returns the door. It refuses a bad space name, an account that is not an
// account public key, a missing signer, ledger, key source or authority, a loopback door
// without a well-formed cap and a public door with one.
func New(cfg Config) (*Door, error) {
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("sepdoor: %w", err)
	}
	if !nkeys.IsValidPublicAccountKey(cfg.Account) {
		return nil, fmt.Errorf("sepdoor: account %.64q is not an account public key", cfg.Account)
	}
	if cfg.Signer == nil || cfg.Ledger == nil || cfg.Keys == nil || cfg.Authority == nil {
		return nil, errors.New("sepdoor: a signer, a ledger, a key source and an authority are required")
	}
	f, err := exchange.NewDoorFace(cfg.Loopback, cfg.Cap, cfg.Now, cfg.Logger, cfg.Throttle)
	if err != nil {
		return nil, fmt.Errorf("sepdoor: %w (operator proofs are loopback only)", err)
	}
	d := &Door{cfg: cfg, now: f.Now, log: f.Log, throttle: f.Throttle, face: f.Name, cap: f.Auth}
	d.validator = &serviceaccess.Validator{Space: cfg.Space, Keys: cfg.Keys, Now: d.now}
	return d, nil
}

// Accepts reports whether a request of kind k accepts a proof of kind p (seed 002): register an
// idp proof; activate an idp or renewal proof; renew a renewal proof; ready an access proof;
// status an idp, renewal, access or operator proof; name-bind an operator proof; decide an idp
// proof. Every other pair is refused.
func Accepts(k serviceaccess.Kind, p serviceaccess.ProofKind) bool {
	switch k {
	case serviceaccess.KindRegister, serviceaccess.KindDecide:
		return p == serviceaccess.ProofIDP
	case serviceaccess.KindActivate:
		return p == serviceaccess.ProofIDP || p == serviceaccess.ProofRenewal
	case serviceaccess.KindRenew:
		return p == serviceaccess.ProofRenewal
	case serviceaccess.KindReady:
		return p == serviceaccess.ProofAccess
	case serviceaccess.KindStatus:
		return p == serviceaccess.ProofIDP || p == serviceaccess.ProofRenewal || p == serviceaccess.ProofAccess || p == serviceaccess.ProofOperator
	case serviceaccess.KindNameBind:
		return p == serviceaccess.ProofOperator
	}
	return false
}

// refusal is an answer the door writes itself: status, reason, the public message, the cause
// for the log only, and the throttle source a failed proof counts against ("" counts nowhere).
type refusal struct {
	status int
	reason string
	public string
	cause  error
	source string
}

func refused(status int, reason, public string, cause error) *refusal {
	return &refusal{status: status, reason: reason, public: public, cause: cause}
}

// ServeHTTP answers GET and POST serviceaccess.Path after the Origin and method guards.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := r.Header["Origin"]; ok {
		d.reject(w, r, nil, refused(http.StatusForbidden, ReasonOrigin, "requests with an Origin header are refused", nil))
		return
	}
	switch r.Method {
	case http.MethodGet:
		d.serveInfo(w, r)
	case http.MethodPost:
		d.servePost(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		d.reject(w, r, nil, refused(http.StatusMethodNotAllowed, ReasonMethod, "method not allowed: GET or POST", nil))
	}
}

func (d *Door) serveInfo(w http.ResponseWriter, r *http.Request) {
	keys, err := d.jwks(r.Context())
	if err != nil {
		d.reject(w, r, nil, refused(http.StatusServiceUnavailable, "", "the signer is unavailable", err))
		return
	}
	w.Header().Set("Cache-Control", fmt.Sprintf("max-age=%d", int(InfoMaxAge/time.Second)))
	writeJSON(w, http.StatusOK, serviceaccess.Info{
		V: 1, Account: d.cfg.Account, Space: d.cfg.Space, Issuer: serviceaccess.Issuer(d.cfg.Space), Keys: keys,
	})
}

// jwks returns the issuer keys as GET /jwks publishes them, asking signerd at most once per
// InfoMaxAge.
func (d *Door) jwks(ctx context.Context) ([]serviceaccess.JWK, error) {
	d.keysMu.Lock()
	defer d.keysMu.Unlock()
	now := d.now()
	if d.keys != nil && now.Sub(d.keysAt) < InfoMaxAge {
		return d.keys, nil
	}
	ctx, cancel := context.WithTimeout(ctx, signerTimeout)
	defer cancel()
	resp, err := d.cfg.Signer.GetJWKS(ctx, &signerv1.GetJWKSRequest{Space: d.cfg.Space})
	if err != nil {
		return nil, err
	}
	keys := make([]serviceaccess.JWK, 0, len(resp.GetKeys()))
	for _, k := range resp.GetKeys() {
		keys = append(keys, serviceaccess.JWK{Kty: k.GetKty(), Crv: k.GetCrv(), X: k.GetX(), Kid: k.GetKid(), Alg: k.GetAlg(), Use: k.GetUse()})
	}
	if len(keys) == 0 {
		return nil, errors.New("signerd published no issuer key")
	}
	d.keys, d.keysAt = keys, now
	return keys, nil
}

func (d *Door) servePost(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		d.reject(w, r, nil, refused(http.StatusUnsupportedMediaType, ReasonContentType, "the body must be application/json", nil))
		return
	}
	tooLarge := refused(http.StatusRequestEntityTooLarge, ReasonTooLarge, fmt.Sprintf("the body is larger than %d bytes", serviceaccess.MaxEnvelopeBytes), nil)
	if r.ContentLength > serviceaccess.MaxEnvelopeBytes {
		d.reject(w, r, nil, tooLarge)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, serviceaccess.MaxEnvelopeBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			d.reject(w, r, nil, tooLarge)
			return
		}
		d.reject(w, r, nil, refused(http.StatusBadRequest, ReasonEnvelope, "the body could not be read", err))
		return
	}
	env, err := serviceaccess.ParseEnvelope(body)
	if err != nil {
		d.reject(w, r, nil, refused(http.StatusBadRequest, ReasonEnvelope, bounded(err.Error()), nil))
		return
	}
	req := &env.Request
	if req.Account != d.cfg.Account || req.Space != d.cfg.Space {
		d.reject(w, r, env, refused(http.StatusForbidden, ReasonAccount,
			fmt.Sprintf("this authority serves account %s, space %s only", d.cfg.Account, d.cfg.Space), nil))
		return
	}
	if !Accepts(req.Kind, env.Proof.Kind) {
		d.reject(w, r, env, refused(http.StatusForbidden, ReasonProofKind,
			fmt.Sprintf("a %s request does not accept a %s proof", req.Kind, env.Proof.Kind), nil))
		return
	}
	caller, rf := d.authenticate(r, req, &env.Proof)
	if rf != nil {
		d.reject(w, r, env, rf)
		return
	}
	ans, err := d.cfg.Authority.ServiceRequest(r.Context(), req, caller)
	if err == nil && ans == nil {
		err = errors.New("the authority answered nothing")
	}
	status := 0
	if err == nil {
		if ans.RequestID == "" && req.Kind != serviceaccess.KindStatus {
			ans.RequestID = req.RequestID
		}
		if status = ans.HTTPStatus(); status < 200 || status > 599 || status == http.StatusInternalServerError {
			err = fmt.Errorf("the authority's %.32q answer has no status", ans.Kind)
		}
	}
	if err != nil {
		d.log.Warn("service endpoint authority: unavailable", d.attrs(r, req, caller.Proof, "err", err)...)
		writeJSON(w, http.StatusServiceUnavailable, &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, RequestID: req.RequestID,
			Message: "the authority is unavailable: replay the same request"})
		return
	}
	d.log.Info("service endpoint authority: answered", d.attrs(r, req, caller.Proof, "status", status, "answer", ans.Kind, "code", ans.Code, "reason", ans.Reason)...)
	writeJSON(w, status, ans)
}

// authenticate verifies the proof (the matrix has admitted its kind) and returns the caller.
func (d *Door) authenticate(r *http.Request, req *serviceaccess.Request, p *serviceaccess.Proof) (authority.ServiceCaller, *refusal) {
	ctx, peer := r.Context(), r.RemoteAddr
	caller := authority.ServiceCaller{Proof: p.Kind}
	switch p.Kind {
	case serviceaccess.ProofIDP:
		hu, err := exchange.VerifyHuman(ctx, exchange.HumanProof{IdP: d.cfg.IdP, Throttle: d.throttle, Signer: d.cfg.Signer, Space: d.cfg.Space, Now: d.now}, p.Token, peer)
		if err != nil {
			var xr *exchange.Refusal
			if !errors.As(err, &xr) {
				return caller, refused(http.StatusServiceUnavailable, "", "the IdP proof could not be checked", err)
			}
			reason := ReasonProof
			if xr.Status == http.StatusTooManyRequests {
				reason = ReasonThrottled
			}
			return caller, &refusal{status: xr.Status, reason: reason, public: xr.Public, cause: xr.Cause, source: xr.Source}
		}
		if rf := d.interactiveRow(hu.Owner); rf != nil {
			rf.source = hu.Source
			return caller, rf
		}
		caller.Owner = hu.Owner
	case serviceaccess.ProofRenewal:
		c, err := d.validator.Renewal(ctx, p.Token)
		if err != nil {
			return caller, tokenRefusal("renewal proof", err, peer)
		}
		if rf := ownInstance(req, c.Sub, c.Ep, c.Iid, c.Wit); rf != nil {
			return caller, rf
		}
		caller.Owner, caller.Renewal = c.Sub, c
	case serviceaccess.ProofAccess:
		c, err := d.validator.Access(ctx, p.Token)
		if err != nil {
			return caller, tokenRefusal("access bearer", err, peer)
		}
		if rf := ownInstance(req, c.Sub, c.Ep, c.Iid, c.Wit); rf != nil {
			return caller, rf
		}
		caller.Owner, caller.Access = c.Sub, c
	case serviceaccess.ProofOperator:
		if !d.cfg.Loopback {
			rf := refused(http.StatusForbidden, ReasonLoopback, "an operator proof is accepted on the loopback face only", nil)
			rf.source = exchange.PeerKey(classOperator, peer)
			return caller, rf
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), d.cap) != 1 {
			rf := refused(http.StatusUnauthorized, ReasonCap, "an operator proof needs the capability (Authorization: Bearer <cap>)", nil)
			rf.source = exchange.PeerKey(exchange.ClassCap, peer)
			return caller, rf
		}
	default:
		return caller, refused(http.StatusForbidden, ReasonProofKind, "unknown proof kind", nil)
	}
	return caller, nil
}

// interactiveRow checks that owner holds exactly one current interactive row among
// InteractiveActors: nil, or a 403 that says which of none, an unusable row or two rows it is.
func (d *Door) interactiveRow(owner string) *refusal {
	found := 0
	for _, actor := range InteractiveActors {
		row, err := d.cfg.Ledger.AuthorizeGrant(owner, actor)
		switch {
		case errors.Is(err, ledger.ErrNoRow):
			continue
		case err != nil:
			return refused(http.StatusForbidden, ReasonRow,
				fmt.Sprintf("the %s row of owner %s is not a current interactive row", actor, owner), err)
		case row.LifecycleUID == "":
			return refused(http.StatusForbidden, ReasonRow,
				fmt.Sprintf("the %s row of owner %s has no lifecycle uid: re-grant it", actor, owner), nil)
		}
		found++
	}
	switch found {
	case 0:
		return refused(http.StatusForbidden, ReasonRow,
			fmt.Sprintf("owner %s holds no current interactive cli or web row (authd actor grant)", owner), nil)
	case 1:
		return nil
	}
	return refused(http.StatusForbidden, ReasonRow,
		fmt.Sprintf("owner %s holds more than one interactive cli or web row; one is required", owner), nil)
}

// tokenRefusal maps a Validator error: a refused token is 401 counted against the peer; any
// other failure (none is expected: the validator refuses what it cannot check) is 503.
func tokenRefusal(what string, err error, peer string) *refusal {
	var te *serviceaccess.TokenError
	if !errors.As(err, &te) {
		return refused(http.StatusServiceUnavailable, "", "the "+what+" could not be checked", err)
	}
	public := fmt.Sprintf("the %s is refused (%s)", what, te.Check)
	if errors.Is(err, serviceaccess.ErrNotYetValid) {
		public = fmt.Sprintf("the %s is not yet valid (%s): check the clocks", what, te.Check)
	}
	rf := refused(http.StatusUnauthorized, ReasonProof, public, err)
	rf.source = exchange.PeerKey(classService, peer)
	return rf
}

// ownInstance checks a verified service token against the request: its ep and iid must be the
// request's endpoint and instance, and for activate, renew and ready its wit the request's
// witness. A refusal counts against the token's instance.
func ownInstance(req *serviceaccess.Request, sub, ep, iid, wit string) *refusal {
	var rf *refusal
	switch {
	case ep != req.Endpoint || iid != req.Instance:
		rf = refused(http.StatusForbidden, ReasonClaims, "the service proof is for another endpoint or instance: a service proof reads and acts on its own instance only", nil)
	case req.Kind != serviceaccess.KindStatus && wit != req.Witness:
		rf = refused(http.StatusForbidden, ReasonClaims, "the service proof is for another witness", nil)
	default:
		return nil
	}
	sum := sha256.Sum256([]byte(sub + "\x00" + ep + "\x00" + iid))
	rf.source = classService + " " + hex.EncodeToString(sum[:])
	return rf
}

// throttledRefusal is the 429 of a source past its budget.
func throttledRefusal() *refusal {
	return refused(http.StatusTooManyRequests, ReasonThrottled,
		fmt.Sprintf("%d refused proofs from this source in the last minute; try again later", exchange.MaxFailures), nil)
}

// reject writes rf as a denied answer (an unavailable one for a 5xx). A failed proof (401 or 403
// with a source) counts in the failure window first, and one past it is answered 429 instead.
func (d *Door) reject(w http.ResponseWriter, r *http.Request, env *serviceaccess.Envelope, rf *refusal) {
	var req *serviceaccess.Request
	var proof serviceaccess.ProofKind
	if env != nil {
		req, proof = &env.Request, env.Proof.Kind
	}
	if rf.source != "" && (rf.status == http.StatusUnauthorized || rf.status == http.StatusForbidden) && d.throttle.Fail(rf.source, d.now()) {
		d.log.Debug("service endpoint authority: throttled", d.attrs(r, req, proof, "source", rf.source)...)
		rf = throttledRefusal()
	} else {
		d.log.Info("service endpoint authority: refused", d.attrs(r, req, proof, "status", rf.status, "reason", rf.reason, "source", rf.source, "why", rf.public, "cause", rf.cause)...)
	}
	var reqID string
	if req != nil {
		reqID = req.RequestID
	}
	if rf.status >= 500 {
		writeJSON(w, http.StatusServiceUnavailable, &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, RequestID: reqID, Message: rf.public})
		return
	}
	writeJSON(w, rf.status, &serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, RequestID: reqID, Code: codeOf(rf.status), Reason: rf.reason, Message: rf.public})
}

// codeOf is the denial code of a refusal status (405 travels as bad-request).
func codeOf(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return serviceaccess.CodeUnauthenticated
	case http.StatusForbidden:
		return serviceaccess.CodePermissionDenied
	case http.StatusNotFound:
		return serviceaccess.CodeNotFound
	case http.StatusPreconditionFailed:
		return serviceaccess.CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return serviceaccess.CodeTooLarge
	case http.StatusUnsupportedMediaType:
		return serviceaccess.CodeUnsupportedMedia
	case http.StatusTooManyRequests:
		return serviceaccess.CodeRateLimited
	}
	return serviceaccess.CodeBadRequest
}

// attrs describes a request for the log: the face, the peer and the parsed request's kind,
// requestId, endpoint and instance (each within its grammar once ParseEnvelope accepted it),
// never a token.
func (d *Door) attrs(r *http.Request, req *serviceaccess.Request, proof serviceaccess.ProofKind, more ...any) []any {
	a := []any{"face", d.face, "peer", r.RemoteAddr}
	if req != nil {
		a = append(a, "kind", req.Kind, "requestId", req.RequestID, "endpoint", req.Endpoint, "instance", req.Instance)
	}
	if proof != "" {
		a = append(a, "proof", proof)
	}
	return append(a, more...)
}

// bounded cuts a parser's message to a length a log line and an answer can carry.
func bounded(s string) string {
	const max = 300
	if len(s) > max {
		return strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	// HTML characters unescaped: a registered answer's snapshot travels as the exact canonical
	// bytes its witness hashes.
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
