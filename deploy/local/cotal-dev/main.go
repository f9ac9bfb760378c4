// Command cotal-dev runs the local stack behind `make run`, every daemon a separate process with
// its own dev certificate and the dev policy, from one state directory (./.cotal-dev):
//
//   - first use only: `signerd init` (broker trust, the space's accounts) and `signerd pki init`
//     (a dev CA, signerd's server certificate, a client certificate per daemon);
//   - an embedded nats-server in operator mode that trusts signerd's accounts;
//   - `signerd serve` (the only process that reads a signing seed);
//   - the space provisioned (pkg/provision, on a one-shot provisioner credential);
//   - `deliveryd serve`, `authd serve` (with a dev IdP run in process: an Ed25519 JWKS on
//     loopback whose key lives in memory only);
//   - as root: `managerd launcher` (root) and `managerd serve` as the dev user cotal-dev-manager,
//     then two demo agents (the test agent) spawned through ManagerService, each as a uid of
//     its own from the launcher's range (devAgentUIDFirst),
//     exchanging a message through deliveryd, shown from the second agent's terminal (Attach);
//     without root, the launcher and the agents are left out (the launcher drops uids);
//   - one bearer from authd's exchange (the human arm: a dev IdP token, an actor granted with
//     `authd actor grant`) and a NATS connection with it through the auth callout, proven by a
//     publish the grant allows and one it forbids;
//   - a status table: each daemon, its identity, readiness and credential expiry (never a JWT,
//     bearer or seed).
//
// SIGINT or SIGTERM stops everything (agents through ManagerService Shutdown, each daemon with
// SIGTERM) and exits 0. A second run reuses the keys and state.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".cotal-dev", "state directory (created on first run)")
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the signerd, authd, deliveryd, managerd and testagent binaries")
	flag.StringVar(&o.space, "space", "demo", "space name")
	flag.IntVar(&o.natsPort, "nats-port", 4222, "broker client port on 127.0.0.1 (-1 for a random port)")
	flag.BoolVar(&o.once, "once", false, "stop after the status table instead of serving until interrupted")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: cotal-dev [--dir DIR] [--bin DIR] [--space NAME] [--nats-port N] [--once]\n\n"+
			"Runs the local Cotal stack (signerd, broker, authd, deliveryd, managerd launcher and serve, two demo\n"+
			"agents) from DIR and prints a status table; Ctrl-C stops it. The agent demo needs root.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "cotal-dev:", err)
		os.Exit(1)
	}
}
