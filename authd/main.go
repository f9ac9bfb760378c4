// Command authd is Cotal's auth service for one space: the NATS auth-callout responder, the
// loopback token exchange and the actor ledger. It holds no signing key: signerd signs every
// credential, bearer and callout answer. See `authd --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

const usage = `authd: Cotal's auth service for one space (auth callout, token exchange, actor ledger).

Usage:
  authd serve --config FILE
  authd actor [--config FILE] grant|revoke|list [flags] [--state-dir DIR]
  authd idp [--config FILE] pin URL [--state-dir DIR]
  authd help | --help

Run "authd COMMAND --help" for a command's flags.
`

func main() {
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
		return serve(ctx, args[1:], stdout, stderr)
	case "actor", "idp":
		env := admin.Env{Stdout: stdout, Stderr: stderr}
		rest, cfgPath := leadingConfig(args[1:])
		if cfgPath != "" {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				fmt.Fprintf(stderr, "authd: %v\n", err)
				return 1
			}
			env.StateDir = cfg.StateDir
			// --subject asks signerd for the owner id; only then is signerd dialled.
			env.DeriveOwner = func(ctx context.Context, issuer, subject string) (string, error) {
				sc, err := signerclient.Dial(cfg.Signer.ClientConfig())
				if err != nil {
					return "", err
				}
				defer sc.Close()
				return admin.SignerDeriveOwner(sc, cfg.Space)(ctx, issuer, subject)
			}
		}
		if args[0] == "actor" {
			return adminExit(admin.Actor(ctx, rest, env), stderr)
		}
		return adminExit(admin.IdP(ctx, rest, env), stderr)
	}
	fmt.Fprintf(stderr, "authd: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// serve is `authd serve --config FILE`: Start, then wait for SIGINT/SIGTERM or a failure.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := daemon.Flags("authd serve", "authd serve --config FILE", stdout, stderr)
	cfgPath := fs.String("config", "", "authd's YAML configuration (required; unknown keys are refused)")
	if code, ok := daemon.ParseFlags(fs, args); !ok {
		return code
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "authd serve: --config is required")
		return 2
	}
	// Start validates the values, so that a refusal once the state dir is known is also written
	// to auth-service-refusal.json for the launcher.
	cfg, err := config.Decode(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "authd: %v\n", err)
		return 1
	}
	return daemon.Serve(ctx, stderr, "authd", cfg.LogLevel, func(ctx context.Context, log *slog.Logger) (daemon.Service, error) {
		svc, err := service.Start(ctx, service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: log, Hooks: notifyHooks(log)})
		if err != nil {
			return nil, err
		}
		go daemon.Watchdog(ctx, svc.Healthy, log)
		return svc, nil
	})
}

// notifyHooks are the CLI's service hooks: sd_notify READY=1 once authd serves and STOPPING=1 when
// it begins to stop (the embedding API leaves them to the host).
func notifyHooks(log *slog.Logger) service.Hooks {
	notify := func(state string) func() {
		return func() {
			if _, err := daemon.Notify(state); err != nil {
				log.Warn("sd_notify failed", "state", state, "err", err)
			}
		}
	}
	return service.Hooks{OnReady: notify("READY=1"), OnStopping: notify("STOPPING=1")}
}

// leadingConfig takes a leading "--config FILE" (or --config=FILE) off an operator command's
// arguments, so `authd actor --config authd.yaml list` uses the configured state dir.
func leadingConfig(args []string) (rest []string, path string) {
	if len(args) >= 2 && (args[0] == "--config" || args[0] == "-config") {
		return args[2:], args[1]
	}
	if len(args) >= 1 {
		if p, ok := strings.CutPrefix(args[0], "--config="); ok {
			return args[1:], p
		}
	}
	return args, ""
}

// adminExit maps an operator command's result to an exit code: help 0, usage 2, refusal 1.
func adminExit(err error, stderr io.Writer) int {
	var ue *admin.UsageError
	switch {
	case err == nil, errors.Is(err, admin.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, ue.Msg)
		return 2
	}
	fmt.Fprintf(stderr, "authd: %v\n", err)
	return 1
}
