package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// eventLog records what a manager hands RuntimeOptions.Events.
type eventLog struct {
	mu   sync.Mutex
	list []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = append(l.list, e)
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.list...)
}

// states are the states the state events moved to, in order.
func (l *eventLog) states() []State {
	var out []State
	for _, e := range l.all() {
		if e.Kind == EventState {
			out = append(out, e.State)
		}
	}
	return out
}

func (l *eventLog) has(kind EventKind, code string) bool {
	for _, e := range l.all() {
		if e.Kind == kind && e.Code == code {
			return true
		}
	}
	return false
}

// waitState waits until m is in want.
func waitState(t *testing.T, m *Manager, want State, within time.Duration) {
	t.Helper()
	testkit.Eventually(t, within, func() error {
		if st := m.State(); st != want {
			return fmt.Errorf("state %s, want %s", st, want)
		}
		return nil
	})
}

// TestStartHandle: Start returns a handle that serves (ManagerService answers on its socket),
// State and Events say ready, Close stops it cleanly; a refused start is a *StartError.
func TestStartHandle(t *testing.T) {
	e := plane3test.New(t)

	t.Run("ok/start serves, close stops", func(t *testing.T) {
		cfg := testConfig(t, e)
		var ev eventLog
		m, err := Start(runCtx(t), Inputs{Config: cfg}, RuntimeOptions{Events: ev.add})
		if err != nil {
			t.Fatal(err)
		}
		if m.State() != StateReady || !m.Ready() {
			t.Fatalf("after Start: state %s, Ready %v", m.State(), m.Ready())
		}
		// Nothing was raised while starting: the one event is the move to ready.
		if got := ev.all(); len(got) != 1 || got[0].Kind != EventState || got[0].State != StateReady || got[0].Daemon != "managerd" {
			t.Fatalf("events after Start: %v", got)
		}
		c, closer, err := managerclient.Dial(plane3test.Ctx(t), cfg.API.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		st, err := c.Status(plane3test.Ctx(t), &managerv1.StatusRequest{})
		if err != nil || st.Lease != managerv1.LeaseState_LEASE_STATE_HELD || st.InstanceId != instanceA {
			t.Fatalf("ManagerService Status after Start: %v %v", st, err)
		}
		if err := m.Close(plane3test.Ctx(t)); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case <-m.Done():
		default:
			t.Fatal("Done not closed when Close returned")
		}
		if m.State() != StateStopped || m.Ready() || m.Err() != nil {
			t.Fatalf("after Close: state %s, Ready %v, Err %v", m.State(), m.Ready(), m.Err())
		}
		if got, want := fmt.Sprint(ev.states()), fmt.Sprint([]State{StateReady, StateUnavailable, StateStopped}); got != want {
			t.Fatalf("states %s, want %s", got, want)
		}
		if _, ok := leaseRow(t, e, instanceA); ok {
			t.Fatal("lease row still there after Close")
		}
		if _, err := os.Stat(cfg.API.Socket); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the ManagerService socket is still there after Close: %v", err)
		}
		if err := m.Close(plane3test.Ctx(t)); err != nil {
			t.Fatalf("a second Close: %v", err)
		}
	})

	t.Run("ok/ctx ended is a default shutdown", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		m, err := Start(ctx, Inputs{Config: testConfig(t, e)}, RuntimeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case <-m.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("not stopped 20s after its ctx ended")
		}
		if m.State() != StateStopped || m.Err() != nil {
			t.Fatalf("after ctx ended: state %s, Err %v", m.State(), m.Err())
		}
		if _, ok := leaseRow(t, e, instanceA); ok {
			t.Fatal("lease row still there after the shutdown")
		}
	})

	for _, tc := range []struct {
		name string
		cfg  func() *Config
		ctx  func() context.Context
		code string
	}{
		{"fail/no configuration", func() *Config { return nil }, nil, CodeConfig},
		{"fail/configuration refused", func() *Config { c := testConfig(t, e); c.Space = ""; return c }, nil, CodeConfig},
		{"fail/bad instance id", func() *Config { c := testConfig(t, e); c.InstanceID = "x"; return c }, nil, CodeConfig},
		{"fail/ctx canceled", func() *Config { return testConfig(t, e) }, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, CodeCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := runCtx(t)
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			var ev eventLog
			m, err := Start(ctx, Inputs{Config: tc.cfg()}, RuntimeOptions{Events: ev.add})
			var se *StartError
			if m != nil || !errors.As(err, &se) || se.Code != tc.code || se.Daemon != "managerd" {
				t.Fatalf("Start: %v, %v; want a %s StartError", m, err, tc.code)
			}
			if got := ev.states(); len(got) != 1 || got[0] != StateStopped {
				t.Fatalf("states %v, want [stopped]", got)
			}
			if _, ok := leaseRow(t, e, instanceA); ok {
				t.Fatal("a refused start left a lease row")
			}
		})
	}
}

// TestStateBrokerLoss: a stopped broker makes the manager unavailable (with a BROKER warning),
// its return makes it ready again on its own; Close with the broker stopped reports the
// unconfirmed lease release.
func TestStateBrokerLoss(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	b := s.StartRestartableBroker(t)
	e := plane3test.On(t, s, b.NS.ClientURL())
	var ev eventLog
	m, err := Start(runCtx(t), Inputs{Config: testConfig(t, e)}, RuntimeOptions{Events: ev.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	waitState(t, m, StateReady, time.Second)

	t.Run("ok/broker stopped is unavailable", func(t *testing.T) {
		b.Stop()
		waitState(t, m, StateUnavailable, 10*time.Second)
		if !ev.has(EventWarning, CodeBroker) {
			t.Fatalf("no BROKER warning: %v", ev.all())
		}
		select {
		case <-m.Done():
			t.Fatalf("stopped while the broker is gone: %v", m.Err())
		default:
		}
		// An unavailable manager admits no agent, and holds no slot for the refused one.
		_, err := m.Backend().Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "a1", Connector: "echo"})
		wantRefusal(t, err, codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE)
		if st, _ := m.Backend().Status(plane3test.Ctx(t)); st.GetAgents() != 0 {
			t.Fatalf("a refused spawn holds %d slots", st.GetAgents())
		}
	})
	t.Run("ok/broker back is ready", func(t *testing.T) {
		b.Start()
		waitState(t, m, StateReady, 20*time.Second)
		if got, want := fmt.Sprint(ev.states()), fmt.Sprint([]State{StateReady, StateUnavailable, StateReady}); got != want {
			t.Fatalf("states %s, want %s", got, want)
		}
		if _, ok := leaseRow(t, e, instanceA); !ok {
			t.Fatal("no lease row once ready again")
		}
	})
	t.Run("fail/close with the broker stopped reports an unconfirmed release", func(t *testing.T) {
		b.Stop()
		waitState(t, m, StateUnavailable, 10*time.Second)
		err := m.Close(plane3test.Ctx(t))
		if !errors.Is(err, ErrReleaseUnconfirmed) {
			t.Fatalf("Close with the broker stopped: %v, want ErrReleaseUnconfirmed", err)
		}
		if m.State() != StateStopped || !errors.Is(m.Err(), ErrReleaseUnconfirmed) {
			t.Fatalf("after Close: state %s, Err %v", m.State(), m.Err())
		}
	})
}

// TestStateLeaseTaken: another row on the instance's lease key makes the manager unavailable
// (with a LEASE warning) and is left alone; once it is gone the manager puts its row again and
// is ready.
func TestStateLeaseTaken(t *testing.T) {
	e := plane3test.New(t)
	var ev eventLog
	m, err := startManager(t, testConfig(t, e), func(_ *Inputs, opts *RuntimeOptions) { opts.Events = ev.add })
	if err != nil {
		t.Fatal(err)
	}
	nc := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "m1", Actor: "s4"})
	kv, err := plane3test.JS(t, nc).KeyValue(plane3test.Ctx(t), "cotal_manager_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	foreign := LeaseRow{Holder: "m1.s4", InstanceID: instanceA, Runtime: "pty", Root: "/elsewhere", PID: 1, Since: time.Now().UnixMilli()}
	b, err := json.Marshal(foreign)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(plane3test.Ctx(t), "lease."+instanceA, b); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, StateUnavailable, 10*time.Second)
	if !ev.has(EventWarning, CodeLease) {
		t.Fatalf("no LEASE warning: %v", ev.all())
	}
	if row, ok := leaseRow(t, e, instanceA); !ok || row != foreign {
		t.Fatalf("the foreign row was not left alone: %+v %v", row, ok)
	}
	if err := kv.Delete(plane3test.Ctx(t), "lease."+instanceA); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, StateReady, 10*time.Second)
	if row, ok := leaseRow(t, e, instanceA); !ok || row.PID != os.Getpid() {
		t.Fatalf("the manager's row was not put again: %+v %v", row, ok)
	}
	if err := m.Close(plane3test.Ctx(t)); err != nil {
		t.Fatal(err)
	}
}
