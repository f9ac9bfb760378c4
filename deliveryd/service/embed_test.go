package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// events records what a service tells its host.
type events struct {
	mu  sync.Mutex
	all []service.Event
}

func (ev *events) on(e service.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.all = append(ev.all, e)
}

// states is the sequence of states reported, each with its code ("ready/READY").
func (ev *events) states() []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []string
	for _, e := range ev.all {
		if e.Kind == service.EventState {
			out = append(out, string(e.State)+"/"+e.Code)
		}
	}
	return out
}

// warnings is the codes of the warnings reported.
func (ev *events) warnings() []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []string
	for _, e := range ev.all {
		if e.Kind == service.EventWarning {
			out = append(out, e.Code)
		}
	}
	return out
}

// stateFiles lists the deliveryd files in dir.
func stateFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, service.FileName+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dataAccount is the space's data account public key, as signerd's trust material names it.
func dataAccount(t *testing.T, s *signerdtest.Signer) string {
	t.Helper()
	_, spaces := s.Trust(t)
	return spaces[0].DataAccountPublicKey()
}

// deliverydConns lists the broker's client connections deliveryd or its credential proofs opened.
func deliverydConns(t *testing.T, ns *server.Server) []string {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cz.Conns {
		if c.Name == "deliveryd" || c.Name == "cotal-credential-proof" {
			out = append(out, fmt.Sprintf("%s cid %d", c.Name, c.Cid))
		}
	}
	return out
}

const hostedUID = "uidhhhhhhhhhhhhhhhhhhhhhhhhh"

// TestHostedAccount (issue 22 row 2): a hosted start serves its assigned account and writes no
// file; a credential of another account, or a malformed context, refuses the start and leaves
// nothing behind: no lease row, no connection, no file.
func TestHostedAccount(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	ns := s.StartBrokerServer(t)
	e := plane3test.On(t, s, ns.ClientURL())
	account := dataAccount(t, s)
	kv := servicetest.DeliveryKV(t, e)

	t.Run("ok/assigned-account", func(t *testing.T) {
		var ev events
		cfg := servicetest.Config(t, e, "")
		svc, err := service.Start(ctx(t), service.Inputs{Config: cfg,
			Hosted: &service.Hosted{Account: account, LifecycleUID: hostedUID, StoreIdentity: "vault://platform/alpha"}},
			service.RuntimeOptions{Getenv: noEnv, Events: ev.on})
		if err != nil {
			t.Fatal(err)
		}
		if !svc.Ready() || svc.State() != service.StateReady {
			t.Fatalf("state after Start = %s", svc.State())
		}
		row, _, err := servicetest.LeaseRow(ctx(t), kv)
		if err != nil || !strings.HasSuffix(row.Holder, " lifecycle "+hostedUID) || !row.Ready {
			t.Fatalf("lease row = %+v, %v; want a ready row naming the lifecycle", row, err)
		}
		sup := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "manager"})
		r := ctlCall(t, sup, space.CtlServiceDeliveryAdmin, "manager", "reloadStoreIdentity", map[string]any{})
		var id struct{ Kind, Identity, Endpoint string }
		if !r.OK || json.Unmarshal(r.Data, &id) != nil || id.Kind != "injected" || id.Identity != "vault://platform/alpha" || id.Endpoint != "" {
			t.Fatalf("reloadStoreIdentity = %+v; want the injected store identity", r)
		}
		if err := svc.Close(ctx(t)); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if f := stateFiles(t, cfg.StateDir); len(f) != 0 {
			t.Fatalf("a hosted instance wrote %v", f)
		}
		if got := strings.Join(ev.states(), " "); got != "ready/READY stopped/CLOSED" {
			t.Fatalf("states = %s", got)
		}
	})
	t.Run("fail/another-account-refused-leaving-nothing", func(t *testing.T) {
		other, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		otherPub, _ := other.PublicKey()
		var ev events
		cfg := servicetest.Config(t, e, "hosted-wrong")
		_, err = service.Start(ctx(t), service.Inputs{Config: cfg, Hosted: &service.Hosted{Account: otherPub, LifecycleUID: hostedUID, StoreIdentity: "vault://platform/alpha"}},
			service.RuntimeOptions{Getenv: noEnv, Events: ev.on})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeAccount || se.Details["assigned"] != otherPub || se.Details["account"] != account {
			t.Fatalf("start = %v; want ACCOUNT naming both accounts", err)
		}
		if _, _, err := servicetest.LeaseRow(ctx(t), kv); !errors.Is(err, servicetest.ErrNoRow) {
			t.Fatalf("lease row after the refusal: %v; want none", err)
		}
		if f := stateFiles(t, cfg.StateDir); len(f) != 0 {
			t.Fatalf("a refused hosted start wrote %v", f)
		}
		eventually(t, 5*time.Second, func() error {
			if c := deliverydConns(t, ns); len(c) != 0 {
				return fmt.Errorf("connections left: %v", c)
			}
			return nil
		})
		if got := strings.Join(ev.states(), " "); got != "stopped/ACCOUNT" {
			t.Fatalf("states = %s", got)
		}
	})
	t.Run("fail/malformed-context", func(t *testing.T) {
		for name, h := range map[string]service.Hosted{
			"no account":          {},
			"a user key":          {Account: "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"},
			"a bad lifecycle uid": {Account: account, LifecycleUID: "UPPER", StoreIdentity: "st"},
			"no lifecycle uid":    {Account: account, StoreIdentity: "st"},
			"a two-line store":    {Account: account, LifecycleUID: hostedUID, StoreIdentity: "a\nb"},
			"no store":            {Account: account, LifecycleUID: hostedUID},
		} {
			cfg := servicetest.Config(t, e, "hosted-bad")
			_, err := service.Start(ctx(t), service.Inputs{Config: cfg, Hosted: &h}, service.RuntimeOptions{Getenv: noEnv})
			var se *service.StartError
			if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), "hosted") {
				t.Errorf("%s: start = %v; want CONFIG naming the hosted context", name, err)
			}
			if f := stateFiles(t, cfg.StateDir); len(f) != 0 {
				t.Errorf("%s: wrote %v", name, f)
			}
		}
		if _, _, err := servicetest.LeaseRow(ctx(t), kv); !errors.Is(err, servicetest.ErrNoRow) {
			t.Fatalf("lease row after the refusals: %v; want none", err)
		}
	})
}

// TestCloseUnconfirmedRelease (issue 22 row 3): with the broker stopped, Close waits the
// broker-gone window from the drop, then returns an error saying the release was not confirmed;
// the row is indeed still there when the broker comes back. A second Close says the same.
func TestCloseUnconfirmedRelease(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	b := startBroker(t, s)
	e := plane3test.On(t, s, b.NS.ClientURL())
	var logs logBuffer
	var ev events
	cfg := servicetest.Config(t, e, "deliveryd-a")
	const window = 2 * time.Second
	cfg.BrokerGone = yamlx.Duration(window)
	svc, err := service.Start(ctx(t), service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv, Events: ev.on})
	if err != nil {
		t.Fatal(err)
	}
	inc := svc.Row().Incarnation
	b.Stop()
	began := time.Now()
	err = svc.Close(ctx(t))
	took := time.Since(began)
	var re *service.ReleaseError
	if !errors.Is(err, service.ErrReleaseUnconfirmed) || !errors.As(err, &re) || re.Holder != "" ||
		!strings.Contains(err.Error(), "delivery lease release was not confirmed") {
		t.Fatalf("Close = %v; want the unconfirmed release\n%s", err, logs.String())
	}
	// It waited for the connection before deciding (a wait can only be longer under load, so only
	// its floor is checked), and it decided: it returned.
	if took < window/2 || !strings.Contains(logs.String(), "waiting for the broker connection to release the delivery lease") {
		t.Fatalf("Close took %v without waiting for the connection (window %v)\n%s", took, window, logs.String())
	}
	if again := svc.Close(ctx(t)); !errors.Is(again, service.ErrReleaseUnconfirmed) {
		t.Fatalf("second Close = %v", again)
	}
	if svc.State() != service.StateStopped || !errors.Is(svc.Err(), service.ErrStopped) {
		t.Fatalf("state %s err %v", svc.State(), svc.Err())
	}
	if !strings.Contains(strings.Join(ev.warnings(), " "), service.CodeBroker) {
		t.Fatalf("no BROKER warning for the wait; warnings %v", ev.warnings())
	}
	b.Start()
	eventually(t, 15*time.Second, func() error {
		row, _, err := servicetest.LeaseRow(ctx(t), servicetest.DeliveryKV(t, e))
		if err != nil {
			return err
		}
		if row.Incarnation != inc {
			return fmt.Errorf("row %+v is not the closed instance's", row)
		}
		return nil
	})
}

// TestCloseForeignRow (issue 22 row 3): when another instance's row took the lease, the service
// stops, and Close and Drain both say that row is there, leaving it in place.
func TestCloseForeignRow(t *testing.T) {
	e := plane3test.New(t)
	var logs logBuffer
	svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
	kv := servicetest.DeliveryKV(t, e)
	servicetest.WaitReady(t, kv, "deliveryd-a", 5*time.Second)
	foreign, _ := json.Marshal(lease.Row{Holder: "intruder", Incarnation: "0123456789abcdef", Since: time.Now().UTC(), Ready: true})
	if _, err := kv.Put(ctx(t), space.DeliveryLeaseKey, foreign); err != nil {
		t.Fatal(err)
	}
	if err := stopped(t, svc, 10*time.Second, &logs); !errors.Is(err, service.ErrLeaseTaken) {
		t.Fatalf("Err = %v; want ErrLeaseTaken", err)
	}
	for name, f := range map[string]func(context.Context) error{"Close": svc.Close, "Drain": svc.Drain} {
		err := f(ctx(t))
		var re *service.ReleaseError
		if !errors.Is(err, service.ErrForeignRow) || !errors.As(err, &re) || re.Holder != "intruder" || !strings.Contains(err.Error(), `"intruder"`) {
			t.Fatalf("%s = %v; want the foreign row of intruder", name, err)
		}
	}
	row, _, err := servicetest.LeaseRow(ctx(t), kv)
	if err != nil || row.Holder != "intruder" {
		t.Fatalf("row after Close = %+v, %v; want intruder's left in place", row, err)
	}
}

// TestDrainLosesNothing (issue 22 row 3): alice posts a numbered sequence to general, bob's
// durable channel; the first deliveryd is drained while she posts, a second one then takes the
// lease. Every number reaches bob exactly once: DLV_<space> stores each once (the Nats-Msg-Id
// dedup collapses any copy made twice) and bob's client is handed each once. The wait is far
// below the 60 s ack wait, so nothing the first instance took in was left unacked.
func TestDrainLosesNothing(t *testing.T) {
	e := plane3test.New(t)
	members(t, e)
	var logs logBuffer
	var ev events
	first, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "deliveryd-first")},
		service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv, Events: ev.on})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, first)
	bob := plane3test.Receive(t, e, "bob", uidBob)
	anc := e.Agent(t, "alice", uidAlice)
	ajs := plane3test.JS(t, anc)
	subj, err := e.N.Chat(plane3test.Owner, "alice", "general")
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	want := servicetest.Seq("n", 1, n)
	half := make(chan struct{})
	posted := make(chan error, 1)
	go func() {
		for i, id := range want {
			if i == n/2 {
				close(half)
			}
			b, _ := json.Marshal(map[string]any{"id": id, "from": map[string]string{"id": plane3test.Owner + ".alice"}, "text": "number"})
			if _, err := ajs.Publish(context.Background(), subj, b); err != nil {
				posted <- fmt.Errorf("post %s: %w", id, err)
				return
			}
		}
		posted <- nil
	}()
	<-half
	eventually(t, 10*time.Second, func() error {
		if len(bob.IDs()) == 0 {
			return errors.New("nothing delivered yet")
		}
		return nil
	})
	atDrain := len(bob.IDs())
	if err := first.Drain(ctx(t)); err != nil {
		t.Fatalf("Drain = %v\n%s", err, logs.String())
	}
	atDrained := len(bob.IDs())
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if _, _, err := servicetest.LeaseRow(ctx(t), servicetest.DeliveryKV(t, e)); !errors.Is(err, servicetest.ErrNoRow) {
		t.Fatalf("lease row after Drain: %v; want none", err)
	}
	if got := strings.Join(ev.states(), " "); got != "ready/READY unavailable/DRAINING stopped/CLOSED" {
		t.Fatalf("states of the drained instance = %s", got)
	}
	if !logs.has("drained: the passes in flight are settled") {
		t.Fatalf("the drain did not settle its passes:\n%s", logs.String())
	}
	second := start(t, servicetest.Config(t, e, "deliveryd-second"), &logs)
	began := time.Now()
	eventually(t, 20*time.Second, func() error { return servicetest.Exactly(bob.IDs(), want) })
	t.Logf("bob had %d of %d at Drain, %d when it returned; the second instance delivered the rest in %v",
		atDrain, n, atDrained, time.Since(began).Round(time.Millisecond))
	if c := servicetest.DLVCount(t, e, e.Provisioner(t), "bob", uidBob); c != n {
		t.Fatalf("DLV holds %d messages for bob, want %d", c, n)
	}
	if !second.Ready() {
		t.Fatalf("second instance state %s", second.State())
	}
}

// TestReadinessStates (issue 22 row 4): the state moves ready -> unavailable when the broker
// goes, and back to ready when it returns within the window, through State, the events and the
// state file; Close ends in stopped. A broker gone past the window stops a hosted instance
// (unavailable, then stopped, Err ErrBrokerGone) without a file and without touching the process.
func TestReadinessStates(t *testing.T) {
	t.Run("ok/broker-loss-and-return", func(t *testing.T) {
		s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
		b := startBroker(t, s)
		e := plane3test.On(t, s, b.NS.ClientURL())
		var logs logBuffer
		var ev events
		cfg := servicetest.Config(t, e, "deliveryd-a")
		cfg.BrokerGone = yamlx.Duration(20 * time.Second)
		svc, err := service.Start(ctx(t), service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv, Events: ev.on})
		if err != nil {
			t.Fatal(err)
		}
		closeAtEnd(t, svc)
		pid := os.Getpid()
		file := func(want service.State) func() error {
			return func() error {
				f, err := daemon.ReadState(cfg.StateDir, service.FileName)
				if err != nil {
					return err
				}
				if f.PID != pid || f.State != want {
					return fmt.Errorf("state file %+v, want pid %d %s", f, pid, want)
				}
				return nil
			}
		}
		state := func(want service.State) func() error {
			return func() error {
				if got := svc.State(); got != want {
					return fmt.Errorf("state %s, want %s", got, want)
				}
				return file(want)()
			}
		}
		eventually(t, time.Second, state(service.StateReady))

		b.Stop()
		eventually(t, 10*time.Second, state(service.StateUnavailable))
		if svc.Ready() {
			t.Fatal("Ready while the broker is gone")
		}
		b.Start()
		eventually(t, 15*time.Second, state(service.StateReady))

		if err := svc.Close(ctx(t)); err != nil {
			t.Fatalf("Close = %v", err)
		}
		eventually(t, time.Second, state(service.StateStopped))
		if got := strings.Join(ev.states(), " "); got != "ready/READY unavailable/BROKER ready/READY stopped/CLOSED" {
			t.Fatalf("states = %s\n%s", got, logs.String())
		}
	})
	t.Run("fail/broker-gone-past-window-stops-hosted", func(t *testing.T) {
		s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
		b := startBroker(t, s)
		e := plane3test.On(t, s, b.NS.ClientURL())
		var logs logBuffer
		var ev events
		cfg := servicetest.Config(t, e, "deliveryd-a")
		cfg.BrokerGone = yamlx.Duration(time.Second)
		svc, err := service.Start(ctx(t), service.Inputs{Config: cfg, Hosted: &service.Hosted{Account: dataAccount(t, s), LifecycleUID: hostedUID, StoreIdentity: "vault://platform/alpha"}},
			service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv, Events: ev.on})
		if err != nil {
			t.Fatal(err)
		}
		b.Stop()
		err = stopped(t, svc, 15*time.Second, &logs)
		var ge *service.BrokerGoneError
		if !errors.Is(err, service.ErrBrokerGone) || !errors.As(err, &ge) || ge.Max != time.Second {
			t.Fatalf("Err = %v; want the broker-gone verdict", err)
		}
		if got := strings.Join(ev.states(), " "); got != "ready/READY unavailable/BROKER stopped/BROKER" {
			t.Fatalf("states = %s", got)
		}
		if err := svc.Close(ctx(t)); !errors.Is(err, service.ErrReleaseUnconfirmed) {
			t.Fatalf("Close after the verdict = %v; want the unconfirmed release", err)
		}
		if f := stateFiles(t, cfg.StateDir); len(f) != 0 {
			t.Fatalf("a hosted instance wrote %v", f)
		}
	})
}

// reloadProbe wraps deliveryd's own responders: right after they bind at start, before the lease
// watch, it sends reloadCreds as the supervisor and keeps the reply.
type reloadProbe struct {
	service.Responders
	t     *testing.T
	sup   *nats.Conn
	once  sync.Once
	early ctlReply
}

func (p *reloadProbe) Start(ctx context.Context, nc *nats.Conn) error {
	if err := p.Responders.Start(ctx, nc); err != nil {
		return err
	}
	p.once.Do(func() {
		p.early = ctlCall(p.t, p.sup, space.CtlServiceDeliveryAdmin, "manager", "reloadCreds", map[string]any{})
	})
	return nil
}

// TestReloadCredsBeforeStart (issue 22 row 2): a reloadCreds that reaches the responders before
// start-up has finished (they are bound, the lease watch is not) is refused with "this daemon
// has not finished starting" and renews nothing; once Start has returned, the same request
// renews.
func TestReloadCredsBeforeStart(t *testing.T) {
	e := plane3test.New(t)
	sup := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "manager"})
	var logs logBuffer
	probe := &reloadProbe{t: t, sup: sup}
	svc, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "deliveryd-a")}, service.RuntimeOptions{
		Logger: logs.logger(), Getenv: noEnv,
		Responders: func(h service.Hooks) (service.Responders, error) {
			r, err := service.CtlResponders(h)
			probe.Responders = r
			return probe, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, svc)
	if probe.early.OK || !strings.Contains(probe.early.Error, "this daemon has not finished starting") || len(probe.early.Data) > 0 && string(probe.early.Data) != "null" {
		t.Fatalf("reloadCreds before start-up finished = %+v; want the refusal", probe.early)
	}
	const renewed = "credential renewed on request"
	if logs.has(renewed) {
		t.Fatalf("a refused reloadCreds renewed:\n%s", logs.String())
	}
	r := ctlCall(t, sup, space.CtlServiceDeliveryAdmin, "manager", "reloadCreds", map[string]any{})
	if !r.OK || !logs.has(renewed) {
		t.Fatalf("reloadCreds after Start = %+v\n%s", r, logs.String())
	}
}
