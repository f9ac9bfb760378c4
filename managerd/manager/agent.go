package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/internal/launcher"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Launcher is how the manager starts and signals agents: in production a client of the
// uid-dropping launcher (`managerd launcher`, root) on Config.Launcher.Socket; a host may pass
// its own in RuntimeOptions.Launcher. Whatever it is, it must keep the launcher's promises, for
// they are what the manager's proofs rest on:
//
//   - Launch starts the agent in a session and process group of its own, as a uid that cannot
//     read managerd's or signerd's files, writes req.Material (the agent's credential) 0600 as
//     that uid and names only its path in COTAL_LAUNCH_MATERIAL, and returns the Child and its
//     PTY master (the manager's to read, write and close). A refusal is a *LaunchRefusedError.
//   - Signal sends SIGTERM to the child's process group, SIGKILL to all it started; signal 0 is
//     a probe, nil while any process of the child may live, and a *LaunchRefusedError with reason
//     LaunchChildUnknown once it has proven them all gone. The manager releases an agent's
//     durables, and its lease at shutdown, only on that proof.
//   - ReplaceMaterial replaces the material of a child it started, atomically (a renewed
//     credential).
type Launcher interface {
	Launch(ctx context.Context, req LaunchRequest) (Child, *os.File, error)
	Signal(ctx context.Context, child Child, sig syscall.Signal) error
	ReplaceMaterial(ctx context.Context, child Child, material []byte) error
}

// AgentSpec names an agent incarnation for its provisioning.
type AgentSpec struct {
	Owner, Actor, LifecycleUID, Role string
	AllowSubscribe                   []string
}

// Provisioner creates an agent's durables and ACL row, and removes them.
type Provisioner interface {
	// Provision creates them and returns their names; on failure it leaves none behind.
	Provision(ctx context.Context, a AgentSpec) ([]string, error)
	// Deprovision removes exactly that lifecycle's two consumers, its ACL row and its
	// membership rows on memberChannels (concrete channels), and returns what it observed
	// (provision.Result); already-absent items are not errors. A slot left uncertain is a
	// *provision.DeprovisionError carrying the Result.
	Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error)
}

// Terminal is an agent's PTY as the manager holds it (a *term.Term).
type Terminal interface {
	Attach() (snapshot []byte, out <-chan []byte, lagged func() bool, detach func(), err error)
	Write(ctx context.Context, p []byte) (int, error)
	Resize(rows, cols uint16) error
	Done() <-chan struct{}
	Close() error
}

// errExpired: the agent's credential has expired; renewal mints anew.
var errExpired = errors.New("credential expired")

// maxEnvValue bounds one environment value a Spawn may set.
const maxEnvValue = 4096

// agent is one agent incarnation. Fields after the constant block are guarded by Manager.mu.
type agent struct {
	name, actor, uid, connector, role string
	subscribe, allowSub, allowPub     []string
	caps                              []string
	pub                               string

	// exchange is a remote managerd's agent's exchange URL (it has no key, mint or credential).
	exchange string

	key  nkeys.KeyPair         // the agent's user key: only for Remint proofs; wiped at stop
	mint *signerv1.MintRequest // the spawn's mint, asked again for the same key once the credential expired

	state     managerv1.ProcessState
	child     launcher.Child
	dir       string
	term      Terminal
	startedAt time.Time
	exited    chan struct{}
	exitOnce  sync.Once
	// ready is closed when the spawn ends, launched or undone.
	ready    chan struct{}
	durables []string

	cred     credState
	renew    renewState
	lastSeen time.Time
	phases   phases

	renewCancel context.CancelFunc
	stopping    *stopCall
}

type credState struct {
	jwt             string
	iat, exp, recvd time.Time
}

type renewState struct {
	due      time.Time
	failures uint32
	lastErr  string
}

type stopCall struct {
	done chan struct{}
	resp *managerv1.StopResponse
	err  error
}

func (a *agent) markExited() {
	a.exitOnce.Do(func() { close(a.exited) })
}

func (a *agent) stopRenewal() {
	if a.renewCancel != nil {
		a.renewCancel()
	}
}

func (a *agent) closeTerm() {
	if a.term != nil {
		_ = a.term.Close()
	}
}

// admit checks a request without touching anything but memory, and reserves its slot.
func (m *Manager) admit(req *managerv1.SpawnRequest) (*agent, error) {
	bad := func(r managerv1.Reason, f string, args ...any) error {
		return api.Refuse(codes.InvalidArgument, r, f, args...)
	}
	name := req.GetName()
	if !nameRE.MatchString(name) || len(name) > MaxNameLen {
		return nil, bad(managerv1.Reason_REASON_NAME_INVALID, "name %q: want ^[A-Za-z0-9_-]+$, at most %d bytes", name, MaxNameLen)
	}
	actor := strings.ReplaceAll(name, "-", "_")
	if err := space.ValidateActor(actor); err != nil {
		return nil, bad(managerv1.Reason_REASON_NAME_INVALID, "name %q: %v", name, err)
	}
	if !m.cfg.hasConnector(req.GetConnector()) {
		return nil, bad(managerv1.Reason_REASON_CONNECTOR_UNKNOWN, "connector %q is not in this manager's table", req.GetConnector())
	}
	if r := req.GetRole(); r != "" {
		if err := space.ValidateRole(r); err != nil {
			return nil, bad(managerv1.Reason_REASON_INVALID_ARGUMENT, "role: %v", err)
		}
	}
	sub := req.GetSubscribe()
	if len(sub) == 0 {
		sub = []string{"general"}
	}
	allowSub, allowPub := req.GetAllowSubscribe(), req.GetAllowPublish()
	if len(allowSub) == 0 {
		allowSub = sub
	}
	if len(allowPub) == 0 {
		allowPub = sub
	}
	for _, c := range sub {
		if err := space.ValidateChannel(c); err != nil {
			return nil, bad(managerv1.Reason_REASON_CHANNEL_INVALID, "subscribe: %v", err)
		}
	}
	for _, list := range [][]string{allowSub, allowPub} {
		for _, c := range list {
			if err := space.ValidateChannelPattern(c); err != nil {
				return nil, bad(managerv1.Reason_REASON_CHANNEL_INVALID, "channel pattern: %v", err)
			}
		}
	}
	for _, c := range sub {
		if !slices.ContainsFunc(allowSub, func(p string) bool { return space.PatternCovers(p, c) }) {
			return nil, bad(managerv1.Reason_REASON_SUBSCRIBE_NOT_ALLOWED, "subscribe channel %q is not covered by allow_subscribe %v", c, allowSub)
		}
	}
	for _, c := range req.GetCapabilities() {
		if c == "" || len(c) > 64 || strings.ContainsAny(c, " \t\r\n\x00") {
			return nil, bad(managerv1.Reason_REASON_INVALID_ARGUMENT, "capability %q is not a word", c)
		}
	}
	for k, v := range req.GetEnv() {
		if !m.cfg.envAllowed(k) {
			return nil, bad(managerv1.Reason_REASON_ENV_NOT_ALLOWED, "environment variable %q is not in env_allow", k)
		}
		if len(v) > maxEnvValue || strings.ContainsRune(v, 0) {
			return nil, bad(managerv1.Reason_REASON_INVALID_ARGUMENT, "environment variable %q: value over %d bytes or with NUL", k, maxEnvValue)
		}
	}
	if req.GetRows() > 1000 || req.GetCols() > 1000 {
		return nil, bad(managerv1.Reason_REASON_INVALID_ARGUMENT, "terminal %dx%d: at most 1000x1000", req.GetRows(), req.GetCols())
	}
	uid, err := newUID()
	if err != nil {
		return nil, fmt.Errorf("manager: lifecycle uid: %w", err)
	}
	a := &agent{
		name: name, actor: actor, uid: uid, connector: req.GetConnector(), role: req.GetRole(),
		subscribe: slices.Clone(sub), allowSub: slices.Clone(allowSub), allowPub: slices.Clone(allowPub),
		caps: slices.Clone(req.GetCapabilities()), state: managerv1.ProcessState_PROCESS_STATE_STARTING,
		exited: make(chan struct{}), ready: make(chan struct{}),
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shutting {
		return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_SHUTTING_DOWN, "the manager is shutting down")
	}
	if _, ok := m.agents[name]; ok {
		return nil, api.Refuse(codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE, "agent %q exists; stop it first", name)
	}
	if m.retire.held(name) {
		return nil, api.Refuse(codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE, "agent %q has a pending retirement; its name is held until the authority retires it", name)
	}
	if other, ok := m.byActor[actor]; ok {
		return nil, api.Refuse(codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE, "agent %q has the same actor token %q", other.name, actor)
	}
	if len(m.agents) >= m.cfg.Capacity {
		return nil, api.Refuse(codes.ResourceExhausted, managerv1.Reason_REASON_CAPACITY_EXHAUSTED, "%d agents held, spawns in progress included; capacity %d", len(m.agents), m.cfg.Capacity)
	}
	m.agents[name], m.byActor[actor] = a, a
	return a, nil
}

// release frees a's slot.
func (m *Manager) release(a *agent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.agents[a.name] == a {
		delete(m.agents, a.name)
	}
	if m.byActor[a.actor] == a {
		delete(m.byActor, a.actor)
	}
}

// spawn runs an admitted request to a running agent; on failure it undoes every step it took.
func (m *Manager) spawn(ctx context.Context, req *managerv1.SpawnRequest) (*managerv1.Agent, error) {
	m.mu.Lock()
	started := m.started && m.rail != nil
	shutting := m.shutting
	m.mu.Unlock()
	if !started {
		return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_SHUTTING_DOWN, "the manager is not running")
	}
	remote := m.cfg.Remote()
	var enroller ManagedAgentEnroller
	if remote {
		// No enrollment hook: a remote managerd never authors a local grant the host knows
		// nothing about (seed 001 "Fresh managed agents").
		var ok bool
		if enroller, ok = m.remote.auth.(ManagedAgentEnroller); !ok {
			return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_ENROLLMENT_UNAVAILABLE, "%s", MsgEnrollmentUnavailable)
		}
	}
	// A manager that cannot confirm its lease or reach the broker admits no agent: the spawn
	// would provision and mint for an instance that may no longer be the space's. A shutdown's
	// own refusal (admit) names it.
	if !shutting && m.State() == StateUnavailable {
		return nil, api.Refuse(codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE,
			"the manager is unavailable (broker connection or instance lease not confirmed); retry once it is ready")
	}
	a, err := m.admit(req)
	if err != nil {
		return nil, err
	}
	a.phases.admitted = time.Now()
	ctx = withPhases(ctx, &a.phases)
	ok := false
	var provisioned, enrolled bool
	defer func() {
		defer close(a.ready)
		if ok {
			return
		}
		if provisioned {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			if _, err := m.prov.Deprovision(dctx, m.cfg.AgentOwner, a.actor, a.uid, m.memberChannels(a)); err != nil {
				m.log.Error("spawn failed and its durables could not be removed", "agent", a.name, "uid", a.uid, "err", err)
				m.tr.Warn(CodeDeprovision, fmt.Sprintf("spawn of %s failed and its durables and ACL row (lifecycle %s) could not be removed", a.name, a.uid), err)
			}
			cancel()
		}
		if enrolled {
			m.undoEnrollment(ctx, a)
		}
		if a.key != nil {
			a.key.Wipe()
		}
		m.release(a)
	}()

	var cs credState
	var mat []byte
	if remote {
		if mat, err = m.enrollRemote(ctx, enroller, a); err != nil {
			return nil, err
		}
		enrolled = true
	} else {
		if cs, mat, err = m.provisionAndMint(ctx, a, &provisioned); err != nil {
			return nil, err
		}
	}
	defer clear(mat)
	step := time.Now()
	child, master, err := m.lnch.Launch(ctx, launcher.Request{
		Name: a.name, Connector: a.connector, Env: req.GetEnv(), Material: mat,
		Rows: uint16(req.GetRows()), Cols: uint16(req.GetCols()),
	})
	a.phases.launch = time.Since(step)
	if err != nil {
		var rj *Rejection
		if errors.As(err, &rj) { // logged and raised by the guard
			return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_LAUNCH_FAILED, "launch: %s", rj.Error())
		}
		var re *launcher.RefusedError
		if errors.As(err, &re) && re != nil {
			return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_LAUNCH_FAILED, "launcher refused: %s: %s", re.Reason, re.Message)
		}
		m.log.Warn("the launcher could not be reached", "agent", a.name, "err", err)
		m.tr.Warn(CodeLauncher, fmt.Sprintf("spawn of %s: the launcher could not be reached", a.name), err)
		return nil, api.Refuse(codes.Unavailable, managerv1.Reason_REASON_LAUNCH_FAILED, "launcher: %v", err)
	}
	if master == nil {
		if child.Pid > 1 {
			m.killUnproven(child)
		}
		return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_LAUNCH_FAILED, "launch: the launcher returned no terminal and no error")
	}
	t, err := newTerm(master)
	if err != nil {
		master.Close()
		m.killUnproven(child)
		return nil, fmt.Errorf("manager: terminal: %w", err)
	}
	a.child = child
	if err := m.record(a); err != nil {
		_ = t.Close()
		m.killUnproven(child)
		return nil, fmt.Errorf("manager: custody record: %w", err)
	}
	rctx, rcancel := context.WithCancel(m.runCtx)
	m.mu.Lock()
	a.child, a.dir, a.term, a.startedAt = child, child.Dir, t, time.Now()
	a.cred = cs
	if !remote {
		a.renew.due = renewDue(cs)
	}
	a.state = managerv1.ProcessState_PROCESS_STATE_RUNNING
	a.renewCancel = rcancel
	view := m.view(a)
	m.mu.Unlock()
	ok = true
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.watchExit(rctx, a) }()
	if !remote { // an enrolled agent renews its own bearer at the exchange
		m.wg.Add(1)
		go func() { defer m.wg.Done(); m.renewLoop(rctx, a) }()
	}
	m.log.Info("agent spawned", "agent", a.name, "uid", a.uid, "pid", child.Pid, "user", a.pub, "expires", cs.exp)
	return view, nil
}

// provisionAndMint is a signer-mode spawn's grant: the agent's user nkey, its durables and ACL
// row (*provisioned once they are), and its credential rendered into launch material.
func (m *Manager) provisionAndMint(ctx context.Context, a *agent, provisioned *bool) (credState, []byte, error) {
	var err error
	if a.key, err = nkeys.CreateUser(); err != nil {
		return credState{}, nil, fmt.Errorf("manager: user nkey: %w", err)
	}
	if a.pub, err = a.key.PublicKey(); err != nil {
		return credState{}, nil, fmt.Errorf("manager: user nkey: %w", err)
	}
	step := time.Now()
	a.durables, err = m.prov.Provision(ctx, AgentSpec{Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUID: a.uid, Role: a.role, AllowSubscribe: a.allowSub})
	a.phases.provision = time.Since(step)
	if err != nil {
		m.sig.record(signerOnly(err))
		return credState{}, nil, m.signerRefusal(err, managerv1.Reason_REASON_PROVISION_FAILED, "provision")
	}
	*provisioned = true
	mreq := &signerv1.MintRequest{
		Space: m.cfg.Space, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: a.pub,
		Params: &signerv1.ProfileParams{Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUid: a.uid, Role: a.role,
			Subscribe: a.subscribe, AllowSubscribe: a.allowSub, AllowPublish: a.allowPub, Capabilities: a.caps},
	}
	if ttl := m.cfg.AgentTTL.D(); ttl > 0 {
		mreq.Ttl = durationpb.New(ttl)
	}
	step = time.Now()
	a.mint = mreq
	cred, err := m.signer.Calls().Mint(ctx, mreq)
	a.phases.mint = time.Since(step)
	m.sig.record(err)
	if err != nil {
		return credState{}, nil, m.signerRefusal(err, managerv1.Reason_REASON_SIGNER_REFUSED, "mint")
	}
	cs := credState{jwt: cred.GetJwt(), iat: cred.GetIssuedAt().AsTime(), exp: cred.GetExpiresAt().AsTime(), recvd: time.Now()}
	if cred.GetExpiresAt() == nil || !cs.exp.After(cs.iat) {
		return credState{}, nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_SIGNER_REFUSED, "signerd returned an agent credential without a usable expiry")
	}
	mat, err := m.material(a, cs.jwt)
	if err != nil {
		return credState{}, nil, err
	}
	return cs, mat, nil
}

// killUnproven SIGKILLs a child whose start could not be completed.
func (m *Manager) killUnproven(child launcher.Child) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := launcher.Terminate(ctx, child, 0, m.lnch.Signal); err != nil {
		m.log.Error("a half-started agent could not be killed", "pid", child.Pid, "err", err)
		m.tr.Warn(CodeLauncher, fmt.Sprintf("a half-started agent (pid %d) could not be killed", child.Pid), err)
	}
}

// material renders a's launch material with its current credential.
func (m *Manager) material(a *agent, userJWT string) ([]byte, error) {
	var creds string
	var ferr error
	// nkeys returns its own seed buffer: format from a copy and wipe the copy, never the key's.
	keySeed, err := a.key.Seed()
	if err != nil {
		return nil, fmt.Errorf("manager: agent seed: %w", err)
	}
	seed := append([]byte(nil), keySeed...)
	creds, ferr = material.FormatCreds(userJWT, seed)
	clear(seed)
	if ferr != nil {
		return nil, ferr
	}
	b, err := material.Encode(material.Material{
		Version: material.Version, Space: m.cfg.Space, Servers: m.cfg.Brokers,
		Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUID: a.uid, InstanceID: m.cfg.InstanceID,
		Role: a.role, Subscribe: a.subscribe, AllowSubscribe: a.allowSub, AllowPublish: a.allowPub, Creds: creds,
	})
	if err != nil {
		return nil, fmt.Errorf("manager: launch material: %w", err)
	}
	return b, nil
}

// signerOnly keeps err only if it came from signerd, for the reachability record.
func signerOnly(err error) error {
	var se *signerclient.Error
	if errors.As(err, &se) {
		return err
	}
	return nil
}

// signerRefusal maps a signer or provisioning failure to a refusal: signerd unreachable is
// SIGNER_UNAVAILABLE, a signerd refusal SIGNER_REFUSED, anything else the given reason.
func (m *Manager) signerRefusal(err error, other managerv1.Reason, step string) error {
	var rj *Rejection
	switch {
	case errors.As(err, &rj): // a host provisioner's rejection, logged and raised by the guard
		return api.Refuse(codes.Internal, other, "%s: %s", step, rj.Error())
	case errors.Is(err, signerclient.ErrUnavailable) || errors.Is(err, signerclient.ErrDeadline):
		return api.Refuse(codes.Unavailable, managerv1.Reason_REASON_SIGNER_UNAVAILABLE, "%s: signerd unreachable: %v", step, err)
	case signerclient.ReasonOf(err) != signerv1.Reason_REASON_UNSPECIFIED || errors.Is(err, signerclient.ErrDenied):
		return api.Refuse(codes.PermissionDenied, managerv1.Reason_REASON_SIGNER_REFUSED, "%s: signerd refused: %v", step, err)
	}
	code := codes.Unavailable
	if other == managerv1.Reason_REASON_SIGNER_REFUSED {
		code = codes.Internal
	}
	return api.Refuse(code, other, "%s: %v", step, err)
}

// watchExit marks a exited once its process is proven gone: woken by the terminal's end, and
// checked every half second (a child that closed its terminal but lives on stays running).
func (m *Manager) watchExit(ctx context.Context, a *agent) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	done := a.term.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			done = nil
		case <-tick.C:
		}
		if gone, err := a.child.Gone(); err == nil && gone {
			m.mu.Lock()
			if a.state == managerv1.ProcessState_PROCESS_STATE_RUNNING {
				a.state = managerv1.ProcessState_PROCESS_STATE_EXITED
			}
			m.mu.Unlock()
			a.markExited()
			a.stopRenewal()
			m.log.Info("agent exited", "agent", a.name, "uid", a.uid, "pid", a.child.Pid)
			return
		}
	}
}

// renewDue is 75% of the credential's lifetime after it arrived.
func renewDue(c credState) time.Time {
	return c.recvd.Add(c.exp.Sub(c.iat) * 3 / 4)
}

// renewLoop remints a's credential for the same nkey at 75% of its lifetime and replaces its
// launch material through the launcher; a failure keeps the last good credential, is counted as
// renewal debt and retried after RenewRetry (sooner if the credential would expire first).
func (m *Manager) renewLoop(ctx context.Context, a *agent) {
	for {
		m.mu.Lock()
		due, cur := a.renew.due, a.cred
		m.mu.Unlock()
		t := time.NewTimer(time.Until(due))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := m.renewOnce(ctx, a, cur)
		if ctx.Err() != nil {
			return
		}
		m.mu.Lock()
		if err != nil {
			a.renew.failures++
			a.renew.lastErr = err.Error()
			retry := m.cfg.RenewRetry.D()
			if left := time.Until(cur.recvd.Add(cur.exp.Sub(cur.iat))); left/2 < retry && left > 0 {
				retry = max(left/2, time.Second)
			}
			a.renew.due = time.Now().Add(retry)
			m.log.Warn("agent credential renewal failed; the last good credential stays", "agent", a.name, "failures", a.renew.failures, "retry", retry, "err", err)
			failures := a.renew.failures
			m.mu.Unlock()
			m.tr.Warn(CodeRenewal, fmt.Sprintf("agent %s: credential renewal failed (%d in a row); the last good credential stays, next attempt in %v", a.name, failures, retry.Round(time.Second)), err)
			continue
		}
		a.renew.failures, a.renew.lastErr = 0, ""
		a.renew.due = renewDue(a.cred)
		m.mu.Unlock()
	}
}

// renewOnce remints cur and installs the result.
func (m *Manager) renewOnce(ctx context.Context, a *agent, cur credState) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Remint while the credential lives; once it has expired (signerd was unreachable past its
	// end) signerd refuses a remint, so mint again for the same key with the spawn's parameters:
	// managerd is the agent's minting authority either way, and the agent keeps its key.
	var cred *signerv1.Credential
	var err error
	if time.Since(cur.recvd) < cur.exp.Sub(cur.iat) {
		cred, err = m.signer.Remint(cctx, m.cfg.Space, cur.jwt, a.key, m.cfg.AgentTTL.D())
	} else {
		err = errExpired
	}
	if errors.Is(err, errExpired) || signerclient.ReasonOf(err) == signerv1.Reason_REASON_CREDENTIAL_EXPIRED {
		cred, err = m.signer.Calls().Mint(cctx, a.mint)
	}
	m.sig.record(err)
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if cred.GetUserPublicKey() != a.pub || cred.GetExpiresAt() == nil {
		return errors.New("remint: signerd answered for another key or without expiry")
	}
	next := credState{jwt: cred.GetJwt(), iat: cred.GetIssuedAt().AsTime(), exp: cred.GetExpiresAt().AsTime(), recvd: time.Now()}
	mat, err := m.material(a, next.jwt)
	if err != nil {
		return err
	}
	defer clear(mat)
	if err := m.lnch.ReplaceMaterial(cctx, a.child, mat); err != nil {
		return fmt.Errorf("replace launch material: %w", err)
	}
	m.mu.Lock()
	a.cred = next
	m.mu.Unlock()
	m.log.Info("agent credential renewed", "agent", a.name, "uid", a.uid, "expires", next.exp)
	return nil
}

// stopAgent stops a; concurrent calls share one result. A spawn in progress is waited for.
func (m *Manager) stopAgent(ctx context.Context, a *agent) (*managerv1.StopResponse, error) {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m.mu.Lock()
	if m.agents[a.name] != a {
		m.mu.Unlock()
		return nil, api.Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "agent %q did not start", a.name)
	}
	if c := a.stopping; c != nil {
		m.mu.Unlock()
		select {
		case <-c.done:
			return c.resp, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &stopCall{done: make(chan struct{})}
	a.stopping = c
	if a.state == managerv1.ProcessState_PROCESS_STATE_RUNNING {
		a.state = managerv1.ProcessState_PROCESS_STATE_STOPPING
	}
	m.mu.Unlock()
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StopGrace.D()+20*time.Second)
		defer cancel()
		c.resp, c.err = m.doStop(sctx, a)
		m.mu.Lock()
		if c.err != nil {
			a.stopping = nil // a later Stop may try again
		}
		m.mu.Unlock()
		close(c.done)
	}()
	select {
	case <-c.done:
		return c.resp, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *Manager) doStop(ctx context.Context, a *agent) (*managerv1.StopResponse, error) {
	a.stopRenewal()
	if _, err := launcher.Terminate(ctx, a.child, m.cfg.StopGrace.D(), m.lnch.Signal); err != nil {
		if gone, gerr := a.child.Gone(); gerr != nil || !gone {
			return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_STOP_UNPROVEN, "agent %s (pid %d) not proven gone: %v", a.name, a.child.Pid, err)
		}
	}
	a.markExited()
	if m.cfg.Remote() {
		return m.stopRemote(ctx, a)
	}
	res, err := m.prov.Deprovision(ctx, m.cfg.AgentOwner, a.actor, a.uid, m.memberChannels(a))
	m.sig.record(signerOnly(err))
	if err != nil {
		if de := (*provision.DeprovisionError)(nil); errors.As(err, &de) {
			// Some slots settled, some did not: a later Stop examines every slot again.
			m.log.Error("agent deprovision incomplete", "agent", a.name, "uid", a.uid, "removed", de.Result.Removed, "result", de.Result.String(), "err", err)
		}
		return nil, m.signerRefusal(err, managerv1.Reason_REASON_PROVISION_FAILED, "deprovision")
	}
	m.mu.Lock()
	a.state = managerv1.ProcessState_PROCESS_STATE_EXITED
	view := m.view(a)
	m.mu.Unlock()
	a.closeTerm()
	if a.key != nil {
		a.key.Wipe()
	}
	m.unrecord(a)
	m.release(a)
	m.log.Info("agent stopped", "agent", a.name, "uid", a.uid, "deprovisioned", res.Removed, "result", res.String())
	return &managerv1.StopResponse{Agent: view, Deprovisioned: res.Removed}, nil
}

// memberChannels is a's teardown member channels (see the package function), logging when
// some were left out.
func (m *Manager) memberChannels(a *agent) []string {
	chans, truncated := memberChannels(a.subscribe, a.allowSub)
	if truncated {
		m.log.Warn("agent reads more concrete channels than one deprovisioner names; the rest of its membership rows are left to deliveryd", "agent", a.name, "uid", a.uid, "named", len(chans))
	}
	return chans
}

// seen records a probe from actor.
func (m *Manager) seen(actor string, at time.Time) {
	m.mu.Lock()
	a, ok := m.byActor[actor]
	first := ok && a.lastSeen.IsZero()
	if ok {
		a.lastSeen = at
	}
	if first && !a.phases.admitted.IsZero() {
		a.phases.connected = max(at.Sub(a.phases.admitted), time.Nanosecond)
	}
	m.mu.Unlock()
	if first && m.opts.OnFirstSeen != nil {
		m.onFirstSeen(a.name, at)
	}
}

// view renders a for the API; m.mu is held.
func (m *Manager) view(a *agent) *managerv1.Agent {
	v := &managerv1.Agent{
		Name: a.name, Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUid: a.uid, Connector: a.connector,
		Role: a.role, Pid: int32(a.child.Pid), InstanceId: m.cfg.InstanceID, Process: a.state,
		UserPublicKey: a.pub, ExitCode: -1, Subscribe: slices.Clone(a.subscribe),
	}
	if !a.startedAt.IsZero() {
		v.StartedAt = timestamppb.New(a.startedAt)
	}
	if !a.cred.exp.IsZero() {
		v.CredentialExpiresAt = timestamppb.New(a.cred.exp)
	}
	switch {
	case a.lastSeen.IsZero():
		v.Mesh = managerv1.MeshState_MESH_STATE_NOT_SEEN
	case time.Since(a.lastSeen) <= m.cfg.LiveWindow.D():
		v.Mesh = managerv1.MeshState_MESH_STATE_ONLINE
		v.LastSeen = timestamppb.New(a.lastSeen)
	default:
		v.Mesh = managerv1.MeshState_MESH_STATE_OFFLINE
		v.LastSeen = timestamppb.New(a.lastSeen)
	}
	return v
}

func (m *Manager) renewal(a *agent) *managerv1.Renewal {
	r := &managerv1.Renewal{Failures: a.renew.failures, LastError: a.renew.lastErr}
	if !a.renew.due.IsZero() {
		r.DueAt = timestamppb.New(a.renew.due)
	}
	if !a.cred.exp.IsZero() {
		r.ExpiresAt = timestamppb.New(a.cred.exp)
	}
	return r
}

func sortStrings(lists ...[]string) {
	for _, l := range lists {
		sort.Strings(l)
	}
}
