package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/manager"
	"github.com/cotalgo/cotal/pkg/daemon"
)

const serveSynopsis = `managerd serve --config FILE [--dev-allow-readable-seeds]

The agent supervisor of one space on this machine: ManagerService on a Unix socket, agents
started through the launcher, each as a uid of its own, every credential minted by signerd. SIGTERM or
SIGINT is a default shutdown (agents keep running); ManagerService.Shutdown{with_agents} stops
them too.

It refuses to start if signerd cannot be reached, if its instance lease is held by a live
manager (or a manager on another root), or if it can open any file under signer_seed_paths:
managerd's uid must not be able to read a signing key. --dev-allow-readable-seeds lets a
single-uid development stack past that last check, with a loud warning; never in a deployment.

Configuration (strict YAML: an unknown key stops start-up, naming it):

  space: alpha
  brokers: [nats://127.0.0.1:4222]
  signer: {address: 127.0.0.1:7443, ca: /etc/cotal/managerd/signer-ca.pem,
           cert: /etc/cotal/managerd/client.pem, key: /etc/cotal/managerd/client-key.pem}
  state_dir: /var/lib/cotal/managerd           # 0700, managerd's
  instance_id: <26-32 chars of [a-z0-9]>       # lease.<instance_id> in cotal_manager_<space>
  root: /srv/cotal                             # the workspace root this instance serves
  owner: local                                 # managerd's own principal (supervisor)
  actor: manager
  agent_owner: local                           # agents' owner token (default: owner)
  launcher: {socket: /run/cotal/launcher/launcher.sock, token_file: /run/cotal/managerd/launcher.token}
  api: {socket: /run/cotal/manager/manager.sock, allow_uids: [1000]}
  connectors: [claude]                         # each must be in the launcher's table
  env_allow: [TERM, LANG]
  capacity: 16
  agent_ttl: 1h                                # asked of signerd per agent credential
  signer_seed_paths: [/var/lib/cotal/signerd/signer, /var/lib/cotal/signerd/operator]
  log_level: info`

// drainTimeout bounds how long in-flight calls (the Shutdown answer among them) may finish once
// the manager has stopped; Attach streams are cut after it.
const drainTimeout = 2 * time.Second

// runServe is `managerd serve --config FILE`.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := daemon.Flags("managerd serve", serveSynopsis, stdout, stderr)
	cfgPath := fs.String("config", "", "managerd's YAML configuration (required; unknown keys are refused)")
	dev := fs.Bool("dev-allow-readable-seeds", false, "DEVELOPMENT ONLY: start even if a signer key is readable by this uid")
	if code, ok := daemon.ParseFlags(fs, args); !ok {
		return code
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "managerd serve: --config is required")
		return 2
	}
	cfg, err := manager.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "managerd serve: %v\n", err)
		return 1
	}
	return daemon.Serve(ctx, stderr, "managerd serve", cfg.LogLevel, func(ctx context.Context, log *slog.Logger) (daemon.Service, error) {
		return startServe(ctx, cfg, *dev, log)
	})
}

// served is managerd serve: the manager and its API server.
type served struct {
	m    *manager.Manager
	gs   *grpc.Server
	done chan struct{}
}

func (s *served) Done() <-chan struct{} { return s.done }
func (s *served) Err() error            { return s.m.Err() }

func startServe(ctx context.Context, cfg *manager.Config, dev bool, log *slog.Logger) (*served, error) {
	m, err := manager.New(manager.Inputs{Config: cfg, Logger: log, AllowReadableSeeds: dev})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	ln, err := api.Listen(cfg.API.Socket, -1)
	if err != nil {
		_, _ = m.Shutdown(context.Background(), false)
		return nil, err
	}
	s := &served{m: m, gs: api.NewServer(m.Backend(), api.Options{AllowUIDs: cfg.API.AllowUIDs, Logger: log}), done: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- s.gs.Serve(ln) }()
	go func() {
		select {
		case <-ctx.Done():
			log.Info("signal: default shutdown (agents keep running)")
			if _, err := m.Shutdown(context.Background(), false); err != nil {
				log.Error("shutdown", "err", err)
			}
		case <-m.Done():
		case err := <-served:
			if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				log.Error("ManagerService stopped serving; shutting down", "err", err)
			}
			_, _ = m.Shutdown(context.Background(), false)
		}
		<-m.Done()
		stopped := make(chan struct{})
		go func() { s.gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(drainTimeout):
			s.gs.Stop()
		}
		close(s.done)
	}()
	if _, err := daemon.Notify("READY=1"); err != nil {
		log.Warn("sd_notify", "err", err)
	}
	go daemon.Watchdog(ctx, m.Healthy, log)
	log.Info("ManagerService serving", "socket", cfg.API.Socket, "allow_uids", cfg.API.AllowUIDs)
	return s, nil
}
