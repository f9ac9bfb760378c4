package manager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/internal/instlease"
	"github.com/cotalgo/cotal/pkg/daemon"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Inputs are what the manager runs: its configuration and its start-up policy.
type Inputs struct {
	// Config is required. Start validates a copy of it (defaults applied); the caller's is not
	// changed.
	Config *Config
	// AllowReadableSeeds is the development flag: start even when a signer key is readable by
	// this uid, logging a loud warning and raising a READABLE_SEEDS warning event. A deployment
	// never sets it.
	AllowReadableSeeds bool
	// RemoteAuthority is a remote managerd's manager-service authority (Config.Authority
	// "remote"; remote.go); nil means the stock HTTP client of Config.AuthorityURL
	// (NewHTTPAuthority). A signer-mode manager refuses one.
	RemoteAuthority RemoteAuthority
}

// RuntimeOptions are how the manager runs inside its host. Every field is optional.
type RuntimeOptions struct {
	// Logger receives the manager's lines (never a seed, JWT or token); nil discards them.
	Logger *slog.Logger
	// Events receives every state change and every nonfatal warning (Event), in order, on the
	// goroutine that raised it: it must not block nor call back into the Manager.
	Events func(Event)
	// PID is this process's id in the lease row; zero means os.Getpid().
	PID int
	// Now stamps events and the lease row's since; nil means time.Now.
	Now func() time.Time
	// NatsOptions are added to the manager's broker connection and to its one-shot provisioning
	// connections (TLS settings, say). The manager's own disconnect and reconnect handlers come
	// after them: those move State.
	NatsOptions []nats.Option
	// Launcher starts and signals agents; nil means a client of Config.Launcher (the
	// uid-dropping launcher the host runs as root, `managerd launcher`).
	Launcher Launcher
	// Provisioner provisions and deprovisions agents; nil means one-shot provisioner and
	// deprovisioner credentials from signerd (pkg/provision).
	Provisioner Provisioner
	// OnFirstSeen, if set, is called when an agent first probes the manager's liveness plane,
	// that is, once it holds a working broker connection (the spawn-to-connected benchmark).
	OnFirstSeen func(name string, at time.Time)
}

// drainTimeout bounds how long in-flight ManagerService calls (the Shutdown answer among them)
// may finish once the manager has stopped; Attach streams are cut after it.
const drainTimeout = 2 * time.Second

// Manager is a running managerd. Its methods are safe for concurrent use.
type Manager struct {
	cfg        *Config
	allowSeeds bool
	opts       RuntimeOptions
	pid        int
	log        *slog.Logger
	n          space.Names
	lnch       Launcher
	prov       Provisioner
	tr         *daemon.Tracker
	avMu       sync.Mutex // guards av; held while State moves
	av         availability

	signer *signerclient.Client
	rail   *signerclient.Rail
	nc     *nats.Conn
	lease  *instlease.Lease
	live   *nats.Subscription
	ln     net.Listener
	gs     *grpc.Server

	sig signerState

	// remoteAuth is Inputs.RemoteAuthority; remote is a remote managerd's authority state (nil in
	// signer mode).
	remoteAuth RemoteAuthority
	remote     *remoteState

	// registry is the registration loop's state (register.go).
	registry registration

	mu       sync.Mutex
	agents   map[string]*agent // by name, spawns in progress included
	byActor  map[string]*agent
	shutting bool
	shut     *shutdown
	apiErr   error // why ManagerService stopped serving on its own

	runCtx context.Context
	// retire tracks a remote managerd's pending retirements (retire.go).
	retire    retirements
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

// Start runs managerd (see the package doc for the order) and returns once it serves: its
// instance lease held, its liveness plane and ManagerService bound. It runs until ctx ends (a
// default shutdown: agents keep running), Close or Shutdown is called. A refusal is a
// *StartError (errors.As), whose cause may be a *LeaseHeld or a *ReadableSeedError; it leaves
// nothing running and nothing held.
func Start(ctx context.Context, in Inputs, opts RuntimeOptions) (*Manager, error) {
	m := newManager(in, opts)
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// newManager builds a manager that start runs; the configuration is checked by start.
func newManager(in Inputs, opts RuntimeOptions) *Manager {
	m := &Manager{allowSeeds: in.AllowReadableSeeds, remoteAuth: in.RemoteAuthority, opts: opts, pid: opts.PID, log: opts.Logger,
		agents: map[string]*agent{}, byActor: map[string]*agent{}, done: make(chan struct{})}
	if in.Config != nil {
		cfg := *in.Config
		m.cfg = &cfg
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	} else {
		m.log = slog.New(guardedHandler{h: m.log.Handler(), m: m, reporting: new(atomic.Bool)})
	}
	if m.pid == 0 {
		m.pid = os.Getpid()
	}
	// Every host-supplied call goes through a guard (rejection.go). The tracker guards the Events
	// callback and the clock itself (it calls them under its lock, where logging could re-enter
	// it through a rejected logger); the rest of the manager reads the guarded clock.
	m.tr = daemon.NewTracker("managerd", opts.Events, opts.Now)
	m.tr.OnRejection(func(rj *Rejection) {
		m.log.Error("a host callback of the event tracker was rejected; its event was dropped or stamped with time.Now", "hook", rj.Hook, "panicked", rj.Panicked, "rejection", rj.Text)
	})
	if opts.Now != nil {
		m.opts.Now = m.guardedClock(opts.Now)
	}
	if opts.Launcher != nil {
		m.lnch = guardedLauncher{l: opts.Launcher, m: m}
	}
	m.prov = &oneShot{m: m}
	if opts.Provisioner != nil {
		m.prov = guardedProvisioner{p: opts.Provisioner, m: m}
	}
	return m
}

// start brings the manager up; a failure leaves nothing running and nothing held, and returns a
// *StartError.
func (m *Manager) start(ctx context.Context) (err error) {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("manager: already started")
	}
	m.started = true
	m.mu.Unlock()
	defer func() {
		if err == nil {
			return
		}
		var se *StartError
		if !errors.As(err, &se) {
			se = &StartError{Code: CodeConfig, Reason: "start failed", Err: err}
		}
		se.Daemon = "managerd"
		err = se
		m.abort()
		m.tr.Set(StateStopped, se.Code, se.Reason, se.Err)
		close(m.done)
	}()
	fail := func(code, reason string, err error) error {
		if ctx.Err() != nil {
			return &StartError{Code: CodeCanceled, Reason: "start canceled", Err: ctx.Err()}
		}
		return &StartError{Code: code, Reason: reason, Err: err}
	}
	if m.cfg == nil {
		return &StartError{Code: CodeConfig, Reason: "no configuration"}
	}
	cfg := m.cfg
	if err := cfg.Validate(); err != nil {
		return fail(CodeConfig, "configuration refused", err)
	}
	if m.n, err = space.NewNames(cfg.Space); err != nil {
		return fail(CodeConfig, "space refused", err)
	}
	if m.lnch == nil {
		m.lnch = newLauncherClient(cfg.Launcher)
	}
	m.lnch = newLimited(m.lnch)
	if err := CheckSeedsUnreadable(cfg.SignerSeedPaths); err != nil {
		var rs *ReadableSeedError
		switch {
		case !errors.As(err, &rs):
			return fail(CodeConfig, "signer_seed_paths refused", err)
		case !m.allowSeeds:
			return fail(CodeSeeds, "a signer key is readable by managerd's uid", err)
		}
		m.log.Warn("DEVELOPMENT MODE: a signer key is readable by managerd's uid; an agent escaping to this uid could read it. Never run a deployment like this.", "path", rs.Path)
		m.tr.Warn(CodeSeeds, "development mode: a signer key is readable by managerd's uid; an agent escaping to this uid could read it", rs)
	}
	m.runCtx, m.runCancel = context.WithCancel(context.WithoutCancel(ctx))

	if cfg.Remote() {
		// The supervisor credential of a remote managerd: its identity's supervisor key, the
		// credential prepared by the remote authority, proven on the broker.
		if err := m.startRemoteRail(ctx, fail); err != nil {
			return err
		}
	} else {
		if m.remoteAuth != nil {
			return fail(CodeConfig, "a RemoteAuthority is given but authority is signer", errors.New("set authority: remote, or drop Inputs.RemoteAuthority"))
		}
		// The supervisor credential: a key held only in memory, minted by signerd, proven on the broker.
		sc := cfg.Signer.ClientConfig()
		sc.Logger = m.log
		sc.Interceptors = append(sc.Interceptors, signerTimer)
		if m.signer, err = signerclient.Dial(sc); err != nil {
			return fail(CodeConfig, "signer client refused", err)
		}
		if m.rail, err = signerclient.NewRail(signerclient.RailConfig{
			Client: m.signer, Space: cfg.Space, Profile: signerv1.Profile_PROFILE_SUPERVISOR,
			Params: &signerv1.ProfileParams{Owner: cfg.Owner, Actor: cfg.Actor},
			TTL:    cfg.CredentialTTL.D(), NatsURLs: cfg.Brokers, Logger: m.log, OnRenewFailed: m.onRailRenewFailed,
		}); err != nil {
			return fail(CodeConfig, "supervisor rail refused", err)
		}
		if err := m.rail.Start(ctx); err != nil {
			m.sig.record(err)
			var pe *signerclient.ProofError
			if errors.As(err, &pe) {
				return fail(CodeBroker, "the broker refused the supervisor credential", err)
			}
			return fail(CodeSigner, "no supervisor credential from signerd", err)
		}
		m.sig.record(nil)
	}

	// The broker connection; the host's options first, then the handlers that move State.
	opts := append(m.rail.NatsOptions(), nats.Name("cotal-managerd "+cfg.InstanceID), nats.MaxReconnects(-1))
	opts = append(opts, m.opts.NatsOptions...)
	opts = append(opts, nats.DisconnectErrHandler(m.onDisconnect), nats.ReconnectHandler(m.onReconnect))
	m.update(func(a *availability) { a.brokerUp = true })
	if m.nc, err = nats.Connect(strings.Join(cfg.Brokers, ","), opts...); err != nil {
		return fail(CodeBroker, "broker connection refused", err)
	}

	// The instance lease: a signer-mode manager holds it as its principal, a remote one as the
	// gate principal the authority registers, <owner>.manager_serve_<instance id>.
	holder, err := space.PrincipalKey(cfg.Owner, cfg.Actor)
	if cfg.Remote() {
		holder, err = lifecycle.ServePrincipal(cfg.Owner, cfg.InstanceID)
	}
	if err != nil {
		return fail(CodeConfig, "owner and actor refused", err)
	}
	m.update(func(a *availability) { a.lease = lease.Held })
	if m.lease, err = instlease.Acquire(ctx, instlease.Config{
		Conn: m.nc, Names: m.n, InstanceID: cfg.InstanceID, Holder: holder, Runtime: "pty",
		Root: cfg.Root, PID: m.pid, Now: m.opts.Now, Logger: m.log, OnChange: m.onLease,
	}); err != nil {
		var held *LeaseHeld
		if errors.As(err, &held) && ctx.Err() == nil {
			return &StartError{Code: CodeLeaseHeld, Reason: err.Error(), Err: err, Details: map[string]string{
				"instance_id": held.Row.InstanceID, "holder": held.Row.Holder, "root": held.Row.Root,
				"pid": strconv.Itoa(held.Row.PID), "since": time.UnixMilli(held.Row.Since).UTC().Format(time.RFC3339),
			}}
		}
		return fail(CodeLease, "instance lease failed", err)
	}
	if cfg.Remote() {
		// Activate: the authority registers this start; its epoch and revision go into the
		// lease row before the manager serves.
		if err := m.activateRemote(ctx); err != nil {
			return fail(CodeAuthority, "the remote authority did not activate this start", err)
		}
	}
	// A predecessor's agents (it was killed, or spared them) are reaped before any new spawn.
	m.reap(ctx)
	if cfg.Remote() {
		// Retirements a predecessor left pending (a reaped agent's among them) are retried
		// under their opIds, each holding its name until retired.
		m.resumeRetirements()
	}

	// The liveness plane, then ManagerService.
	if m.live, err = m.nc.QueueSubscribe(m.n.LiveManagerServe(), space.LiveQueue(space.LivePlaneManager), m.onProbe); err != nil {
		return fail(CodeBind, "serve the liveness plane", err)
	}
	if err := m.nc.Flush(); err != nil {
		return fail(CodeBind, "serve the liveness plane", err)
	}
	if err := m.nc.LastError(); err != nil {
		return fail(CodeBind, "serve the liveness plane", err)
	}
	if m.ln, err = api.Listen(cfg.API.Socket, -1); err != nil {
		return fail(CodeBind, "ManagerService socket", err)
	}
	m.gs = api.NewServer(m.Backend(), api.Options{AllowUIDs: cfg.API.AllowUIDs, Logger: m.log})

	// The upkeep, then ready, then ManagerService answers (a Shutdown it serves finds every
	// goroutine started).
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		if err := m.lease.Run(m.runCtx); err != nil && m.runCtx.Err() == nil {
			m.log.Error("instance lease loop ended", "err", err)
		}
	}()
	if !cfg.Remote() {
		// A remote managerd registered by activate; a signer-mode one on the register-manager rail.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.registerLoop(m.runCtx)
		}()
	}
	go func() {
		defer m.wg.Done()
		err := m.rail.Run(m.runCtx)
		if err == nil || m.runCtx.Err() != nil {
			return
		}
		m.log.Error("supervisor credential renewal ended", "err", err)
		var ee *signerclient.ExpiredError
		if errors.As(err, &ee) {
			m.tr.Warn(CodeCredential, "the supervisor credential expired without renewal; the broker will refuse this manager's connection", err)
			m.update(func(a *availability) { a.expired = err })
		}
	}()
	m.update(func(a *availability) { a.on = true })
	served := make(chan error, 1)
	go func(gs *grpc.Server, ln net.Listener) { served <- gs.Serve(ln) }(m.gs, m.ln)
	go m.watch(ctx, served)
	m.log.Info("managerd ready", "space", cfg.Space, "instance", cfg.InstanceID, "root", cfg.Root, "user", m.rail.PublicKey())
	m.log.Info("ManagerService serving", "socket", cfg.API.Socket, "allow_uids", cfg.API.AllowUIDs)
	return nil
}

// watch stops the manager when ctx ends (a default shutdown) or ManagerService stops serving on
// its own.
func (m *Manager) watch(ctx context.Context, served <-chan error) {
	select {
	case <-ctx.Done():
		m.log.Info("context ended: default shutdown (agents keep running)")
		if err := m.Close(context.Background()); err != nil {
			m.log.Error("shutdown", "err", err)
		}
	case err := <-served:
		if err == nil || errors.Is(err, grpc.ErrServerStopped) || isClosed(m.done) {
			return
		}
		m.mu.Lock()
		if m.shut == nil {
			m.apiErr = fmt.Errorf("%w: %v", ErrAPIStopped, err)
		}
		m.mu.Unlock()
		m.log.Error("ManagerService stopped serving; shutting down", "err", err)
		m.tr.Warn(CodeAPI, "ManagerService stopped serving; shutting down (agents keep running)", err)
		_ = m.Close(context.Background())
	case <-m.done:
	}
}

// Done is closed once the manager has stopped (after Close or Shutdown, or a failed Start).
func (m *Manager) Done() <-chan struct{} { return m.done }

// State is the manager's readiness: StateReady while it holds its instance lease on a live
// broker connection; StateUnavailable while its lease is not confirmed (lost, taken by another
// row, or its renewal failing), its broker connection is down, its supervisor credential has
// expired, or it is shutting down; StateStopped once Done is closed.
func (m *Manager) State() State { return m.tr.State() }

// Ready reports whether State is StateReady.
func (m *Manager) Ready() bool { return m.State() == StateReady }

// abort closes what a failed start opened, releasing the lease if it was acquired.
func (m *Manager) abort() {
	if m.gs != nil {
		m.gs.Stop()
	}
	if m.ln != nil {
		_ = m.ln.Close()
	}
	if m.lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := m.lease.Release(ctx); err != nil {
			m.log.Warn("a refused start could not release its instance lease; it expires with its TTL", "err", err)
		}
		cancel()
	}
	m.teardown()
}

// teardown closes everything Start opened but ManagerService, without touching agents or the
// lease row.
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

// stopAPI stops ManagerService: in-flight calls may finish for drainTimeout, then are cut.
func (m *Manager) stopAPI() {
	if m.gs == nil {
		return
	}
	stopped := make(chan struct{})
	go func() { m.gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(drainTimeout):
		m.gs.Stop()
		<-stopped
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

// Close is a default shutdown (agents keep running, see Shutdown), or joins the shutdown
// already running, and returns once the manager has stopped (Done), with Err: an error when an
// agent was not proven gone or the lease release was not confirmed by the broker (the row then
// expires with its TTL). It returns ctx's error if ctx ends first; the shutdown goes on.
func (m *Manager) Close(ctx context.Context) error {
	if _, started := m.begin(false); !started {
		return errors.New("manager: not started")
	}
	select {
	case <-m.done:
		return m.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown stops the manager once: a second call joins the first and gets its result, one asking
// a different withAgents is refused with SHUTDOWN_CONFLICT. With agents, every agent is stopped
// and deprovisioned, and the lease is released only if each was proven gone; otherwise the
// lease stays (its row expires on its own) and the error names the agents. It is what
// ManagerService.Shutdown calls; an embedder calls Close, or Shutdown(ctx, true) to stop the
// agents too. It returns once the manager has shut down, before Done (in-flight ManagerService
// calls are still draining).
func (m *Manager) Shutdown(ctx context.Context, withAgents bool) (*managerv1.ShutdownResponse, error) {
	s, started := m.begin(withAgents)
	if !started {
		return nil, errors.New("manager: not started")
	}
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

// begin starts the one shutdown, asking withAgents, or returns the one already running.
func (m *Manager) begin(withAgents bool) (*shutdown, bool) {
	m.mu.Lock()
	if s := m.shut; s != nil || !m.started {
		m.mu.Unlock()
		return s, m.started
	}
	s := &shutdown{withAgents: withAgents, done: make(chan struct{})}
	m.shut, m.shutting = s, true
	m.mu.Unlock()
	m.update(func(a *availability) { a.shutting = true })
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), m.cfg.ShutdownTimeout.D())
		defer cancel()
		s.resp, s.err = m.shutdown(sctx, withAgents)
		close(s.done)
		m.stopAPI()
		err := m.stopErr()
		msg := "stopped"
		if err != nil {
			msg = "stopped with an error"
		}
		m.tr.Set(StateStopped, CodeShutdown, msg, err)
		close(m.done)
	}()
	return s, true
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
	// The release is the last broker work, so it runs before teardown stops the upkeep: the rail
	// goes on renewing the supervisor credential until the row is deleted. Stopped first, a
	// credential expiring during the release cut the connection and no renewal let it back
	// ("expired without renewal"). Release stops the lease's own loop itself.
	var err error
	if len(unproven) > 0 {
		err = api.Refuse(codes.Internal, managerv1.Reason_REASON_STOP_UNPROVEN,
			"agents not proven gone, lease kept until it expires: %s", strings.Join(unproven, ", "))
		m.tr.Warn(CodeStopUnproven, "agents not proven gone; the instance lease is kept until it expires", err)
	} else if rerr := m.lease.Release(ctx); rerr != nil {
		err = fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, rerr)
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

// Err is why the manager stopped, once Done is closed: nil for a clean stop (Close, Shutdown,
// or ctx ended); an error wrapping ErrReleaseUnconfirmed when the lease release was not
// confirmed; a STOP_UNPROVEN *Refusal when agents were not proven gone; ErrAPIStopped when
// ManagerService stopped serving on its own.
func (m *Manager) Err() error {
	if !isClosed(m.done) {
		return nil
	}
	return m.stopErr()
}

// stopErr is Err once the shutdown has finished.
func (m *Manager) stopErr() error {
	m.mu.Lock()
	s, apiErr := m.shut, m.apiErr
	m.mu.Unlock()
	var err error
	if s != nil && isClosed(s.done) {
		err = s.err
	}
	return errors.Join(apiErr, err)
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
