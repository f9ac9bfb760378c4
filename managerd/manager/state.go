package manager

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/lease"
)

// Refusal codes carried by *StartError, and the codes of Events. A code names the condition; the
// message says it in a sentence.
const (
	// Start refusals.
	CodeConfig    = daemon.CodeConfig   // the configuration is refused, or a part of it cannot be built
	CodeSeeds     = "READABLE_SEEDS"    // a signer key is readable by this uid (also the development-mode warning)
	CodeSigner    = "SIGNER"            // signerd refused or could not be reached for the supervisor credential
	CodeBroker    = "BROKER"            // the broker refused the credential or the connection (also: connection lost)
	CodeLeaseHeld = "LEASE_HELD"        // a live manager holds this instance's lease; the cause is a *LeaseHeld
	CodeLease     = "LEASE"             // the instance lease failed (also: lease lost, taken, unconfirmed, put again)
	CodeBind      = "BIND"              // the liveness plane or the ManagerService socket could not bind
	CodeCanceled  = daemon.CodeCanceled // ctx ended before the manager was ready

	// Warnings and state changes after start.
	CodeSupervisorRenewal = "SUPERVISOR_RENEWAL" // the supervisor credential's renewal failed; it is retried
	CodeCredential        = "CREDENTIAL"         // the supervisor credential expired without renewal
	CodeRenewal           = "RENEWAL"            // an agent credential's renewal failed; the last good one stays, it is retried
	CodeLauncher          = "LAUNCHER"           // the launcher could not be reached, or could not kill a half-started agent
	CodeDeprovision       = "DEPROVISION"        // an agent's durables and ACL row could not be removed
	CodeCustody           = "CUSTODY"            // a custody record could not be read, removed, or its agent reaped
	CodeStopUnproven      = "STOP_UNPROVEN"      // agents not proven gone at shutdown: the lease is kept
	CodeAPI               = "API"                // ManagerService stopped serving on its own
	CodeShutdown          = "SHUTDOWN"           // the manager is shutting down, or has stopped
	CodeHook              = "HOOK"               // a host-supplied call (launcher, provisioner, callback, logger) panicked or returned an unreadable error; the manager went on
)

// Stop causes, in Err after Done (errors.Is).
var (
	// ErrReleaseUnconfirmed: the broker did not confirm the instance lease's release; the row
	// expires with its TTL (10 s), after which another manager may take the instance.
	ErrReleaseUnconfirmed = errors.New("managerd: the instance lease release was not confirmed (its row expires with its TTL)")
	// ErrAPIStopped: ManagerService stopped serving on its own, so the manager shut down (agents
	// kept running).
	ErrAPIStopped = errors.New("managerd: ManagerService stopped serving")
)

// availability is what State is computed from once Start has finished.
type availability struct {
	on        bool // Start finished: changes move the state
	brokerUp  bool
	brokerErr error
	lease     lease.State
	leaseErr  error
	expired   error // the supervisor credential expired without renewal
	shutting  bool
}

// update applies f to the availability and moves State to what it now says. It serializes, so
// two conditions changing at once never leave a stale state behind.
func (m *Manager) update(f func(a *availability)) {
	m.avMu.Lock()
	defer m.avMu.Unlock()
	f(&m.av)
	a := &m.av
	if !a.on {
		return
	}
	switch {
	case a.shutting:
		m.tr.Set(StateUnavailable, CodeShutdown, "shutting down", nil)
	case !a.brokerUp:
		m.tr.Set(StateUnavailable, CodeBroker, "the broker connection is down; reconnecting", a.brokerErr)
	case a.lease != lease.Held:
		m.tr.Set(StateUnavailable, CodeLease, fmt.Sprintf("the instance lease is %s: this instance may not act for its root until it holds it again", a.lease), a.leaseErr)
	case a.expired != nil:
		m.tr.Set(StateUnavailable, CodeCredential, "the supervisor credential expired without renewal", a.expired)
	default:
		m.tr.Set(StateReady, "", "serving", nil)
	}
}

// shuttingDown reports whether a shutdown has begun (its own disconnect is no warning).
func (m *Manager) shuttingDown() bool {
	m.avMu.Lock()
	defer m.avMu.Unlock()
	return m.av.shutting
}

// onDisconnect is the broker connection's disconnect handler. A connection this process closed
// (a shutdown, or a refused start undoing itself) is no loss to warn of.
func (m *Manager) onDisconnect(nc *nats.Conn, err error) {
	if m.shuttingDown() || (nc != nil && nc.IsClosed()) {
		return
	}
	m.log.Warn("broker connection lost; reconnecting", "err", err)
	m.tr.Warn(CodeBroker, "broker connection lost; reconnecting", err)
	m.update(func(a *availability) { a.brokerUp, a.brokerErr = false, err })
}

// onReconnect is the broker connection's reconnect handler. The lease is not confirmed by it:
// the next renewal (every RenewInterval) is.
func (m *Manager) onReconnect(*nats.Conn) {
	m.log.Info("broker connection restored")
	m.update(func(a *availability) { a.brokerUp, a.brokerErr = true, nil })
}

// onLease is the instance lease's OnChange.
func (m *Manager) onLease(from, to lease.State, err error) {
	switch to {
	case lease.Held:
		if from == lease.Gone {
			m.tr.Warn(CodeLease, "the instance lease row was gone (deleted or expired) and has been put again", nil)
		}
	case lease.Taken:
		m.tr.Warn(CodeLease, "another row holds this instance's lease key; it is left alone, and this manager's row is put again once it is gone", err)
	default:
		m.tr.Warn(CodeLease, fmt.Sprintf("the instance lease renewal failed (%s); it is retried every renew interval", to), err)
	}
	m.update(func(a *availability) { a.lease, a.leaseErr = to, err })
}

// onRailRenewFailed is the supervisor rail's OnRenewFailed.
func (m *Manager) onRailRenewFailed(err error, retryIn time.Duration) {
	if !m.cfg.Remote() { // a remote managerd's renewal asks the remote authority, not signerd
		m.sig.record(err)
	}
	m.tr.Warn(CodeSupervisorRenewal, fmt.Sprintf("the supervisor credential's renewal failed; the current one stays, next attempt in %v", retryIn.Round(time.Second)), err)
}
