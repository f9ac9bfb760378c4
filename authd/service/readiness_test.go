package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// newEnvRestartable is newEnv on a broker the test can stop and start again.
func newEnvRestartable(t *testing.T) (*env, *signerdtest.Broker) {
	t.Helper()
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{sp}})
	b := sg.StartRestartableBroker(t)
	url := b.NS.ClientURL()
	mgr, err := signerclient.Dial(signerclient.Config{Addr: sg.Addr, TLS: sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	if _, err := provision.Run(ctxT(t), provision.Config{Signer: mgr, Space: sp, NatsURL: url}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return &env{sg: sg, ns: b.NS, url: url}, b
}

// events records what a service tells its host.
type events struct {
	mu  sync.Mutex
	all []service.Event
}

func (r *events) on(e service.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, e)
}

// states is the state changes so far, each "state/code".
func (r *events) states() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.all {
		if e.Kind == service.EventState {
			out = append(out, string(e.State)+"/"+e.Code)
		}
	}
	return out
}

// warned reports whether a warning with code was raised.
func (r *events) warned(code string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.all, func(e service.Event) bool { return e.Kind == service.EventWarning && e.Code == code })
}

// holds reports an event whose text holds secret.
func (r *events) holds(secret string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.all {
		if strings.Contains(e.String(), secret) {
			return fmt.Errorf("event %q holds the secret", e.Kind)
		}
	}
	return nil
}

// waitStates waits until the state changes are want.
func (r *events) waitStates(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	testkit.Eventually(t, d, func() error {
		if got := r.states(); !slices.Equal(got, want) {
			return fmt.Errorf("state events %q, want %q", got, want)
		}
		return nil
	})
}

// fileState is the state auth-service.json says, or "absent".
func fileState(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(daemon.DiscoveryPath(dir, service.FileName))
	if errors.Is(err, os.ErrNotExist) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	var d daemon.Discovery
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return string(d.State)
}

// TestReadinessStates (issue 22 row 4): a CLI-path authd whose broker stops reports unavailable
// once its connections have been down for the broker-gone window, through State, Events and
// auth-service.json (which daemon.Ready then waits on), and ready again once the broker is back
// on the same port; Close ends in stopped. A hosted context closes itself instead.
func TestReadinessStates(t *testing.T) {
	const window = time.Second
	t.Run("ok/cli-unavailable-and-back", func(t *testing.T) {
		e, b := newEnvRestartable(t)
		cfg := e.config(t)
		cfg.PlaneTTL = yamlx.Duration(30 * time.Second) // the fence stays well after the outage
		var ev events
		s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Events: ev.on, BrokerGone: window})
		if s.State() != service.StateReady || fileState(t, cfg.StateDir) != "ready" {
			t.Fatalf("after Start: state %s, file %s", s.State(), fileState(t, cfg.StateDir))
		}
		ev.waitStates(t, time.Second, "ready/READY")

		b.Stop()
		ev.waitStates(t, 20*time.Second, "ready/READY", "unavailable/BROKER")
		if s.Ready() || !ev.warned(service.CodeBroker) {
			t.Fatalf("ready %v, broker warning %v", s.Ready(), ev.warned(service.CodeBroker))
		}
		if st := fileState(t, cfg.StateDir); st != "unavailable" {
			t.Fatalf("auth-service.json says %s, want unavailable", st)
		}
		short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		var nr *daemon.NotReadyError
		if _, err := service.Ready(short, cfg.StateDir, os.Getpid()); !errors.As(err, &nr) || !strings.Contains(nr.Last, "unavailable") {
			t.Fatalf("Ready while unavailable = %v, want not ready naming the state", err)
		}

		b.Start()
		ev.waitStates(t, 20*time.Second, "ready/READY", "unavailable/BROKER", "ready/BROKER")
		if st := fileState(t, cfg.StateDir); st != "ready" || !s.Ready() {
			t.Fatalf("after the broker came back: file %s, ready %v", st, s.Ready())
		}
		if _, err := service.Ready(readyCtx(t), cfg.StateDir, os.Getpid()); err != nil {
			t.Fatalf("Ready after recovery = %v", err)
		}
		select {
		case <-s.Done():
			t.Fatalf("stopped: %v", s.Err())
		default:
		}

		if err := s.Close(ctxT(t)); err != nil {
			t.Fatalf("Close = %v", err)
		}
		ev.waitStates(t, time.Second, "ready/READY", "unavailable/BROKER", "ready/BROKER", "unavailable/STOPPING", "stopped/CLOSED")
		if st := fileState(t, cfg.StateDir); st != "absent" {
			t.Fatalf("auth-service.json after Close says %s", st)
		}
		if err := ev.holds(s.Cap()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ok/hosted-closes-on-broker-loss", func(t *testing.T) {
		e, b := newEnvRestartable(t)
		cfg := e.config(t)
		cfg.PlaneTTL = yamlx.Duration(30 * time.Second)
		cfg.ShutdownTimeout = yamlx.Duration(time.Second) // the release cannot be confirmed: do not wait 10 s for it
		var ev events
		s := startWith(t, service.Inputs{Config: cfg, Hosted: e.hosted(t)}, service.RuntimeOptions{Events: ev.on, BrokerGone: window})
		b.Stop()
		select {
		case <-s.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("the hosted context did not close after losing its broker")
		}
		if !errors.Is(s.Err(), service.ErrBrokerGone) || s.State() != service.StateStopped {
			t.Fatalf("Err = %v, state %s; want ErrBrokerGone, stopped", s.Err(), s.State())
		}
		ev.waitStates(t, time.Second, "ready/READY", "unavailable/BROKER", "stopped/BROKER")
		if st := fileState(t, cfg.StateDir); st != "absent" {
			t.Fatalf("a hosted context left auth-service.json saying %s", st)
		}
	})
}

// TestCloseReportsUnconfirmedRelease (issue 22): with the broker stopped, Close cannot confirm the
// plane release and says so (ErrReleaseUnconfirmed, also to a second caller); the row is indeed
// still there when the broker is back. With the broker up, Close returns nil (TestStartReadyClose).
func TestCloseReportsUnconfirmedRelease(t *testing.T) {
	e, b := newEnvRestartable(t)
	cfg := e.config(t)
	cfg.PlaneTTL = yamlx.Duration(30 * time.Second)
	cfg.ShutdownTimeout = yamlx.Duration(2 * time.Second)
	s, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, s)
	b.Stop()
	err = s.Close(ctxT(t))
	if !errors.Is(err, service.ErrReleaseUnconfirmed) {
		t.Fatalf("Close with the broker stopped = %v, want ErrReleaseUnconfirmed", err)
	}
	if again := s.Close(ctxT(t)); !errors.Is(again, service.ErrReleaseUnconfirmed) {
		t.Fatalf("second Close = %v, want the same verdict", again)
	}
	b.Start()
	e.ns, e.url = b.NS, b.NS.ClientURL()
	if row, ok := e.planeRow(t); !ok || !strings.HasSuffix(row["holder"].(string), fmt.Sprintf(" pid %d", os.Getpid())) {
		t.Fatalf("plane row after an unconfirmed release: %v (present %v), want this instance's", row, ok)
	}
}

// TestCredentialExpiry (issue 22 row 4): signerd mints authd's auth-plane credential for 4 s and
// refuses to renew it. The host hears each retried renewal (CREDENTIAL warnings), then authd is
// unavailable once the credential has expired, and stops (ErrCredentialExpired): signerd renews
// no expired credential.
func TestCredentialExpiry(t *testing.T) {
	policy := strings.Replace(signerdtest.DefaultPolicy, "auth-plane: {ttl_max: 24h}", "auth-plane: {ttl_max: 4s, remint: none}", 1)
	if policy == signerdtest.DefaultPolicy {
		t.Fatal("the default policy no longer has the auth-plane line this test shortens")
	}
	e := newEnvWith(t, signerdtest.Options{Spaces: []string{sp}, Policy: policy})
	cfg := e.config(t)
	cfg.PlaneTTL = yamlx.Duration(30 * time.Second) // the fence stays out of it
	var ev events
	s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Events: ev.on})
	select {
	case <-s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("authd still serving on an expired credential")
	}
	if !errors.Is(s.Err(), service.ErrCredentialExpired) {
		t.Fatalf("Err = %v, want ErrCredentialExpired", s.Err())
	}
	if !ev.warned(service.CodeCredential) {
		t.Fatal("no CREDENTIAL warning for the refused renewals")
	}
	ev.waitStates(t, 0, "ready/READY", "unavailable/CREDENTIAL", "stopped/CREDENTIAL")
	if st := fileState(t, cfg.StateDir); st != "absent" {
		t.Fatalf("auth-service.json after the stop says %s", st)
	}
}
