// Command embed runs authd, deliveryd and managerd inside one process, as a hosted platform
// composes them (docs/embedding.md): each from its public package, on the same configuration
// files the three binaries read, every credential from signerd over mTLS, no seed in this
// process. With --account the auth and delivery contexts are hosted: both must be given
// credentials of that data account, or nothing starts, and neither writes a file.
//
//	embed --authd authd.yaml --deliveryd deliveryd.yaml --managerd managerd.yaml [--account A… --lifecycle-uid UID --store-identity ID]
//
// It prints every state change and warning the three report, and stops them, last started
// first, on SIGINT or SIGTERM or when one of them stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	authd "github.com/cotalgo/cotal/authd/service"
	deliveryd "github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/managerd/manager"
	"github.com/cotalgo/cotal/pkg/daemon"
)

// options are the command line: the three configuration files and the hosted account.
type options struct {
	authd, deliveryd, managerd string
	// account, lifecycle and store are the hosted assignment; account "" runs the CLI path
	// (discovery and state files).
	account, lifecycle, store string
}

// running are the three handles, for whoever watches them (the test).
type running struct {
	Auth     *authd.Service
	Delivery *deliveryd.Service
	Manager  *manager.Manager
}

func main() {
	var o options
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: embed --authd FILE --deliveryd FILE --managerd FILE [--account A… --lifecycle-uid UID --store-identity ID]")
		fmt.Fprintln(fs.Output(), "Runs authd, deliveryd and managerd in this process (docs/embedding.md).")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.authd, "authd", "", "authd configuration file (required)")
	fs.StringVar(&o.deliveryd, "deliveryd", "", "deliveryd configuration file (required)")
	fs.StringVar(&o.managerd, "managerd", "", "managerd configuration file (required)")
	fs.StringVar(&o.account, "account", "", "run auth and delivery as hosted contexts for this data account (A…)")
	fs.StringVar(&o.lifecycle, "lifecycle-uid", "", "the hosted contexts' lifecycle uid (26 to 32 of [a-z0-9]); with --account")
	fs.StringVar(&o.store, "store-identity", "", "the identity of the store the host renews credentials through; with --account")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if o.authd == "" || o.deliveryd == "" || o.managerd == "" || fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	ctx, stop := daemon.NotifyContext(context.Background())
	defer stop()
	if err := run(ctx, o, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run starts the three daemons in order (authd, deliveryd, managerd), calls up with their
// handles once all serve, waits for ctx to end or one of them to stop, then closes them in
// reverse order. A refused start closes what already started and returns the refusal (a
// *daemon.StartError: errors.As).
func run(ctx context.Context, o options, out io.Writer, up func(running)) (err error) {
	var mu sync.Mutex
	events := func(e daemon.Event) { // the three share out; never blocks for long
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, e)
	}
	acfg, err := authd.LoadConfig(o.authd)
	if err != nil {
		return err
	}
	dcfg, err := deliveryd.LoadConfig(o.deliveryd)
	if err != nil {
		return err
	}
	mcfg, err := manager.LoadConfig(o.managerd)
	if err != nil {
		return err
	}

	// The daemons run on runCtx, which ends only if ctx ends before all three serve: after that
	// they stop by Close, in order, not all at once when ctx ends.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	started := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			cancelRun()
		case <-started:
		}
	}()

	var closers []func(context.Context) error
	defer func() { // last started, first closed; every error kept
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i](cctx))
		}
	}()

	ain := authd.Inputs{Config: acfg}
	din := deliveryd.Inputs{Config: dcfg}
	if o.account != "" {
		// One assignment for both: authd.Hosted and deliveryd.Hosted are the same type.
		h := &authd.Hosted{Account: o.account, LifecycleUID: o.lifecycle, StoreIdentity: o.store}
		ain.Hosted, din.Hosted = h, h
	}
	a, err := authd.Start(runCtx, ain, authd.RuntimeOptions{Events: events})
	if err != nil {
		return fmt.Errorf("authd: %w", err)
	}
	closers = append(closers, a.Close)
	d, err := deliveryd.Start(runCtx, din, deliveryd.RuntimeOptions{Events: events})
	if err != nil {
		return fmt.Errorf("deliveryd: %w", err)
	}
	closers = append(closers, d.Close)
	m, err := manager.Start(runCtx, manager.Inputs{Config: mcfg}, manager.RuntimeOptions{Events: events})
	if err != nil {
		return fmt.Errorf("managerd: %w", err)
	}
	closers = append(closers, m.Close)
	close(started)

	mu.Lock()
	fmt.Fprintf(out, "embedded: authd %s on %s, deliveryd %s, managerd %s\n", a.State(), a.URL(), d.State(), m.State())
	mu.Unlock()
	if up != nil {
		up(running{Auth: a, Delivery: d, Manager: m})
	}
	select {
	case <-ctx.Done():
		return nil
	case <-a.Done():
		return fmt.Errorf("authd stopped: %w", a.Err())
	case <-d.Done():
		return fmt.Errorf("deliveryd stopped: %w", d.Err())
	case <-m.Done():
		return fmt.Errorf("managerd stopped: %w", m.Err())
	}
}
