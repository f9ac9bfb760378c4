// Package manager is managerd: the signerless agent supervisor of one space on one machine.
//
// Start, in order: the configuration is validated and the signer's key paths are proven
// unreadable to this uid (upstream's "seed readable by the manager uid" refusal; only the
// development flag lets a single-uid stack past it, with a loud warning); the supervisor
// credential is minted by signerd for a key held only in memory and proven on the broker (a
// signerd that cannot be reached stops the start); the instance lease lease.<instance_id> in
// cotal_manager_<space> is acquired (instlease: a live holder refuses with *instlease.LeaseHeld, a
// dead predecessor on this root is waited out); the manager liveness plane is served. Then Spawn
// may run.
//
// A manager keeps a custody record of each running agent in its state directory; the next
// manager on that directory reaps what a predecessor left (see custody.go).
//
// Spawn admits a request before any signer call (name, connector, capacity counting spawns in
// progress, channels, environment), then per agent: a fresh user nkey and lifecycle uid, its
// durables and ACL row through a one-shot provisioner credential, its credential minted by
// signerd (agent profile), and its launch through the uid-dropping launcher, which writes the
// launch material (credential included) 0600 as the agent's and starts it on a PTY. Each agent's
// credential is reminted for the same nkey at 75% of its lifetime and its material replaced
// through the launcher; a failed renewal keeps the last good credential and retries.
//
// Stop ends one agent (SIGTERM to its group, SIGKILL after the grace) and, once its process is
// proven gone, deprovisions exactly its durables and ACL row with a one-shot deprovisioner
// credential. Shutdown runs once; with agents it stops every agent and keeps the lease (and
// fails) if any could not be proven gone.
package manager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/internal/instlease"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Inputs are what New needs besides the configuration.
type Inputs struct {
	Config *Config
	Logger *slog.Logger
	// AllowReadableSeeds is the development flag: start even when a signer key is readable by
	// this uid, logging a loud warning. The systemd units never set it.
	AllowReadableSeeds bool
	// Launcher starts and signals agents; nil means a client of Config.Launcher.
	Launcher Launcher
	// Provisioner provisions and deprovisions agents; nil means one-shot credentials from
	// signerd (provision.RunProvisionAgent, provision.RunDeprovisionAgent).
	Provisioner Provisioner
	// NatsOptions are added to the manager's broker connection.
	NatsOptions []nats.Option
	// OnFirstSeen, if set, is called when an agent first probes the manager's liveness plane,
	// that is, once it holds a working broker connection (the spawn-to-connected benchmark).
	OnFirstSeen func(name string, at time.Time)
	// PID is this process's id in the lease row; zero means os.Getpid().
	PID int
}

// Manager is a running managerd. Its methods are safe for concurrent use.
type Manager struct {
	cfg  *Config
	in   Inputs
	log  *slog.Logger
	n    space.Names
	lnch Launcher
	prov Provisioner

	signer *signerclient.Client
	rail   *signerclient.Rail
	nc     *nats.Conn
	lease  *instlease.Lease
	live   *nats.Subscription

	sig signerState

	mu       sync.Mutex
	agents   map[string]*agent // by name, spawns in progress included
	byActor  map[string]*agent
	shutting bool
	shut     *shutdown

	runCtx    context.Context
	runCancel context.CancelFunc
	wg        sync.WaitGroup
	done      chan struct{}
	started   bool
}

// shutdown is the one Shutdown run; later calls join it.
type shutdown struct {
	withAgents bool
	done       chan struct{}
	resp       *managerv1.ShutdownResponse
	err        error
}

// New validates the configuration and builds a manager; Start runs it.
func New(in Inputs) (*Manager, error) {
	if in.Config == nil {
		return nil, errors.New("manager: no configuration")
	}
	cfg := *in.Config
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("manager: configuration: %w", err)
	}
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	m := &Manager{cfg: &cfg, in: in, log: in.Logger, n: n, agents: map[string]*agent{}, byActor: map[string]*agent{}, done: make(chan struct{})}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.in.PID == 0 {
		m.in.PID = os.Getpid()
	}
	l := in.Launcher
	if l == nil {
		l = newLauncherClient(cfg.Launcher)
	}
	m.lnch = newLimited(l)
	m.prov = in.Provisioner
	return m, nil
}

// Start brings the manager up (see the package doc) and returns once it serves. A failure leaves
// nothing running and nothing held.
func (m *Manager) Start(ctx context.Context) (err error) {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("manager: already started")
	}
	m.started = true
	m.mu.Unlock()
	defer func() {
		if err != nil {
			m.teardown()
			close(m.done)
		}
	}()
	cfg := m.cfg
	if err := CheckSeedsUnreadable(cfg.SignerSeedPaths); err != nil {
		var rs *ReadableSeedError
		if !errors.As(err, &rs) || !m.in.AllowReadableSeeds {
			return err
		}
		m.log.Warn("DEVELOPMENT MODE: a signer key is readable by managerd's uid; an agent escaping to this uid could read it. Never run a deployment like this.", "path", rs.Path)
	}
	m.runCtx, m.runCancel = context.WithCancel(context.WithoutCancel(ctx))

	sc := cfg.Signer.ClientConfig()
	sc.Logger = m.log
	sc.Interceptors = append(sc.Interceptors, signerTimer)
	if m.signer, err = signerclient.Dial(sc); err != nil {
		return fmt.Errorf("manager: signer client: %w", err)
	}
	if m.prov == nil {
		m.prov = &oneShot{m: m}
	}
	if m.rail, err = signerclient.NewRail(signerclient.RailConfig{
		Client: m.signer, Space: cfg.Space, Profile: signerv1.Profile_PROFILE_SUPERVISOR,
		Params: &signerv1.ProfileParams{Owner: cfg.Owner, Actor: cfg.Actor},
		TTL:    cfg.CredentialTTL.D(), NatsURLs: cfg.Brokers, Logger: m.log,
	}); err != nil {
		return fmt.Errorf("manager: supervisor rail: %w", err)
	}
	if err := m.rail.Start(ctx); err != nil {
		m.sig.record(err)
		return fmt.Errorf("manager: no supervisor credential from signerd: %w", err)
	}
	m.sig.record(nil)

	opts := append(m.rail.NatsOptions(), nats.Name("cotal-managerd "+cfg.InstanceID), nats.MaxReconnects(-1))
	if m.nc, err = nats.Connect(strings.Join(cfg.Brokers, ","), append(opts, m.in.NatsOptions...)...); err != nil {
		return fmt.Errorf("manager: broker: %w", err)
	}
	holder, err := space.PrincipalKey(cfg.Owner, cfg.Actor)
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if m.lease, err = instlease.Acquire(ctx, instlease.Config{
		Conn: m.nc, Names: m.n, InstanceID: cfg.InstanceID, Holder: holder, Runtime: "pty",
		Root: cfg.Root, PID: m.in.PID, Logger: m.log,
	}); err != nil {
		return err
	}
	// A predecessor's agents (it was killed, or spared them) are reaped before any new spawn.
	m.reap(ctx)
	if m.live, err = m.nc.QueueSubscribe(m.n.LiveManagerServe(), space.LiveQueue(space.LivePlaneManager), m.onProbe); err != nil {
		return fmt.Errorf("manager: serve the liveness plane: %w", err)
	}
	if err := m.nc.Flush(); err != nil {
		return fmt.Errorf("manager: serve the liveness plane: %w", err)
	}
	if err := m.nc.LastError(); err != nil {
		return fmt.Errorf("manager: serve the liveness plane: %w", err)
	}
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		if err := m.lease.Run(m.runCtx); err != nil && m.runCtx.Err() == nil {
			m.log.Error("instance lease loop ended", "err", err)
		}
	}()
	go func() {
		defer m.wg.Done()
		if err := m.rail.Run(m.runCtx); err != nil && m.runCtx.Err() == nil {
			m.log.Error("supervisor credential renewal ended", "err", err)
		}
	}()
	m.log.Info("managerd ready", "space", cfg.Space, "instance", cfg.InstanceID, "root", cfg.Root, "user", m.rail.PublicKey())
	return nil
}

// Done is closed once the manager has stopped (after Shutdown, or a failed Start).
func (m *Manager) Done() <-chan struct{} { return m.done }

// teardown closes everything Start opened, without touching agents or the lease row.
func (m *Manager) teardown() {
	if m.runCancel != nil {
		m.runCancel()
	}
	if m.live != nil {
		_ = m.live.Unsubscribe()
	}
	m.wg.Wait()
	if m.nc != nil {
		m.nc.Close()
	}
	if m.rail != nil {
		m.rail.Close()
	}
	if m.signer != nil {
		_ = m.signer.Close()
	}
}

// onProbe answers a liveness probe on live.manager.<owner>.<actor> at its bound .reply. leaf and
// records the agent as seen.
func (m *Manager) onProbe(msg *nats.Msg) {
	if !strings.HasPrefix(msg.Reply, msg.Subject+".reply.") {
		return
	}
	toks := strings.Split(msg.Subject, ".")
	if len(toks) < 2 {
		return
	}
	owner, actor := toks[len(toks)-2], toks[len(toks)-1]
	if owner == m.cfg.AgentOwner {
		m.seen(actor, time.Now())
	}
	_ = msg.Respond([]byte(`{"plane":"manager","responder":"` + m.cfg.InstanceID + `"}`))
}

// Stop is Shutdown for embedders: the manager stops, and its agents too when withAgents is set.
func (m *Manager) Stop(ctx context.Context, withAgents bool) error {
	_, err := m.Shutdown(ctx, withAgents)
	return err
}

// Shutdown stops the manager once: a second call joins the first and gets its result, one asking
// a different withAgents is refused with SHUTDOWN_CONFLICT. With agents, every agent is stopped
// and deprovisioned, and the lease is released only if each was proven gone; otherwise the
// lease stays (its row expires on its own) and the error names the agents.
func (m *Manager) Shutdown(ctx context.Context, withAgents bool) (*managerv1.ShutdownResponse, error) {
	m.mu.Lock()
	if s := m.shut; s != nil {
		m.mu.Unlock()
		if s.withAgents != withAgents {
			return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_SHUTDOWN_CONFLICT,
				"a shutdown with with_agents=%v is already running", s.withAgents)
		}
		select {
		case <-s.done:
			return s.resp, s.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s := &shutdown{withAgents: withAgents, done: make(chan struct{})}
	m.shut, m.shutting = s, true
	started := m.started
	m.mu.Unlock()
	if !started {
		s.err = errors.New("manager: not started")
		close(s.done)
		return nil, s.err
	}
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ShutdownTimeout.D())
		defer cancel()
		s.resp, s.err = m.shutdown(sctx, withAgents)
		close(s.done)
		close(m.done)
	}()
	select {
	case <-s.done:
		return s.resp, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *Manager) shutdown(ctx context.Context, withAgents bool) (*managerv1.ShutdownResponse, error) {
	if m.live != nil {
		_ = m.live.Unsubscribe()
	}
	resp := &managerv1.ShutdownResponse{}
	var unproven []string
	m.mu.Lock()
	all := make([]*agent, 0, len(m.agents))
	for _, a := range m.agents {
		all = append(all, a)
	}
	m.mu.Unlock()
	if withAgents {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, a := range all {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := m.stopAgent(ctx, a)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					m.log.Error("shutdown: agent not stopped", "agent", a.name, "err", err)
					unproven = append(unproven, a.name)
					return
				}
				resp.Stopped = append(resp.Stopped, a.name)
			}()
		}
		wg.Wait()
	} else {
		for _, a := range all {
			a.stopRenewal()
			resp.Spared = append(resp.Spared, a.name)
		}
	}
	sortStrings(resp.Stopped, resp.Spared, unproven)
	if m.runCancel != nil {
		m.runCancel()
	}
	m.wg.Wait()
	var err error
	if len(unproven) > 0 {
		err = api.Refuse(codes.Internal, managerv1.Reason_REASON_STOP_UNPROVEN,
			"agents not proven gone, lease kept until it expires: %s", strings.Join(unproven, ", "))
	} else if rerr := m.lease.Release(ctx); rerr != nil {
		err = fmt.Errorf("manager: release the instance lease: %w", rerr)
	}
	// A spared agent's terminal stays open in this process; when the process exits the kernel
	// hangs it up (SIGHUP to the agent's session), as it would for any PTY whose master closes.
	m.teardown()
	m.log.Info("managerd stopped", "with_agents", withAgents, "stopped", resp.Stopped, "spared", resp.Spared, "err", err)
	return resp, err
}

// signerState is signerd as last seen.
type signerState struct {
	mu          sync.Mutex
	reachable   bool
	lastContact time.Time
	lastErr     string
}

// record notes the outcome of a signer call: an answer (a refusal included) is contact; a
// transport failure is not.
func (s *signerState) record(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil || signerclient.ReasonOf(err) != signerv1.Reason_REASON_UNSPECIFIED ||
		!(errors.Is(err, signerclient.ErrUnavailable) || errors.Is(err, signerclient.ErrDeadline)) {
		s.reachable, s.lastContact = true, time.Now()
		if err == nil {
			s.lastErr = ""
		}
		return
	}
	s.reachable, s.lastErr = false, err.Error()
}

// newUID is a fresh lifecycle uid: 26 characters of [a-z2-7] (130 random bits).
func newUID() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var b [26]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	uid := string(b[:])
	return uid, space.ValidateUID(uid)
}

// leaseState maps the lease's state for Status.
func leaseState(l *instlease.Lease, released bool) managerv1.LeaseState {
	if released {
		return managerv1.LeaseState_LEASE_STATE_RELEASED
	}
	if l == nil {
		return managerv1.LeaseState_LEASE_STATE_UNKNOWN
	}
	switch l.State() {
	case lease.Held:
		return managerv1.LeaseState_LEASE_STATE_HELD
	case lease.Gone:
		return managerv1.LeaseState_LEASE_STATE_GONE
	default:
		return managerv1.LeaseState_LEASE_STATE_UNKNOWN
	}
}

// Err is why the manager stopped: nil for a clean Shutdown (daemon.Service).
func (m *Manager) Err() error {
	m.mu.Lock()
	s := m.shut
	m.mu.Unlock()
	if s == nil || !isClosed(s.done) {
		return nil
	}
	return s.err
}

// Healthy is managerd's proof of progress for systemd's watchdog: running, and its instance
// lease written within four renew intervals (10 s, the lease's TTL).
func (m *Manager) Healthy() error {
	m.mu.Lock()
	shutting := m.shutting
	m.mu.Unlock()
	if shutting || m.lease == nil {
		return errors.New("managerd: not running")
	}
	if last := m.lease.LastRenewed(); time.Since(last) > 4*m.lease.RenewInterval() {
		return fmt.Errorf("managerd: instance lease last written %v ago", time.Since(last).Round(time.Second))
	}
	return nil
}
