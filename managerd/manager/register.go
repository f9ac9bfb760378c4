package manager

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/managerd/internal/instlease"
	"github.com/cotalgo/cotal/pkg/creds"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Registration (issue 23 item 8). Once it holds its instance lease, the manager asks authd to
// register this start of its instance on the register-manager rail,
// cotal.<t>.ep.one.auth.register-manager.<owner>.<actor>.<nonce>, as its configured principal
// (the supervisor credential's connection, so the broker pins the subject's <owner>.<actor> to
// it), with lifecycle's closed body {"v":1,"instanceId"}. It subscribes the one answer subject,
// <request>.reply, before it publishes. authd registers only the lease's holder and answers the
// epoch it committed: 0 for the first start of the instance, one more for each later start.
//
// The request runs in a background loop that never refuses the start and never holds up Ready:
// a refusal, no answer within CodeRegistration's timeout, or no responder is retried with
// backoff (250 ms doubling to 30 s) until authd registers this start or the manager closes. On
// success the loop rewrites the lease row with the processEpoch and registrationRevision (by
// compare-and-set: instlease.Lease.SetRegistration), writes manager-identity.json
// {"v":1,"space","instanceId"} (0600, atomically, in the 0700 Config.StateDir: the file a local
// authd reads to find this manager), and records the registration: Manager.Registration. A
// retried request whose earlier answer was lost commits one more epoch; only the last is
// recorded. The ManagerService Status message has no field for it (its proto is frozen for this
// issue): Registration is the Go API's.

// IdentityFile is the file in Config.StateDir that names this manager's space and instance once
// it registered: {"v":1,"space":"<space>","instanceId":"<instance id>"}.
const IdentityFile = "manager-identity.json"

// CodeRegistration is the warning raised while authd has not registered this start (a refusal or
// no answer); the loop retries.
const CodeRegistration = "REGISTRATION"

// Registration timing.
const (
	registerAnswerTimeout = 10 * time.Second
	registerBackoffMin    = 250 * time.Millisecond
	registerBackoffMax    = 30 * time.Second
)

// Registration is the registration authd committed for this start of the instance.
type Registration struct {
	// ProcessEpoch is the instance's epoch for this start: 0 for its first registration, one
	// more for each later one. 0 is a real epoch, never "not registered".
	ProcessEpoch uint64
	// RegistrationRevision is the KV revision of the instance's spec, which the gate records.
	RegistrationRevision uint64
	// Generation is the endpoint gate's generation after the registration reopened it.
	Generation uint64
	// At is when the manager learned it.
	At time.Time
}

// registration is the loop's state, read by Registration.
type registration struct {
	mu      sync.Mutex
	done    bool
	reg     Registration
	lastErr error
	tries   int
}

// Registration returns this start's registration and true once authd registered it (and the
// lease row and identity file recorded it); before that, false and the last attempt's error
// (nil before the first answer).
func (m *Manager) Registration() (Registration, bool, error) {
	m.registry.mu.Lock()
	defer m.registry.mu.Unlock()
	return m.registry.reg, m.registry.done, m.registry.lastErr
}

// registrationStatus is Status's registration field: nil before the first attempt settles.
func (m *Manager) registrationStatus() *managerv1.Registration {
	reg, done, err := m.Registration()
	switch {
	case done:
		return &managerv1.Registration{Registered: true, ProcessEpoch: reg.ProcessEpoch, RegistrationRevision: reg.RegistrationRevision}
	case err != nil:
		return &managerv1.Registration{LastError: err.Error()}
	}
	return nil
}

// registerLoop runs until this start is registered and recorded, or ctx ends (Close).
func (m *Manager) registerLoop(ctx context.Context) {
	backoff := registerBackoffMin
	var res *lifecycle.RegisterManagerResult
	for {
		var err error
		if res == nil {
			var r lifecycle.RegisterManagerResult
			if r, err = requestRegistration(ctx, m.nc, m.n, m.cfg.Owner, m.cfg.Actor, m.cfg.InstanceID); err == nil {
				res = &r
				m.log.Info("authd registered this start", "instance", r.InstanceID, "processEpoch", r.ProcessEpoch,
					"registrationRevision", r.RegistrationRevision, "generation", r.Generation)
			}
		}
		if res != nil {
			err = m.recordRegistration(ctx, *res)
			if err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		m.registry.mu.Lock()
		m.registry.lastErr = err
		m.registry.tries++
		first := m.registry.tries == 1
		m.registry.mu.Unlock()
		m.log.Warn("registration not done; retrying", "err", err, "in", backoff)
		if first {
			m.tr.Warn(CodeRegistration, "authd has not registered this start yet; retrying", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, registerBackoffMax)
	}
}

// recordRegistration rewrites the lease row, writes the identity file and publishes the
// registration.
func (m *Manager) recordRegistration(ctx context.Context, r lifecycle.RegisterManagerResult) error {
	if err := m.lease.SetRegistration(ctx, r.ProcessEpoch, r.RegistrationRevision); err != nil {
		if errors.Is(err, instlease.ErrStopping) {
			return err
		}
		return fmt.Errorf("record the registration in the lease row: %w", err)
	}
	if err := writeIdentity(m.cfg.StateDir, m.cfg.Space, m.cfg.InstanceID); err != nil {
		return fmt.Errorf("write %s: %w", IdentityFile, err)
	}
	now := time.Now
	if m.opts.Now != nil {
		now = m.opts.Now
	}
	m.registry.mu.Lock()
	m.registry.done, m.registry.lastErr = true, nil
	m.registry.reg = Registration{ProcessEpoch: r.ProcessEpoch, RegistrationRevision: r.RegistrationRevision,
		Generation: r.Generation, At: now()}
	m.registry.mu.Unlock()
	return nil
}

// requestRegistration sends one register-manager request as owner.actor for instanceID on nc and
// waits for its answer: the result, or an error for a refusal (its code and sentence), no answer
// or an answer that does not decode or names another instance.
func requestRegistration(ctx context.Context, nc *nats.Conn, n space.Names, owner, actor, instanceID string) (lifecycle.RegisterManagerResult, error) {
	var zero lifecycle.RegisterManagerResult
	body, err := lifecycle.EncodeRegisterManagerRequest(instanceID)
	if err != nil {
		return zero, err
	}
	nonce := rand.Text() // 26 characters of base32: the inbox nonce grammar
	subj, err := n.RegisterManager(owner, actor, nonce)
	if err != nil {
		return zero, err
	}
	wctx, cancel := context.WithTimeout(ctx, registerAnswerTimeout)
	defer cancel()
	sub, err := nc.SubscribeSync(space.RailReply(subj))
	if err != nil {
		return zero, fmt.Errorf("subscribe the answer: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.FlushWithContext(wctx); err != nil {
		return zero, fmt.Errorf("subscribe the answer: %w", err)
	}
	if err := nc.Publish(subj, body); err != nil {
		return zero, fmt.Errorf("publish the request: %w", err)
	}
	msg, err := sub.NextMsgWithContext(wctx)
	if err != nil {
		return zero, fmt.Errorf("no answer from authd on the register-manager rail: %w", err)
	}
	reply, err := lifecycle.DecodeRegisterManagerReply(msg.Data)
	if err != nil {
		return zero, err
	}
	if !reply.OK {
		return zero, fmt.Errorf("authd refused the registration (%s): %s", reply.Code, reply.Error)
	}
	if reply.Result.InstanceID != instanceID {
		return zero, fmt.Errorf("authd answered a registration of instance %s", reply.Result.InstanceID)
	}
	return reply.Result, nil
}

// identity is the identity file's content, in its field order.
type identity struct {
	V          int    `json:"v"`
	Space      string `json:"space"`
	InstanceID string `json:"instanceId"`
}

// writeIdentity writes IdentityFile in dir (0600, atomically; dir 0700, created if missing).
func writeIdentity(dir, spaceName, instanceID string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(identity{V: 1, Space: spaceName, InstanceID: instanceID}); err != nil {
		return err
	}
	return creds.WriteFileAtomic(filepath.Join(dir, IdentityFile), buf.Bytes())
}
