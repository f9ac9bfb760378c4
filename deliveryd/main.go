// Command deliveryd is Cotal's durable delivery daemon for one space: the fan-out writer and the
// trusted reader behind a single-instance lease, on a delivery credential signerd mints and
// renews. It holds no signing key. See `deliveryd --help`.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
)

const usage = `deliveryd: Cotal's durable delivery daemon for one space (fan-out writer, trusted reader, lease).

Usage:
  deliveryd serve --config FILE
  deliveryd help | --help

Run "deliveryd COMMAND --help" for a command's flags.
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
	}
	fmt.Fprintf(stderr, "deliveryd: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// serve is `deliveryd serve --config FILE`: start, then wait for SIGINT/SIGTERM or a fatal
// condition (exit 1 with its message). SIGINT/SIGTERM stop the service as Close does (the lease
// released, exit 0). A fatal condition (a broker gone past its window, an expired credential, a
// lost lease) exits 1 for the supervisor to restart deliveryd: the CLI path's answer to a stop
// that a hosted instance reports through Done and Err without exiting its process.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := daemon.Flags("deliveryd serve", "deliveryd serve --config FILE", stdout, stderr)
	cfgPath := fs.String("config", "", "deliveryd's YAML configuration (required; unknown keys are refused)")
	if code, ok := daemon.ParseFlags(fs, args); !ok {
		return code
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "deliveryd serve: --config is required")
		return 2
	}
	// The service validates the values, so that a refusal once the state dir is known is also
	// written to delivery-service-refusal.json for the launcher.
	cfg, err := config.Decode(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "deliveryd: %v\n", err)
		return 1
	}
	return daemon.Serve(ctx, stderr, "deliveryd", cfg.LogLevel, func(ctx context.Context, log *slog.Logger) (daemon.Service, error) {
		svc, err := service.Start(ctx, service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: log})
		if err != nil {
			return nil, err
		}
		go daemon.Watchdog(ctx, svc.Healthy, log)
		return svc, nil
	})
}
