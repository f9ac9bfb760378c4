package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Flags is a subcommand's FlagSet: errors go to stderr, and --help prints "Usage: synopsis"
// and the flags to stdout.
func Flags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fs.SetOutput(stdout)
		fmt.Fprintf(stdout, "Usage: %s\n\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// ParseFlags parses args and refuses positional arguments. When ok is false the caller returns
// code at once: 0 after --help, 2 for bad flags or arguments (named on fs's output).
func ParseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		return 2, false
	}
	return 0, true
}

// LogLevel maps a config's log_level ("debug", "info", "warn", "error") to a slog level; any
// other value, the empty one included, is info (the configs validate the value first).
func LogLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Service is a started daemon service: Done is closed when it has stopped and Err says why (nil,
// context.Canceled or ErrStopped for a stop that was asked for).
type Service interface {
	Done() <-chan struct{}
	Err() error
}

// Serve runs one daemon service to its end and returns the process's exit code. It logs JSON to
// stderr at level (LogLevel), starts the service with a context that SIGINT and SIGTERM cancel
// (NotifyContext) and waits for it to stop. A refused start or a failure is printed as
// "prefix: error" on stderr and exits 1; a stop that was asked for exits 0.
func Serve(ctx context.Context, stderr io.Writer, prefix, level string, start func(context.Context, *slog.Logger) (Service, error)) int {
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: LogLevel(level)}))
	ctx, stop := NotifyContext(ctx)
	defer stop()
	svc, err := start(ctx, log)
	if err != nil {
		fmt.Fprintln(stderr, errLine(prefix, err))
		return 1
	}
	<-svc.Done()
	if err := svc.Err(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopped) {
		fmt.Fprintln(stderr, errLine(prefix, err))
		return 1
	}
	return 0
}

// errLine is "prefix: err", without a second prefix when err already begins with it (a
// *StartError names its daemon, and the daemons' stop causes begin with their name).
func errLine(prefix string, err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, prefix+": ") {
		return msg
	}
	return prefix + ": " + msg
}
