// Package callout is authd's NATS auth-callout responder (upstream callout.ts startAuthCallout;
// reference/auth.md §3). The broker publishes each client's CONNECT, sealed to the space's
// callout xkey, on $SYS.REQ.USER.AUTH in the quarantined AUTH account; the responder answers on
// the callout-service user's connection, in queue group cotal-auth-callout. authd holds no key
// that opens, verifies, signs or seals anything: signerd does all four (OpenCalloutRequest,
// SignCalloutResponse), and this package decides.
//
// For each request, in order:
//
//  1. The Nats-Server-Xkey header must be present (§3 step 3).
//  2. signerd's OpenCalloutRequest opens and verifies the request (steps 4-6 and 8: it opens with
//     the xkey, verifies the server's signature, requires user_nkey and server_id.id, iss equal
//     to the server id, server_id.xkey equal to the header key, the request addressed to this
//     space's callout account as an authorization request, and unexpired).
//  3. The server id must be on the allow-list when one is configured (step 7).
//
// A failure of 1-3 sends no reply at all: the broker denies the client when its callout times
// out, and whoever crafted the request learns nothing. From here on the answer is a signed,
// sealed refusal naming the failed check in one short sentence, or a grant:
//
//  4. The auth_token's JOSE header typ picks the arm (serviceaccess.TypOf, which reads the header
//     only): "JWT" is a user bearer, verified (steps 9-12, package bearer) and decided by steps
//     5-9; cotal-service-access+jwt is a service access bearer, decided by the service arm below;
//     anything else (a renewal proof, no typ, an unknown typ, a header that does not parse) is
//     refused, so no token kind passes as another. No token is "no user token presented".
//  5. A view must map to a profile (package views; only admin does) and the bearer's scope must
//     carry the view's required capability.
//  6. The ledger's connect arm (step 13): the row exists in exactly one space, the bearer's scope
//     is within the row's current scope, and its lifecycle UID is the row's.
//  7. The connection name is an inbox nonce bound to the row's principal
//     (space.ValidateBoundInboxNonce: <tag of owner.actor>-<random suffix>; step 15 tightened, so
//     no client can name a minted credential's _INBOX_<user key> or another principal's nonce).
//  8. A managed row (ledger managed-actors) is admitted only while its lifecycle's issuance
//     gate gate.<lifecycleUid> is open (issue 23; Config.Lifecycle leader-reads it over the
//     plane connection on every connect). Absent (never activated), frozen (an activation not
//     finished, a retirement begun), retired, corrupt or unreadable: refused, the reason logged.
//     Interactive rows have no gate: their revocation is the ledger's alone.
//  9. SignCalloutResponse mints the grant: without a view the agent profile from the row (owner,
//     actor, lifecycle UID, role, channels; capabilities the bearer's scope words that are agent
//     capabilities), with the admin view the admin profile; expires_at is the bearer's exp, so
//     the broker drops the connection when the bearer expires. A grant signerd refuses (its
//     policy) becomes a refusal.
//
// The service arm (seed 002: a service endpoint instance serving its endpoint) takes steps 1-3
// and then:
//
//  1. serviceaccess.Validator.Access verifies the access bearer against the same issuer keys as
//     user bearers (Config.JWKS): typ, kid, EdDSA signature, closed claims, iss and aud of this
//     space, iat at most 5 s ahead, no grace on exp, at most 60 s of life.
//  2. Config.Services.CheckServe re-reads what the bearer stands on: the registration it names
//     (its witness), the endpoint gate (open), the root, the approval and the name binding
//     (owner == sub). Without Config.Services every service connect is refused.
//  3. SignCalloutResponse mints the service-serve profile with exactly owner (sub),
//     service_endpoint (ep) and instance_id (iid); expires_at is the bearer's exp. The profile
//     names its own actor (svc_<iid>), serves only its instance's subjects and has no inbox:
//     the connection name is not read and grants nothing, and no ledger row, view or inbox
//     nonce is involved.
//
// Both arms share the budgets, the in-flight bound and WaitIdle, and the same logs (which never
// hold a token).
//
// Local budgets keep signerd's capacity for grants. The sentinel is a public credential, so
// anyone who reaches the broker can make authd ask signerd about a connect; signerd charges
// every call to authd's one rate (policy `rate`), the exchange's and authd's own renewals
// included. Two token buckets on the responder's clock bound what a flood can spend there:
// OpenRate, every OpenCalloutRequest (the request is sealed, so authd cannot tell a flood
// from a legitimate connect before signerd opens it); and RefusalRate, every signed refusal.
// Past either, the request gets no reply (the broker refuses the client at its callout
// timeout) and signerd is not called for it. Grants are never charged to a local budget
// beyond their open: a flood of bad connects costs signerd one call each, not two, and at most
// OpenRate of them a second, leaving the rest of authd's rate for grants.
//
// Fail closed: when signerd cannot be reached nothing is signed, so nothing is answered and the
// connect is denied by the broker's timeout; the responder keeps serving and admits again as
// soon as signerd answers. Requests are served concurrently, at most MaxInFlight at a time;
// the rest wait in the subscription's queue (and time out at the broker if the wait is long).
// Nothing logged names a bearer, JWT or sealed request.
package callout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/internal/views"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Subject and queue group the responder serves.
const (
	Subject    = space.AuthCalloutSubject
	QueueGroup = "cotal-auth-callout"
	// XKeyHeader carries the server's curve key on every callout request
	// (nats-server AuthRequestXKeyHeader).
	XKeyHeader = "Nats-Server-Xkey"
)

// Defaults of Config.
const (
	DefaultMaxInFlight = 64
	// DefaultRequestTimeout bounds the signerd calls for one request. The broker waits about
	// two seconds for an answer; one later than that is of no use.
	DefaultRequestTimeout = 2 * time.Second
)

// Default local budgets (Config.OpenRate, Config.RefusalRate). They are sized for the deployed
// signerd policy's authd rate of 200 calls a second: a flood alone spends at most 100 opens and
// 20 signed refusals a second of it, and a grant costs one open and one signature.
var (
	DefaultOpenRate    = Rate{PerSecond: 100, Burst: 200}
	DefaultRefusalRate = Rate{PerSecond: 20, Burst: 40}
)

// Rate is a token bucket: PerSecond tokens are added each second, up to Burst.
type Rate struct {
	PerSecond float64
	Burst     int
}

// valid reports whether r can admit anything: a positive, finite rate and a burst of at least one.
func (r Rate) valid() bool {
	return r.PerSecond > 0 && !math.IsInf(r.PerSecond, 0) && r.Burst >= 1
}

// Warning codes Config.Warn receives.
const (
	// WarnBudget: requests were dropped without reply past a local budget (OpenRate or
	// RefusalRate); the broker refuses those clients at its callout timeout.
	WarnBudget = "CALLOUT_BUDGET"
	// WarnSigner: signerd could not be reached, so requests were denied by silence.
	WarnSigner = "SIGNER"
)

// warnEvery bounds how often each warning code reaches Config.Warn: a flood is one warning a
// second, with its count, not one per request.
const warnEvery = time.Second

// Outcomes of a request dropped by a local budget (answer's outcome).
const (
	outcomeOpenBudget    = "past the open budget: not sent to signerd"
	outcomeRefusalBudget = "past the refusal budget: refusal not signed"
)

// Refusal sentences sent to a client (signed and sealed by signerd). They never quote the
// request.
const (
	refuseNoToken     = "no user token presented"
	refuseViewProfile = "bearer view has no profile on this broker"
	refuseViewScope   = "bearer scope lacks the capability its view requires"
	refuseNonce       = "connection name is not an inbox nonce bound to this principal (<tag>-<suffix>)"
	refuseSigner      = "the signer refused the grant"
	refuseGate        = "managed lifecycle is not active (its issuance gate is not open)"
	// refuseService: the service arm's re-read of the registration, gate, root, approval or
	// name binding did not admit the bearer (or no service authority is configured).
	refuseService = "service endpoint instance is not admitted to serve"
)

// Checks the callout logs (check=...) and names in a refusal when it refuses a token before
// either arm's verifier: a token whose header does not parse (serviceaccess.TypOf's check,
// format when it names none), and a typ neither arm takes.
const (
	checkFormat = "format"
	checkTyp    = "typ"
)

// Signer is the part of signerd the responder calls; signerv1.SignerServiceClient implements it.
type Signer interface {
	OpenCalloutRequest(ctx context.Context, in *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error)
	SignCalloutResponse(ctx context.Context, in *signerv1.SignCalloutResponseRequest, opts ...grpc.CallOption) (*signerv1.SignCalloutResponseResponse, error)
}

// GateReader leader-reads a managed lifecycle's issuance gate, gate.<uid> in the auth bucket:
// found is false for a gate never written; a corrupt row or an unreachable store is an error.
// authority.Store satisfies it (over authd's plane connection).
type GateReader interface {
	Gate(ctx context.Context, uid string) (g lifecycle.Gate, revision uint64, found bool, err error)
}

// ServiceGate decides whether a verified service access bearer may serve now: it re-reads the
// registration the bearer names (witness), the endpoint gate, the root, the approval and the
// name binding; nil admits. *authority.Authority implements it (CheckServe).
type ServiceGate interface {
	CheckServe(ctx context.Context, c *serviceaccess.AccessClaims) error
}

// Config is what New needs. Space, Signer, Ledger and JWKS are required.
type Config struct {
	Space string
	// Signer is authd's signerd client; the callout RPCs go over its Calls (signerd's Stream,
	// the unary RPCs when signerd does not serve it).
	Signer *signerclient.Client
	// Ledger is the actor ledger, read fresh on every request.
	Ledger *ledger.Ledger
	// JWKS holds the bearer issuer's keys (fed by signerd's GetJWKS).
	JWKS *bearer.Cache
	// Lifecycle reads managed rows' issuance gates (step 8). nil refuses every managed row.
	Lifecycle GateReader
	// Services admits verified service access bearers (the service arm's step 2). nil refuses
	// every service connect.
	Services ServiceGate
	// AllowedServers lists the broker server ids (N... public keys) whose requests are
	// answered. Empty answers any server that signed its request; New logs a warning then,
	// because any holder of a server key the broker trusts no more than any other could ask.
	AllowedServers []string
	// MaxInFlight bounds requests served at once; zero means DefaultMaxInFlight.
	MaxInFlight int
	// RequestTimeout bounds the signerd calls of one request; zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// OpenRate bounds the requests handed to signerd's OpenCalloutRequest; past it a request
	// gets no reply. Zero means DefaultOpenRate.
	OpenRate Rate
	// RefusalRate bounds the refusals signerd is asked to sign; past it a refused request gets
	// no reply. Zero means DefaultRefusalRate.
	RefusalRate Rate
	// Now is the clock bearers are checked against; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Gate, when set, is asked before each request is served: false drops the request without
	// a reply (the broker refuses that client at its callout timeout). authd closes it while its
	// plane claim is not proven on its current broker connection.
	Gate func() bool
	// Warn, if set, is told of what the responder survives but its host should know: requests
	// dropped past a local budget (WarnBudget) and signerd unreachable (WarnSigner). Each code
	// reaches it at most once a second (warnEvery), with the count since its last report; it
	// never carries request content. It must not block.
	Warn func(code, msg string, err error)

	// signer replaces Signer.Calls() in tests.
	signer Signer
}

// Responder answers callout requests for one space.
type Responder struct {
	space    string
	signer   Signer
	ledger   *ledger.Ledger
	gates    GateReader
	verifier *bearer.Verifier
	access   *serviceaccess.Validator
	services ServiceGate
	allowed  map[string]bool
	timeout  time.Duration
	log      *slog.Logger
	sem      chan struct{}
	now      func() time.Time
	opens    *rate.Limiter
	refusals *rate.Limiter
	gate     func() bool

	warn                    func(code, msg string, err error)
	budgetWarn, signerWarn  rate.Sometimes
	openDrops, refusalDrops atomic.Int64 // dropped past a budget since the last WarnBudget
	unreached               atomic.Int64 // requests signerd did not answer since the last WarnSigner

	flight inflight // requests being served, for WaitIdle

	mu     sync.Mutex
	sub    *nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool
}

// New validates cfg. It refuses a missing signer, ledger or JWKS cache, an invalid space, an
// allow-list entry that is not a canonical server public key, and a negative bound or timeout.
func New(cfg Config) (*Responder, error) {
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("callout: %w", err)
	}
	signer := cfg.signer
	if signer == nil {
		if cfg.Signer == nil {
			return nil, errors.New("callout: Config.Signer is nil")
		}
		signer = cfg.Signer.Calls()
	}
	switch {
	case cfg.Ledger == nil:
		return nil, errors.New("callout: Config.Ledger is nil")
	case cfg.JWKS == nil:
		return nil, errors.New("callout: Config.JWKS is nil")
	case cfg.MaxInFlight < 0 || cfg.RequestTimeout < 0:
		return nil, fmt.Errorf("callout: negative MaxInFlight (%d) or RequestTimeout (%v)", cfg.MaxInFlight, cfg.RequestTimeout)
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.OpenRate == (Rate{}) {
		cfg.OpenRate = DefaultOpenRate
	}
	if cfg.RefusalRate == (Rate{}) {
		cfg.RefusalRate = DefaultRefusalRate
	}
	if !cfg.OpenRate.valid() || !cfg.RefusalRate.valid() {
		return nil, fmt.Errorf("callout: OpenRate %+v and RefusalRate %+v need a positive rate and a burst of at least 1", cfg.OpenRate, cfg.RefusalRate)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("space", cfg.Space)
	allowed := map[string]bool{}
	for _, id := range cfg.AllowedServers {
		if !nkey.IsServer(id) {
			return nil, fmt.Errorf("callout: allowed server %.64q is not a canonical server (N) public key", id)
		}
		allowed[id] = true
	}
	if len(allowed) == 0 {
		log.Warn("callout: no allow-list of broker server ids; any server key's signed request is answered")
	}
	v, err := bearer.NewVerifier(cfg.Space, cfg.JWKS, cfg.Now)
	if err != nil {
		return nil, err
	}
	return &Responder{
		space: cfg.Space, signer: signer, ledger: cfg.Ledger, gates: cfg.Lifecycle, verifier: v, allowed: allowed,
		access:   &serviceaccess.Validator{Space: cfg.Space, Keys: cfg.JWKS, Now: cfg.Now},
		services: cfg.Services,
		timeout:  cfg.RequestTimeout, log: log, sem: make(chan struct{}, cfg.MaxInFlight), now: now,
		opens:    rate.NewLimiter(rate.Limit(cfg.OpenRate.PerSecond), cfg.OpenRate.Burst),
		refusals: rate.NewLimiter(rate.Limit(cfg.RefusalRate.PerSecond), cfg.RefusalRate.Burst),
		gate:     cfg.Gate,
		warn:     cfg.Warn, budgetWarn: rate.Sometimes{Interval: warnEvery}, signerWarn: rate.Sometimes{Interval: warnEvery},
	}, nil
}

// dropped counts a request dropped past a budget and reports the drops at most once a second.
func (r *Responder) dropped(counter *atomic.Int64) {
	counter.Add(1)
	if r.warn == nil {
		return
	}
	r.budgetWarn.Do(func() {
		opens, refusals := r.openDrops.Swap(0), r.refusalDrops.Swap(0)
		r.warn(WarnBudget, fmt.Sprintf("callout requests dropped without reply past the local budgets since the last warning: %d past callout_opens, %d past callout_refusals", opens, refusals), nil)
	})
}

// signerUnreachable logs a signerd call that could not be made and reports such calls at most
// once a second.
func (r *Responder) signerUnreachable(err error) {
	r.log.Warn("callout: signerd unreachable; denying by silence", "err", err)
	r.unreached.Add(1)
	if r.warn == nil {
		return
	}
	r.signerWarn.Do(func() {
		r.warn(WarnSigner, fmt.Sprintf("signerd unreachable: %d callout requests denied by silence since the last warning", r.unreached.Swap(0)), err)
	})
}

// Start subscribes on nc (the callout-service user's connection) and returns once the broker has
// the subscription (after a flush), so a connect attempted after Start returns is answered. ctx
// bounds the subscription's life as Close does. It refuses a second Start and a Start after Close.
func (r *Responder) Start(ctx context.Context, nc *nats.Conn) error {
	return r.startOn(ctx, nc, Subject)
}

// startOn is Start on another subject: the broker refuses any publish on Subject in the AUTH
// account (nats-server denies it to every user there), so tests deliver crafted requests to a
// responder serving a test subject.
func (r *Responder) startOn(ctx context.Context, nc *nats.Conn, subject string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("callout: responder closed")
	}
	if r.sub != nil {
		return errors.New("callout: responder already started")
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sub, err := nc.QueueSubscribe(subject, QueueGroup, func(m *nats.Msg) { r.dispatch(runCtx, m) })
	if err != nil {
		cancel()
		return fmt.Errorf("callout: subscribe %s: %w", subject, err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return fmt.Errorf("callout: flush subscription: %w", err)
	}
	if err := nc.LastError(); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return fmt.Errorf("callout: subscription refused: %w", err)
	}
	r.sub, r.cancel = sub, cancel
	go func() {
		select {
		case <-ctx.Done():
			r.Close()
		case <-runCtx.Done():
		}
	}()
	r.log.Info("callout: serving", "subject", subject, "queue", QueueGroup, "max_in_flight", cap(r.sem))
	return nil
}

// Close unsubscribes and waits for the requests in flight. It is idempotent.
func (r *Responder) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	sub, cancel := r.sub, r.cancel
	r.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	if cancel != nil {
		cancel()
	}
	r.wg.Wait()
}

// dispatch runs on the subscription's goroutine: it waits for a slot, then serves m on its own
// goroutine, so up to MaxInFlight requests are in flight while the queue keeps order of arrival.
func (r *Responder) dispatch(ctx context.Context, m *nats.Msg) {
	if r.gate != nil && !r.gate() {
		r.log.Debug("callout: request dropped without reply", "outcome", "gate closed")
		return
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	// Close sets closed under mu before it waits, so no Add races its Wait.
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		<-r.sem
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	ticket := r.flight.begin()
	go func() {
		defer r.wg.Done()
		defer func() { <-r.sem }()
		defer r.flight.end(ticket)
		rctx, cancel := context.WithTimeout(ctx, r.timeout)
		defer cancel()
		reply, outcome := r.answer(rctx, m.Header.Get(XKeyHeader), m.Data)
		if reply == nil {
			r.log.Debug("callout: request dropped without reply", "outcome", outcome)
			return
		}
		if err := m.Respond(reply); err != nil {
			r.log.Warn("callout: publish reply", "err", err)
		}
	}()
}

// answer decides one request and returns the sealed reply, or nil when nothing may be sent.
// outcome says why, for the log and tests; it never holds request content.
func (r *Responder) answer(ctx context.Context, xkey string, sealed []byte) (reply []byte, outcome string) {
	if xkey == "" {
		return nil, "no " + XKeyHeader + " header"
	}
	if !r.opens.AllowN(r.now(), 1) {
		r.dropped(&r.openDrops)
		return nil, outcomeOpenBudget
	}
	opened, err := r.signer.OpenCalloutRequest(ctx, &signerv1.OpenCalloutRequestRequest{Space: r.space, SealedRequest: sealed, ServerXkey: xkey})
	if err != nil {
		if unreachable(err) {
			r.signerUnreachable(err)
		}
		return nil, "request not opened: " + statusMessage(err)
	}
	if len(r.allowed) > 0 && !r.allowed[opened.GetServerId()] {
		r.log.Warn("callout: request from a server not on the allow-list", "server_id", opened.GetServerId())
		return nil, "server not on the allow-list"
	}
	base := &signerv1.SignCalloutResponseRequest{Space: r.space, SealedRequest: sealed, ServerXkey: xkey}
	grant, refusal := r.decide(ctx, opened)
	if grant != nil {
		req := cloneReq(base)
		req.Decision = &signerv1.SignCalloutResponseRequest_Grant{Grant: grant}
		resp, err := r.signer.SignCalloutResponse(ctx, req)
		if err == nil {
			r.log.Debug("callout: granted", "user", opened.GetUserNkey(), "owner", grant.GetParams().GetOwner(),
				"actor", grant.GetParams().GetActor(), "endpoint", grant.GetParams().GetServiceEndpoint(),
				"instance", grant.GetParams().GetInstanceId(), "profile", grant.GetProfile().String(), "jti", resp.GetUserJti())
			return resp.GetSealedResponse(), "granted"
		}
		if unreachable(err) {
			r.signerUnreachable(err)
			return nil, "grant not signed: " + statusMessage(err)
		}
		r.log.Warn("callout: signerd refused the grant", "owner", grant.GetParams().GetOwner(), "actor", grant.GetParams().GetActor(),
			"profile", grant.GetProfile().String(), "err", err)
		refusal = refuseSigner
	}
	if !r.refusals.AllowN(r.now(), 1) {
		r.log.Debug("callout: refusal not signed: past the refusal budget", "user", opened.GetUserNkey(), "reason", refusal)
		r.dropped(&r.refusalDrops)
		return nil, outcomeRefusalBudget
	}
	req := cloneReq(base)
	req.Decision = &signerv1.SignCalloutResponseRequest_Error{Error: refusal}
	resp, err := r.signer.SignCalloutResponse(ctx, req)
	if err != nil {
		return nil, "refusal not signed: " + statusMessage(err)
	}
	r.log.Info("callout: refused", "user", opened.GetUserNkey(), "reason", refusal)
	return resp.GetSealedResponse(), "refused: " + refusal
}

// decide picks the arm by the token's typ (step 4): a grant, or the refusal sentence.
func (r *Responder) decide(ctx context.Context, opened *signerv1.OpenCalloutRequestResponse) (*signerv1.CalloutGrant, string) {
	token := opened.GetAuthToken()
	if token == "" {
		return nil, refuseNoToken
	}
	typ, err := serviceaccess.TypOf(token)
	switch {
	case err != nil:
		check := checkFormat
		var te *serviceaccess.TokenError
		if errors.As(err, &te) && te.Check != "" {
			check = te.Check
		}
		r.log.Info("callout: bearer refused", "user", opened.GetUserNkey(), "check", check, "detail", "the token's header does not parse")
		return nil, "bearer refused: " + check
	case typ == serviceaccess.TypUser:
		return r.decideUser(ctx, opened, token)
	case typ == serviceaccess.TypAccess:
		return r.decideService(ctx, opened, token)
	}
	// A renewal proof, no typ or another typ. The typ is not logged: it is the client's text.
	r.log.Info("callout: bearer refused", "user", opened.GetUserNkey(), "check", checkTyp, "detail", "typ is neither a user bearer's nor a service access bearer's")
	return nil, "bearer refused: " + checkTyp
}

// decideService is the service arm (its steps 1-3) for an auth_token whose typ is a service access
// bearer's.
func (r *Responder) decideService(ctx context.Context, opened *signerv1.OpenCalloutRequestResponse, token string) (*signerv1.CalloutGrant, string) {
	c, err := r.access.Access(ctx, token)
	if err != nil {
		check := "claims"
		var te *serviceaccess.TokenError
		if errors.As(err, &te) && te.Check != "" {
			check = te.Check
		}
		r.log.Info("callout: service access bearer refused", "user", opened.GetUserNkey(), "check", check, "err", err)
		return nil, "service access bearer refused: " + check
	}
	if r.services == nil {
		r.log.Info("callout: service access bearer refused", "user", opened.GetUserNkey(), "owner", c.Sub,
			"endpoint", c.Ep, "instance", c.Iid, "reason", "no service endpoint authority configured")
		return nil, refuseService
	}
	if err := r.services.CheckServe(ctx, c); err != nil {
		r.log.Info("callout: service endpoint instance refused", "user", opened.GetUserNkey(), "owner", c.Sub,
			"endpoint", c.Ep, "instance", c.Iid, "err", err)
		return nil, refuseService
	}
	return &signerv1.CalloutGrant{
		Profile:   signerv1.Profile_PROFILE_SERVICE_SERVE,
		Params:    &signerv1.ProfileParams{Owner: c.Sub, ServiceEndpoint: c.Ep, InstanceId: c.Iid},
		ExpiresAt: timestamppb.New(time.Unix(c.Exp, 0)),
	}, ""
}

// decideUser applies steps 4-9 to a user bearer.
func (r *Responder) decideUser(ctx context.Context, opened *signerv1.OpenCalloutRequestResponse, token string) (*signerv1.CalloutGrant, string) {
	c, err := r.verifier.Verify(ctx, token)
	if err != nil {
		var be *bearer.Error
		if errors.As(err, &be) {
			r.log.Info("callout: bearer refused", "user", opened.GetUserNkey(), "check", string(be.Check), "detail", be.Detail)
			return nil, "bearer refused: " + string(be.Check)
		}
		return nil, "bearer refused"
	}
	var profile profiles.Name
	if c.View != "" {
		p, need, ok := views.Profile(c.View)
		if !ok {
			return nil, refuseViewProfile
		}
		if need != "" && !slices.Contains(c.Scope, need) {
			return nil, refuseViewScope
		}
		profile = p
	}
	row, kind, err := r.ledger.AuthorizeConnectKind(c.Owner, c.Actor, c.Scope, c.LifecycleUID)
	if err != nil {
		r.log.Info("callout: ledger refused", "user", opened.GetUserNkey(), "err", err)
		var le *ledger.Error
		if errors.As(err, &le) {
			return nil, le.Err.Error()
		}
		return nil, "actor ledger unreadable"
	}
	// The connection name becomes the reply inbox _INBOX_<name>: it must be bound to this
	// principal, or a bearer holder could name a minted credential's _INBOX_<user key> or another
	// principal's nonce and read their replies (pkg/space inbox.go).
	if err := space.ValidateBoundInboxNonce(opened.GetConnectionName(), row.Owner, row.Actor); err != nil {
		return nil, refuseNonce
	}
	if kind == ledger.Managed {
		if why := r.gateClosed(ctx, row.LifecycleUID); why != "" {
			r.log.Info("callout: managed lifecycle refused", "user", opened.GetUserNkey(), "owner", row.Owner, "actor", row.Actor,
				"uid", row.LifecycleUID, "reason", why)
			return nil, refuseGate
		}
	}
	g := &signerv1.CalloutGrant{ExpiresAt: timestamppb.New(c.Expires)}
	if profile == "" {
		g.Profile = signerv1.Profile_PROFILE_AGENT
		g.Params = &signerv1.ProfileParams{
			Owner: row.Owner, Actor: row.Actor, LifecycleUid: row.LifecycleUID, Role: row.Role,
			Subscribe: row.AllowSubscribe, AllowSubscribe: row.AllowSubscribe, AllowPublish: row.AllowPublish,
			Capabilities: agentCapabilities(c.Scope),
		}
		return g, ""
	}
	pp, ok := protoProfile[profile]
	if !ok {
		return nil, refuseViewProfile
	}
	g.Profile = pp
	g.Params = &signerv1.ProfileParams{Owner: row.Owner, Actor: row.Actor}
	return g, ""
}

// gateClosed leader-reads uid's issuance gate and returns why it does not admit ("" when open).
func (r *Responder) gateClosed(ctx context.Context, uid string) string {
	if r.gates == nil {
		return "no lifecycle authority to read the issuance gate"
	}
	g, _, found, err := r.gates.Gate(ctx, uid)
	switch {
	case err != nil:
		r.log.Warn("callout: issuance gate unreadable", "uid", uid, "err", err)
		return "issuance gate unreadable or corrupt"
	case !found:
		return "no issuance gate (the lifecycle was never activated)"
	case g.State != lifecycle.GateOpen:
		why := "issuance gate " + string(g.State)
		if g.Op != nil {
			why += " by its " + string(g.Op.Kind)
		}
		return why
	}
	return ""
}

// protoProfile maps the profiles a view can name to their proto enum.
var protoProfile = map[profiles.Name]signerv1.Profile{
	profiles.Admin: signerv1.Profile_PROFILE_ADMIN,
}

// agentCapabilities keeps the bearer scope words the agent profile knows (spawn, run, admin).
// Other scope words (supervise, ...) gate views, not agent rows; passing them would make signerd
// refuse the whole grant. (role:<r> delegation tokens never reach a bearer: ledger.Row.BearerScope.)
func agentCapabilities(scope []string) []string {
	var out []string
	for _, s := range scope {
		switch s {
		case profiles.CapSpawn, profiles.CapRun, profiles.CapAdmin:
			out = append(out, s)
		}
	}
	return out
}

func cloneReq(r *signerv1.SignCalloutResponseRequest) *signerv1.SignCalloutResponseRequest {
	return &signerv1.SignCalloutResponseRequest{Space: r.Space, SealedRequest: r.SealedRequest, ServerXkey: r.ServerXkey}
}

// unreachable reports a transport failure (as opposed to a decision of signerd's).
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func statusMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Code().String() + ": " + s.Message()
	}
	return err.Error()
}
