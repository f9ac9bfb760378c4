package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/managerd/internal/launcher"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// hostLauncher is a host's own Launcher (RuntimeOptions.Launcher) at this test's uid: it starts
// `sleep` in a session of its own on a real PTY, writes the launch material 0600 in the agent's
// directory, and signals the process group; it proves a child gone as the launcher does. Each
// operation can be told to reject instead (set): panic with any value, or return an error.
type hostLauncher struct {
	root string
	mu   sync.Mutex
	fail map[string]func() error // by "launch", "signal", "replace"
	cmds []*exec.Cmd
}

func newHostLauncher(t *testing.T) *hostLauncher {
	l := &hostLauncher{root: t.TempDir(), fail: map[string]func() error{}}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	})
	return l
}

// set makes op call f instead of doing its work; nil restores it.
func (l *hostLauncher) set(op string, f func() error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail[op] = f
}

func (l *hostLauncher) rejects(op string) func() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fail[op]
}

func (l *hostLauncher) Launch(_ context.Context, req LaunchRequest) (Child, *os.File, error) {
	if f := l.rejects("launch"); f != nil {
		return Child{}, nil, f()
	}
	dir := filepath.Join(l.root, req.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Child{}, nil, err
	}
	path := filepath.Join(dir, "launch-material")
	if err := os.WriteFile(path, req.Material, 0o600); err != nil {
		return Child{}, nil, err
	}
	cmd := exec.Command("sleep", "300")
	cmd.Env = []string{"COTAL_LAUNCH_MATERIAL=" + path}
	master, err := pty.Start(cmd) // a new session: the pid is the group
	if err != nil {
		return Child{}, nil, err
	}
	st, err := launcher.ReadProcStat(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		master.Close()
		return Child{}, nil, err
	}
	l.mu.Lock()
	l.cmds = append(l.cmds, cmd)
	l.mu.Unlock()
	go func() { _ = cmd.Wait() }() // reaped, so that Gone sees it go
	return Child{Pid: cmd.Process.Pid, StartTime: st.StartTime, Dir: dir}, master, nil
}

func (l *hostLauncher) Signal(ctx context.Context, child Child, sig syscall.Signal) error {
	if f := l.rejects("signal"); f != nil {
		return f()
	}
	if sig == 0 {
		if gone, err := child.Gone(); err != nil || !gone {
			return err
		}
		return &LaunchRefusedError{Reason: LaunchChildUnknown, Message: "gone"}
	}
	return launcher.KillGroup(ctx, child, sig)
}

func (l *hostLauncher) ReplaceMaterial(_ context.Context, child Child, material []byte) error {
	if f := l.rejects("replace"); f != nil {
		return f()
	}
	return os.WriteFile(filepath.Join(child.Dir, "launch-material"), material, 0o600)
}

// hostProv is a host's own Provisioner: the manager's one-shot provisioner, unless told to
// reject.
type hostProv struct {
	inner Provisioner
	mu    sync.Mutex
	fail  map[string]func() error // by "provision", "deprovision"
	specs []AgentSpec             // every lifecycle provisioned
}

func (p *hostProv) provisioned() []AgentSpec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]AgentSpec(nil), p.specs...)
}

func (p *hostProv) set(op string, f func() error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[op] = f
}

func (p *hostProv) rejects(op string) func() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fail[op]
}

func (p *hostProv) Provision(ctx context.Context, a AgentSpec) ([]string, error) {
	if f := p.rejects("provision"); f != nil {
		return nil, f()
	}
	p.mu.Lock()
	p.specs = append(p.specs, a)
	p.mu.Unlock()
	return p.inner.Provision(ctx, a)
}

func (p *hostProv) Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error) {
	if f := p.rejects("deprovision"); f != nil {
		return provision.Result{}, f()
	}
	return p.inner.Deprovision(ctx, owner, actor, uid, memberChannels)
}

// typedNilRefusal is a launcher bug: a nil *LaunchRefusedError in a non-nil error, whose Error
// dereferences nil.
func typedNilRefusal() error {
	var re *LaunchRefusedError
	return re
}

// rpcRefusal returns a ManagerService error's code, ErrorInfo reason and message.
func rpcRefusal(t *testing.T, err error) (codes.Code, string, string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("want a gRPC status, got %v", err)
	}
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.Reason
		}
	}
	return st.Code(), reason, st.Message()
}

// hookWarnings are the HOOK warnings raised so far, by their rejection's hook.
func (l *eventLog) hookWarnings() map[string][]*Rejection {
	out := map[string][]*Rejection{}
	for _, e := range l.all() {
		var rj *Rejection
		if e.Kind == EventWarning && e.Code == CodeHook && errors.As(e.Err, &rj) {
			out[rj.Hook] = append(out[rj.Hook], rj)
		}
	}
	return out
}

// TestHookRejection: a host launcher or provisioner that panics (with a string, nil, an int, a
// struct, an unreadable error) or returns an unreadable error is refused with its text over
// ManagerService (INTERNAL, LAUNCH_FAILED or PROVISION_FAILED, the text RejectionText gives),
// logged and raised as a HOOK warning, and undone (no slot, no durables); managerd keeps
// serving: Status answers, and a spawn and stop with the hooks sane again run to the end.
func TestHookRejection(t *testing.T) {
	e := plane3test.New(t)
	cfg := testConfig(t, e)
	lnch := newHostLauncher(t)
	prov := &hostProv{fail: map[string]func() error{}}
	var ev eventLog
	var logged testkit.SyncBuffer
	m, err := startManager(t, cfg, func(_ *Inputs, opts *RuntimeOptions) {
		opts.Launcher, opts.Provisioner, opts.Events = lnch, prov, ev.add
		opts.Logger = slog.New(slog.NewJSONHandler(&logged, nil)) // JSON calls Error() on error values
	})
	if err != nil {
		t.Fatal(err)
	}
	prov.inner = &oneShot{m: m}
	c, closer, err := managerclient.Dial(plane3test.Ctx(t), cfg.API.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	before := streamCounts(t, e)
	acl, err := e.Provisioner(t).KeyValue(plane3test.Ctx(t), "cotal_acl_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}

	serving := func(t *testing.T) {
		t.Helper()
		st, err := c.Status(plane3test.Ctx(t), &managerv1.StatusRequest{})
		if err != nil || st.GetInstanceId() != instanceA || st.GetAgents() != 0 || st.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD {
			t.Fatalf("Status after a rejected hook: %v %v", st, err)
		}
		if after := streamCounts(t, e); after[0] != before[0] || after[1] != before[1] {
			t.Fatalf("a rejected spawn left DM/DLV consumers: %v -> %v", before, after)
		}
		for _, a := range prov.provisioned() {
			key, err := space.ACLKey(a.Owner, a.Actor, a.LifecycleUID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := acl.Get(plane3test.Ctx(t), key); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("ACL row %s after its spawn was refused or its agent stopped: %v", key, err)
			}
		}
		if m.State() != StateReady {
			t.Fatalf("state %s after a rejected hook", m.State())
		}
	}

	for _, tc := range []struct {
		name, op, hook string
		f              func() error
		reason, text   string
	}{
		{"fail/launch panics with a string", "launch", "the launcher's Launch", func() error { panic("launcher on fire") },
			"LAUNCH_FAILED", "the launcher's Launch panicked: launcher on fire"},
		{"fail/launch panics with nil", "launch", "the launcher's Launch", func() error { panic(nil) },
			"LAUNCH_FAILED", "the launcher's Launch panicked: nil"},
		{"fail/launch panics with an int", "launch", "the launcher's Launch", func() error { panic(42) },
			"LAUNCH_FAILED", "the launcher's Launch panicked: 42"},
		{"fail/launch panics with a struct", "launch", "the launcher's Launch", func() error { panic(struct{ Slot int }{7}) },
			"LAUNCH_FAILED", "the launcher's Launch panicked: {7}"},
		{"fail/launch panics with an unreadable error", "launch", "the launcher's Launch", func() error { panic(typedNilRefusal()) },
			"LAUNCH_FAILED", "the launcher's Launch panicked: " + UnreadableRejection},
		{"fail/launch returns an unreadable error", "launch", "the launcher's Launch", typedNilRefusal,
			"LAUNCH_FAILED", "the launcher's Launch rejected: " + UnreadableRejection},
		{"fail/provision panics", "provision", "the provisioner's Provision", func() error { panic(fmt.Errorf("store %s", "offline")) },
			"PROVISION_FAILED", "the provisioner's Provision panicked: store offline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.op == "provision" {
				prov.set(tc.op, tc.f)
				defer prov.set(tc.op, nil)
			} else {
				lnch.set(tc.op, tc.f)
				defer lnch.set(tc.op, nil)
			}
			n := len(ev.hookWarnings()[tc.hook])
			_, err := c.Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "a1", Connector: "echo"})
			code, reason, msg := rpcRefusal(t, err)
			if code != codes.Internal || reason != tc.reason || !strings.HasSuffix(msg, tc.text) {
				t.Fatalf("Spawn: %v %s %q; want INTERNAL %s ending %q", code, reason, msg, tc.reason, tc.text)
			}
			ws := ev.hookWarnings()[tc.hook]
			if len(ws) != n+1 || ws[n].Error() != tc.text {
				t.Fatalf("HOOK warnings for %s: %v, want one more: %q", tc.hook, ws, tc.text)
			}
			if !strings.Contains(logged.String(), `"hook":"`+tc.hook+`"`) {
				t.Fatalf("the rejection of %s is not in the log: %s", tc.hook, logged.String())
			}
			serving(t)
		})
	}

	t.Run("ok/sane hooks spawn and stop after the rejections", func(t *testing.T) {
		a, err := c.Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "a1", Connector: "echo"})
		if err != nil {
			t.Fatalf("Spawn with sane hooks: %v", err)
		}
		agent := a.GetAgent()
		if agent.GetProcess() != managerv1.ProcessState_PROCESS_STATE_RUNNING || agent.GetPid() <= 1 || agent.GetLifecycleUid() == "" {
			t.Fatalf("spawned %v", agent)
		}
		if mat, err := os.ReadFile(filepath.Join(lnch.root, "a1", "launch-material")); err != nil || len(mat) == 0 {
			t.Fatalf("launch material: %d bytes, %v", len(mat), err)
		}

		// A Signal that panics leaves the agent unproven gone: the stop is refused, the agent
		// kept; a later stop with a sane Signal ends it and deprovisions it.
		lnch.set("signal", func() error { panic("signal jammed") })
		_, err = c.Stop(plane3test.Ctx(t), &managerv1.StopRequest{Name: "a1"})
		code, reason, msg := rpcRefusal(t, err)
		if code != codes.Internal || reason != "STOP_UNPROVEN" || !strings.Contains(msg, "the launcher's Signal panicked: signal jammed") {
			t.Fatalf("Stop with a panicking Signal: %v %s %q", code, reason, msg)
		}
		if gone, err := (launcher.Child{Pid: int(agent.GetPid()), StartTime: procStart(t, int(agent.GetPid()))}).Gone(); err != nil || gone {
			t.Fatalf("the agent is gone (%v, %v) though its stop was refused", gone, err)
		}
		lnch.set("signal", nil)
		resp, err := c.Stop(plane3test.Ctx(t), &managerv1.StopRequest{Name: "a1"})
		if err != nil || resp.GetAgent().GetProcess() != managerv1.ProcessState_PROCESS_STATE_EXITED || len(resp.GetDeprovisioned()) == 0 {
			t.Fatalf("Stop with a sane Signal: %v %v", resp, err)
		}
		serving(t)
	})

	t.Run("fail/a panicking OnFirstSeen is a HOOK warning", func(t *testing.T) {
		m.opts.OnFirstSeen = func(string, time.Time) { panic("first-seen hook broke") }
		defer func() { m.opts.OnFirstSeen = nil }()
		a, err := c.Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "a2", Connector: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		m.seen(a.GetAgent().GetActor(), time.Now()) // what a liveness probe from it does
		ws := ev.hookWarnings()["the OnFirstSeen callback"]
		if len(ws) != 1 || ws[0].Text != "first-seen hook broke" || !ws[0].Panicked {
			t.Fatalf("OnFirstSeen warnings %v", ws)
		}
		if _, err := c.Stop(plane3test.Ctx(t), &managerv1.StopRequest{Name: "a2"}); err != nil {
			t.Fatal(err)
		}
		serving(t)
	})

	// Six spawns provisioned before their launch was rejected, two ran: each was checked gone.
	if n := len(prov.provisioned()); n != 8 {
		t.Fatalf("%d lifecycles provisioned, want 8", n)
	}
}

// procStart is a live process's start time.
func procStart(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := launcher.ReadProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.StartTime
}

// panicHandler is a host's slog.Handler that panics on every line.
type panicHandler struct{ slog.Handler }

func (panicHandler) Handle(context.Context, slog.Record) error { panic("log sink gone") }

// TestCallbackRejection: an Events callback, a logger and a clock that panic on every call do
// not stop the manager starting and serving; the events callback's panics are logged, the
// logger's are raised as a HOOK warning.
func TestCallbackRejection(t *testing.T) {
	e := plane3test.New(t)

	t.Run("fail/events callback panics", func(t *testing.T) {
		cfg := testConfig(t, e)
		var logged testkit.SyncBuffer
		calls := 0
		var mu sync.Mutex
		m, err := startManager(t, cfg, func(_ *Inputs, opts *RuntimeOptions) {
			opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			opts.Events = func(Event) { mu.Lock(); calls++; mu.Unlock(); panic("event sink gone") }
		})
		if err != nil {
			t.Fatalf("Start with a panicking Events: %v", err)
		}
		if m.State() != StateReady {
			t.Fatalf("state %s", m.State())
		}
		st, err := m.Backend().Status(plane3test.Ctx(t))
		if err != nil || st.GetInstanceId() != instanceA {
			t.Fatalf("Status: %v %v", st, err)
		}
		mu.Lock()
		n := calls
		mu.Unlock()
		if n != 1 || !strings.Contains(logged.String(), `rejection="event sink gone"`) || !strings.Contains(logged.String(), `hook="the events callback"`) {
			t.Fatalf("%d calls; log: %s", n, logged.String())
		}
		if err := m.Close(plane3test.Ctx(t)); err != nil || m.State() != StateStopped {
			t.Fatalf("Close: %v, state %s", err, m.State())
		}
	})

	t.Run("fail/logger and clock panic", func(t *testing.T) {
		cfg := testConfig(t, e)
		var ev eventLog
		m, err := startManager(t, cfg, func(_ *Inputs, opts *RuntimeOptions) {
			opts.Logger = slog.New(panicHandler{slog.NewTextHandler(io.Discard, nil)})
			opts.Now = func() time.Time { panic("no clock") }
			opts.Events = ev.add
		})
		if err != nil {
			t.Fatalf("Start with a panicking logger and clock: %v", err)
		}
		if m.State() != StateReady {
			t.Fatalf("state %s", m.State())
		}
		ws := ev.hookWarnings()["the logger's Handle"]
		if len(ws) == 0 || ws[0].Text != "log sink gone" {
			t.Fatalf("logger HOOK warnings %v", ws)
		}
		for _, e := range ev.all() {
			if e.Time.IsZero() {
				t.Fatalf("an event without a time: %v", e)
			}
		}
		row, ok := leaseRow(t, e, instanceA)
		if !ok || row.Since == 0 {
			t.Fatalf("lease row %+v %v: want one stamped by time.Now", row, ok)
		}
		if _, err := m.Backend().Status(plane3test.Ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(plane3test.Ctx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRejectionTextExport(t *testing.T) {
	var re *LaunchRefusedError
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"ok/nil", nil, "nil"},
		{"ok/an error", &LaunchRefusedError{Reason: "NAME_IN_USE"}, "launcher refused: NAME_IN_USE"},
		{"fail/a typed nil launcher refusal", error(re), UnreadableRejection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RejectionText(tc.v); got != tc.want {
				t.Fatalf("RejectionText = %q, want %q", got, tc.want)
			}
		})
	}
}
