package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/cotalgo/cotal/managerd/manager"
	"github.com/cotalgo/cotal/pkg/daemon"
)

const serveSynopsis = `managerd serve --config FILE [--dev-allow-readable-seeds]

The agent supervisor of one space on this machine: ManagerService on a Unix socket, agents
started through the launcher, each as a uid of its own, every credential minted by signerd (or,
with authority: remote, its own credential issued by authd's manager-service authority). SIGTERM or
SIGINT is a default shutdown (agents keep running); ManagerService.Shutdown{with_agents} stops
them too.

It refuses to start if signerd (or the remote authority) cannot be reached or refuses it, if its instance lease is held by a live
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
  log_level: info

A remote managerd (no signerd certificate, no seed) sets authority: remote instead of a signer
section, which it refuses. authd's manager-service authority then prepares its supervisor
credential (a remote-manager credential for its identity's supervisor key), activates each start
(the epoch and registration revision go into the lease row) and renews the credential:

  authority: remote                            # default: signer (the signer section above)
  authority_url: https://auth.example/t        # authd's public_url (http only to a loopback host)
  idp_token_file: /etc/cotal/managerd/idp.token  # 0600 in a 0700 dir, this uid's; re-read per call
  owner: <the owner authd derives from the IdP token>
  actor: cli                                   # the interactive ledger actor holding supervise
  # instance_id is optional: the identity in state_dir/remote-identity.json (instance id,
  # lifecycle uid, five nkeys; 0600) is made at the first start and reused by every restart.

A remote managerd refuses Spawn (FAILED_PRECONDITION, ENROLLMENT_UNAVAILABLE) until the authority
serves managed-agent enrollment.`

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

// startServe is managerd serve once the configuration is loaded: the manager (which serves
// ManagerService itself), then what only a process does: sd_notify and the systemd watchdog.
func startServe(ctx context.Context, cfg *manager.Config, dev bool, log *slog.Logger) (*manager.Manager, error) {
	m, err := manager.Start(ctx, manager.Inputs{Config: cfg, AllowReadableSeeds: dev}, manager.RuntimeOptions{Logger: log})
	if err != nil {
		return nil, err
	}
	if _, err := daemon.Notify("READY=1"); err != nil {
		log.Warn("sd_notify", "err", err)
	}
	go daemon.Watchdog(ctx, m.Healthy, log)
	return m, nil
}
