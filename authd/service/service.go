package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// FileName is the discovery file's base name in the state directory: auth-service.json, and
// auth-service-refusal.json for a refused start.
const FileName = "auth-service"

// Refusal codes written to auth-service-refusal.json and carried by *StartError.
const (
	CodeConfig     = daemon.CodeConfig   // the configuration or state directory is refused
	CodeSigner     = "SIGNER"            // signerd refused or could not be reached for a credential
	CodeBroker     = "BROKER"            // the broker refused a credential or a connection
	CodePlaneHeld  = "PLANE_HELD"        // another authd holds the space's plane claim
	CodePermission = "PERMISSION"        // the broker refused a subject the plane claim needs
	CodePlane      = "PLANE"             // the plane claim failed otherwise
	CodeCallout    = "CALLOUT"           // the callout responder could not subscribe
	CodeRail       = "RAIL"              // the auth rails (register-manager, retire-lifecycle) could not subscribe
	CodeListen     = "LISTEN"            // the exchange listener could not bind
	CodeDiscovery  = "DISCOVERY"         // the discovery file could not be written
	CodeCanceled   = daemon.CodeCanceled // ctx ended before the service was ready
	CodeAccount    = "ACCOUNT"           // a hosted start's first credential is not of the assigned account
)

// StartError is a refused start (daemon.StartError): code, reason, details and cause.
type StartError = daemon.StartError

// Stop causes reported by Err after Done.
var (
	// ErrPlaneTaken: another instance's row replaced this one's plane claim.
	ErrPlaneTaken = errors.New("authd: the plane claim was taken by another instance")
	// ErrPlaneLost: no renewal reached the broker before the claim's fence (lease.Fence: the
	// last stored write plus the TTL, less the margin).
	ErrPlaneLost = errors.New("authd: the plane claim was not renewed before its fence")
)

// Service is a running authd. Its methods are safe for concurrent use.
type Service struct {
	cfg      *config.Config
	log      *slog.Logger
	pid      int
	instance string // instance.json's id (instance.go)
	readiness
	hooks     Hooks
	selection selection // select.go

	signer    *signerclient.Client
	planeRail *signerclient.Rail
	dataNC    *nats.Conn
	plane     *lease.Lease
	gate      *planeGate           // closes the callout while the claim is unproven (reclaim.go)
	authority *authority.Authority // the lifecycle authority on dataNC (authority.go)
	account   string               // the space's data account (GetSpace), set by startAuthority
	rails     []*nats.Subscription // the auth rails on the plane connection (authority.go)
	retire    retirement           // boot resume and the retire door (retire.go)
	callout   calloutPart
	ln        net.Listener
	http      *http.Server
	url       string
	// The public face (public.go), when public_listen is set.
	pubLn     net.Listener
	pubHTTP   *http.Server
	publicURL string

	cancel context.CancelFunc
	wg     sync.WaitGroup

	stopOnce sync.Once
	done     chan struct{}
	errMu    sync.Mutex
	err      error // why it stopped; guarded by errMu
}

// Start runs authd until ctx ends or Close is called, and returns once it is ready (see the
// package doc for the order). A refusal is a *StartError, also written to the refusal file when
// the state directory can hold it (CLI path).
func Start(ctx context.Context, in Inputs, opts RuntimeOptions) (*Service, error) {
	if in.Config == nil {
		return nil, &StartError{Daemon: "authd", Code: CodeConfig, Reason: "no configuration"}
	}
	// Refused before any effect: no refusal file, no event.
	sel, err := newSelection(in, opts)
	if err != nil {
		return nil, &StartError{Daemon: "authd", Code: CodeConfig, Reason: "runtime options refused", Err: err}
	}
	cfg := *in.Config
	s := &Service{cfg: &cfg, log: opts.Logger, pid: opts.PID, done: make(chan struct{}), hooks: opts.Hooks, selection: sel}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.pid == 0 {
		s.pid = os.Getpid()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s.readiness = newReadiness(in.Hosted, opts)
	if err := cfg.Validate(); err != nil {
		return nil, s.refuse(&StartError{Code: CodeConfig, Reason: "configuration refused", Err: err})
	}
	if err := checkHosted(s.hosted); err != nil {
		return nil, s.refuse(&StartError{Code: CodeConfig, Reason: "hosted inputs refused", Err: err})
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if err := s.start(ctx, runCtx, opts); err != nil {
		s.teardown(context.Background())
		return nil, s.refuse(err)
	}
	s.log.Info("authd ready", "space", cfg.Space, "url", s.url, "public_url", s.publicURL, "pid", s.pid, "hosted", s.hosted != nil)
	if s.hooks.OnReady != nil {
		s.hook("the OnReady hook", s.hooks.OnReady)
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
// the caller. in is the normalized RuntimeOptions (Now set).
func (s *Service) start(ctx, runCtx context.Context, in RuntimeOptions) error {
	cfg := s.cfg
	fail := func(code, reason string, err error) error {
		if ctx.Err() != nil {
			return &StartError{Code: CodeCanceled, Reason: "start canceled", Err: ctx.Err()}
		}
		return &StartError{Code: code, Reason: reason, Err: err}
	}
	led, err := ledger.Open(cfg.StateDir)
	if err != nil {
		return fail(CodeConfig, "state directory refused", err)
	}
	if s.instance, err = loadInstance(cfg.StateDir, cfg.Space, cfg.InstanceID, in.Now); err != nil {
		return fail(CodeIdentity, "instance identity refused", err)
	}
	// A bad idp.json shows at start; a missing one is read when the first human exchange comes
	// (idp.Pinned), so `authd idp pin` takes effect without a restart.
	if _, err := idp.Load(cfg.StateDir); err != nil && !errors.Is(err, idp.ErrNotPinned) {
		return fail(CodeConfig, "idp.json refused", err)
	}
	idpv := idp.NewPinned(cfg.StateDir, idp.Options{Client: in.IdPClient, Now: in.Now})

	sc := cfg.Signer.ClientConfig()
	sc.Logger = s.log
	if s.signer, err = signerclient.Dial(sc); err != nil {
		return fail(CodeConfig, "signer client refused", err)
	}

	// The data-account connection and the plane claim come first: a second authd must refuse
	// before it touches the callout subject.
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return fail(CodeConfig, "space refused", err)
	}
	if s.planeRail, err = signerclient.NewRail(signerclient.RailConfig{
		Client: s.signer, Space: cfg.Space, Profile: signerv1.Profile_PROFILE_AUTH_PLANE,
		NatsURLs: cfg.Brokers, Logger: s.log, Now: in.Now, OnRenewFailed: s.renewFailed("auth-plane"),
	}); err != nil {
		return fail(CodeConfig, "plane rail refused", err)
	}
	if err := s.planeRail.Start(ctx); err != nil {
		return fail(railCode(err), "no auth-plane credential", err)
	}
	if err := s.checkAccount(); err != nil {
		return err
	}
	s.dataNC, err = connect(cfg, s.planeRail, planeConnName, s.connOptions(planeConnName, in.NatsOptions))
	if err != nil {
		return fail(CodeBroker, "data-account connection refused", err)
	}
	// Both lifecycle-authority stores must exist as provisioned before anything reads or
	// writes one, the plane claim included.
	if err := checkStores(ctx, s.dataNC, n); err != nil {
		if ctx.Err() != nil {
			return fail(CodeStore, "", err) // reported as canceled
		}
		return err
	}
	bucket, err := n.Bucket(space.Auth)
	if err != nil {
		return fail(CodeConfig, "space refused", err)
	}
	host, _ := os.Hostname()
	s.plane, err = lease.Acquire(ctx, lease.Config{
		Conn: s.dataNC, Bucket: bucket, Key: profiles.PlaneKey,
		Holder: "authd " + host + " pid " + strconv.Itoa(s.pid), Now: in.Now, KeyTTL: cfg.PlaneTTL.D(),
		Instance: s.instance, User: s.planeRail.PublicKey(), ConnName: planeConnName, Reclaim: newPlaneSweep(s.dataNC, bucket).reclaim,
	})
	if err != nil {
		var he *lease.HeldError
		var pe *lease.PermissionError
		switch {
		case errors.As(err, &he):
			return planeHeld(cfg, s.instance, he, err)
		case errors.As(err, &pe):
			return fail(CodePermission, "the broker refused the auth-plane credential a subject of the plane claim", err)
		}
		return fail(CodePlane, "plane claim failed", err)
	}
	s.logReclaim()
	s.gate = newPlaneGate(s.dataNC, s.plane)
	s.retire.plane = runCtx
	if err := s.startAuthority(ctx, n, led, in.Now, in.NatsOptions); err != nil {
		if ctx.Err() != nil {
			return fail(CodeSigner, "", err) // reported as canceled
		}
		return err
	}
	if err := s.startRetirement(ctx); err != nil {
		if ctx.Err() != nil {
			return fail(CodeStore, "", err) // reported as canceled
		}
		return err
	}
	if err := s.startRails(runCtx); err != nil {
		return fail(CodeRail, "the auth rails could not subscribe", err)
	}

	if s.callout, err = startCallout(ctx, runCtx, s, in, led); err != nil {
		if ctx.Err() != nil {
			return fail(CodeCallout, "", err) // reported as canceled
		}
		return err
	}
	s.retire.idle.Set(s.callout.resp)

	capBytes := make([]byte, exchange.CapHexLen/2)
	if _, err := rand.Read(capBytes); err != nil {
		return fail(CodeConfig, "random cap", err)
	}
	capHex := hex.EncodeToString(capBytes)
	clear(capBytes)
	s.capHex = capHex
	doors, err := s.lifecycleDoors(capHex)
	if err != nil {
		return fail(CodeConfig, "lifecycle doors refused", err)
	}
	selector, err := s.selection.selector(s.authority.Store())
	if err != nil {
		return fail(CodeConfig, "manager selection refused", err)
	}
	// Each face has one failure window, its /exchange's and its service endpoint door's.
	failures, pubFailures := exchange.NewFailureThrottle(), exchange.NewThrottle(exchange.MaxFailures, exchange.FailureWindow, exchange.DefaultMaxPeers)
	sep, err := s.serviceEndpoints(idpv, led, failures, true, in.Now)
	if err != nil {
		return fail(CodeConfig, "service endpoint door refused", err)
	}
	msa, err := s.managerAuthority(idpv, failures, true, in.Now)
	if err != nil {
		return fail(CodeConfig, "manager-service authority door refused", err)
	}
	h, err := exchange.New(exchange.Config{Space: cfg.Space, Signer: s.signer, Ledger: led, IdP: idpv, Selector: selector, Cap: capHex, Now: in.Now, Logger: s.log,
		Activator: s.authority, Lifecycle: doors, ServiceEndpoints: sep, ManagerAuthority: msa, Throttle: failures})
	if err != nil {
		return fail(CodeConfig, "exchange refused", err)
	}
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fail(CodeListen, "exchange listener", err)
	}
	s.url = "http://" + s.ln.Addr().String()
	s.http = exchange.NewServer(h)
	s.http.ErrorLog = slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.http.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.stop(fmt.Errorf("authd: exchange listener: %w", err))
		}
	}()

	pubSep, err := s.serviceEndpoints(idpv, led, pubFailures, false, in.Now)
	if err != nil {
		return fail(CodeConfig, "public service endpoint door refused", err)
	}
	pubMSA, err := s.managerAuthority(idpv, pubFailures, false, in.Now)
	if err != nil {
		return fail(CodeConfig, "public manager-service authority door refused", err)
	}
	if err := s.startPublic(exchange.Config{Space: cfg.Space, Signer: s.signer, Ledger: led, IdP: idpv, Selector: selector, Now: in.Now, Logger: s.log,
		Activator: s.authority, Throttle: pubFailures}, pubSep, pubMSA); err != nil {
		return err
	}

	if err := s.plane.SetReady(ctx, true); err != nil {
		return fail(CodePlane, "plane claim could not be marked ready", err)
	}
	s.runLoops(runCtx)
	if err := s.publish(); err != nil {
		return fail(CodeDiscovery, "discovery file", err)
	}
	return nil
}

// railCode tells a signerd refusal from a broker refusal of the credential.
func railCode(err error) string {
	var pe *signerclient.ProofError
	if errors.As(err, &pe) {
		return CodeBroker
	}
	return CodeSigner
}

// connect opens a reconnecting broker connection authenticated by rail.
func connect(cfg *config.Config, rail *signerclient.Rail, name string, extra []nats.Option) (*nats.Conn, error) {
	opts := append(rail.NatsOptions(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	opts = append(opts, extra...)
	servers := strings.Join(cfg.Brokers, ",")
	return nats.Connect(servers, opts...)
}

// runLoops starts the rails' renewals and the claim's upkeep under ctx.
func (s *Service) runLoops(ctx context.Context) {
	rails := []*signerclient.Rail{s.planeRail}
	if r := s.callout.rail(); r != nil {
		rails = append(rails, r)
	}
	for _, r := range rails {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, signerclient.ErrClosed) {
				if errors.Is(err, signerclient.ErrExpired) {
					s.unavailable(CodeCredential, "a credential expired without renewal", err)
				}
				s.stop(fmt.Errorf("authd: credential renewal: %w", err))
			}
		}()
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.keepPlane(ctx)
	}()
	go func() {
		defer s.wg.Done()
		s.fencePlane(ctx)
	}()
}

// planeRetry is the pause between renewals after one failed: the fence leaves four tenths of
// the TTL (12 s at the default) to get one through, and a renewal every half TTL would try once.
const planeRetry = time.Second

// fencePlane waits for the claim's fence and, if no renewal moved it by then, closes the
// callout responder before anything else (unsubscribed, requests in flight canceled and waited
// for) and stops the service. It runs apart from keepPlane because a renewal may hang on an
// unanswering broker for longer than the fence leaves.
func (s *Service) fencePlane(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fence := s.plane.Fence()
		if left := time.Until(fence); left > 0 && !s.plane.Fenced() {
			t.Reset(left)
			continue
		}
		s.callout.closeResponder()
		s.log.Error("plane claim fenced: the callout no longer answers", "last_written", s.plane.LastWritten(), "ttl", s.plane.TTL(), "margin", s.plane.Margin())
		s.unavailable(CodeFence, "plane claim fenced: the callout no longer answers", nil)
		s.stop(fmt.Errorf("%w: last stored write %v ago", ErrPlaneLost, time.Since(s.plane.LastWritten()).Round(time.Millisecond)))
		return
	}
}

// keepPlane renews the claim every half TTL (every planeRetry while renewals fail) and acts on
// what a failed renewal learns. It never decides that the claim is lost by time: fencePlane does.
func (s *Service) keepPlane(ctx context.Context) {
	t := time.NewTimer(s.plane.RenewInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.gate.kicked(): // a reconnect: prove the claim again before the callout answers
		}
		next := s.plane.RenewInterval()
		st, err := s.plane.Renew(ctx)
		switch st {
		case lease.Held:
		case lease.Gone:
			s.log.Warn("plane claim gone; claiming it again", "err", err)
			s.warn(CodePlane, "plane claim gone; claiming it again", err)
			if rerr := s.plane.Reacquire(ctx); rerr != nil {
				s.stop(fmt.Errorf("%w: %v", ErrPlaneTaken, rerr))
				return
			}
			if rerr := s.plane.SetReady(ctx, true); rerr != nil {
				s.log.Warn("plane claim re-created but not marked ready", "err", rerr)
				s.warn(CodePlane, "plane claim re-created but not marked ready", rerr)
			}
		case lease.Taken:
			s.callout.closeResponder()
			s.stop(fmt.Errorf("%w: %v", ErrPlaneTaken, err))
			return
		default:
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("plane claim renewal unanswered; retrying before the fence", "err", err, "fence_in", time.Until(s.plane.Fence()).Round(time.Millisecond), "retry_in", planeRetry)
			s.warn(CodePlane, "plane claim renewal unanswered; retrying before the fence", err)
			next = min(next, planeRetry)
		}
		t.Reset(next)
	}
}

// Ready waits until the authd running as pid with state directory stateDir is ready, or refused,
// or gone: daemon.Ready on auth-service.json (see there). The capability stays in the file.
func Ready(ctx context.Context, stateDir string, pid int) (daemon.ReadyInfo, error) {
	return daemon.Ready(ctx, stateDir, FileName, pid)
}

// URL is the exchange face, http://127.0.0.1:<port>.
func (s *Service) URL() string { return s.url }

// Done is closed when the service has stopped; Err then says why.
func (s *Service) Done() <-chan struct{} { return s.done }

// Err is why the service stopped: daemon.ErrStopped after Close, context.Canceled when Start's
// ctx ended, or the failure that stopped it; nil while it runs.
func (s *Service) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// Close withdraws serving (discovery file, listener, callout subscription), releases this
// instance's plane claim (only if the row is still its own) and closes every connection. It is
// idempotent and returns once everything is down, or with ctx's error when ctx ends first (the
// teardown goes on, bounded by shutdown_timeout). Its error wraps ErrReleaseUnconfirmed when the
// broker did not confirm the release (the claim then expires with its TTL); every call, and a
// Close after the service stopped on its own, returns the same verdict.
func (s *Service) Close(ctx context.Context) error {
	s.stop(daemon.ErrStopped)
	select {
	case <-s.done:
		return s.releaseErr
	case <-ctx.Done():
		return fmt.Errorf("authd: close: %w", ctx.Err())
	}
}

// stop records why and tears down once.
func (s *Service) stop(why error) {
	s.stopOnce.Do(func() {
		s.errMu.Lock()
		s.err = why
		s.errMu.Unlock()
		if !errors.Is(why, daemon.ErrStopped) && !errors.Is(why, context.Canceled) {
			s.log.Error("authd stopping", "err", why)
		}
		s.stopping(why)
		if s.hooks.OnStopping != nil {
			s.hook("the OnStopping hook", s.hooks.OnStopping)
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout.D())
			defer cancel()
			s.teardown(ctx)
			s.stopped(why)
			close(s.done)
		}()
	})
}

// teardown undoes whatever start did, in reverse; every part tolerates not having started.
// Readiness goes first, so no caller is sent to a service that is going away.
func (s *Service) teardown(ctx context.Context) {
	s.withdraw()
	s.closeRails()
	// The callout goes before the exchange: its answers are what the plane claim fences, and the
	// exchange's shutdown waits for requests in flight.
	s.callout.close()
	if s.http != nil {
		if err := s.http.Shutdown(ctx); err != nil {
			_ = s.http.Close()
		}
	} else if s.ln != nil {
		_ = s.ln.Close()
	}
	s.closePublic(ctx)
	if s.cancel != nil {
		s.cancel()
	}
	if s.plane != nil {
		if err := s.plane.Release(ctx); err != nil {
			s.log.Warn("plane claim not released; it expires with its TTL", "err", err)
			s.releaseErr = fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, err)
		}
	}
	if s.dataNC != nil {
		s.dataNC.Close()
	}
	s.wg.Wait()
	if s.planeRail != nil {
		s.planeRail.Close()
	}
	if s.signer != nil {
		_ = s.signer.Close()
	}
}

// refuse writes the refusal file for a failed start (daemon.RefuseStart; a hosted context writes
// none), reports the state stopped and returns err as a *StartError.
func (s *Service) refuse(err error) error {
	dir := s.cfg.StateDir
	if s.hosted != nil {
		dir = ""
	}
	se := daemon.RefuseStart(s.log, dir, FileName, "authd", s.pid, err)
	s.stopped(se)
	return se
}

// Healthy is authd's proof of progress for systemd's watchdog: its plane claim written within
// three renew intervals.
func (s *Service) Healthy() error {
	if last := s.plane.LastWritten(); time.Since(last) > 3*s.plane.RenewInterval() {
		return fmt.Errorf("authd: plane claim last written %v ago", time.Since(last).Round(time.Second))
	}
	return nil
}

// hook calls a host's lifecycle hook behind the rejection guard (daemon.Guard): a panic is
// logged and raised as a HOOK warning, and authd goes on (a stop still runs to its end).
func (s *Service) hook(name string, f func()) {
	err := daemon.Guard(name, func() error { f(); return nil })
	if err == nil {
		return
	}
	s.log.Error("a host hook was rejected; authd goes on", "err", err)
	s.warn(CodeHook, "a host hook was rejected; authd goes on", err)
}
