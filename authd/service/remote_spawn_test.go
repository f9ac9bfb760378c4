package service_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/managerd/manager"
	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// hostLauncher is a host's own manager.Launcher at this test's uid (the one managerd's manager
// tests use, rebuilt here where managerd/internal cannot be imported): it writes the launch
// material 0600 in the agent's directory and starts `sleep` (or argv) in a session of its own on
// a real PTY; it signals the process group and proves a child gone by /proc.
type hostLauncher struct {
	root     string
	mu       sync.Mutex
	argv     []string // the agent's command line; nil is `sleep 300`
	env      []string // the agent's environment besides COTAL_LAUNCH_MATERIAL
	cmds     []*exec.Cmd
	children map[string]manager.Child // the last child of each name
	refuse   string                   // a name whose launch fails
}

// child is the last child launched as name.
func (l *hostLauncher) child(name string) manager.Child {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.children[name]
}

func newHostLauncher(t *testing.T) *hostLauncher {
	l := &hostLauncher{root: t.TempDir(), children: map[string]manager.Child{}}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	})
	return l
}

// startTime is field 22 of /proc/<pid>/stat.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

func (l *hostLauncher) Launch(_ context.Context, req manager.LaunchRequest) (manager.Child, *os.File, error) {
	l.mu.Lock()
	refuse, argv, env := l.refuse == req.Name, l.argv, l.env
	l.mu.Unlock()
	if refuse {
		return manager.Child{}, nil, &manager.LaunchRefusedError{Reason: "TEST", Message: "refused by the test"}
	}
	dir := filepath.Join(l.root, req.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return manager.Child{}, nil, err
	}
	path := filepath.Join(dir, "launch-material")
	if err := os.WriteFile(path, req.Material, 0o600); err != nil {
		return manager.Child{}, nil, err
	}
	if argv == nil {
		argv = []string{"sleep", "300"}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{material.EnvVar + "=" + path}, env...)
	master, err := pty.Start(cmd)
	if err != nil {
		return manager.Child{}, nil, err
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		master.Close()
		return manager.Child{}, nil, err
	}
	child := manager.Child{Pid: cmd.Process.Pid, StartTime: st, Dir: dir}
	l.mu.Lock()
	l.cmds = append(l.cmds, cmd)
	l.children[req.Name] = child
	l.mu.Unlock()
	go func() { _ = cmd.Wait() }() // reaped, so that Gone sees it go
	return child, master, nil
}

func (l *hostLauncher) Signal(_ context.Context, child manager.Child, sig syscall.Signal) error {
	gone, err := child.Gone()
	if err != nil {
		return err
	}
	if gone {
		if sig == 0 {
			return &manager.LaunchRefusedError{Reason: manager.LaunchChildUnknown, Message: "gone"}
		}
		return nil
	}
	if sig == 0 {
		return nil
	}
	if err := syscall.Kill(-child.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func (l *hostLauncher) ReplaceMaterial(_ context.Context, child manager.Child, b []byte) error {
	return os.WriteFile(filepath.Join(child.Dir, "launch-material"), b, 0o600)
}

// startWith runs a remote managerd on in and opts; it is closed when the test ends.
func (r *remoteRig) startWith(t *testing.T, in manager.Inputs, opts manager.RuntimeOptions, mlogs *testkit.SyncBuffer) *manager.Manager {
	t.Helper()
	opts.Logger = slog.New(slog.NewJSONHandler(mlogs, nil))
	m, err := manager.Start(context.Background(), in, opts)
	if err != nil {
		t.Fatalf("start: %v\nmanagerd:\n%s", err, mlogs.String())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

// startOnly is a RemoteAuthority with the start hooks only: embedding the interface hides the
// stock client's EnrollManagedAgent.
type startOnly struct{ manager.RemoteAuthority }

// widening is the stock RemoteAuthority whose enrollment answer is tampered with after authd
// answered: it grants one more publish channel than was asked, so it does not bind.
type widening struct{ *manager.HTTPAuthority }

func (w widening) EnrollManagedAgent(ctx context.Context, req *managerauthority.EnrollmentRequest) (*managerauthority.Enrollment, error) {
	e, err := w.HTTPAuthority.EnrollManagedAgent(ctx, req)
	if err == nil {
		e.AllowPublish = append(e.AllowPublish, "widened")
	}
	return e, err
}

// panicky is a host RemoteAuthority whose enrollment hook panics (with nil).
type panicky struct{ manager.RemoteAuthority }

func (panicky) EnrollManagedAgent(context.Context, *managerauthority.EnrollmentRequest) (*managerauthority.Enrollment, error) {
	panic(nil)
}

// TestRemoteManagerdSpawn is issue 25 item 6's spawn: a remote managerd enrolls the agent at
// authd's door (only the SHA-256 of the actor token it made leaves it), binds the answer, and
// launches the agent through a host launcher with the exchange form of its launch material
// (0600; the exchange URL, the token and the sentinel; no creds). With that material a client
// exchanges the token at authd's public face and connects through the callout. The real
// testagent is not run: the material's exchange URL is the public URL authd publishes
// (https://auth.example/t, a proxy the test has not got), so the exchange is made with
// pkg/authclient's agent arm against the face's listen address, as enroll_test does
// (TestRemoteManagerdRealAgent runs the real testagent through a TLS proxy). A remote
// managerd whose authority has no enrollment hook refuses Spawn.
func TestRemoteManagerdSpawn(t *testing.T) {
	r := newRemoteRig(t)
	cfg := r.config()
	lnch := newHostLauncher(t)
	mlogs := &testkit.SyncBuffer{}
	r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: lnch}, mlogs)
	c := r.client(t, cfg)
	h := r.h
	var ag *managerv1.Agent
	var mat material.Material

	t.Run("ok/spawn enrolls and launches with the exchange form", func(t *testing.T) {
		resp, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Subscribe: []string{"general"}})
		if err != nil {
			t.Fatalf("spawn: %v\nmanagerd:\n%s", err, mlogs.String())
		}
		ag = resp.GetAgent()
		if ag.GetOwner() != h.owner || ag.GetActor() != "a1" || ag.GetProcess() != managerv1.ProcessState_PROCESS_STATE_RUNNING {
			t.Fatalf("agent %v", ag)
		}
		path := filepath.Join(lnch.root, "a1", "launch-material")
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("material %v err %v, want mode 0600", fi, err)
		}
		if mat, err = material.ReadFile(path); err != nil {
			t.Fatal(err)
		}
		if !mat.Exchange() || mat.Creds != "" || mat.ExchangeURL != h.s.PublicURL() || mat.Owner != h.owner || mat.Actor != "a1" ||
			mat.LifecycleUID != ag.GetLifecycleUid() || len(mat.Subscribe) != 1 || mat.Subscribe[0] != "general" {
			t.Fatalf("material %v (exchange %v, creds %d bytes), want the exchange form at %s", mat, mat.Exchange(), len(mat.Creds), h.s.PublicURL())
		}
		raw, _ := os.ReadFile(path)
		if bytes.Contains(raw, []byte(`"creds"`)) || bytes.Contains(raw, []byte("NKEY SEED")) {
			t.Fatal("the exchange form carries a credential")
		}
		// Only the token's SHA-256 reached the authority: the ledger row holds it.
		row, _, err := h.led.Get(h.owner, "a1")
		sum := sha256.Sum256([]byte(mat.Token))
		if err != nil || row.TokenHash != hex.EncodeToString(sum[:]) || row.LifecycleUID != ag.GetLifecycleUid() {
			t.Fatalf("ledger row uid %s err %v: want the token's SHA-256 at uid %s", row.LifecycleUID, err, ag.GetLifecycleUid())
		}
		if strings.Contains(mlogs.String(), mat.Token) || strings.Contains(r.logs.String(), mat.Token) {
			t.Fatal("the actor token was logged")
		}
	})

	t.Run("ok/the material exchanges at the public face and connects through the callout", func(t *testing.T) {
		if mat.Token == "" {
			t.Fatal("no material (the spawn failed)")
		}
		ac, err := authclient.New(authclient.Config{URL: r.pub, Owner: mat.Owner, Actor: mat.Actor, ActorToken: mat.Token})
		if err != nil {
			t.Fatal(err)
		}
		opts, err := ac.NatsOptions(mat.Sentinel)
		if err != nil {
			t.Fatalf("exchange: %v", err)
		}
		nc, err := nats.Connect(strings.Join(mat.Servers, ","), append(opts, nats.NoReconnect(), nats.Timeout(10*time.Second))...)
		if err != nil {
			t.Fatalf("connect through the callout: %v", err)
		}
		defer nc.Close()
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		// The exchange activated the lifecycle at the uid the authority chose and the manager bound.
		head, _, found, err := h.e.lifecycleStore(t).Head(ctxT(t), h.owner, "a1")
		if err != nil || !found || head.State != lifecycle.HeadActive || head.LifecycleUID != ag.GetLifecycleUid() {
			t.Fatalf("head %+v found %v err %v, want active at the spawned uid %s", head, found, err, ag.GetLifecycleUid())
		}
	})

	t.Run("fail/a panicking enrollment hook is a HOOK warning and a refused spawn", func(t *testing.T) {
		warned := &hookWarnings{}
		cfg3, _ := r.secondManagerd(t, "3", func(s *manager.HTTPAuthority) manager.RemoteAuthority { return panicky{s} },
			manager.RuntimeOptions{Launcher: lnch, Events: warned.events}, &testkit.SyncBuffer{})
		_, err := r.client(t, cfg3).Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "p1", Connector: "echo"})
		if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "EnrollManagedAgent") {
			t.Fatalf("spawn = %v, want INTERNAL naming the rejected hook", err)
		}
		if hooks := warned.list(); len(hooks) != 1 || !strings.Contains(hooks[0], "EnrollManagedAgent") {
			t.Fatalf("HOOK warnings %v, want one for EnrollManagedAgent", hooks)
		}
		if _, err := os.Stat(filepath.Join(lnch.root, "p1")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("p1 was launched (%v)", err)
		}
	})

	t.Run("fail/an authority without the enrollment hook refuses spawn", func(t *testing.T) {
		cfg2, _ := r.secondManagerd(t, "2", func(s *manager.HTTPAuthority) manager.RemoteAuthority { return startOnly{s} },
			manager.RuntimeOptions{Launcher: lnch}, &testkit.SyncBuffer{})
		_, err := r.client(t, cfg2).Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "a2", Connector: "echo"})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "managed-agent enrollment is not available") {
			t.Fatalf("spawn = %v, want FAILED_PRECONDITION naming enrollment", err)
		}
		if _, _, err := h.led.Get(h.owner, "a2"); err == nil {
			t.Fatal("a row of a2 was written")
		}
	})
}

// logIndex is the index of the first line of logs at or after from that holds every part, or -1.
func logIndex(logs string, from int, parts ...string) int {
	lines := strings.Split(logs, "\n")
	for i := from; i < len(lines); i++ {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(lines[i], p)
		}
		if all {
			return i
		}
	}
	return -1
}

// activate exchanges the agent's material at the public face and connects through the callout
// once (the lifecycle's first exchange makes its head active), then hangs up.
func activate(t *testing.T, r *remoteRig, lnch *hostLauncher, name string) material.Material {
	t.Helper()
	mat, err := material.ReadFile(filepath.Join(lnch.root, name, "launch-material"))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := authclient.New(authclient.Config{URL: r.pub, Owner: mat.Owner, Actor: mat.Actor, ActorToken: mat.Token})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := ac.NatsOptions(mat.Sentinel)
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	nc, err := nats.Connect(strings.Join(mat.Servers, ","), append(opts, nats.NoReconnect(), nats.Timeout(10*time.Second))...)
	if err != nil {
		t.Fatalf("connect through the callout: %v", err)
	}
	defer nc.Close()
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return mat
}

// waitManagerReady polls until mgr is ready, for at most 20 s.
func waitManagerReady(t *testing.T, mgr *manager.Manager) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !mgr.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("managerd not ready within 20 s (state %v)", mgr.State())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// connectAgent exchanges the agent's material at the public face and connects through the
// callout; the connection lives until the test ends.
func connectAgent(t *testing.T, r *remoteRig, lnch *hostLauncher, name string) (material.Material, *nats.Conn) {
	t.Helper()
	mat, err := material.ReadFile(filepath.Join(lnch.root, name, "launch-material"))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := authclient.New(authclient.Config{URL: r.pub, Owner: mat.Owner, Actor: mat.Actor, ActorToken: mat.Token})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := ac.NatsOptions(mat.Sentinel)
	if err != nil {
		t.Fatalf("exchange %s: %v", name, err)
	}
	nc, err := nats.Connect(strings.Join(mat.Servers, ","), append(opts, nats.NoReconnect(), nats.Timeout(10*time.Second))...)
	if err != nil {
		t.Fatalf("connect %s through the callout: %v", name, err)
	}
	t.Cleanup(nc.Close)
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return mat, nc
}

// TestRemoteManagerdStop is issue 25 item 6's stop (and a spawn's undo: a launch that fails
// after the enrollment prepares the retirement, so the grant is gone): once the agent's process is proven gone, a
// remote managerd prepares the retirement at authd's door, has a retirement requester minted at
// the current epoch, and retires the lifecycle on the retire-lifecycle rail, in that order; the
// head is retired and the name free (a new spawn of it gets a new uid). With deliveryd down the
// prepare fails (unavailable): no requester, no rail, the name held, a pending-retirement record
// (0600) in the state directory; once deliveryd is back the background retry retires it under
// the same opId and frees the name. A retirement still pending when the manager closes is
// retried by the next start (at its new serve epoch), which holds the name until it is retired.
func TestRemoteManagerdStop(t *testing.T) {
	r := newRemoteRig(t)
	h := r.h
	d := h.e.startDeliveryd(t)
	cfg := r.config()
	lnch := newHostLauncher(t)
	mlogs := &testkit.SyncBuffer{}
	mgr := r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: lnch}, mlogs)
	c := r.client(t, cfg)
	st := h.e.lifecycleStore(t)
	spawn := func(t *testing.T, name string) *managerv1.Agent {
		t.Helper()
		// The rig's remote-manager credential lives 4 s: at its first expiry the broker cuts
		// managerd's connection, which it restores with the renewed one.
		waitManagerReady(t, mgr)
		resp, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: name, Connector: "echo", Subscribe: []string{"general"}})
		if err != nil {
			t.Fatalf("spawn %s: %v\nmanagerd:\n%s", name, err, mlogs.String())
		}
		return resp.GetAgent()
	}
	pendingPath := func(name string) string { return filepath.Join(cfg.StateDir, "retire", name+".json") }
	// retriedAndFree: a pending retirement of ag, retried in the background, ends with its head
	// retired at its uid and no pending record; then a spawn of name through client gets a new
	// uid.
	retriedAndFree := func(t *testing.T, client managerv1.ManagerServiceClient, name string, ag *managerv1.Agent) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, func() error {
			head, _, _, err := st.Head(ctxT(t), h.owner, name)
			if err != nil || head.State != lifecycle.HeadRetired || head.LifecycleUID != ag.GetLifecycleUid() {
				return fmt.Errorf("head %+v err %v", head, err)
			}
			if _, err := os.Stat(pendingPath(name)); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("pending record still there (%v)", err)
			}
			return nil
		})
		testkit.Eventually(t, 10*time.Second, func() error {
			resp, err := client.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: name, Connector: "echo", Subscribe: []string{"general"}})
			if err != nil {
				return err
			}
			if resp.GetAgent().GetLifecycleUid() == ag.GetLifecycleUid() {
				return errors.New("the respawn reused the retired uid")
			}
			return nil
		})
	}
	// retiredAndFree: since log line from, authd saw prepare, requester and rail for ag in that
	// order; its head is retired at its uid, no pending record is left, and a new spawn of name
	// gets a new uid.
	retiredAndFree := func(t *testing.T, name string, ag *managerv1.Agent, from int) {
		t.Helper()
		logs := r.logs.String()
		prep := logIndex(logs, from, `"msg":"manager service authority: answered"`, `"kind":"manager-managed-agent-prepare-retirement"`)
		mint := logIndex(logs, max(prep, 0), `"msg":"manager service authority: answered"`, `"operation":"retire"`)
		rail := logIndex(logs, max(mint, 0), `"msg":"retire rail: retirement requested"`, `"uid":"`+ag.GetLifecycleUid()+`"`)
		if prep < 0 || mint <= prep || rail <= mint {
			t.Fatalf("authd log order prepare %d, requester %d, rail %d: want all three, in that order", prep, mint, rail)
		}
		head, _, found, err := st.Head(ctxT(t), h.owner, name)
		if err != nil || !found || head.State != lifecycle.HeadRetired || head.LifecycleUID != ag.GetLifecycleUid() {
			t.Fatalf("head %+v found %v err %v, want retired at %s", head, found, err, ag.GetLifecycleUid())
		}
		if _, err := os.Stat(pendingPath(name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("pending record after a finished retirement: %v", err)
		}
		again := spawn(t, name)
		if again.GetLifecycleUid() == ag.GetLifecycleUid() || again.GetLifecycleUid() == "" {
			t.Fatalf("respawn uid %s, want a new one (was %s)", again.GetLifecycleUid(), ag.GetLifecycleUid())
		}
	}

	t.Run("fail/a launch that fails after the enrollment undoes it (the whole retirement)", func(t *testing.T) {
		lnch.mu.Lock()
		lnch.refuse = "x1"
		lnch.mu.Unlock()
		waitManagerReady(t, mgr)
		_, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "x1", Connector: "echo", Subscribe: []string{"general"}})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "refused by the test") {
			t.Fatalf("spawn = %v, want the launcher's refusal", err)
		}
		if _, _, err := h.led.Get(h.owner, "x1"); err == nil {
			t.Fatal("the enrolled grant of x1 stands after the failed spawn")
		}
		if !strings.Contains(mlogs.String(), `"msg":"spawn failed after the enrollment; the enrollment was undone","agent":"x1"`) {
			t.Fatal("no undo logged")
		}
		// The undo is the whole retirement: the enrollment activated the lifecycle, the rail
		// retired it, and no pending record is left.
		if head, _, found, err := st.Head(ctxT(t), h.owner, "x1"); err != nil || !found || head.State != lifecycle.HeadRetired {
			t.Fatalf("head of x1 %+v found %v err %v, want retired", head, found, err)
		}
		if _, err := os.Stat(pendingPath("x1")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("pending record after the undo: %v", err)
		}
		lnch.mu.Lock()
		lnch.refuse = ""
		lnch.mu.Unlock()
		// A fresh token (another digest) enrolls: the grant is gone, not left to conflict.
		spawn(t, "x1")
	})

	t.Run("fail/an enrollment answer that does not bind is retired, not launched", func(t *testing.T) {
		m4logs := &testkit.SyncBuffer{}
		cfg4, m4 := r.secondManagerd(t, "4", func(s *manager.HTTPAuthority) manager.RemoteAuthority { return widening{s} },
			manager.RuntimeOptions{Launcher: lnch}, m4logs)
		waitManagerReady(t, m4)
		_, err := r.client(t, cfg4).Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "w1", Connector: "echo", Subscribe: []string{"general"}})
		if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "does not bind") {
			t.Fatalf("spawn = %v, want INTERNAL: the answer does not bind", err)
		}
		if _, err := os.Stat(filepath.Join(lnch.root, "w1")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("w1 was launched (%v)", err)
		}
		if _, _, err := h.led.Get(h.owner, "w1"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("the grant of w1 after the refused bind: %v", err)
		}
		head, _, found, err := st.Head(ctxT(t), h.owner, "w1")
		if err != nil || !found || head.State != lifecycle.HeadRetired {
			t.Fatalf("head of w1 %+v found %v err %v, want retired", head, found, err)
		}
		if !strings.Contains(m4logs.String(), `"msg":"spawn failed after the enrollment; the enrollment was undone","agent":"w1"`) {
			t.Fatalf("no undo logged:\n%s", m4logs.String())
		}
	})

	t.Run("ok/an enrolled agent, connected through the callout, receives through deliveryd what another posts", func(t *testing.T) {
		// The rig's remote-manager credential lives 4 s, so managerd's broker connection is cut
		// and restored between renewals; each step starts once it is ready again.
		defer waitManagerReady(t, mgr)
		waitManagerReady(t, mgr)
		for _, name := range []string{"rx", "tx"} {
			waitManagerReady(t, mgr)
			if _, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: name, Connector: "echo", Subscribe: []string{"general"},
				AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}}); err != nil {
				t.Fatalf("spawn %s: %v\nmanagerd:\n%s", name, err, mlogs.String())
			}
		}
		rx, rnc := connectAgent(t, r, lnch, "rx")
		tx, tnc := connectAgent(t, r, lnch, "tx")
		n, err := space.NewNames(sp)
		if err != nil {
			t.Fatal(err)
		}
		// rx becomes a durable member of general as itself, over its exchanged connection.
		jr, err := dlvclient.Join(ctxT(t), rnc, n, rx.Owner, rx.Actor, rx.LifecycleUID, "general")
		if err != nil {
			t.Fatalf("durable join of rx: %v", err)
		}
		if jr.Generation < 1 {
			t.Fatalf("join %+v, want a generation", jr)
		}
		rjs, err := jetstream.New(rnc)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := dlvclient.New(ctxT(t), rjs, dlvclient.Config{Space: sp, Owner: rx.Owner, Actor: rx.Actor, LifecycleUID: rx.LifecycleUID})
		if err != nil {
			t.Fatalf("rx binds its delivery durable: %v", err)
		}
		got := make(chan dlvclient.Delivery, 4)
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- dc.Run(rctx, func(_ context.Context, d dlvclient.Delivery) error { got <- d; return nil })
		}()
		stopRx := func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("rx's delivery client: %v", err)
			}
		}
		// tx posts on general as itself, over its own exchanged connection.
		subj, err := n.Chat(tx.Owner, tx.Actor, "general")
		if err != nil {
			t.Fatal(err)
		}
		text := "hello rx through deliveryd " + rand.Text()
		body, err := json.Marshal(map[string]any{"id": "m-remote-1", "from": map[string]string{"id": tx.Owner + "." + tx.Actor}, "text": text, "to": "all"})
		if err != nil {
			t.Fatal(err)
		}
		tjs, err := jetstream.New(tnc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tjs.Publish(ctxT(t), subj, body, jetstream.WithMsgID("m-remote-1")); err != nil {
			t.Fatalf("tx posts on general: %v", err)
		}
		select {
		case d := <-got:
			var m struct {
				ID, Text string
				From     struct{ ID string }
			}
			if err := json.Unmarshal(d.Msg, &m); err != nil {
				t.Fatalf("delivered frame: %v", err)
			}
			if d.Channel != "general" || d.ID != "m-remote-1" || m.Text != text || m.From.ID != tx.Owner+"."+tx.Actor {
				t.Fatalf("rx received channel %q id %q text %q from %q; want general, m-remote-1, %q from %s.%s", d.Channel, d.ID, m.Text, m.From.ID, text, tx.Owner, tx.Actor)
			}
		case err := <-done:
			t.Fatalf("rx's delivery client ended before the message arrived: %v", err)
		case <-time.After(20 * time.Second):
			stopRx()
			t.Fatal("rx received nothing through deliveryd within 20 s")
		}
		// The agents hang up (their processes are what Stop ends; these connections stand in for
		// them), then both despawn through the retirement path; their heads are retired.
		stopRx()
		rnc.Close()
		tnc.Close()
		for _, name := range []string{"rx", "tx"} {
			waitManagerReady(t, mgr)
			if _, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: name}); err != nil {
				t.Fatalf("stop %s: %v\nmanagerd:\n%s", name, err, mlogs.String())
			}
			head, _, found, err := st.Head(ctxT(t), h.owner, name)
			if err != nil || !found || head.State != lifecycle.HeadRetired {
				t.Fatalf("head of %s %+v found %v err %v, want retired", name, head, found, err)
			}
		}
	})

	t.Run("ok/stop prepares, mints the requester, retires on the rail; the name is free", func(t *testing.T) {
		ag := spawn(t, "a1")
		activate(t, r, lnch, "a1")
		from := len(strings.Split(r.logs.String(), "\n")) - 1
		resp, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "a1"})
		if err != nil {
			t.Fatalf("stop: %v\nmanagerd:\n%s", err, mlogs.String())
		}
		if resp.GetAgent().GetProcess() != managerv1.ProcessState_PROCESS_STATE_EXITED {
			t.Fatalf("stopped agent %v", resp.GetAgent())
		}
		if gone, err := lnch.child("a1").Gone(); err != nil || !gone || lnch.child("a1").Pid != int(ag.GetPid()) {
			t.Fatalf("the agent (pid %d) gone %v err %v", ag.GetPid(), gone, err)
		}
		retiredAndFree(t, "a1", ag, from)
	})

	t.Run("ok/an agent that never exchanged its token retires at its uid; the name is free", func(t *testing.T) {
		ag := spawn(t, "n1")
		// The enrollment activated the lifecycle before any row or durable: the head stands at
		// the spawned uid although no exchange ever ran.
		head, _, found, err := st.Head(ctxT(t), h.owner, "n1")
		if err != nil || !found || head.State != lifecycle.HeadActive || head.LifecycleUID != ag.GetLifecycleUid() {
			t.Fatalf("head %+v found %v err %v, want active at %s before any exchange", head, found, err, ag.GetLifecycleUid())
		}
		from := len(strings.Split(r.logs.String(), "\n")) - 1
		if _, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "n1"}); err != nil {
			t.Fatalf("stop: %v\nmanagerd:\n%s", err, mlogs.String())
		}
		retiredAndFree(t, "n1", ag, from)
		if _, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "n1"}); err != nil {
			t.Fatalf("stop the respawn: %v\nmanagerd:\n%s", err, mlogs.String())
		}
	})

	t.Run("fail/prepare unavailable: no requester, no rail, name held, pending record; retried once deliveryd is back", func(t *testing.T) {
		ag := spawn(t, "b1")
		activate(t, r, lnch, "b1")
		if err := d.Close(ctxT(t)); err != nil {
			t.Fatalf("stop deliveryd: %v", err)
		}
		from := len(strings.Split(r.logs.String(), "\n")) - 1
		_, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "b1"})
		if msg := status.Convert(err).Message(); status.Code(err) != codes.Unavailable || !strings.Contains(msg, "retirement is pending") ||
			!strings.Contains(msg, "prepare: ") || !strings.Contains(msg, "(503 unavailable)") {
			t.Fatalf("stop = %v, want UNAVAILABLE naming the pending retirement and the prepare's 503", err)
		}
		logs := r.logs.String()
		if i := logIndex(logs, from, `"operation":"retire"`); i >= 0 {
			t.Fatal("a retirement requester was minted after a failed prepare")
		}
		if i := logIndex(logs, from, `"msg":"retire rail: retirement requested"`); i >= 0 {
			t.Fatal("the rail was asked after a failed prepare")
		}
		fi, err := os.Stat(pendingPath("b1"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("pending record %v err %v, want mode 0600", fi, err)
		}
		rec, _ := os.ReadFile(pendingPath("b1"))
		opID, _ := lifecycle.ManagedRetirementOpID(ag.GetLifecycleUid())
		if !strings.Contains(string(rec), `"opId":"`+opID+`"`) || !strings.Contains(string(rec), `"lifecycleUid":"`+ag.GetLifecycleUid()+`"`) {
			t.Fatalf("pending record %s, want opId %s for uid %s", rec, opID, ag.GetLifecycleUid())
		}
		waitManagerReady(t, mgr)
		_, err = c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "b1", Connector: "echo"})
		if status.Code(err) != codes.AlreadyExists {
			t.Fatalf("spawn of the held name = %v, want ALREADY_EXISTS", err)
		}
		head, _, _, err := st.Head(ctxT(t), h.owner, "b1")
		if err != nil || head.State != lifecycle.HeadActive {
			t.Fatalf("head %+v err %v, want still active", head, err)
		}

		h.e.startDeliveryd(t)
		retriedAndFree(t, c, "b1", ag)
	})
	t.Run("ok/a retirement left pending is retried at the next start, its name held meanwhile", func(t *testing.T) {
		// deliveryd is down again: the previous subtest's ended with it.
		ag := spawn(t, "c1")
		activate(t, r, lnch, "c1")
		if _, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "c1"}); status.Code(err) != codes.Unavailable {
			t.Fatalf("stop = %v, want UNAVAILABLE (pending)", err)
		}
		if err := mgr.Close(ctxT(t)); err != nil {
			t.Fatalf("close: %v", err)
		}
		if _, err := os.Stat(pendingPath("c1")); err != nil {
			t.Fatalf("pending record across the restart: %v", err)
		}
		r.startWith(t, manager.Inputs{Config: r.config()}, manager.RuntimeOptions{Launcher: lnch}, mlogs)
		c2 := r.client(t, cfg)
		_, err := c2.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "c1", Connector: "echo"})
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(status.Convert(err).Message(), "pending retirement") {
			t.Fatalf("spawn of the held name after the restart = %v, want ALREADY_EXISTS naming the pending retirement", err)
		}
		if !strings.Contains(mlogs.String(), `"msg":"resuming a pending retirement","agent":"c1"`) {
			t.Fatal("the restarted manager did not resume c1's retirement")
		}
		h.e.startDeliveryd(t)
		retriedAndFree(t, c2, "c1", ag)
	})
}
