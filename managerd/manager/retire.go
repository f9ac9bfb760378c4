package manager

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/daemon"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/space"
)

// A remote managerd's stop (seed 001 "Managed retirement", reference lifecycle-hosted.md §2.6):
// once the agent's process is proven gone, the manager
//
//  1. writes a pending-retirement record (state_dir/retire/<name>.json, 0600) naming the
//     lifecycle and its managed retirement opId;
//  2. prepares the retirement at the authority (ManagedAgentRetirer, the door's
//     manager-managed-agent-prepare-retirement): the lifecycle's broker footprint is released
//     and its grant revoked;
//  3. has the authority mint a retirement-requester credential (MintRetirementRequester) for a
//     fresh nkey at the current serve epoch;
//  4. asks the retire-lifecycle rail, with that credential, to retire the lifecycle.
//
// Only a rail answer retired (ok, this uid, this opId) frees the agent's name and removes the
// record. Any other outcome keeps both: the retirement is retried in the background (backoff
// doubling to at most RetireBackoffMax) and at the next start, under the same opId, every try
// from step 2 (a repeated prepare is a no-op at the authority), which is also where a rail that
// finds the lifecycle not started sends it.

// ManagedAgentRetirer is the prepare-retirement hook of a RemoteAuthority, optional like
// ManagedAgentEnroller (the stock HTTPAuthority has it). Without it a remote managerd's Stop
// ends the process and keeps the retirement pending.
type ManagedAgentRetirer interface {
	PrepareAgentRetirement(ctx context.Context, req *managerauthority.PrepareRetirementRequest) (*managerauthority.PrepareRetirementAnswer, error)
}

var _ ManagedAgentRetirer = (*HTTPAuthority)(nil)

// PrepareAgentRetirement posts a manager-managed-agent-prepare-retirement request and decodes
// its answer closed (managerauthority.DecodePrepareRetirementAnswer).
func (h *HTTPAuthority) PrepareAgentRetirement(ctx context.Context, req *managerauthority.PrepareRetirementRequest) (*managerauthority.PrepareRetirementAnswer, error) {
	b, err := h.post(ctx, req)
	if err != nil {
		return nil, err
	}
	return managerauthority.DecodePrepareRetirementAnswer(b)
}

// Retirement retry bounds.
const (
	RetireBackoffMin = time.Second
	RetireBackoffMax = 60 * time.Second
	// retireRailTimeout bounds the rail's answer (the barrier included).
	retireRailTimeout = 30 * time.Second
	retireDir         = "retire"
	maxRetireRecord   = 4 << 10
)

// pendingRetirement is a retirement the manager owes: its record's content.
type pendingRetirement struct {
	V      int                     `json:"v"`
	Name   string                  `json:"name"`
	Target managerauthority.Target `json:"target"`
	OpID   string                  `json:"opId"`
}

func (m *Manager) retirePath(name string) string {
	return filepath.Join(m.cfg.StateDir, retireDir, name+".json")
}

func (m *Manager) writePending(p pendingRetirement) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return creds.WriteFileAtomic(m.retirePath(p.Name), b)
}

func (m *Manager) removePending(name string) {
	if err := os.Remove(m.retirePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Error("pending-retirement record not removed", "agent", name, "err", err)
	}
}

// decodePending reads one record strictly.
func decodePending(b []byte) (pendingRetirement, error) {
	if len(b) > maxRetireRecord {
		return pendingRetirement{}, fmt.Errorf("%d bytes, over %d", len(b), maxRetireRecord)
	}
	var p pendingRetirement
	if err := lifecycle.DecodeObject(b, &p); err != nil {
		return pendingRetirement{}, err
	}
	if _, err := space.ACLKey(p.Target.Owner, p.Target.Actor, p.Target.LifecycleUID); err != nil {
		return pendingRetirement{}, err
	}
	if op, _ := lifecycle.ManagedRetirementOpID(p.Target.LifecycleUID); p.V != 1 || p.OpID != op || !nameRE.MatchString(p.Name) || len(p.Name) > MaxNameLen {
		return pendingRetirement{}, errors.New("not a v 1 record of a name and its lifecycle's managed retirement opId")
	}
	return p, nil
}

// pendFromCustody records a reaped predecessor agent's retirement as pending, unless a record
// already stands.
func (m *Manager) pendFromCustody(c custody) error {
	if _, err := os.Lstat(m.retirePath(c.Name)); err == nil {
		return nil
	}
	opID, err := lifecycle.ManagedRetirementOpID(c.LifecycleUID)
	if err != nil {
		return err
	}
	return m.writePending(pendingRetirement{V: 1, Name: c.Name,
		Target: managerauthority.Target{Owner: c.Owner, Actor: c.Actor, LifecycleUID: c.LifecycleUID}, OpID: opID})
}

// retirements tracks the pending retirements: the names they hold and their retry loops.
type retirements struct {
	mu      sync.Mutex
	pending map[string]bool        // names held by a pending retirement without an agent entry
	running map[string]bool        // names with a retry loop
	locks   map[string]*sync.Mutex // one try at a time per name
}

func (r *retirements) lock(name string) *sync.Mutex {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.locks == nil {
		r.locks = map[string]*sync.Mutex{}
	}
	l := r.locks[name]
	if l == nil {
		l = &sync.Mutex{}
		r.locks[name] = l
	}
	return l
}

// hold marks name as held by a pending retirement the manager has no agent for.
func (r *retirements) hold(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[string]bool{}
	}
	r.pending[name] = true
}

// held reports whether name is held by a pending retirement the manager has no agent for.
func (r *retirements) held(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending[name]
}

// stopRemote is doStop's remote half, a's process proven gone: retire its lifecycle, and free
// its name only once retired.
func (m *Manager) stopRemote(ctx context.Context, a *agent) (*managerv1.StopResponse, error) {
	opID, err := lifecycle.ManagedRetirementOpID(a.uid)
	if err != nil {
		return nil, err
	}
	p := pendingRetirement{V: 1, Name: a.name, Target: managerauthority.Target{Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUID: a.uid}, OpID: opID}
	if err := m.writePending(p); err != nil {
		return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_PROVISION_FAILED, "record the pending retirement of %s: %v", a.name, err)
	}
	m.mu.Lock()
	a.state = managerv1.ProcessState_PROCESS_STATE_EXITED
	m.mu.Unlock()
	if err := m.retireOnce(ctx, p); err != nil {
		m.log.Warn("agent stopped; its retirement is pending and retried", "agent", a.name, "uid", a.uid, "opId", opID, "err", err)
		m.retryRetirement(p, a)
		return nil, api.Refuse(codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE,
			"agent %s stopped, but its retirement is pending (retried in the background, its name held until retired): %v", a.name, err)
	}
	return m.retired(p, a), nil
}

// retired frees what a finished retirement held: the record, a's name and its custody record.
func (m *Manager) retired(p pendingRetirement, a *agent) *managerv1.StopResponse {
	m.removePending(p.Name)
	m.retire.mu.Lock()
	delete(m.retire.pending, p.Name)
	m.retire.mu.Unlock()
	var resp *managerv1.StopResponse
	if a != nil {
		m.mu.Lock()
		a.state = managerv1.ProcessState_PROCESS_STATE_EXITED
		view := m.view(a)
		m.mu.Unlock()
		a.closeTerm()
		m.unrecord(a)
		m.release(a)
		resp = &managerv1.StopResponse{Agent: view} // the authority released the footprint (prepare)
	}
	m.log.Info("agent retired", "agent", p.Name, "uid", p.Target.LifecycleUID, "opId", p.OpID)
	return resp
}

// retryRetirement runs p's retry loop once (a second call while one runs is a no-op).
func (m *Manager) retryRetirement(p pendingRetirement, a *agent) {
	m.retire.mu.Lock()
	if m.retire.running == nil {
		m.retire.running = map[string]bool{}
	}
	if m.retire.running[p.Name] {
		m.retire.mu.Unlock()
		return
	}
	m.retire.running[p.Name] = true
	m.retire.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.retire.mu.Lock()
			delete(m.retire.running, p.Name)
			m.retire.mu.Unlock()
		}()
		backoff := RetireBackoffMin
		for {
			t := time.NewTimer(backoff)
			select {
			case <-m.runCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(m.runCtx, 2*retireRailTimeout)
			err := m.retireOnce(ctx, p)
			cancel()
			if err == nil {
				m.mu.Lock()
				live := a != nil && m.agents[p.Name] == a
				m.mu.Unlock()
				if !live {
					a = nil
				}
				m.retired(p, a)
				return
			}
			backoff = min(2*backoff, RetireBackoffMax)
			m.log.Warn("retirement still pending", "agent", p.Name, "uid", p.Target.LifecycleUID, "opId", p.OpID, "err", err, "retry_in", backoff)
		}
	}()
}

// resumeRetirements retries, at start, every retirement a predecessor left pending; each holds
// its name until retired.
func (m *Manager) resumeRetirements() {
	dir := filepath.Join(m.cfg.StateDir, retireDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Error("pending retirements not read", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		b, err := creds.ReadSecretFile(filepath.Join(dir, e.Name()))
		var p pendingRetirement
		if err == nil {
			p, err = decodePending(b)
		}
		if err == nil && p.Name != name {
			err = errors.New("the record names another agent than its file")
		}
		if err != nil {
			m.log.Error("a pending-retirement record is unreadable; it is left for an operator", "file", e.Name(), "err", err)
			m.tr.Warn(CodeAuthority, "a pending-retirement record is unreadable; it is left for an operator", err)
			continue
		}
		m.retire.hold(p.Name)
		m.log.Info("resuming a pending retirement", "agent", p.Name, "uid", p.Target.LifecycleUID, "opId", p.OpID)
		m.retryRetirement(p, nil)
	}
}

// retireOnce is one try of p's retirement, from prepare: prepare, requester, rail. It returns
// nil only when the rail answered the lifecycle retired under p.OpID.
func (m *Manager) retireOnce(ctx context.Context, p pendingRetirement) error {
	l := m.retire.lock(p.Name)
	l.Lock()
	defer l.Unlock()
	env, err := m.prepareRetirement(ctx, p)
	if err != nil {
		return err
	}
	// 2. The retirement requester, for a fresh nkey at the current serve epoch.
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	rreq, err := m.remoteRequest(managerauthority.OpRetire)
	if err != nil {
		return err
	}
	rreq.RegistrationProof = env.RegistrationProof
	rreq.Retirement = &managerauthority.Retirement{ID: pub, Target: p.Target, OpID: p.OpID, ServeEpoch: env.ServeEpoch}
	mat, err := m.callRemote(ctx, "MintRetirementRequester", rreq, m.remote.auth.MintRetirementRequester)
	if err != nil {
		return err
	}
	// 3. The rail.
	return m.retireRail(ctx, p, env.ServeEpoch, mat.Credentials.RetirementRequester.JWT, kp)
}

// prepareRetirement is the prepare step: the authority releases p's lifecycle's broker
// footprint and revokes its grant. It returns the envelope it asked under (its proof and epoch
// are the ones the requester is minted at).
func (m *Manager) prepareRetirement(ctx context.Context, p pendingRetirement) (managerauthority.ManagedRequest, error) {
	hook, ok := m.remote.auth.(ManagedAgentRetirer)
	if !ok {
		return managerauthority.ManagedRequest{}, errors.New("the remote authority has no prepare-retirement hook")
	}
	env, err := m.managedRequest(managerauthority.KindPrepareRetirement)
	if err != nil {
		return env, err
	}
	preq := &managerauthority.PrepareRetirementRequest{ManagedRequest: env, Target: p.Target, OpID: p.OpID}
	var ans *managerauthority.PrepareRetirementAnswer
	err = daemon.Guard("the remote authority's PrepareAgentRetirement", func() error {
		var herr error
		ans, herr = hook.PrepareAgentRetirement(ctx, preq)
		return herr
	})
	if err = m.hookFailed(err); err != nil {
		return env, fmt.Errorf("prepare: %w", err)
	}
	switch {
	case ans == nil:
		return env, errors.New("prepare: the remote authority answered nothing")
	case ans.V != 1 || ans.Kind != managerauthority.KindPrepareRetirement || ans.Space != env.Space || ans.Actor != env.Actor ||
		ans.InstanceID != env.InstanceID || ans.RequestID != env.RequestID || ans.ServeEpoch != env.ServeEpoch:
		return env, errors.New("prepare: the answer echoes another kind, space, actor, instance, request id or serve epoch")
	case ans.Owner != m.cfg.Owner || ans.Target != p.Target || ans.OpID != p.OpID:
		return env, errors.New("prepare: the answer names another owner, target or opId")
	case !ans.Prepared:
		return env, errors.New("prepare: the authority did not prepare the retirement")
	}
	return env, nil
}

// retireRail asks the retire-lifecycle rail, as the retirement requester, to retire p's
// lifecycle, and checks the answer names it retired under p.OpID.
func (m *Manager) retireRail(ctx context.Context, p pendingRetirement, epoch uint64, userJWT string, kp nkeys.KeyPair) error {
	rs := m.remote
	actors, err := managerauthority.ActorsOf(rs.id.InstanceID)
	if err != nil {
		return err
	}
	subj, err := m.n.RetireLifecycle(space.RetireRail{TargetOwner: p.Target.Owner, TargetActor: p.Target.Actor, TargetUID: p.Target.LifecycleUID,
		CallerOwner: m.cfg.Owner, CallerActor: actors.Serve, CallerUID: rs.id.LifecycleUID, Nonce: rand.Text()})
	if err != nil {
		return err
	}
	body, err := lifecycle.EncodeRetireLifecycleRequest(lifecycle.RetireLifecycleRequest{OpID: p.OpID,
		ServeEndpoint: lifecycle.ManagerEndpoint, ServeInstanceID: rs.id.InstanceID, ServeEpoch: epoch})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(strings.Join(m.cfg.Brokers, ","), nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign),
		nats.NoReconnect(), nats.Name("cotal-managerd retirement "+rs.id.InstanceID))
	if err != nil {
		return fmt.Errorf("rail: connect as the retirement requester: %w", err)
	}
	defer nc.Close()
	wctx, cancel := context.WithTimeout(ctx, retireRailTimeout)
	defer cancel()
	sub, err := nc.SubscribeSync(space.RailReply(subj))
	if err != nil {
		return fmt.Errorf("rail: subscribe the answer: %w", err)
	}
	if err := nc.FlushWithContext(wctx); err != nil {
		return fmt.Errorf("rail: subscribe the answer: %w", err)
	}
	if err := nc.Publish(subj, body); err != nil {
		return fmt.Errorf("rail: %w", err)
	}
	msg, err := sub.NextMsgWithContext(wctx)
	if err != nil {
		return fmt.Errorf("rail: no answer: %w", err)
	}
	rep, err := lifecycle.DecodeRetireLifecycleReply(msg.Data)
	switch {
	case err != nil:
		return fmt.Errorf("rail: %w", err)
	case !rep.OK:
		return fmt.Errorf("rail: refused (%s): %s", rep.Code, rep.Error)
	case rep.Result.LifecycleUID != p.Target.LifecycleUID || rep.Result.OpID != p.OpID:
		return errors.New("rail: the answer retired another lifecycle or opId")
	}
	return nil
}
