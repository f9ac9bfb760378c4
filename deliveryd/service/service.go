package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/deliveryd/internal/watchdog"
	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Responders are request handlers the lease supervisor runs while this instance holds the
// lease (deliveryd/internal/ctl's ctl.delivery and ctl.delivery-admin): Start binds them on nc
// (subscribed and flushed when it returns) and is called on start and on every resume; Stop
// unbinds them at once, on every quiesce and at Close. Their effects are fenced by Hooks.MayAct.
type Responders interface {
	Start(ctx context.Context, nc *nats.Conn) error
	Stop()
}

// Renewer renews the delivery credential now through signerd, proving it on the broker before
// adopting it: what ctl.delivery-admin's reloadCreds calls. *signerclient.Rail implements it.
type Renewer interface {
	RenewNow(ctx context.Context) (signerclient.Renewed, error)
}

var _ Renewer = (*signerclient.Rail)(nil)

// Hooks is what the service hands the responders' constructor.
type Hooks struct {
	Names space.Names
	// MayAct is the lease fence: false while quiesced. Check it before every reply, publish and
	// write.
	MayAct func() bool
	// Renewer renews the delivery credential (reloadCreds).
	Renewer Renewer
	// Identity is the credential's user public key; SignerAddress is where it is renewed from
	// (reloadStoreIdentity).
	Identity, SignerAddress string
	// StoreIdentity is the hosted store's declared identity (Hosted.StoreIdentity), which
	// reloadStoreIdentity answers instead of SignerAddress when set.
	StoreIdentity string
	// Started reports whether start-up has finished (the lease watch bound): reloadCreds is
	// refused until it has.
	Started func() bool
	Logger  *slog.Logger
	// exec runs the $SYS verbs of ctl.delivery-admin; nil when live eviction is off.
	exec ctl.Executor
}

// CtlResponders is deliveryd's ctl.delivery and ctl.delivery-admin (deliveryd/internal/ctl),
// wired to the hooks: the lease fence, the rail for reloadCreds (refused until start-up has
// finished) and the signer address or the hosted store's identity for reloadStoreIdentity;
// membership rows carry the daemon's user public key as writer identity.
func CtlResponders(h Hooks) (Responders, error) {
	var rn ctl.Renewer
	if h.Renewer != nil {
		rn = ctlRenewer{h.Renewer, h.Identity}
	}
	return ctl.New(ctl.Config{Names: h.Names, WriterIdentity: h.Identity, MayAct: h.MayAct, Renewer: rn,
		StoreIdentity: h.SignerAddress, InjectedStore: h.StoreIdentity, Started: h.Started, Logger: h.Logger,
		Executor: h.exec})
}

// ctlRenewer answers ctl's reloadCreds with the rail's proven renewal.
type ctlRenewer struct {
	r        Renewer
	identity string
}

func (c ctlRenewer) RenewNow(ctx context.Context) (ctl.Proven, error) {
	rn, err := c.r.RenewNow(ctx)
	if err != nil {
		return ctl.Proven{}, err
	}
	return ctl.Proven{Identity: c.identity, IssuedAt: rn.Issued, Expires: rn.Expires}, nil
}

// Service is a running deliveryd. Its methods are safe for concurrent use.
type Service struct {
	cfg    *config.Config
	log    *slog.Logger
	pid    int
	n      space.Names
	holder string
	hosted *Hosted // nil on the CLI path

	tracker *daemon.Tracker
	// stateFile: this instance holds the lease on the CLI path, so its states go to the state
	// file.
	stateFile atomic.Bool
	// started: start-up has finished (the lease watch bound); reloadCreds may adopt.
	started atomic.Bool
	// closing: Close, Drain or a fatal stop began; the state only moves to stopped from here.
	closing atomic.Bool

	signer *signerclient.Client
	rail   *signerclient.Rail
	nc     *nats.Conn
	kv     jetstream.KeyValue // the delivery bucket
	lease  *lease.Lease
	writer *fanout.Writer
	reader *reader.Reader
	resp   Responders
	sys    sysParts // membership feed and $SYS executor (membership.go)
	wd     *watchdog.Watchdog
	// metrics is the metrics_listen server (metrics.go), or nil.
	metrics *metrics
	watch   *nats.Subscription
	live    *nats.Subscription
	prompt  chan struct{}
	// recheck asks the lease supervisor to renew at once: the connection came back.
	recheck chan struct{}
	// liveID is the liveness rail's opaque instance token.
	liveID string

	// checked is the connection's reconnect count when the lease was last renewed on it: MayAct
	// holds only while the count is still that (nats.go counts a reconnect before it sends
	// anything on the new connection).
	checked atomic.Uint64

	// quiesced is the fence: true while the loops and responders must not act.
	quiesced atomic.Bool
	// leaseTaken: another holder owns the row; Close must not touch it.
	leaseTaken atomic.Bool

	loopMu     sync.Mutex // guards loopCancel, drainCh and draining; held across a quiesce or resume
	loopCancel context.CancelFunc
	loopWG     sync.WaitGroup
	// drainCh is closed to stop the running loops' intake (Drain); draining: no loop starts again.
	drainCh   chan struct{}
	draining  bool
	drainOnce sync.Once

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// The rail's renewals run on a context of their own, ended by teardown only after the lease
	// is released: the release is broker work on the rail's credential, and a credential left
	// unrenewed during the quiesce and the release could expire and cut it for good.
	railCancel context.CancelFunc
	railDone   chan struct{}

	stopOnce sync.Once
	done     chan struct{}
	errMu    sync.Mutex
	err      error // why it stopped; guarded by errMu
	// releaseErr is the release's outcome, set before done is closed.
	releaseErr error
	// abort is closed when a Close or Drain ctx ended: the teardown waits no more for the broker.
	abort     chan struct{}
	abortOnce sync.Once
}

// Start runs deliveryd until ctx ends, Close or Drain is called or a fatal condition stops it,
// and returns once it serves (see the package doc). A refusal is a *StartError, also written to
// the refusal file on the CLI path when the state directory can hold it.
func Start(ctx context.Context, in Inputs, opts RuntimeOptions) (*Service, error) {
	s := &Service{log: opts.Logger, pid: opts.PID, done: make(chan struct{}), abort: make(chan struct{}),
		prompt: make(chan struct{}, 1), recheck: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.pid == 0 {
		s.pid = os.Getpid()
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	s.tracker = daemon.NewTracker("deliveryd", s.onEvent(opts.Events), nil)
	s.quiesced.Store(true)
	if in.Hosted != nil {
		h := *in.Hosted
		s.hosted = &h
	}
	if in.Config == nil {
		return nil, s.refuse(&StartError{Code: CodeConfig, Reason: "no configuration"})
	}
	cfg := *in.Config
	s.cfg = &cfg
	if s.hosted != nil {
		if err := s.hosted.Validate(); err != nil {
			return nil, s.refuse(&StartError{Code: CodeConfig, Reason: "hosted context refused", Err: err})
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, s.refuse(&StartError{Code: CodeConfig, Reason: "configuration refused", Err: err})
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if err := s.start(ctx, runCtx, opts); err != nil {
		_ = s.teardown(false)
		close(s.done)
		return nil, s.refuse(err)
	}
	s.log.Info("deliveryd ready", "space", cfg.Space, "holder", s.holder, "user", s.rail.PublicKey(), "pid", s.pid)
	if !s.markReady() {
		s.tracker.Set(StateUnavailable, CodeBroker, "started, but the connection or the lease dropped at once; waiting for it", nil)
	}
	if s.hosted == nil {
		if _, err := daemon.Notify("READY=1"); err != nil {
			s.log.Warn("sd_notify READY failed", "err", err)
		}
	}
	go func() {
		select {
		case <-ctx.Done():
			s.stop(context.Canceled)
		case <-s.done:
		}
	}()
	return s, nil
}

// start brings every part up in order; a failure returns a *StartError and leaves teardown to
// the caller.
func (s *Service) start(ctx, runCtx context.Context, opts RuntimeOptions) error {
	cfg := s.cfg
	fail := func(code, reason string, err error) error {
		if ctx.Err() != nil {
			return &StartError{Code: CodeCanceled, Reason: "start canceled", Err: ctx.Err()}
		}
		return &StartError{Code: code, Reason: reason, Err: err}
	}
	var err error
	if s.n, err = space.NewNames(cfg.Space); err != nil {
		return fail(CodeConfig, "space refused", err)
	}
	window, backstop, err := watchdog.Limits(cfg.BrokerGone.D(), cfg.BrokerGoneBackstop.D(), opts.Getenv)
	if err != nil {
		return fail(CodeConfig, "broker-gone limits refused", err)
	}
	s.wd = watchdog.New(window, backstop, nil)
	if s.hosted == nil {
		// The state file is left to the instance that holds the lease: this one rewrites it
		// once it does.
		if err := daemon.ClearRefusal(cfg.StateDir, FileName); err != nil {
			return fail(CodeConfig, "state directory refused", err)
		}
	}
	s.holder = cfg.Holder
	if s.holder == "" {
		host, _ := os.Hostname()
		s.holder = "deliveryd " + host + " pid " + strconv.Itoa(s.pid)
		if s.hosted != nil && s.hosted.LifecycleUID != "" {
			s.holder += " lifecycle " + s.hosted.LifecycleUID
		}
	}

	// 1. The credential: the rail's own nkey, minted by signerd and proven on the broker.
	sc := cfg.Signer.ClientConfig()
	sc.Logger = s.log
	if s.signer, err = signerclient.Dial(sc); err != nil {
		return fail(CodeConfig, "signer client refused", err)
	}
	if s.rail, err = signerclient.NewRail(signerclient.RailConfig{
		Client: s.signer, Space: cfg.Space, Profile: signerv1.Profile_PROFILE_DELIVERY,
		TTL: cfg.CredentialTTL.D(), NatsURLs: cfg.Brokers, Logger: s.log, OnRenew: s.onRenew,
		OnRenewFailed: func(err error, retryIn time.Duration) {
			s.tracker.Warn(CodeCredential, "credential renewal failed; keeping the current credential, retrying in "+retryIn.Round(time.Second).String(), err)
		},
	}); err != nil {
		return fail(CodeConfig, "delivery rail refused", err)
	}
	if err := s.rail.Start(ctx); err != nil {
		var pe *signerclient.ProofError
		if errors.As(err, &pe) {
			return fail(CodeBroker, "the broker refused the delivery credential", err)
		}
		return fail(CodeSigner, "no delivery credential from signerd", err)
	}
	// A hosted instance serves only its assigned account: checked before anything connects.
	if s.hosted != nil {
		if got := s.rail.Account(); got != s.hosted.Account {
			return &StartError{Code: CodeAccount, Details: map[string]string{"account": got, "assigned": s.hosted.Account},
				Reason: "the delivery credential belongs to account " + daemon.QuoteInput(got) + ", not the assigned account " + daemon.QuoteInput(s.hosted.Account)}
		}
	}

	// 2. The resident connection and one authenticated reachability probe.
	nc, err := s.connect(opts.NatsOptions)
	if err != nil {
		return fail(CodeBroker, "broker connection refused", err)
	}
	s.loopMu.Lock()
	s.nc = nc
	s.loopMu.Unlock()
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fail(CodeBroker, "jetstream", err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = js.AccountInfo(pctx)
	pcancel()
	if err != nil {
		return fail(CodeBroker, "reachability probe (JetStream account info) failed", err)
	}

	// 3. Every stream and bucket, opened and never created.
	for _, name := range []string{s.n.ChatStream(), s.n.InboxStream(), s.n.DLVStream()} {
		if _, err := plane3.OpenStream(ctx, js, name); err != nil {
			return fail(missingCode(err), "stream "+name, err)
		}
	}
	for _, k := range []space.BucketKind{space.Members, space.ACL, space.Channels, space.Presence, space.Delivery} {
		kv, err := plane3.OpenBucket(ctx, js, s.n, k)
		if err != nil {
			return fail(missingCode(err), "bucket "+string(k), err)
		}
		if k == space.Delivery {
			s.kv = kv
		}
	}

	// 4. The lease, ready false, before anything binds.
	bucket, _ := s.n.Bucket(space.Delivery)
	epoch := s.nc.Stats().Reconnects
	s.lease, err = lease.Acquire(ctx, lease.Config{Conn: s.nc, Bucket: bucket, Key: space.DeliveryLeaseKey, Holder: s.holder})
	if err != nil {
		var he *lease.HeldError
		var pe *lease.PermissionError
		switch {
		case errors.As(err, &he):
			return &StartError{Code: CodeLeaseHeld, Err: err,
				Reason:  "another deliveryd serves space " + strconv.Quote(cfg.Space) + ": " + strconv.Quote(he.Row.Holder) + " holds its delivery lease " + bucket + "/" + space.DeliveryLeaseKey + "; stop it, or wait for its lease to expire",
				Details: he.Details()}
		case errors.As(err, &pe):
			return fail(CodePermission, "the broker refused the delivery credential a subject of the lease (a permission error, not another daemon)", err)
		}
		return fail(CodeLease, "delivery lease failed", err)
	}
	s.checked.Store(epoch)
	if s.hosted == nil {
		s.stateFile.Store(true)
		if err := daemon.WriteState(cfg.StateDir, FileName, s.pid, StateStarting); err != nil {
			s.log.Warn("state file not written", "err", err)
		}
	}

	// 5. The writer, the reader and the responders, bound.
	if s.writer, err = fanout.New(ctx, s.nc, fanout.Config{Names: s.n, MayAct: s.MayAct, Logger: s.log, WriterIdentity: s.rail.PublicKey()}); err != nil {
		return fail(bindCode(err), "fan-out writer", err)
	}
	reg, err := s.registerer(opts)
	if err != nil {
		return fail(CodeConfig, "metrics", err)
	}
	if s.reader, err = reader.New(ctx, s.nc, reader.Config{Names: s.n, MayAct: s.MayAct, Logger: s.log, Registerer: reg}); err != nil {
		return fail(bindCode(err), "trusted reader", err)
	}
	if opts.Responders == nil {
		opts.Responders = CtlResponders
	}
	hooks := Hooks{Names: s.n, MayAct: s.MayAct, Renewer: s.rail, Started: s.started.Load,
		Identity: s.rail.PublicKey(), SignerAddress: cfg.Signer.Endpoint(), Logger: s.log}
	if s.hosted != nil {
		hooks.StoreIdentity = s.hosted.StoreIdentity
	}
	hooks.exec = s.startExecutor(ctx, opts.NatsOptions)
	if s.resp, err = opts.Responders(hooks); err != nil {
		return fail(CodeBind, "responders", err)
	}
	if err := s.serve(runCtx); err != nil {
		return fail(CodeBind, "binding", err)
	}

	// 6. The mandatory lease watch: a core subscription on exactly $KV.<bucket>.lease.0 (see
	// pkg/profiles deliveryPerms), restored by the client after a reconnect.
	subj, err := s.n.KV(space.Delivery, space.DeliveryLeaseKey)
	if err != nil {
		return fail(CodeWatch, "lease watch", err)
	}
	if s.watch, err = s.nc.Subscribe(subj, s.onLeaseMsg); err != nil {
		return fail(CodeWatch, "lease watch", err)
	}
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		return fail(CodeWatch, "lease watch", err)
	}
	if err := s.nc.LastError(); err != nil && errors.Is(err, nats.ErrPermissionViolation) {
		return fail(CodeWatch, "lease watch refused", err)
	}

	// The liveness rail, in its queue group, until Close.
	if err := s.serveLiveness(); err != nil {
		return fail(CodeBind, "liveness rail", err)
	}

	// 7. Ready, then the upkeep.
	if err := s.lease.SetReady(ctx, true); err != nil {
		return fail(CodeLease, "delivery lease could not be marked ready", err)
	}
	s.startFeed(ctx, opts.NatsOptions)
	s.runLoops(runCtx)
	s.started.Store(true)
	return nil
}

func missingCode(err error) string {
	if errors.Is(err, plane3.ErrMissing) {
		return CodeMissing
	}
	return CodeBroker
}

func bindCode(err error) string {
	if errors.Is(err, plane3.ErrMissing) {
		return CodeMissing
	}
	return CodeBind
}

// connect opens the resident connection: reconnecting for ever (the watchdog decides when the
// broker is gone), pinging every 2.5 s with at most 2 outstanding (upstream's defaults), and
// feeding the watchdog its disconnect, reconnect and error events.
func (s *Service) connect(extra []nats.Option) (*nats.Conn, error) {
	opts := append(s.rail.NatsOptions(),
		nats.Name("deliveryd"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.PingInterval(2500*time.Millisecond), nats.MaxPingsOutstanding(2),
		// No reconnect buffer: a publish or ack made while the connection is down fails at once
		// instead of being sent when it comes back, perhaps after a successor took the lease.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				// nats.go reports its own Close as a disconnect without an error: nothing was
				// lost and nothing reconnects.
				s.log.Debug("broker connection closed")
				return
			}
			if s.wd.Disconnected(err) {
				s.log.Warn("broker connection lost: the credential expired; awaiting a proved renewal", "err", err)
				s.unavailable(CodeCredential, "the broker closed the connection as the credential expired; awaiting a proved renewal", err)
				return
			}
			s.log.Warn("broker connection lost; reconnecting", "err", err, "window", s.wd.Window())
			s.unavailable(CodeBroker, "broker connection lost; reconnecting (the broker-gone window is "+s.wd.Window().String()+")", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			s.wd.Reconnected()
			s.log.Info("broker connection restored; renewing the lease before acting again")
			select {
			case s.recheck <- struct{}{}:
			default:
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			s.wd.AsyncError(err)
			switch {
			case watchdog.IsAuthExpired(err):
				s.log.Debug("the broker closed the connection as its credential expired")
			case sub != nil:
				s.warn(CodeBroker, "broker connection error", err, "subject", sub.Subject)
			default:
				s.warn(CodeBroker, "broker connection error", err)
			}
		}),
	)
	opts = append(opts, extra...)
	servers := strings.Join(s.cfg.Brokers, ",")
	return nats.Connect(servers, opts...)
}

// swapDelay is how long after a renewal the resident connection moves onto it (upstream's
// reloadCreds swap runs 250 ms after its reply, so the reply leaves on the old connection).
const swapDelay = 250 * time.Millisecond

// onRenew is the rail's hook after it adopted a proven renewal: the watchdog learns of it, and
// the resident connection moves onto the new credential shortly rather than at the old one's
// expiry.
func (s *Service) onRenew(jti string, expires time.Time) {
	s.wd.Renewed()
	time.AfterFunc(swapDelay, func() {
		if nc := s.conn(); nc != nil && nc.IsConnected() {
			if err := nc.ForceReconnect(); err != nil {
				s.warn(CodeCredential, "reconnect onto the renewed credential failed", err)
			}
		}
	})
}

// conn is the resident connection once it exists (the rail may renew while start still runs).
func (s *Service) conn() *nats.Conn {
	s.loopMu.Lock()
	defer s.loopMu.Unlock()
	return s.nc
}

// MayAct is the lease fence: true while this instance serves, its lease's fence has not fallen,
// and the connection has not reconnected since the lease was last renewed on it.
func (s *Service) MayAct() bool {
	if s.quiesced.Load() {
		return false
	}
	if s.lease == nil || s.lease.Fenced() {
		return false
	}
	return s.nc.Stats().Reconnects == s.checked.Load()
}

// renew renews the lease; a stored renewal also marks the connection it went out on as checked
// (the reconnect count is read before the write, so a reconnect during it is checked again).
func (s *Service) renew(ctx context.Context) (lease.State, error) {
	epoch := s.nc.Stats().Reconnects
	st, err := s.lease.Renew(ctx)
	if st == lease.Held && err == nil {
		s.checked.Store(epoch)
		s.markReady()
	}
	return st, err
}

// serveLiveness subscribes the liveness rail (see the package doc).
func (s *Service) serveLiveness() error {
	tok := make([]byte, 8)
	_, _ = rand.Read(tok)
	s.liveID = hex.EncodeToString(tok)
	sub, err := s.nc.QueueSubscribe(s.n.LiveDeliveryServe(), space.LiveQueue(space.LivePlaneDelivery), s.onProbe)
	if err != nil {
		return err
	}
	s.live = sub
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		return err
	}
	if err := s.nc.LastError(); err != nil && errors.Is(err, nats.ErrPermissionViolation) {
		return err
	}
	return nil
}

// onProbe answers a liveness probe at its bound .reply. leaf, graded from this instance's state.
func (s *Service) onProbe(m *nats.Msg) {
	if !strings.HasPrefix(m.Reply, m.Subject+".reply.") {
		return
	}
	state := "unbound"
	if s.MayAct() && s.lease.Row().Ready {
		state = "bound"
	}
	b, _ := json.Marshal(LivenessAnswer{Plane: space.LivePlaneDelivery, Responder: state, Instance: s.liveID})
	if err := m.Respond(b); err != nil {
		s.log.Debug("liveness reply not sent", "err", err)
	}
}

// LivenessAnswer is the liveness rail's reply: the plane, the responder's verdict on itself
// (bound or unbound) and the opaque instance token.
type LivenessAnswer struct {
	Plane     string `json:"plane"`
	Responder string `json:"responder"`
	Instance  string `json:"instance"`
}

// serve binds the responders and starts the writer and the reader under ctx, the fence up.
func (s *Service) serve(ctx context.Context) error {
	s.loopMu.Lock()
	defer s.loopMu.Unlock()
	if s.loopCancel != nil {
		return nil
	}
	if s.draining {
		return errors.New("draining: no loop starts again")
	}
	lctx, cancel := context.WithCancel(ctx)
	s.quiesced.Store(false)
	if s.resp != nil {
		if err := s.resp.Start(lctx, s.nc); err != nil {
			s.quiesced.Store(true)
			s.resp.Stop() // unbind whatever the failed start bound
			cancel()
			return fmt.Errorf("responders: %w", err)
		}
	}
	s.loopCancel = cancel
	s.drainCh = make(chan struct{})
	for name, run := range map[string]func(context.Context, <-chan struct{}) error{"fan-out writer": s.writer.Run, "trusted reader": s.reader.Run} {
		s.loopWG.Add(1)
		go func(drain <-chan struct{}) {
			defer s.loopWG.Done()
			if err := run(lctx, drain); err != nil && lctx.Err() == nil {
				s.stop(fmt.Errorf("deliveryd: %s stopped: %w", name, err))
			}
		}(s.drainCh)
	}
	return nil
}

// quiesce drops the fence, unbinds the responders and stops the loops, waiting for them.
// Unacked messages redeliver to whoever holds the lease.
func (s *Service) quiesce() {
	s.quiesced.Store(true)
	s.unavailable(CodeLease, "quiesced: not serving while the lease is re-checked", nil)
	s.loopMu.Lock()
	defer s.loopMu.Unlock()
	if s.loopCancel == nil {
		return
	}
	if s.resp != nil {
		s.resp.Stop()
	}
	s.loopCancel()
	s.loopCancel = nil
	s.loopWG.Wait()
}

// Quiesced reports whether the service is quiesced (not serving while it holds, or re-checks,
// its lease).
func (s *Service) Quiesced() bool { return s.quiesced.Load() }

// onLeaseMsg is the lease watch: a message on lease.0 that is not this instance's own row (a
// delete, a purge or another holder's row) prompts the supervisor to read the key. A message is
// only a prompt: the subscription also sees writes the stream then rejected.
func (s *Service) onLeaseMsg(m *nats.Msg) {
	if op := m.Header.Get("KV-Operation"); op == "" && len(m.Data) <= 4096 {
		var row lease.Row
		mine := s.lease.Row()
		if json.Unmarshal(m.Data, &row) == nil && row.Holder == mine.Holder && row.Incarnation == mine.Incarnation {
			return
		}
	}
	select {
	case s.prompt <- struct{}{}:
	default:
	}
}

// runLoops starts the lease upkeep and the watchdog under ctx, and the rail's renewals under a
// context of their own that teardown ends after the release (railCancel).
func (s *Service) runLoops(ctx context.Context) {
	railCtx, railCancel := context.WithCancel(context.WithoutCancel(ctx))
	s.railCancel, s.railDone = railCancel, make(chan struct{})
	go func() {
		defer close(s.railDone)
		if err := s.rail.Run(railCtx); err != nil && !errors.Is(err, signerclient.ErrClosed) {
			s.stop(fmt.Errorf("deliveryd: delivery credential: %w", err))
		}
	}()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.keepLease(ctx)
	}()
	go func() {
		defer s.wg.Done()
		if err := s.wd.Run(ctx, watchdog.Tick); err != nil {
			s.stop(fmt.Errorf("deliveryd: %w", err))
		}
	}()
}

// keepLease renews the lease every RenewInterval, at once after a reconnect, and runs the
// recovery tree on a failed renewal, a fallen fence, or a foreign row or delete seen by the watch.
func (s *Service) keepLease(ctx context.Context) {
	t := time.NewTicker(s.lease.RenewInterval())
	defer t.Stop()
	fence := time.NewTimer(time.Until(s.lease.Fence()))
	defer fence.Stop()
	// The watch hears a write before the stream has stored it, so a prompt that reads the row
	// still ours is read again a few times: a foreign write the stream then stored shows on a
	// later read, one it rejected never does.
	var again <-chan time.Time
	rereads := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-fence.C:
			if s.lease.Fenced() {
				s.warn(CodeLease, "delivery lease fenced: no renewal stored within its TTL less the margin", nil, "last_written", s.lease.LastWritten(), "ttl", s.lease.TTL(), "margin", s.lease.Margin())
				s.recover(ctx, "the lease fence fell")
			}
		case <-s.recheck:
			st, err := s.renewAfterReconnect(ctx)
			if st == lease.Held && err == nil {
				s.log.Info("delivery lease renewed after the reconnect")
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.warn(CodeLease, "delivery lease renewal after a reconnect failed", err, "state", st.String())
			s.recover(ctx, "lease renewal after a reconnect failed")
		case <-t.C:
			st, err := s.renew(ctx)
			if st == lease.Held && err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.warn(CodeLease, "delivery lease renewal failed", err, "state", st.String())
			s.recover(ctx, "lease renewal failed")
		case <-s.prompt:
			if s.rowIsMine(ctx) {
				rereads, again = 0, time.After(leaseReread)
				break
			}
			again = nil
			s.recover(ctx, "the lease watch saw a foreign row or a delete")
		case <-again:
			if s.rowIsMine(ctx) {
				if rereads++; rereads < leaseRereads {
					again = time.After(leaseReread)
				} else {
					again = nil
					s.log.Debug("lease watch: a write to lease.0 was rejected; the row is still ours")
				}
				break
			}
			again = nil
			s.recover(ctx, "the lease watch saw a foreign row or a delete")
		}
		fence.Reset(time.Until(s.lease.Fence()))
	}
}

// leaseReread is the pause between the reads of lease.0 after a watch prompt that found the row
// still this instance's, and leaseRereads how many such reads follow the first.
const (
	leaseReread  = 250 * time.Millisecond
	leaseRereads = 4
)

// recheckAttempt bounds one renewal attempt after a reconnect, and recheckPause is the wait
// before the next. After a node loss the bucket's stream may have no leader for seconds; the
// broker drops the writes sent meanwhile unanswered, so one attempt with the lease's 5 s
// operation timeout (two, with its re-read) would leave the fence down that much longer than
// the election.
const (
	recheckAttempt = time.Second
	recheckPause   = 100 * time.Millisecond
)

// renewAfterReconnect renews the lease on the new connection, trying again after an attempt
// that got no answer (Unknown) for up to one RenewInterval and while the lease's fence stands.
// The loops keep running meanwhile with MayAct false: they fetch nothing and hand back what they
// had (plane3.AwaitFence, plane3.HandBack). Any other outcome is returned at once.
func (s *Service) renewAfterReconnect(ctx context.Context) (lease.State, error) {
	until := time.Now().Add(s.lease.RenewInterval())
	for {
		actx, cancel := context.WithTimeout(ctx, recheckAttempt)
		st, err := s.renew(actx)
		cancel()
		if st != lease.Unknown || ctx.Err() != nil || s.lease.Fenced() || time.Now().After(until) {
			return st, err
		}
		var pe *lease.PermissionError
		if errors.As(err, &pe) {
			return st, err
		}
		s.log.Debug("lease renewal after a reconnect got no answer; trying again", "err", err)
		if !plane3.Pause(ctx, recheckPause) {
			return st, err
		}
	}
}

// rowIsMine reads lease.0: true only when the stored row is this instance's.
func (s *Service) rowIsMine(ctx context.Context) bool {
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := s.kv.Get(octx, space.DeliveryLeaseKey)
	if err != nil {
		return false
	}
	var row lease.Row
	mine := s.lease.Row()
	return len(e.Value()) <= 4096 && json.Unmarshal(e.Value(), &row) == nil && row.Holder == mine.Holder && row.Incarnation == mine.Incarnation
}

// recoverRetry is the pause between re-reads while the lease's state is unknown.
const recoverRetry = time.Second

// recover is the tree of reference/delivery.md §2: quiesce, withdraw readiness, re-read and act.
func (s *Service) recover(ctx context.Context, why string) {
	s.quiesce()
	s.log.Warn("quiesced", "why", why)
	if err := s.lease.SetReady(ctx, false); err != nil {
		s.log.Debug("readiness not withdrawn", "err", err)
	}
	// A resume that fails (binding the responders can time out while JetStream elects a stream
	// leader) leaves the instance quiesced and is tried again, for at most one lease TTL.
	var resumeFailing time.Time
	retryResume := func(err error) bool {
		if resumeFailing.IsZero() {
			resumeFailing = time.Now()
		}
		if time.Since(resumeFailing) > s.lease.TTL() {
			s.stop(fmt.Errorf("deliveryd: resume failed for %v: %w", s.lease.TTL(), err))
			return false
		}
		s.warn(CodeLease, "resume failed; staying quiesced and trying again", err, "retry_in", recoverRetry)
		return plane3.Pause(ctx, recoverRetry)
	}
	for ctx.Err() == nil {
		st, err := s.renew(ctx)
		switch st {
		case lease.Held:
			rerr := s.resume(ctx, "the lease is still held")
			if rerr == nil || !retryResume(rerr) {
				return
			}
		case lease.Gone:
			epoch := s.nc.Stats().Reconnects
			if rerr := s.lease.Reacquire(ctx); rerr != nil {
				var he *lease.HeldError
				if errors.As(rerr, &he) {
					s.leaseTaken.Store(true)
				}
				s.stop(fmt.Errorf("%w: %v", ErrLeaseLost, rerr))
				return
			}
			s.checked.Store(epoch)
			rerr := s.resume(ctx, "the lease was gone and is created again")
			if rerr == nil || !retryResume(rerr) {
				return
			}
		case lease.Taken:
			s.leaseTaken.Store(true)
			s.stop(fmt.Errorf("%w: %v", ErrLeaseTaken, err))
			return
		default:
			s.warn(CodeLease, "delivery lease state unknown; staying quiesced", err, "retry_in", recoverRetry)
			if !plane3.Pause(ctx, recoverRetry) {
				return
			}
		}
	}
}

// resume re-binds and marks the lease ready; a failure to bind is returned (the caller stays
// quiesced and tries again).
func (s *Service) resume(ctx context.Context, why string) error {
	if err := s.serve(ctx); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if err := s.lease.SetReady(ctx, true); err != nil {
		s.warn(CodeLease, "resumed, but the lease could not be marked ready; the next renewal decides", err)
	}
	s.log.Info("resumed", "why", why)
	s.markReady()
	return nil
}

// Identity is the delivery credential's user public key.
func (s *Service) Identity() string { return s.rail.PublicKey() }

// Holder is the name in this instance's lease row.
func (s *Service) Holder() string { return s.holder }

// Row is this instance's lease row as last written.
func (s *Service) Row() lease.Row { return s.lease.Row() }

// refuse logs a refused start and, on the CLI path, writes the refusal file (daemon.RefuseStart;
// it removes this process's state file), reports the stop to the host and returns err as a
// *StartError.
func (s *Service) refuse(err error) error {
	s.stateFile.Store(false)
	dir := ""
	if s.cfg != nil && s.hosted == nil {
		dir = s.cfg.StateDir
	}
	se := daemon.RefuseStart(s.log, dir, FileName, "deliveryd", s.pid, err)
	s.tracker.Set(StateStopped, se.Code, se.Reason, se)
	return se
}

// Healthy is deliveryd's proof of progress for systemd's watchdog: serving (not quiesced) and its
// lease row written within three renew intervals.
func (s *Service) Healthy() error {
	if s.quiesced.Load() {
		return errors.New("deliveryd: quiesced")
	}
	if last := s.lease.LastWritten(); time.Since(last) > 3*s.lease.RenewInterval() {
		return fmt.Errorf("deliveryd: lease row last written %v ago", time.Since(last).Round(time.Second))
	}
	return nil
}
