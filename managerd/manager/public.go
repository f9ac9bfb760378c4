package manager

import (
	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/internal/instlease"
	"github.com/cotalgo/cotal/managerd/internal/launcher"
	"github.com/cotalgo/cotal/pkg/daemon"
)

// The names an embedder outside this module needs for what Start takes and returns, where they
// live in packages it cannot import (managerd/internal/..., or pkg/daemon for the shared ones).

// StartError is a refused start (daemon.StartError): a code (CodeLeaseHeld, ...), a sentence,
// details (the holder of a lease) and the cause.
type StartError = daemon.StartError

// State is the manager's readiness (daemon.State).
type State = daemon.State

// The states, in the order a manager goes through them.
const (
	StateStarting    = daemon.StateStarting
	StateReady       = daemon.StateReady
	StateUnavailable = daemon.StateUnavailable
	StateStopped     = daemon.StateStopped
)

// Event is a state change or a nonfatal warning, handed to RuntimeOptions.Events (daemon.Event).
type Event = daemon.Event

// EventKind says what an Event reports.
type EventKind = daemon.EventKind

// The kinds of Event.
const (
	EventWarning = daemon.EventWarning
	EventState   = daemon.EventState
)

// LeaseHeld is the cause of a CodeLeaseHeld refusal: a live manager (this root's, or another
// root's) holds the instance's lease row. Row names it.
type LeaseHeld = instlease.LeaseHeld

// LeaseRow is an instance lease row: holder, instance id, runtime, root, pid, since.
type LeaseRow = instlease.Row

// LaunchRequest is what the manager asks a Launcher to start: an agent's name, connector,
// environment, launch material (its credential; write it 0600 as the agent's) and terminal size.
type LaunchRequest = launcher.Request

// Child is a started agent's process: pid (also its process group), start time in clock ticks
// (together they name this process and no later one), directory and uid.
type Child = launcher.Child

// LaunchRefusedError is a Launcher's refusal with a stable reason; the manager answers a spawn it
// refuses with LAUNCH_FAILED (FailedPrecondition), any other launch error as Unavailable.
type LaunchRefusedError = launcher.RefusedError

// LaunchReason is why a launcher refused ("NAME_IN_USE", "CONNECTOR_UNKNOWN", ...).
type LaunchReason = launcher.Reason

// LaunchChildUnknown is a launcher's answer to a probe (signal 0) of a child it has proven gone,
// every process it started included.
const LaunchChildUnknown = launcher.ReasonChildUnknown

// Backend is the manager as ManagerService serves it (Manager.Backend): Spawn, Stop, List,
// Inspect, Terminal, Status and Shutdown, for a host that drives it in process.
type Backend = api.Backend

// AgentTerminal is a running agent's terminal as Backend.Terminal returns it (attach, write,
// resize, exit).
type AgentTerminal = api.Terminal

// Refusal is a request the manager refused with a reason (ManagerService's error detail).
type Refusal = api.Refusal
