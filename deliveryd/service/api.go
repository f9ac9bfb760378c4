package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/internal/watchdog"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// Config is deliveryd's configuration, the YAML file `deliveryd serve --config` reads; a host
// may build it in code. Its Signer is a signerclient.FileConfig, its durations yamlx.Durations.
type Config = config.Config

// LoadConfig reads a configuration file strictly (unknown keys refused, no secret allowed in it)
// and validates it.
func LoadConfig(path string) (*Config, error) { return config.Load(path) }

// Hosted is the context a hosting platform assigned this instance (seed 000, hosted delivery
// context): the data account the delivery credential must belong to, the lifecycle uid and the
// store identity reloadStoreIdentity answers, all required; authd takes the same value. See the
// package doc.
type Hosted = daemon.Hosted

// Inputs is what Start runs.
type Inputs struct {
	// Config is required; Start validates a copy.
	Config *Config
	// Hosted is the hosting platform's context; nil is the CLI path.
	Hosted *Hosted
}

// RuntimeOptions is how Start runs it; the zero value is fine.
type RuntimeOptions struct {
	// Logger receives the service's lines (never a seed or JWT); nil discards.
	Logger *slog.Logger
	// Events receives every change of state and every warning (see the package doc); nil
	// drops them. It must not block or call back into the Service.
	Events func(Event)
	// PID names this process in the default holder and the CLI path's files; zero means
	// os.Getpid().
	PID int
	// NatsOptions are added to the broker connection (TLS settings, say).
	NatsOptions []nats.Option
	// Getenv reads the watchdog's environment overrides; nil means os.Getenv.
	Getenv func(string) string
	// Responders builds the request handlers the lease supervisor starts and quiesces; nil
	// means CtlResponders (ctl.delivery and ctl.delivery-admin). A seam for tests and for a host
	// that adds its own.
	Responders func(Hooks) (Responders, error)
	// Registerer receives deliveryd's metrics (the trusted reader's gate: reader.NewMetrics) for a
	// host that serves its own; nil with no metrics_listen registers them nowhere.
	Registerer prometheus.Registerer
}

// State, Event and their values, as pkg/daemon defines them for the three embeddable daemons.
type (
	State     = daemon.State
	Event     = daemon.Event
	EventKind = daemon.EventKind
)

// States and event kinds.
const (
	StateStarting    = daemon.StateStarting
	StateReady       = daemon.StateReady
	StateUnavailable = daemon.StateUnavailable
	StateStopped     = daemon.StateStopped
	EventWarning     = daemon.EventWarning
	EventState       = daemon.EventState
)

// FileName is the base name of the CLI path's files in the state directory: the state file
// delivery-service.json and the refusal file delivery-service-refusal.json.
const FileName = "delivery-service"

// Codes of a refused start (*StartError, and the refusal file), of the events and of a stop.
const (
	CodeConfig     = daemon.CodeConfig   // the configuration, the hosted context or the state directory is refused
	CodeSigner     = "SIGNER"            // signerd refused or could not be reached for a credential
	CodeAccount    = "ACCOUNT"           // the credential belongs to another account than the hosted one
	CodeBroker     = "BROKER"            // the broker refused the credential, the connection or the probe; or the connection dropped
	CodeMissing    = "MISSING"           // a stream or bucket does not exist (provision the space)
	CodeLeaseHeld  = "LEASE_HELD"        // another deliveryd holds the space's lease
	CodePermission = "PERMISSION"        // the broker refused a subject the lease needs
	CodeLease      = "LEASE"             // the lease failed otherwise, or is being re-checked
	CodeBind       = "BIND"              // the writer, the reader or a responder could not bind
	CodeWatch      = "WATCH"             // the mandatory lease watch could not be established
	CodeCanceled   = daemon.CodeCanceled // ctx ended (before the service was ready: a refused start)
	CodeCredential = "CREDENTIAL"        // the credential expired, or its renewal failed
	CodeDraining   = "DRAINING"          // Drain is under way
	CodeReady      = "READY"             // serving
	CodeClosed     = "CLOSED"            // stopped by Close or Drain
	CodeFailed     = "FAILED"            // stopped by a loop that failed
)

// StartError is a refused start (daemon.StartError): code, reason, details and cause.
type StartError = daemon.StartError

// Stop causes reported by Err after Done.
var (
	// ErrStopped: Close or Drain stopped the service.
	ErrStopped = daemon.ErrStopped
	// ErrLeaseTaken: another instance's row replaced this one's lease; it was left in place.
	ErrLeaseTaken = errors.New("deliveryd: the delivery lease was taken by another instance")
	// ErrLeaseLost: the lease was gone and could not be created again.
	ErrLeaseLost = errors.New("deliveryd: the delivery lease was gone and could not be created again")
	// ErrBrokerGone matches the broker-gone verdict (a *BrokerGoneError).
	ErrBrokerGone = watchdog.ErrBrokerGone
	// ErrCredentialExpired matches a credential that expired without renewal.
	ErrCredentialExpired = signerclient.ErrExpired
)

// BrokerGoneError is the broker-gone verdict: how long the connection was down and which limit
// (the window or the backstop) it passed.
type BrokerGoneError = watchdog.GoneError

// Errors of Close and Drain, matched by a *ReleaseError.
var (
	// ErrReleaseUnconfirmed: the broker did not confirm the lease release; the row expires with
	// its TTL, and a successor is refused until then.
	ErrReleaseUnconfirmed = errors.New("deliveryd: the delivery lease release was not confirmed")
	// ErrForeignRow: another instance's lease row is there after the close.
	ErrForeignRow = errors.New("deliveryd: another instance's delivery lease row is there")
)

// ReleaseError is why Close or Drain could not promise the lease is free of this instance:
// Holder names the other instance whose row is there (ErrForeignRow), or, when empty, Err says
// why the release was not confirmed (ErrReleaseUnconfirmed).
type ReleaseError struct {
	Holder string
	Err    error
}

func (e *ReleaseError) Error() string {
	if e.Holder != "" {
		return "deliveryd: close: another instance's delivery lease row is there (holder " + daemon.QuoteInput(e.Holder) + "); this instance had no lease left to release"
	}
	return fmt.Sprintf("deliveryd: close: the delivery lease release was not confirmed; the row expires with its TTL: %v", e.Err)
}

// Is matches ErrForeignRow or ErrReleaseUnconfirmed.
func (e *ReleaseError) Is(target error) bool {
	if e.Holder != "" {
		return target == ErrForeignRow
	}
	return target == ErrReleaseUnconfirmed
}

// Unwrap returns the cause.
func (e *ReleaseError) Unwrap() error { return e.Err }

// stopCode is the code of the stopped event for the cause why.
func stopCode(why error) string {
	switch {
	case errors.Is(why, daemon.ErrStopped):
		return CodeClosed
	case errors.Is(why, context.Canceled):
		return CodeCanceled
	case errors.Is(why, ErrBrokerGone):
		return CodeBroker
	case errors.Is(why, ErrCredentialExpired):
		return CodeCredential
	case errors.Is(why, ErrLeaseTaken), errors.Is(why, ErrLeaseLost):
		return CodeLease
	}
	return CodeFailed
}
