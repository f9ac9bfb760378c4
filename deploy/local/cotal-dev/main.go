// Command cotal-dev runs the local stack behind `make run`: it initialises ./.cotal-dev with
// `signerd init` and `signerd pki init` on first use, starts signerd as a separate process (the
// only process that reads a seed), starts an embedded nats-server that trusts signerd's accounts,
// then mints one demo agent credential through signerd over mTLS and uses it, printing what it
// did (never a JWT or seed). Without --once it keeps the stack up, renewing the credential, until
// interrupted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".cotal-dev", "state directory (created on first run)")
	flag.StringVar(&o.signerd, "signerd", "bin/signerd", "path to the signerd binary")
	flag.StringVar(&o.space, "space", "demo", "space name")
	flag.IntVar(&o.natsPort, "nats-port", 4222, "broker client port on 127.0.0.1 (-1 for a random port)")
	flag.BoolVar(&o.once, "once", false, "stop after the demo instead of serving until interrupted")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: cotal-dev [--dir DIR] [--signerd PATH] [--space NAME] [--nats-port N] [--once]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cotal-dev:", err)
		os.Exit(1)
	}
}
