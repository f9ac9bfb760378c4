package service

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// Config is authd's configuration (`authd serve --config FILE`), and the types its fields use,
// so that a host outside this module can build one: Signer is the `signer:` block, Rate a
// callout budget, Duration a YAML duration.
type (
	Config   = config.Config
	Signer   = config.Signer
	Rate     = config.Rate
	Duration = yamlx.Duration
)

// LoadConfig reads an authd configuration file strictly (unknown keys, a secret in the file or
// an invalid value refused, naming it) and applies the defaults.
func LoadConfig(path string) (*Config, error) { return config.Load(path) }

// State, Event and EventKind are pkg/daemon's, the one readiness and warning channel of the
// three embeddable runners.
type (
	State     = daemon.State
	Event     = daemon.Event
	EventKind = daemon.EventKind
)

// The states (see the package doc for when authd is in each).
const (
	StateStarting    = daemon.StateStarting
	StateReady       = daemon.StateReady
	StateUnavailable = daemon.StateUnavailable
	StateStopped     = daemon.StateStopped
)

// The event kinds.
const (
	EventWarning = daemon.EventWarning
	EventState   = daemon.EventState
)

// Event codes (Event.Code), besides the refusal codes that also name conditions while serving
// (CodeBroker, CodePlane, CodeSigner, CodeDiscovery).
const (
	CodeReady         = "READY"            // state: Start finished, authd serves
	CodeFence         = "FENCE"            // state: the plane claim is fenced; authd stops
	CodeCredential    = "CREDENTIAL"       // warning: a renewal failed, retried; state: expired, authd stops
	CodeCalloutBudget = callout.WarnBudget // warning: callout requests dropped past a local budget
	CodeStopping      = "STOPPING"         // state: authd is stopping
	CodeClosed        = "CLOSED"           // state: stopped by Close
	CodeHook          = "HOOK"             // warning: a host hook (OnReady, OnStopping) panicked; authd went on
	CodePlaneTaken    = "PLANE_TAKEN"      // state: stopped, another instance took the plane claim
	CodeFailed        = "FAILED"           // state: stopped by a failure; Err says which
)

// More stop causes (with ErrPlaneTaken and ErrPlaneLost), and Close's error.
var (
	// ErrStopped: Close stopped the service.
	ErrStopped = daemon.ErrStopped
	// ErrBrokerGone: a hosted context's broker connection stayed down past the broker-gone window.
	ErrBrokerGone = errors.New("authd: broker connection down past the broker-gone window")
	// ErrCredentialExpired: a credential expired while its renewals kept failing.
	ErrCredentialExpired = signerclient.ErrExpired
	// ErrReleaseUnconfirmed: Close could not confirm that the plane claim was released (the
	// broker did not answer); the claim expires with its TTL.
	ErrReleaseUnconfirmed = errors.New("authd: plane claim release not confirmed")
)

// Hosted is a hosted auth context's assignment (seed 000): the data account it must serve, the
// lifecycle uid and the identity of the host's store, all required; deliveryd takes the same
// value. See the package doc for the checks.
type Hosted = daemon.Hosted

// Inputs is what Start runs.
type Inputs struct {
	// Config is required; Start validates it (and applies defaults to its own copy).
	Config *Config
	// Hosted, if set, makes this a hosted auth context; nil is the CLI path.
	Hosted *Hosted
	// LocalManager reads this host's managerd identity (its manager-identity.json) afresh at
	// every selection that needs it (LocalManagerFile); nil means no local manager, as in a
	// hosted context. RuntimeOptions.InteractiveManagerSelection "local-primary" requires it.
	LocalManager LocalManager
}

// ManagerIdentity is a managerd's persisted identity (manager-identity.json: v, space,
// instanceId), and LocalManager a fresh reader of it: an error wrapping fs.ErrNotExist means no
// local manager, any other error an unreadable one.
type (
	ManagerIdentity = authority.ManagerIdentity
	LocalManager    = authority.LocalManager
)

// ManagerIdentityFile is the name of the identity file a managerd writes in its state_dir.
const ManagerIdentityFile = authority.ManagerIdentityFile

// LocalManagerFile is the LocalManager reading path, a managerd's manager-identity.json, on every
// call, strictly (at most 1 KiB; exactly v 1, a space name and an instance id).
func LocalManagerFile(path string) LocalManager { return authority.LocalManagerFile(path) }

// Interactive manager selection policies (RuntimeOptions.InteractiveManagerSelection).
const (
	// SelectRemoteFirst (the default): an explicit managerInstanceId must be a live manager of
	// the caller's owner; else exactly one live remote manager is chosen, more than one or only
	// non-live ones are refused, and with none the local manager (Inputs.LocalManager) is chosen
	// if live.
	SelectRemoteFirst = authority.SelectRemoteFirst
	// SelectLocalPrimary binds every unpinned human manager-caller exchange to the local
	// managerd, or refuses it (absent, unreadable, not live) without reading any remote
	// manager's rows, even when the person has a live remote manager. Explicit selectors and
	// the agent arm keep remote-first.
	SelectLocalPrimary = authority.SelectLocalPrimary
)

// Hooks are called at the service's lifecycle points, on the goroutine that reached them; each
// must return promptly. The CLI passes sd_notify READY=1 and STOPPING=1; a hosted context,
// which is not the host process's unit, passes none.
type Hooks struct {
	// OnReady is called once, when Start has finished and authd serves.
	OnReady func()
	// OnStopping is called once, when a started authd begins to stop, for any reason.
	OnStopping func()
}

// DefaultBrokerGone is how long a broker connection may stay down before authd reports itself
// unavailable (and a hosted context closes): long enough to ride out a broker restart or a
// cluster failover (nats reconnects every 250 ms), short enough to fall before the plane fence
// (at the default plane_ttl of 30 s the claim is renewed every 15 s and fenced 27 s after its
// last stored write, so at least 12 s after a loss).
const DefaultBrokerGone = 5 * time.Second

// RuntimeOptions is how Start runs. Every field is optional.
type RuntimeOptions struct {
	// Logger receives the service's lines (never a seed, JWT, bearer or cap); nil discards.
	Logger *slog.Logger
	// Events receives state changes and warnings, in order, one at a time, on the goroutine
	// that raised them; it must not block or call back into the Service (State included): hand
	// the event to a goroutine of your own for anything more.
	Events func(Event)
	// PID is written to the discovery and refusal files; zero means os.Getpid().
	PID int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// IdPClient fetches the pinned IdP's JWKS; nil means idp's default client.
	IdPClient *http.Client
	// NatsOptions are added to both broker connections (TLS settings, say). authd sets the
	// disconnect and reconnect handlers after them, so theirs are replaced.
	NatsOptions []nats.Option
	// BrokerGone is the broker-gone window; zero means DefaultBrokerGone.
	BrokerGone time.Duration
	// InteractiveManagerSelection is SelectRemoteFirst ("", the default) or SelectLocalPrimary
	// (which needs Inputs.LocalManager). Start refuses any other value, and local-primary without
	// a reader, before any effect (CodeConfig, no file written). Only a host composing authd sets
	// it: no flag, configuration key or exchange field does.
	InteractiveManagerSelection string
	// Hooks replace the daemon notifications (see Hooks).
	Hooks Hooks
}

// Cap is the per-start capability of the loopback face (auth-service.json's cap): it alone
// authorizes the loopback host actions, so keep it in the authority process. Never log it.
func (s *Service) Cap() string { return s.capHex }

// PublicURL is the public face's published https URL (config public_url), "" without a public
// face (no public_listen).
func (s *Service) PublicURL() string { return s.publicURL }

// State is the current state (see the package doc).
func (s *Service) State() State { return s.tr.State() }

// Ready reports whether the state is StateReady: whether a host may route to this instance.
func (s *Service) Ready() bool { return s.State() == StateReady }

// LogValue describes the service without its capability.
func (s *Service) LogValue() slog.Value {
	return slog.GroupValue(slog.String("space", s.cfg.Space), slog.String("url", s.url), slog.String("state", string(s.State())))
}

// String describes the service without its capability.
func (s *Service) String() string {
	return "authd " + s.cfg.Space + " " + s.url + " " + string(s.State())
}
