// Package authority is authd's managed lifecycle authority (issue 23; reference
// lifecycle-hosted.md §1–§2): the activation saga, the retirement barrier, the loopback doors
// that start them, the retire-lifecycle and register-manager rails, endpoint registration and
// interactive manager selection. Keyless authd is the only writer of the rows (pkg/lifecycle);
// every read is leader-served and every write carries its expected revision (Store).
//
// Only managed lifecycles (ledger managed-actors rows) have heads and gates. Interactive rows
// change uid at each `authd actor grant` and keep ledger-only revocation.
//
// Retirement (barrier.go, flight.go, contain.go, resume.go, retire.go, rail.go) runs upstream's
// nine barrier steps in order, one flight per opId shared by the retire door, the
// retire-lifecycle rail and boot resume. Steps 5 and 6 are empty in Go: the obligation drain
// (oblig.<uid>) and the exact-pool cleaner and settlement executor are not built, so the barrier
// passes from containment straight to the frontier. Containment itself is narrower than
// upstream's (no credential-ledger revocation, no $SYS eviction: authd holds no $SYS credential):
// it waits for the alias's connections to end, which their bearer expiry bounds (contain.go).
package authority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// Code is an authority refusal's stable code (upstream's lifecycle error codes).
type Code string

// Refusal codes.
const (
	CodeBadRequest         Code = "bad-request"
	CodeNotFound           Code = "not-found"
	CodeAlreadyExists      Code = "already-exists"
	CodeFailedPrecondition Code = "failed-precondition"
	CodePermissionDenied   Code = "permission-denied"
	CodeConflict           Code = "conflict"
	CodeExpired            Code = "expired"
	CodeUnavailable        Code = "unavailable"
)

// Error is a refusal with its code. GateState and BlockedOp say, for a lifecycle-blocked
// refusal, what blocked it (upstream lifecycleBlockedFrom: gate "retired" or op "retirement").
type Error struct {
	Code      Code
	Msg       string
	GateState lifecycle.GateState
	BlockedOp lifecycle.OpKind
	Err       error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Msg, e.Err)
	}
	return string(e.Code) + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// RetirementBegun reports whether the refusal is a lifecycle blocked by a retirement.
func (e *Error) RetirementBegun() bool {
	return e.BlockedOp == lifecycle.OpRetirement || e.GateState == lifecycle.GateRetired
}

func refuse(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf is err's code: an *Error's own, unavailable for a store that could not be reached or
// holds a corrupt row, "" for nil and unavailable for anything else (never success).
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeUnavailable
}

// Config is what the authority needs. Store, Ledger, Space, Account and Held are required.
type Config struct {
	// Store reads and writes the rows over the plane connection.
	Store *Store
	// Ledger is the actor ledger (managed rows name the uid a lifecycle activates at).
	Ledger *ledger.Ledger
	// Space is the space name; Account its data account's public key (the activate door's
	// accountPublicKey must equal it).
	Space, Account string
	// Signer computes registration proofs (Mac); required for registration.
	Signer signerv1.SignerServiceClient
	// Held is re-read before every write: nil while this authd holds the plane claim, an error
	// (reported as unavailable) once it does not.
	Held func() error
	// Now is the clock (nil: time.Now); Logger receives one line per operation (nil discards).
	Now    func() time.Time
	Logger *slog.Logger
	// Context is the plane's lifetime (nil: context.Background()). Retirement flights run on it,
	// never on a caller's context: a door caller that goes away does not cancel a barrier.
	Context context.Context
	// Callouts, optional, is this authd's callout responder (*callout.Responder): the barrier's
	// containment waits out the callouts in flight at its gate freeze. nil: no callout is served
	// in this process.
	Callouts Idler
	// PublicURL is the public face's base URL (config public_url), the agentBearerExchangeUrl an
	// enrollment answers; "" (no public face) refuses enrollment (failed-precondition).
	PublicURL string
	// Provisioner makes and removes an enrolled agent's durables and ACL row on this authd's own
	// one-shot credentials; nil refuses enrollment (unavailable).
	Provisioner Provisioner
	// Footprint, optional, releases a managed lifecycle's broker footprint for the stock
	// prepare-retirement writer (remote_prepare.go); nil answers that writer unavailable.
	Footprint Footprint
}

// Idler is what the barrier needs of the callout responder: WaitIdle returns once every callout
// begun before the call has been answered (callout.Responder.WaitIdle).
type Idler interface {
	WaitIdle(ctx context.Context) error
}

// Authority is one plane's lifecycle authority. Its methods are safe for concurrent use.
type Authority struct {
	cfg   Config
	store *Store
	names space.Names
	now   func() time.Time
	log   *slog.Logger

	// beforeConfirm, set only by tests, runs between a registration's last write and its
	// confirming read.
	beforeConfirm func()

	sep sepState // service endpoint state: in-flight registrations and test hooks (sep_service.go)

	ctx     context.Context // the plane's: flights run on it (Config.Context)
	flights flights         // retirement flights by opId (flight.go)
	aliases aliasLocks      // the stock managed-agent writers (enrollment, prepare-retirement), serialized per alias
	barrierTuning
}

// New checks cfg and returns the authority.
func New(cfg Config) (*Authority, error) {
	if cfg.Store == nil || cfg.Ledger == nil || cfg.Held == nil {
		return nil, errors.New("authority: a store, a ledger and a plane check are required")
	}
	if cfg.Store.Names().Name() != cfg.Space {
		return nil, fmt.Errorf("authority: the store serves %q, not %q", cfg.Store.Names().Name(), cfg.Space)
	}
	if err := nkey.CheckAccount(cfg.Account); err != nil {
		return nil, fmt.Errorf("authority: account: %w", err)
	}
	a := &Authority{cfg: cfg, store: cfg.Store, names: cfg.Store.Names(), now: cfg.Now, log: cfg.Logger,
		ctx: cfg.Context, barrierTuning: defaultBarrierTuning()}
	if a.ctx == nil {
		a.ctx = context.Background()
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	return a, nil
}

// Store is the authority's store.
func (a *Authority) Store() *Store { return a.store }

// held is the plane check every write path makes first.
func (a *Authority) held() error {
	if err := a.cfg.Held(); err != nil {
		return &Error{Code: CodeUnavailable, Msg: "this authd does not hold the plane claim", Err: err}
	}
	return nil
}

// ManagerInstance is the head's managerInstance for a lifecycle this authd activates itself
// (upstream "auth-service:<space>").
func (a *Authority) ManagerInstance() string { return "auth-service:" + a.cfg.Space }
