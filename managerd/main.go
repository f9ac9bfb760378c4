// Command managerd is Cotal's agent supervisor for one machine: `managerd serve` (ManagerService,
// signerless), `managerd launcher` (the uid-dropping launcher, its own process) and `managerd
// provision` (a space's streams and buckets). See `managerd --help`.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/cotalgo/cotal/managerd/internal/launcher"
	"github.com/cotalgo/cotal/pkg/daemon"
)

const usage = `managerd: Cotal's agent supervisor for one machine.

Usage:
  managerd serve --config FILE                 the supervisor: ManagerService on a Unix socket
  managerd launcher --config FILE              the uid-dropping launcher (root, or CAP_SETUID/CAP_SETGID)
  managerd provision --space S --config FILE   create a space's streams and buckets, once
  managerd help | --help

Run "managerd COMMAND --help" for a command's flags.
`

func main() {
	// An agent's trampoline: the launcher re-executes this binary as root in the agent's cgroup
	// to drop every privilege before the connector runs (launcher.Trampoline).
	if len(os.Args) > 2 && os.Args[1] == launcher.TrampolineArg {
		os.Exit(launcher.Trampoline(os.Args[2:]))
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code: 0 done, 1 failed or refused, 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "--help", "-h", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "launcher":
		return runLauncher(ctx, args[1:], stdout, stderr)
	case "provision":
		return runProvision(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "managerd: unknown command %q\n\n%s", args[0], usage)
	return 2
}

const launcherSynopsis = `managerd launcher --config FILE

Starts agents for managerd alone, each as a uid of its own from the agents range, in a cgroup v2
of its own, with no capability and no_new_privs: a Unix socket that admits only managerd's uid
(SO_PEERCRED) and a capability token written at each start to token_file. Needs root, or
CAP_SETUID CAP_SETGID CAP_SETPCAP CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL, and a writable
cgroup v2 directory (under systemd: Delegate=yes); refuses to start without them.

Configuration (strict YAML: an unknown key stops start-up, naming it):

  socket: /run/cotal/launcher/launcher.sock      # dir 0750 launcher:manager-gid, socket 0660
  token_file: /run/cotal/managerd/launcher.token # 0600 in a 0700 dir, both managerd's
  manager: {uid: 990, gid: 990}                  # the only peer uid admitted
  agents: {uid_first: 70000, uid_count: 1000}    # one uid (and gid) per agent; >= 1000, unused
  cgroup_parent: /sys/fs/cgroup/...              # optional; default the launcher's own cgroup
  agent_root: /var/lib/cotal/agents              # one dir per agent, agent:manager 0750
  connectors:                                    # requests name one; they carry no command
    claude: {argv: [/usr/local/bin/claude]}
  env_allow: [TERM, LANG, COTAL_SUBSCRIBE]       # variables a request may set
  path: /usr/local/bin:/usr/bin:/bin             # the agents' PATH (default)
  log_level: info`

// runLauncher is `managerd launcher --config FILE`: serve until SIGINT/SIGTERM or a failure.
func runLauncher(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := daemon.Flags("managerd launcher", launcherSynopsis, stdout, stderr)
	cfgPath := fs.String("config", "", "the launcher's YAML configuration (required; unknown keys are refused)")
	if code, ok := daemon.ParseFlags(fs, args); !ok {
		return code
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "managerd launcher: --config is required")
		return 2
	}
	// Nothing the launcher's starter left open may reach an agent.
	closed, err := launcher.CloseInheritedFDs()
	if err != nil {
		fmt.Fprintf(stderr, "managerd launcher: %v\n", err)
		return 1
	}
	cfg, err := launcher.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "managerd launcher: %v\n", err)
		return 1
	}
	return daemon.Serve(ctx, stderr, "managerd launcher", cfg.LogLevel, func(ctx context.Context, log *slog.Logger) (daemon.Service, error) {
		srv, err := launcher.Start(ctx, launcher.Inputs{Config: cfg, Logger: log})
		if err != nil {
			return nil, err
		}
		if len(closed) > 0 {
			log.Warn("launcher: closed descriptors inherited from its starter", "fds", fmt.Sprint(closed))
		}
		if _, err := daemon.Notify("READY=1"); err != nil {
			log.Warn("sd_notify", "err", err)
		}
		return srv, nil
	})
}
