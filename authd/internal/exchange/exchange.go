// Package exchange is authd's loopback HTTP face (auth.md §4): GET /health, GET /jwks and
// POST /exchange, which turns an IdP token (the human arm) or a managed actor's token (the agent
// arm) into a Cotal user bearer signed by signerd.
//
// It refuses, before reading a body: any request with an Origin header (403: browsers are not
// callers); an /exchange without `Authorization: Bearer <cap>` (401); a body that is not
// application/json (415) or is larger than MaxBodyBytes (413). It never sends CORS headers.
// Authorization comes from the actor ledger alone, read fresh on every exchange: the request
// names an actor, never a scope, parent or lifecycle uid. Only views that map to a profile
// (pkg/profiles through authd/internal/views) are issued, and manager-caller; every other view is
// refused with its name.
//
// A manager-caller bearer (both arms; the agent arm takes no other view) is bound to one manager
// instance, act.managerInstanceId: the request may name it (managerInstanceId, the uid grammar,
// only with that view), and the ManagerSelector (authority.Selector) checks it or picks one by
// its policy, after the caller was authorized; the answer names it. A selection refusal is 400,
// 404 (no manager to bind), 409 (not a live candidate, or ambiguous) or 503, and counts against
// no throttle budget. manager-caller maps to no profile yet, so the callout still refuses to
// admit such a bearer.
//
// Refusals (401) are throttled per source, and only refusals count: once a source has
// MaxFailures refusals in the last FailureWindow, its next refusal is 429 instead. A source is
// the class of the credential that failed and where it came from: a wrong or missing cap, a
// refused agent token and an IdP token that does not verify each count per peer address; the
// refusals of one verified IdP identity count for that identity, and once it has spent its
// budget its exchanges are 429 before signerd is asked anything for it. A request is compared
// against its credential before any budget shared with other callers is looked at, so a correct
// cap, agent token or IdP token is never refused because other callers failed. (The throttle is
// not what stops guessing: the cap and agent tokens are 256-bit secrets. It bounds the log and
// the signerd calls refused callers cost.)
//
// The agent arm activates the managed row's lifecycle (Config.Activator, the lifecycle
// authority's saga at the row's uid) after the ledger authorized it and before signerd signs:
// a managed agent's first exchange makes its lifecycle current, a later one finds it active,
// and a lifecycle a retirement has begun on, or one active at another uid, gets no bearer (409;
// 503 while the authority is unavailable). Without an Activator the agent arm refuses (503).
//
// The loopback lifecycle doors, ManagedActivatePath, ManagedRetirePath and VerifyEnrollmentPath, are routed to
// Config.Lifecycle before this face's own Origin check, so the door's guard set keeps its order
// (405 before 403); without a Lifecycle handler they are 404. The service endpoint route
// (serviceaccess.Path) is routed the same way to Config.ServiceEndpoints, 404 without it, and the
// manager-service authority (ManagerAuthorityPath) to Config.ManagerAuthority.
//
// VerifyHuman (the human arm's IdP proof and owner) and Throttle (the failure window) are
// shared with the service endpoint door, authd/internal/sepdoor.
//
// The public face (NewPublic, public.go) is a second handler over the same exchange, for a
// loopback listener a TLS proxy publishes: no cap, no view, no loopback door, the discovery
// bundle at WellKnownPath, its own refusal throttle, and per-peer, in-flight and deadline limits.
//
// GET /health answers {"ok": true} and nothing else: readiness needs a 2xx, and the answer does
// not name the service, space or issuer to whatever scans the host's loopback ports.
package exchange

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
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/views"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

const (
	// MaxBodyBytes bounds a POST /exchange body.
	MaxBodyBytes = 64 << 10
	// MaxFailures is how many refusals (401s) one source may have in a FailureWindow; once it
	// has, its next refusal is 429 (the 31st within a minute).
	MaxFailures = 30
	// FailureWindow is the span MaxFailures counts over.
	FailureWindow = time.Minute
	// MaxSources bounds the sources the throttle tracks; past it the least recently failed one
	// is forgotten.
	MaxSources = 4096
	// HumanTTL is a human bearer's default and largest lifetime (signerd's bearer cap).
	HumanTTL = 900 * time.Second
	// AgentTTL is an agent bearer's default and largest lifetime (upstream AGENT_BEARER_TTL_SEC).
	AgentTTL = 300 * time.Second
	// JWKSMaxAge is the Cache-Control max-age of GET /jwks, and how long authd reuses signerd's
	// answer before asking again.
	JWKSMaxAge = 300 * time.Second
	// CapHexLen is the length of the capability: hex of 32 random bytes.
	CapHexLen = 64
	// signerTimeout bounds one call to signerd.
	signerTimeout = 5 * time.Second
	// AgentRefusal is the one answer to every failed agent-arm exchange, so a caller learns
	// nothing about which of owner, actor, row kind or token was wrong.
	AgentRefusal = "agent exchange refused: no managed actor matches this owner, actor and token"
	// agentView is the one view the agent arm may ask for (upstream).
	agentView = views.ManagerCaller
)

// The loopback lifecycle doors (seed "Managed lifecycle retirement" and "A separate host
// activates one exact managed lifecycle"), served by Config.Lifecycle.
const (
	// ManagedActivatePath activates one exact managed lifecycle (upstream MANAGED_ACTIVATE_PATH).
	ManagedActivatePath = "/managed-lifecycle/activate"
	// ManagedRetirePath retires one (upstream MANAGED_RETIRE_PATH).
	ManagedRetirePath = "/managed-lifecycle/retire"
	// VerifyEnrollmentPath decides a managed-agent request for a host that keeps the writers in
	// its own storage (upstream VERIFY_ENROLLMENT_PATH); it writes nothing.
	VerifyEnrollmentPath = "/manager-service-authority/verify-enrollment"
)

// Activator activates a managed lifecycle at a uid. *authority.Authority satisfies it.
type Activator interface {
	Activate(ctx context.Context, owner, actor, uid string) (authority.ActivateResult, error)
}

var _ Activator = (*authority.Authority)(nil)

// Signer is what the exchange asks of signerd. *signerclient.Client satisfies it.
type Signer interface {
	API() signerv1.SignerServiceClient
}

var _ Signer = (*signerclient.Client)(nil)

// Ledger is the actor ledger as the exchange reads it. *ledger.Ledger satisfies it.
type Ledger interface {
	// AuthorizeGrant returns the interactive row of owner.actor after checking its parent chain.
	AuthorizeGrant(owner, actor string) (ledger.Row, error)
	// AuthorizeAgentExchange returns the managed row of owner.actor if actorToken's SHA-256 is
	// its tokenHash (constant time) and it sits within its spawner chain.
	AuthorizeAgentExchange(owner, actor, actorToken string) (ledger.Row, error)
}

var _ Ledger = (*ledger.Ledger)(nil)

// ManagerSelector binds a manager-caller bearer to one manager instance. *authority.Selector
// satisfies it; its refusals carry an authority code (authority.CodeOf).
type ManagerSelector interface {
	Select(ctx context.Context, sel authority.Selection) (string, error)
}

var _ ManagerSelector = (*authority.Selector)(nil)

// IdP verifies IdP tokens. *idp.Verifier satisfies it.
type IdP interface {
	Verify(ctx context.Context, token string) (idp.Claims, error)
}

var (
	_ IdP = (*idp.Verifier)(nil)
	_ IdP = (*idp.Pinned)(nil)
)

// Config is everything the exchange needs. Space, Signer, Ledger and Cap are required.
type Config struct {
	// Space is the space this authd serves; bearers are issued for it.
	Space string
	// Signer signs bearers, derives owners and serves the JWKS.
	Signer Signer
	// Ledger authorizes every exchange.
	Ledger Ledger
	// IdP verifies human-arm tokens: idp.NewPinned(stateDir, ...) picks up a pin made after
	// start. nil, or an IdP answering idp.ErrNotPinned, makes the human arm answer 503.
	IdP IdP
	// Selector binds manager-caller bearers; nil makes a manager-caller exchange answer 503.
	Selector ManagerSelector
	// Cap is the capability callers present as `Authorization: Bearer <cap>`: 64 hex characters
	// (32 random bytes), the cap of auth-service.json.
	Cap string
	// Activator activates a managed row's lifecycle before its bearer is signed; nil makes the
	// agent arm refuse every exchange (503).
	Activator Activator
	// Lifecycle serves ManagedActivatePath, ManagedRetirePath and VerifyEnrollmentPath (its own guards, the cap
	// included); nil answers them 404.
	Lifecycle http.Handler
	// ServiceEndpoints serves serviceaccess.Path, GET and POST /service-endpoint-authority (its
	// own guards: authd/internal/sepdoor); nil (service_endpoints off) answers it 404.
	ServiceEndpoints http.Handler
	// ManagerAuthority serves ManagerAuthorityPath, POST /manager-service-authority (its own
	// guards, the cap included: authd/internal/msadoor); nil answers it 404. The public face takes
	// its door in PublicConfig.ManagerAuthority instead.
	ManagerAuthority http.Handler
	// Throttle is the failure window; nil makes one of its own (NewFailureThrottle on the
	// loopback face, a table of PublicConfig.MaxPeers sources on the public one). Share one with
	// the face's service endpoint door so their refusals count in the same window.
	Throttle *Throttle
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives one line per exchange (never a token); nil discards.
	Logger *slog.Logger
}

// Handler serves the exchange routes. Construct it with New.
type Handler struct {
	cfg      Config
	cap      []byte      // "Bearer <cap>"; nil on the public face, which takes no cap
	public   *publicFace // nil on the loopback face
	now      func() time.Time
	log      *slog.Logger
	throttle *Throttle

	jwksMu   sync.Mutex
	jwksBody []byte
	jwksAt   time.Time
}

// New checks cfg and returns the handler. It refuses a bad space name, a missing signer or
// ledger, and a cap that is not 64 lowercase hex characters.
func New(cfg Config) (*Handler, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	if err := CheckCap(cfg.Cap); err != nil {
		return nil, fmt.Errorf("exchange: %w", err)
	}
	return newHandler(cfg, nil), nil
}

// checkConfig refuses what both faces refuse: a bad space name, a missing signer or ledger. A nil
// pointer IdP becomes a nil IdP.
func checkConfig(cfg *Config) error {
	if err := space.ValidateName(cfg.Space); err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	// A nil pointer in the interface would pass the nil check below and panic on the first
	// exchange.
	if v, ok := cfg.IdP.(*idp.Verifier); ok && v == nil {
		cfg.IdP = nil
	}
	if v, ok := cfg.IdP.(*idp.Pinned); ok && v == nil {
		cfg.IdP = nil
	}
	if cfg.Signer == nil || cfg.Ledger == nil {
		return errors.New("exchange: a signer and a ledger are required")
	}
	return nil
}

// newHandler builds a handler from a checked cfg: the loopback face (pub nil, cfg.Cap checked)
// or the public face (pub set, no cap, no lifecycle doors; see public.go).
func newHandler(cfg Config, pub *publicFace) *Handler {
	size := MaxSources
	if pub != nil {
		size = pub.maxPeers
	}
	h := &Handler{cfg: cfg, public: pub, now: cfg.Now, log: cfg.Logger, throttle: cfg.Throttle}
	if h.throttle == nil {
		h.throttle = NewThrottle(MaxFailures, FailureWindow, size)
	}
	if pub == nil {
		h.cap = []byte("Bearer " + cfg.Cap)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h
}

// BearerIssuer is the iss of the bearers signerd signs for space (upstream urn:cotal:auth:<space>).
func BearerIssuer(spaceName string) string { return "urn:cotal:auth:" + spaceName }

// ServeHTTP routes the lifecycle doors to Config.Lifecycle and serviceaccess.Path to
// Config.ServiceEndpoints, and every other request after the Origin guard.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.public != nil {
		h.servePublic(w, r)
		return
	}
	if p := r.URL.Path; p == ManagedActivatePath || p == ManagedRetirePath || p == VerifyEnrollmentPath {
		if h.cfg.Lifecycle == nil {
			writeError(w, http.StatusNotFound, "no such route")
			return
		}
		h.cfg.Lifecycle.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == serviceaccess.Path {
		if h.cfg.ServiceEndpoints == nil {
			writeError(w, http.StatusNotFound, "no such route")
			return
		}
		h.cfg.ServiceEndpoints.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == ManagerAuthorityPath {
		if h.cfg.ManagerAuthority == nil {
			writeError(w, http.StatusNotFound, "no such route")
			return
		}
		h.cfg.ManagerAuthority.ServeHTTP(w, r)
		return
	}
	if _, ok := r.Header["Origin"]; ok {
		// A browser sends Origin on every cross-origin request (and on same-origin POSTs); no
		// caller of this face is a browser page, so any Origin is a page trying to reach it.
		writeError(w, http.StatusForbidden, "requests with an Origin header are refused")
		return
	}
	switch r.URL.Path {
	case "/health":
		if !method(w, r, http.MethodGet) {
			return
		}
		// Nothing but ok: the answer must not tell a port scanner whose service this is.
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	case "/jwks":
		if !method(w, r, http.MethodGet) {
			return
		}
		h.serveJWKS(w, r)
	case "/exchange":
		if !method(w, r, http.MethodPost) {
			return
		}
		h.serveExchange(w, r)
	default:
		writeError(w, http.StatusNotFound, "no such route")
	}
}

func method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want {
		return true
	}
	w.Header().Set("Allow", want)
	writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	return false
}

func (h *Handler) serveJWKS(w http.ResponseWriter, r *http.Request) {
	body, err := h.jwks(r.Context())
	if err != nil {
		h.log.Warn("exchange: jwks", "reason", signerclient.ReasonOf(err).String(), "err", err)
		writeError(w, http.StatusServiceUnavailable, "the signer is unavailable")
		return
	}
	w.Header().Set("Cache-Control", fmt.Sprintf("max-age=%d", int(JWKSMaxAge/time.Second)))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// jwks returns the encoded JWKS, asking signerd at most once per JWKSMaxAge.
func (h *Handler) jwks(ctx context.Context) ([]byte, error) {
	h.jwksMu.Lock()
	defer h.jwksMu.Unlock()
	now := h.now()
	if h.jwksBody != nil && now.Sub(h.jwksAt) < JWKSMaxAge {
		return h.jwksBody, nil
	}
	ctx, cancel := context.WithTimeout(ctx, signerTimeout)
	defer cancel()
	resp, err := h.cfg.Signer.API().GetJWKS(ctx, &signerv1.GetJWKSRequest{Space: h.cfg.Space})
	if err != nil {
		return nil, signerclient.AsError(err)
	}
	type jwk struct {
		Kty string `json:"kty"`
		Crv string `json:"crv"`
		X   string `json:"x"`
		Kid string `json:"kid"`
		Alg string `json:"alg"`
		Use string `json:"use"`
	}
	keys := make([]jwk, 0, len(resp.GetKeys()))
	for _, k := range resp.GetKeys() {
		keys = append(keys, jwk{Kty: k.GetKty(), Crv: k.GetCrv(), X: k.GetX(), Kid: k.GetKid(), Alg: k.GetAlg(), Use: k.GetUse()})
	}
	body, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		return nil, err
	}
	h.jwksBody, h.jwksAt = body, now
	return body, nil
}

// request is a POST /exchange body. Pointers tell absent from empty where it matters.
type request struct {
	IdPToken   *string `json:"idpToken"`
	ActorToken *string `json:"actorToken"`
	Owner      string  `json:"owner"`
	Actor      string  `json:"actor"`
	TTLSec     *int64  `json:"ttlSec"`
	View       string  `json:"view"`
	// ManagerInstanceID pins a manager-caller bearer to this instance.
	ManagerInstanceID *string `json:"managerInstanceId"`
}

// response is a granted exchange.
type response struct {
	Token string `json:"token"`
	Owner string `json:"owner"`
	Exp   int64  `json:"exp"`
	// ManagerInstanceID is the instance a manager-caller bearer is bound to.
	ManagerInstanceID string `json:"managerInstanceId,omitempty"`
}

// Refusal is an exchange answer other than a bearer (and a refused IdP proof, VerifyHuman): the
// HTTP status, the public sentence, the cause for the log only, and the throttle source it
// counts against ("" counts nowhere; the exchange counts only a 401's).
type Refusal struct {
	Status int
	Public string
	Cause  error
	Source string
}

func (e *Refusal) Error() string { return e.Public }

func refused(status int, public string, cause error) *Refusal {
	return &Refusal{Status: status, Public: public, Cause: cause}
}

// counted is a 401 that counts against source.
func counted(source, public string, cause error) *Refusal {
	return &Refusal{Status: http.StatusUnauthorized, Public: public, Cause: cause, Source: source}
}

// throttled is the 429 of a source past its budget.
func throttled() *Refusal {
	return refused(http.StatusTooManyRequests,
		fmt.Sprintf("%d refused exchanges from this source in the last minute; try again later", MaxFailures), nil)
}

func (h *Handler) serveExchange(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	// The cap is compared first: the cap budget is consulted only by a request that failed it.
	// The public face has no cap: the IdP token or the actor token is the whole proof.
	if h.public == nil && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), h.cap) != 1 {
		h.reject(w, counted(PeerKey(ClassCap, r.RemoteAddr), "missing or wrong capability (Authorization: Bearer <cap>)", nil))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "the body must be application/json")
		return
	}
	if r.ContentLength > MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxBodyBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxBodyBytes))
			return
		}
		writeError(w, http.StatusBadRequest, "the body could not be read")
		return
	}
	req, err := decodeRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if h.public != nil && !PublicView(req.View) {
		// Before any credential is looked at: elevated views are a loopback operator surface,
		// whatever the caller presents.
		writeError(w, http.StatusForbidden, fmt.Sprintf("view %.40q is not served by the public exchange: views are a loopback operator surface", req.View))
		return
	}
	var resp *response
	var arm string
	if req.IdPToken != nil {
		arm = "human"
		resp, err = h.human(r.Context(), req, r.RemoteAddr)
	} else {
		arm = "agent"
		resp, err = h.agent(r.Context(), req, r.RemoteAddr)
	}
	if err != nil {
		var rf *Refusal
		if !errors.As(err, &rf) {
			rf = refused(http.StatusInternalServerError, "internal error", err)
		}
		h.reject(w, rf, "arm", arm, "actor", logIdent(req.Actor))
		return
	}
	h.log.Info("exchange: granted", "arm", arm, "owner", resp.Owner, "actor", req.Actor, "view", req.View, "managerInstance", resp.ManagerInstanceID, "exp", resp.Exp)
	writeJSON(w, http.StatusOK, resp)
}

// reject answers a refusal. Only what failed counts, after it failed: a 401 counts against its
// source, and a source past its budget gets 429 for its refusal and no log line of its own.
// attrs describe the request for the log.
func (h *Handler) reject(w http.ResponseWriter, rf *Refusal, attrs ...any) {
	if rf.Status == http.StatusUnauthorized && rf.Source != "" && h.throttle.Fail(rf.Source, h.now()) {
		h.log.Debug("exchange: throttled", append(attrs, "source", rf.Source)...)
		rf = throttled()
	} else {
		h.log.Info("exchange: refused", append(attrs, "status", rf.Status, "source", rf.Source, "why", rf.Public, "cause", rf.Cause)...)
	}
	writeError(w, rf.Status, rf.Public)
}

// logIdent returns s if it is a valid actor token, else a placeholder, so a crafted body cannot
// write arbitrary text into the log.
func logIdent(s string) string {
	if space.ValidateActor(s) != nil {
		return "(invalid)"
	}
	return s
}

// decodeRequest parses a POST /exchange body: one JSON object with only the known members,
// exactly one of idpToken and actorToken, and a ttlSec of at least 1 if present.
func decodeRequest(body []byte) (*request, error) {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	var req request
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("the body is not an exchange request: %v", err)
	}
	if dec.More() {
		return nil, errors.New("the body holds more than one JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the body holds more than one JSON value")
	}
	switch {
	case req.IdPToken != nil && req.ActorToken != nil:
		return nil, errors.New("idpToken and actorToken are exclusive: send one")
	case req.IdPToken == nil && req.ActorToken == nil:
		return nil, errors.New("idpToken (human) or actorToken (agent) is required")
	case req.IdPToken != nil && req.Owner != "":
		return nil, errors.New("the human arm takes no owner: it is derived from the IdP token")
	case req.TTLSec != nil && *req.TTLSec < 1:
		return nil, errors.New("ttlSec must be at least 1")
	case req.ManagerInstanceID != nil && req.View != views.ManagerCaller:
		return nil, errors.New("managerInstanceId comes only with view manager-caller")
	case req.ManagerInstanceID != nil && space.ValidateUID(*req.ManagerInstanceID) != nil:
		return nil, errors.New("managerInstanceId is not an instance id ([a-z0-9]{26,32})")
	}
	return &req, nil
}

// viewProfile checks a requested view: "" is no view; manager-caller is issued (bound to one
// instance, see the package doc); any other view that maps to no profile is refused with its
// name, because a bearer carrying it could be granted nothing at connect.
func viewProfile(view string) (requiredScope string, err error) {
	if view == "" {
		return "", nil
	}
	if !views.Known(view) {
		return "", refused(http.StatusBadRequest, fmt.Sprintf("view %.40q is not a view (known: %s)", view, strings.Join(views.All(), ", ")), nil)
	}
	if view == views.ManagerCaller {
		return views.RequiredScopeOf(view), nil
	}
	_, scope, ok := views.Profile(view)
	if !ok {
		return "", refused(http.StatusBadRequest,
			fmt.Sprintf("view %.40q is not issued by this exchange: it maps to no profile, so a connect with it could be granted nothing", view), nil)
	}
	return scope, nil
}

// human is the human arm: IdP token → owner → interactive row → view → bearer (auth.md §4,
// bridge exchange steps 1-8 without the cred. row, which this project does not keep).
//
// An IdP token that does not verify counts against the peer address (ClassIdP); once the token
// verified, the refusals count against that IdP identity, and an identity past its budget is 429
// before signerd derives its owner.
func (h *Handler) human(ctx context.Context, req *request, peer string) (*response, error) {
	if err := space.ValidateActor(req.Actor); err != nil {
		return nil, refused(http.StatusBadRequest, err.Error(), nil)
	}
	needScope, err := viewProfile(req.View)
	if err != nil {
		return nil, err
	}
	hu, err := VerifyHuman(ctx, HumanProof{IdP: h.cfg.IdP, Throttle: h.throttle, Signer: h.cfg.Signer.API(), Space: h.cfg.Space, Now: h.now},
		*req.IdPToken, peer)
	if err != nil {
		return nil, err
	}
	claims, src, owner := hu.Claims, hu.Source, hu.Owner
	row, err := h.cfg.Ledger.AuthorizeGrant(owner, req.Actor)
	switch {
	case errors.Is(err, ledger.ErrNoRow):
		return nil, counted(src, fmt.Sprintf("no grant for actor %q under your owner %s (authd actor grant)", req.Actor, owner), err)
	case err != nil:
		return nil, counted(src, fmt.Sprintf("the grant for actor %q is refused", req.Actor), err)
	}
	if needScope != "" && !slices.Contains(row.Scope, needScope) {
		return nil, counted(src,
			fmt.Sprintf("the %q view needs scope %q, which the grant for actor %q lacks: re-grant the whole row with it added", req.View, needScope, req.Actor), nil)
	}
	if row.LifecycleUID == "" {
		return nil, counted(src, fmt.Sprintf("the grant for actor %q has no lifecycle uid: re-grant it", req.Actor), nil)
	}
	ttl := HumanTTL
	if req.TTLSec != nil && time.Duration(*req.TTLSec) < ttl/time.Second {
		ttl = time.Duration(*req.TTLSec) * time.Second
	}
	// The bearer must not outlive the IdP proof it rests on.
	if left := time.Duration(claims.Expires-h.now().Unix()) * time.Second; left < ttl {
		ttl = left
	}
	if ttl < time.Second {
		return nil, counted(src, "the IdP token has expired", nil)
	}
	iid, err := h.selectManager(ctx, req, owner, true)
	if err != nil {
		return nil, err
	}
	return h.sign(ctx, owner, req.Actor, req.View, iid, row, ttl)
}

// HumanProof is what VerifyHuman checks an IdP token with.
type HumanProof struct {
	// IdP verifies the token; nil (no IdP pinned) refuses with 503.
	IdP IdP
	// Throttle holds the failure window a verified identity's budget is read from.
	Throttle *Throttle
	// Signer derives the owner.
	Signer signerv1.SignerServiceClient
	// Space is the space the owner is derived in.
	Space string
	// Now is the clock.
	Now func() time.Time
}

// Human is a verified IdP proof: the token's claims, the owner signerd derived from them, and
// the identity's throttle source (IdentityKey), which the caller's later refusals count against.
type Human struct {
	Claims idp.Claims
	Owner  string
	Source string
}

// VerifyHuman is the human arm's proof, shared by /exchange and the service endpoint doors: it
// verifies token with p.IdP and derives its owner through signerd. Every refusal is a *Refusal:
// no IdP pinned, or its keys or pin unreadable, is 503; a token that does not verify is 401
// counted against the peer address (ClassIdP); a verified identity that has spent its budget is
// 429 before signerd is asked anything for it; a signer failure is 503 (unavailable) or 502
// (refused). It never puts the token in an error.
func VerifyHuman(ctx context.Context, p HumanProof, token, peer string) (Human, error) {
	if v, ok := p.IdP.(*idp.Verifier); p.IdP == nil || ok && v == nil {
		return Human{}, refused(http.StatusServiceUnavailable, "no IdP is pinned: run `authd idp pin URL`", nil)
	}
	if v, ok := p.IdP.(*idp.Pinned); ok && v == nil {
		return Human{}, refused(http.StatusServiceUnavailable, "no IdP is pinned: run `authd idp pin URL`", nil)
	}
	claims, err := p.IdP.Verify(ctx, token)
	switch {
	case errors.Is(err, idp.ErrNotPinned):
		return Human{}, refused(http.StatusServiceUnavailable, "no IdP is pinned: run `authd idp pin URL`", err)
	case err != nil && !errors.Is(err, idp.ErrToken):
		// The JWKS or the pin file failed, not the token: the caller can only retry.
		return Human{}, refused(http.StatusServiceUnavailable, "the IdP's keys are unavailable", err)
	case err != nil:
		return Human{}, counted(PeerKey(ClassIdP, peer), err.Error(), err)
	}
	src := IdentityKey(claims.Issuer, claims.Subject)
	if p.Throttle != nil && p.Throttle.Spent(src, p.Now()) {
		return Human{}, throttled()
	}
	owner, err := deriveOwner(ctx, p.Signer, p.Space, claims)
	if err != nil {
		return Human{}, err
	}
	return Human{Claims: claims, Owner: owner, Source: src}, nil
}

func deriveOwner(ctx context.Context, signer signerv1.SignerServiceClient, spaceName string, claims idp.Claims) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, signerTimeout)
	defer cancel()
	resp, err := signer.DeriveOwner(ctx, &signerv1.DeriveOwnerRequest{Space: spaceName, IdpIssuer: claims.Issuer, Subject: claims.Subject})
	if err != nil {
		return "", signerRefusal("the signer could not derive the owner", err)
	}
	if err := space.ValidateDerivedOwner(resp.GetOwner()); err != nil {
		return "", refused(http.StatusServiceUnavailable, "the signer answered a malformed owner", err)
	}
	return resp.GetOwner(), nil
}

// agent is the agent arm: a managed row whose token hash matches → bearer of at most AgentTTL.
// Every refusal past the request's shape is AgentRefusal, so the answer never tells which of
// owner, actor, row space, token or spawner chain was wrong (the ledger compares the hash in
// constant time). A refusal counts against the peer address (ClassAgent) after the token was
// compared, so a correct token is never throttled.
func (h *Handler) agent(ctx context.Context, req *request, peer string) (*response, error) {
	if req.View != "" && req.View != agentView {
		return nil, refused(http.StatusBadRequest, fmt.Sprintf("the agent arm takes no view but %q", agentView), nil)
	}
	if _, err := viewProfile(req.View); err != nil {
		return nil, err
	}
	var row ledger.Row
	var err error
	if space.ValidateDerivedOwner(req.Owner) != nil || space.ValidateActor(req.Actor) != nil || *req.ActorToken == "" {
		err = errors.New("owner, actor or token malformed")
	} else {
		row, err = h.cfg.Ledger.AuthorizeAgentExchange(req.Owner, req.Actor, *req.ActorToken)
	}
	if err == nil && row.LifecycleUID == "" {
		err = errors.New("managed row has no lifecycle uid")
	}
	if err != nil {
		return nil, counted(PeerKey(ClassAgent, peer), AgentRefusal, err)
	}
	if err := h.activate(ctx, req.Owner, req.Actor, row.LifecycleUID); err != nil {
		return nil, err
	}
	ttl := AgentTTL
	if req.TTLSec != nil && time.Duration(*req.TTLSec) < ttl/time.Second {
		ttl = time.Duration(*req.TTLSec) * time.Second
	}
	iid, err := h.selectManager(ctx, req, req.Owner, false)
	if err != nil {
		return nil, err
	}
	return h.sign(ctx, req.Owner, req.Actor, req.View, iid, row, ttl)
}

// selectManager binds a manager-caller exchange of an authorized owner to its instance ("" for
// every other view).
func (h *Handler) selectManager(ctx context.Context, req *request, owner string, human bool) (string, error) {
	if req.View != views.ManagerCaller {
		return "", nil
	}
	if h.cfg.Selector == nil {
		return "", refused(http.StatusServiceUnavailable, "manager selection is not available on this authd", nil)
	}
	sel := authority.Selection{Owner: owner, Human: human}
	if req.ManagerInstanceID != nil {
		sel.InstanceID = *req.ManagerInstanceID
	}
	iid, err := h.cfg.Selector.Select(ctx, sel)
	if err != nil {
		var ae *authority.Error
		public := "the manager instance could not be selected"
		if errors.As(err, &ae) {
			public = ae.Msg
		}
		return "", refused(selectionStatus(authority.CodeOf(err)), public, err)
	}
	if space.ValidateUID(iid) != nil {
		return "", refused(http.StatusInternalServerError, "internal error", fmt.Errorf("selector answered %.40q", iid))
	}
	return iid, nil
}

// selectionStatus is the HTTP status of a selection refusal.
func selectionStatus(c authority.Code) int {
	switch c {
	case authority.CodeBadRequest:
		return http.StatusBadRequest
	case authority.CodeNotFound:
		return http.StatusNotFound
	case authority.CodeFailedPrecondition, authority.CodeConflict:
		return http.StatusConflict
	case authority.CodePermissionDenied:
		return http.StatusForbidden
	}
	return http.StatusServiceUnavailable
}

// activate makes the managed row's lifecycle current before its bearer is signed. The caller
// has proven the row's token, so the refusal may say what blocks the lifecycle (AgentRefusal's
// rule covers only what is answered before the token matched): 409 for a lifecycle that cannot
// be activated at this uid (active at another, a retirement begun, a uid taken), 503 while the
// authority is unavailable. Nothing here counts against the throttle: the token was right.
func (h *Handler) activate(ctx context.Context, owner, actor, uid string) error {
	if h.cfg.Activator == nil {
		return refused(http.StatusServiceUnavailable, "no lifecycle authority: managed agents cannot be activated", nil)
	}
	_, err := h.cfg.Activator.Activate(ctx, owner, actor, uid)
	if err == nil {
		return nil
	}
	var ae *authority.Error
	switch code := authority.CodeOf(err); {
	case code == authority.CodeUnavailable:
		return refused(http.StatusServiceUnavailable, "the lifecycle authority is unavailable; retry", err)
	case errors.As(err, &ae) && ae.RetirementBegun():
		return refused(http.StatusConflict, "this managed lifecycle is retiring or retired: it gets no bearer", err)
	case code == authority.CodeAlreadyExists:
		return refused(http.StatusConflict, "this managed actor is active at another lifecycle uid: it gets no bearer", err)
	default:
		return refused(http.StatusConflict, fmt.Sprintf("this managed lifecycle cannot be activated (%s)", code), err)
	}
}

// sign asks signerd for the bearer: scope, parent and lifecycle uid come from the row only. The
// scope is the row's capability words (ledger.Row.BearerScope); its role:<r> delegation tokens
// stay in the ledger.
func (h *Handler) sign(ctx context.Context, owner, actor, view, managerInstanceID string, row ledger.Row, ttl time.Duration) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, signerTimeout)
	defer cancel()
	resp, err := h.cfg.Signer.API().SignBearer(ctx, &signerv1.SignBearerRequest{
		Space: h.cfg.Space, Owner: owner, Actor: actor, Scope: row.BearerScope(), Parent: row.Parent,
		LifecycleUid: row.LifecycleUID, View: view, ManagerInstanceId: managerInstanceID, Ttl: durationpb.New(ttl),
	})
	if err != nil {
		return nil, signerRefusal("the signer could not issue the bearer", err)
	}
	if resp.GetToken() == "" || resp.GetExpiresAt() == nil {
		return nil, refused(http.StatusServiceUnavailable, "the signer answered an empty bearer", nil)
	}
	return &response{Token: resp.GetToken(), Owner: owner, Exp: resp.GetExpiresAt().AsTime().Unix(), ManagerInstanceID: managerInstanceID}, nil
}

// signerRefusal maps a signerd error: unreachable, slow or rate-limited is 503 (retry later);
// anything else is signerd refusing what the row asked for, 502 with its reason code, since the
// caller can do nothing about it but an operator can (signerd's policy; the ledger accepts only
// rows whose bearer signerd's grammar admits).
func signerRefusal(what string, err error) *Refusal {
	err = signerclient.AsError(err)
	if errors.Is(err, signerclient.ErrUnavailable) || errors.Is(err, signerclient.ErrDeadline) || errors.Is(err, signerclient.ErrRateLimited) {
		return refused(http.StatusServiceUnavailable, what+": the signer is unavailable", err)
	}
	return refused(http.StatusBadGateway, fmt.Sprintf("%s: the signer refused (%s)", what, signerclient.ReasonOf(err)), err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
