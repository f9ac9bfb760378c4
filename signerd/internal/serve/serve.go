package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
	"github.com/cotalgo/cotal/signerd/internal/server"
)

// Signer is a running signerd: build it with Start, stop it with Stop or by cancelling the
// context given to Run.
type Signer struct {
	cfg      *Config
	log      *slog.Logger
	keys     *keystore.Store
	policy   *policy.Store
	audit    *audit.Log
	svc      *server.Service
	flushEnd func() // ends svc.Run after its last write of refusal counts; set by Run
	grpc     *grpc.Server
	health   *health.Server
	lis      net.Listener
	metrics  *http.Server
	mlis     net.Listener
	reloader *mtls.Reloader
	hup      chan os.Signal
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// Options are optional parts for Start.
type Options struct {
	// Now is the clock for the service, the TLS handshake and the audit log; nil means time.Now.
	Now func() time.Time
	// Registry receives the metrics; nil means a fresh registry.
	Registry *prometheus.Registry
	// AuditIO replaces the audit log's write and fsync; the zero value means the real ones.
	// Tests use it to fail the disk (ENOSPC) under a running signer.
	AuditIO audit.IO
	// NoStream serves SignerService without its Stream RPC (UNIMPLEMENTED, as a signerd from
	// before it); tests use it for the clients' fallback to the unary RPCs.
	NoStream bool
}

// Start opens everything cfg names and binds the listeners; it returns once the server is ready
// to accept connections. Nothing is served if any part fails, and what was opened is closed.
func Start(cfg *Config, log *slog.Logger, opts Options) (s *Signer, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	if err := DisableCoreDumps(); err != nil {
		return nil, err
	}
	// sg, not the named result, is what the cleanup sees: `return nil, err` sets s to nil before
	// deferred functions run.
	sg := &Signer{cfg: cfg, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	s = sg
	defer func() {
		if err != nil {
			// Serve never ran, so neither GracefulStop nor Shutdown will close the listeners.
			if sg.lis != nil {
				_ = sg.lis.Close()
			}
			if sg.mlis != nil {
				_ = sg.mlis.Close()
			}
			sg.closeAll()
			s = nil
		}
	}()

	kcfg := keystore.Config{KeyDir: cfg.KeyDir, PublicDir: cfg.PublicDir}
	if dir := os.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
		if cfg.KeyDir != "" {
			log.Info("reading keys from $CREDENTIALS_DIRECTORY; key_dir is ignored", "key_dir", cfg.KeyDir)
		}
		kcfg.KeyDir, kcfg.Flat = dir, true
	}
	if s.keys, err = keystore.Open(kcfg); err != nil {
		return nil, err
	}
	pol, err := policy.Load(cfg.Policy)
	if err != nil {
		return nil, err
	}
	s.policy = policy.NewStore(pol)

	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	metrics, err := server.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	if s.audit, err = audit.New(audit.Config{
		Path: cfg.Audit.Path, Replica: cfg.Audit.Replica, MaxBatch: cfg.Audit.MaxBatch,
		MaxDelay: time.Duration(cfg.Audit.MaxDelay), Now: now, OnBatch: metrics.ObserveAuditBatch,
		MaxBytes: cfg.Audit.MaxBytes, IO: opts.AuditIO, Logger: log,
	}); err != nil {
		return nil, err
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "signerd_connections_refused_total",
		Help: "Connections closed at accept because a connection cap was reached, by cap (total, per-source).",
	}, []string{"cap"})
	if err := reg.Register(refused); err != nil {
		return nil, err
	}

	tlsOpts := []mtls.Option{mtls.WithPollInterval(time.Duration(cfg.TLS.ReloadInterval))}
	if opts.Now != nil {
		tlsOpts = append(tlsOpts, mtls.WithClock(now))
	}
	tlsCfg, reloader, err := mtls.NewServerTLS(mtls.ServerFiles{CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key, ClientCAFile: cfg.TLS.ClientCA}, tlsOpts...)
	if err != nil {
		return nil, err
	}
	s.reloader = reloader
	// Every request re-verifies its caller against the CA pool the reloader holds now.
	peers, err := mtls.NewCallerVerifier(reloader.CAPool, now)
	if err != nil {
		return nil, err
	}

	svc, err := server.New(server.Config{
		Keys: s.keys, Policy: s.policy, Limiter: policy.NewLimiter(s.policy.Current, now),
		Audit: s.audit, Peers: peers, Now: now, Logger: log, Metrics: metrics,
		IdempotencyBytes: cfg.Idempotency.MaxBytes, IdempotencyCallerBytes: cfg.Idempotency.CallerBytes,
		NoStream: opts.NoStream,
	})
	if err != nil {
		return nil, err
	}
	s.svc = svc

	// No per-call logging interceptor: every decision is in the audit log, and the service logs
	// denials and internal errors itself. Recovery turns a handler panic into INTERNAL.
	s.grpc = grpc.NewServer(append(cfg.Limits.ServerOptions(),
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
			log.Error("panic in handler", "panic", fmt.Sprint(p))
			return status.Error(codes.Internal, "internal error")
		}))),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
			log.Error("panic in stream handler", "panic", fmt.Sprint(p))
			return status.Error(codes.Internal, "internal error")
		}))),
	)...)
	svc.Register(s.grpc)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	if s.lis, err = listen(cfg.Listen); err != nil {
		return nil, err
	}
	s.lis = newLimitListener(s.lis, cfg.Limits, refused)
	if cfg.MetricsListen != "" {
		if s.mlis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		s.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	// SIGHUP is caught from here on, so a reload signal sent once Start returns never falls
	// through to the default action (terminate).
	s.hup = make(chan os.Signal, 1)
	signal.Notify(s.hup, syscall.SIGHUP)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(signerv1.SignerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Addr is the gRPC listener's address.
func (s *Signer) Addr() net.Addr { return s.lis.Addr() }

// MetricsAddr is the metrics listener's address, or nil.
func (s *Signer) MetricsAddr() net.Addr {
	if s.mlis == nil {
		return nil
	}
	return s.mlis.Addr()
}

// Run serves until ctx ends or SIGTERM/SIGINT arrives, reloading the policy and rotating the audit
// log on SIGHUP, reloading the policy when the file changes, and the TLS files when they change.
// It then stops gracefully (in-flight calls finish within ShutdownTimeout, then the rest are
// cut), closes the audit log and wipes every key. A clean stop returns nil; a broken audit log stops it with an error (see
// watchAudit), and so does any stop after the log broke.
func (s *Signer) Run(ctx context.Context) error {
	defer close(s.done)
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()

	defer signal.Stop(s.hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.hup:
				s.reloadPolicy(s.policy.ReloadFile(s.cfg.Policy))
				s.rotateAudit(ctx)
			}
		}
	}()
	go s.policy.Watch(ctx, s.cfg.Policy, time.Duration(s.cfg.PolicyReloadInterval), s.reloadPolicy)
	go s.reloader.Run(ctx, time.Duration(s.cfg.TLS.ReloadInterval), func(err error) {
		s.log.Warn("TLS files not reloaded; keeping the current ones", "err", err)
	})

	// The service's refusal flusher outlives serving: shutdown ends it once gRPC has stopped,
	// so its last write holds every refusal counted, and before the audit log is closed.
	flushCtx, stopFlush := context.WithCancel(context.WithoutCancel(ctx))
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = s.svc.Run(flushCtx) }()
	s.flushEnd = func() { stopFlush(); <-flushed }

	errc := make(chan error, 3)
	go s.watchAudit(ctx, errc)
	go func() { errc <- s.grpc.Serve(s.lis) }()
	if s.metrics != nil {
		go func() {
			if err := s.metrics.Serve(s.mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics: %w", err)
			}
		}()
	}
	s.log.Info("signerd serving", "listen", s.lis.Addr().String(), "replica", s.cfg.Audit.Replica, "spaces", s.keys.Spaces())
	// The listener is bound and keys, policy, CA and audit log are loaded (Start), and it is
	// being served: only now does a Type=notify unit count signerd as started, so units ordered
	// After= it do not dial too early.
	if _, err := daemon.Notify("READY=1"); err != nil {
		s.log.Warn("sd_notify READY failed", "err", err)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.shutdown()
	return s.auditFailure(runErr)
}

func (s *Signer) reloadPolicy(err error) {
	if err != nil {
		s.log.Error("policy not reloaded; keeping the current policy", "path", s.cfg.Policy, "err", err)
		return
	}
	s.log.Info("policy reloaded", "path", s.cfg.Policy)
}

// Drain turns health NOT_SERVING on every service name and keeps it so, while the listener
// stays open and calls are still answered: clients that check health (pkg/signerclient watches
// the SignerService name) send this replica no new call. It takes a replica out of rotation
// before it is stopped; there is no way back but a restart.
func (s *Signer) Drain() {
	s.health.Shutdown()
	// Streams are told to drain too: their callers half-close them once every request sent is
	// answered, and open their next stream on a replica that is serving.
	s.svc.StopStreams()
	s.log.Info("signerd draining: health NOT_SERVING")
}

// ReplicaID is the replica id that names this signerd's audit chain (audit.replica).
func (s *Signer) ReplicaID() string { return s.cfg.Audit.Replica }

// Stop ends Run and waits for it to return. Run must have been called.
func (s *Signer) Stop() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

func (s *Signer) shutdown() {
	if _, err := daemon.Notify("STOPPING=1"); err != nil {
		s.log.Warn("sd_notify STOPPING failed", "err", err)
	}
	s.health.Shutdown()
	// Open Streams would hold GracefulStop until ShutdownTimeout: each is told to drain, and ends
	// once its caller half-closes it with every request answered (server.StreamDrainGrace).
	s.svc.StopStreams()
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Duration(s.cfg.ShutdownTimeout)):
		s.log.Warn("graceful stop timed out; closing remaining connections")
		s.grpc.Stop()
	}
	if s.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.metrics.Shutdown(ctx)
		cancel()
	}
	if s.flushEnd != nil {
		s.flushEnd()
	}
	s.closeAll()
	s.log.Info("signerd stopped")
}

// closeAll closes the audit log and wipes the keys; safe on a partly started Signer.
func (s *Signer) closeAll() {
	if s.audit != nil {
		if err := s.audit.Close(); err != nil {
			s.log.Error("closing audit log", "err", err)
		}
	}
	if s.keys != nil {
		s.keys.Close()
	}
}

// listen binds "host:port" or "unix:/path". A Unix socket is created 0660 and an existing
// non-socket file at its path is refused.
func listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		return lis, nil
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen: remove stale socket: %w", err)
		}
	}
	old := unix.Umask(0o117)
	lis, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

// DisableCoreDumps sets RLIMIT_CORE to 0 and marks the process non-dumpable, so neither a
// crash nor a same-uid ptrace or /proc/<pid>/mem read can copy the keys out.
func DisableCoreDumps() error {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: 0, Max: 0}); err != nil {
		return fmt.Errorf("disable core dumps: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("disable core dumps: prctl: %w", err)
	}
	return nil
}
