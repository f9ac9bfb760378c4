package service_test

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/cotalgo/cotal/authd/service"
)

// A CLI-style start: the configuration from its file, events to the log, and a Close that says
// whether the plane claim was released. (Compiled, not run: it needs signerd and a broker.)
func ExampleStart() {
	ctx := context.Background()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := service.LoadConfig("/etc/cotal/authd.yaml")
	if err != nil {
		log.Fatal(err)
	}
	svc, err := service.Start(ctx, service.Inputs{Config: cfg}, service.RuntimeOptions{
		Logger: logger,
		Events: func(e service.Event) { logger.Info("authd event", "event", e.String()) },
	})
	var se *service.StartError
	if errors.As(err, &se) {
		log.Fatalf("authd refused to start: %s: %s", se.Code, se.Reason)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := svc.Close(ctx); errors.Is(err, service.ErrReleaseUnconfirmed) {
			logger.Warn("plane claim left to its TTL", "err", err)
		}
	}()
	<-svc.Done()
	logger.Info("authd stopped", "err", svc.Err())
}

// A hosted auth context: the configuration built in code (only the required fields; Start
// applies the defaults), the assignment in Hosted, and the state watched to route around an
// unavailable context. A hosted context writes no discovery file: the handle is the only place
// its URL and cap are found.
func ExampleStart_hosted() {
	ctx := context.Background()
	cfg := &service.Config{
		Space:   "alpha",
		Brokers: []string{"nats://127.0.0.1:4222"},
		Signer: service.Signer{Address: "127.0.0.1:7443", CA: "/etc/cotal/tls/ca.pem",
			Cert: "/etc/cotal/tls/authd.pem", Key: "/etc/cotal/tls/authd.key"},
		CalloutSeed: "/var/lib/cotal/trust/authd/space.616c706861/callout.nk",
		StateDir:    "/var/lib/cotal/authd/alpha",
		PlaneTTL:    service.Duration(30 * time.Second),
	}
	states := make(chan service.State, 16)
	svc, err := service.Start(ctx, service.Inputs{Config: cfg, Hosted: &service.Hosted{
		Account:       "AAZ564WSXLQ5ESL6E23CQPX7R2WJCSAY64RBM5XLZ6IB6UFNTTADXDEN", // the assigned data account
		LifecycleUID:  "01j9q3v6x8k2m4n5p7r9s1t3v5",
		StoreIdentity: "store:alpha/1",
	}}, service.RuntimeOptions{
		Events: func(e service.Event) {
			if e.Kind == service.EventState {
				select {
				case states <- e.State: // never block the service
				default:
				}
			}
		},
	})
	if err != nil {
		log.Fatal(err) // a *service.StartError; service.CodeAccount if signerd's account is not the assigned one
	}
	defer svc.Close(ctx)
	route(svc.URL(), svc.Cap())
	for st := range states {
		if st == service.StateStopped {
			log.Printf("hosted authd closed: %v", svc.Err()) // service.ErrBrokerGone, service.ErrPlaneLost, ...
			return
		}
		log.Printf("hosted authd %s", st)
	}
}

func route(url, capability string) {}
