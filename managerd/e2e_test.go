package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/managerd/internal/api"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// The end-to-end tests run the whole machine as it is deployed, as root (CI runs as root): a real
// signerd and broker (in process, on loopback), the deliveryd binary, `managerd launcher` as root
// and `managerd serve` as its own throwaway user, and test agents as another throwaway user, all
// driven through ManagerService on managerd's Unix socket.

const canary = "COTAL_E2E_CANARY"

// binaries are built once per test binary run (removed by TestMain).
var binaries = testkit.Binaries{Prefix: "managerd-e2e-bin-", Pkgs: []string{
	"github.com/cotalgo/cotal/managerd", "github.com/cotalgo/cotal/managerd/internal/testagent",
	"github.com/cotalgo/cotal/deliveryd",
}}

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

// builtBinaries returns the paths of managerd, the test agent and deliveryd.
func builtBinaries(t testing.TB) []string {
	t.Helper()
	dir := binaries.Dir(t)
	return []string{filepath.Join(dir, "managerd"), filepath.Join(dir, "testagent"), filepath.Join(dir, "deliveryd")}
}

// proc is a daemon child process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    *testkit.SyncBuffer
	exited chan struct{}
	err    error
}

func startProc(t testing.TB, name string, cred *syscall.Credential, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(argv[0], argv[1:]...), out: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = env
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out)
		}
	})
	return p
}

func (p *proc) exitCode(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("%s still running after %v:\n%s", p.name, within, p.out)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

// writeFile writes data as path, owned by uid:gid with mode.
func writeFile(t testing.TB, path string, data []byte, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t testing.TB, path string, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, from, to string, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, b, uid, gid, mode)
}

// machine is one machine's Cotal: users, directories, binaries, the launcher, deliveryd, and
// managerd's configuration.
type machine struct {
	e              *plane3test.Env
	base, bin      string
	mgrUID, mgrGID uint32
	// uidFirst is the first of the launcher's eight agent uids (one per agent, gid the same).
	uidFirst  uint32
	mgrConfig string
	mgrKey    string
	apiSock   string
	blob      string
	// capacity and agentTTL go into managerd.yaml (default 4 and 5s).
	capacity int
	agentTTL string
}

func (m *machine) path(p ...string) string { return filepath.Join(append([]string{m.base}, p...)...) }

const instanceID = "e2einstaaaaaaaaaaaaaaaaaaa"

// newMachine sets everything up but managerd: the users, the binaries, `managerd launcher` as
// root, the deliveryd binary, and managerd's configuration and files owned by its user.
func newMachine(t testing.TB) *machine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("root test: creating users, the launcher and managerd under its own uid need root (CI runs as root)")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("root test: needs useradd")
	}
	m := &machine{e: plane3test.New(t), capacity: 4, agentTTL: "5s"}
	m.mgrUID, m.mgrGID = testkit.AddUser(t, 0)
	m.uidFirst = 64300 // above login.defs' UID_MAX and below nobody: no user has these
	m.base = t.TempDir()
	for _, d := range []string{filepath.Dir(m.base), m.base} { // traversable by the test's users
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m.bin = m.path("bin")
	mkdir(t, m.bin, 0, 0, 0o755)
	for _, b := range builtBinaries(t) {
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(m.bin, filepath.Base(b)), data, 0, 0, 0o755)
	}

	// A blob of random bytes without CR or LF (the PTY maps LF on output), for the byte-exact check.
	blob := make([]byte, 8<<10)
	_, _ = rand.Read(blob)
	for i, c := range blob {
		if c == '\n' || c == '\r' {
			blob[i] = 'x'
		}
	}
	m.blob = m.path("blob")
	writeFile(t, m.blob, blob, 0, 0, 0o644)

	// The launcher, as root, with a canary in its environment.
	launcherCfg := fmt.Sprintf(`socket: %s
token_file: %s
manager: {uid: %d, gid: %d}
agents: {uid_first: %d, uid_count: 8}
agent_root: %s
connectors:
  testagent: {argv: [%s, --probe-every, 1s]}
  blob: {argv: [/bin/sh, -c, "cat %s; exec sleep 600"]}
env_allow: [TERM]
log_level: debug
`, m.path("run", "launcher.sock"), m.path("mgr-token", "launcher.token"), m.mgrUID, m.mgrGID, m.uidFirst,
		m.path("agents"), filepath.Join(m.bin, "testagent"), m.blob)
	writeFile(t, m.path("launcher.yaml"), []byte(launcherCfg), 0, 0, 0o600)
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", canary + "=leaked", "HOME=/root"}
	launcher := startProc(t, "launcher", nil, env, filepath.Join(m.bin, "managerd"), "launcher", "--config", m.path("launcher.yaml"))
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := os.Stat(m.path("run", "launcher.sock")); err != nil {
			return fmt.Errorf("launcher socket: %v (%s)", err, launcher.out)
		}
		return nil
	})

	// deliveryd, as root.
	dtls := m.e.S.ClientFor(t, mtls.KindDeliveryd, plane3test.Space)
	mkdir(t, m.path("deliveryd"), 0, 0, 0o700)
	dcfg := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {address: %q, ca: %s, cert: %s, key: %s}\nstate_dir: %s\nholder: e2e-deliveryd\n",
		plane3test.Space, m.e.URL, m.e.S.Addr, dtls.ServerCAFile, dtls.CertFile, dtls.KeyFile, m.path("deliveryd", "state"))
	writeFile(t, m.path("deliveryd", "deliveryd.yaml"), []byte(dcfg), 0, 0, 0o600)
	startProc(t, "deliveryd", nil, env, filepath.Join(m.bin, "deliveryd"), "serve", "--config", m.path("deliveryd", "deliveryd.yaml"))

	// managerd's own files, its user's.
	mkdir(t, m.path("mgr"), m.mgrUID, m.mgrGID, 0o700)
	mkdir(t, m.path("mgr", "tls"), m.mgrUID, m.mgrGID, 0o700)
	mtlsFiles := m.e.S.ClientFor(t, mtls.KindManagerd, plane3test.Space)
	copyFile(t, mtlsFiles.ServerCAFile, m.path("mgr", "tls", "ca.pem"), m.mgrUID, m.mgrGID, 0o644)
	copyFile(t, mtlsFiles.CertFile, m.path("mgr", "tls", "client.pem"), m.mgrUID, m.mgrGID, 0o644)
	m.mgrKey = m.path("mgr", "tls", "client-key.pem")
	copyFile(t, mtlsFiles.KeyFile, m.mgrKey, m.mgrUID, m.mgrGID, 0o600)
	mkdir(t, m.path("api"), m.mgrUID, m.mgrGID, 0o750)
	m.apiSock = m.path("api", "manager.sock")
	mkdir(t, m.path("root"), m.mgrUID, m.mgrGID, 0o755)
	m.mgrConfig = m.path("mgr", "managerd.yaml")
	m.writeManagerConfig(t, "")
	return m
}

// writeManagerConfig writes managerd.yaml with extra appended.
func (m *machine) writeManagerConfig(t testing.TB, extra string) {
	t.Helper()
	cfg := fmt.Sprintf(`space: %s
brokers: [%s]
signer: {address: %q, ca: %s, cert: %s, key: %s}
state_dir: %s
instance_id: %s
root: %s
owner: m1
actor: supervisor
agent_owner: %s
launcher: {socket: %s, token_file: %s}
api: {socket: %s, allow_uids: [0]}
connectors: [testagent, blob]
env_allow: [TERM]
capacity: %d
agent_ttl: %s
renew_retry: 1s
signer_seed_paths: [%s, %s]
log_level: debug
%s`, plane3test.Space, m.e.URL, m.e.S.Addr, m.path("mgr", "tls", "ca.pem"), m.path("mgr", "tls", "client.pem"), m.mgrKey,
		m.path("mgr", "state"), instanceID, m.path("root"), plane3test.Owner, m.path("run", "launcher.sock"),
		m.path("mgr-token", "launcher.token"), m.apiSock, m.capacity, m.agentTTL, filepath.Join(m.e.S.Dir, "signer"), filepath.Join(m.e.S.Dir, "operator"), extra)
	writeFile(t, m.mgrConfig, []byte(cfg), m.mgrUID, m.mgrGID, 0o600)
}

// startManagerd runs `managerd serve` as managerd's user, with the canary in its environment.
func (m *machine) startManagerd(t testing.TB, name string) *proc {
	t.Helper()
	env := []string{"PATH=/usr/bin:/bin", canary + "=leaked", "HOME=/"}
	return startProc(t, name, &syscall.Credential{Uid: m.mgrUID, Gid: m.mgrGID}, env,
		filepath.Join(m.bin, "managerd"), "serve", "--config", m.mgrConfig)
}

// client dials ManagerService and waits until Status answers (managerd serving).
func (m *machine) client(t testing.TB, p *proc) managerv1.ManagerServiceClient {
	t.Helper()
	c, closer, err := api.Dial(context.Background(), m.apiSock)
	if err == nil {
		t.Cleanup(func() { closer.Close() })
	}
	testkit.Eventually(t, 40*time.Second, func() error {
		select {
		case <-p.exited:
			t.Fatalf("managerd exited: %v\n%s", p.err, p.out)
		default:
		}
		if err != nil {
			c, closer, err = api.Dial(context.Background(), m.apiSock)
			if err != nil {
				return err
			}
			t.Cleanup(func() { closer.Close() })
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, serr := c.Status(ctx, &managerv1.StatusRequest{})
		return serr
	})
	return c
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// attach opens an Attach stream on name and collects its output.
type attachment struct {
	stream managerv1.ManagerService_AttachClient
	mu     sync.Mutex
	snap   []byte
	data   bytes.Buffer
	exited *managerv1.Exited
	end    chan error
}

func attach(t testing.TB, c managerv1.ManagerServiceClient, name string) *attachment {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := c.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: name}}}); err != nil {
		t.Fatal(err)
	}
	a := &attachment{stream: st, end: make(chan error, 1)}
	first := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			r, err := st.Recv()
			if err != nil {
				if n == 0 {
					close(first)
				}
				a.end <- err
				return
			}
			a.mu.Lock()
			switch f := r.Frame.(type) {
			case *managerv1.AttachResponse_Snapshot:
				a.snap = append([]byte{}, f.Snapshot...)
			case *managerv1.AttachResponse_Data:
				a.data.Write(f.Data)
			case *managerv1.AttachResponse_Exited:
				a.exited = f.Exited
			}
			a.mu.Unlock()
			if n == 0 {
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot frame")
	}
	return a
}

// output is snapshot then data.
func (a *attachment) output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return string(a.snap) + a.data.String()
}

func (a *attachment) waitFor(t testing.TB, sub string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, func() error {
		if !strings.Contains(a.output(), sub) {
			return fmt.Errorf("terminal lacks %q; got:\n%s", sub, a.output())
		}
		return nil
	})
}

func input(t testing.TB, c managerv1.ManagerServiceClient, name, text string) {
	t.Helper()
	if _, err := c.Input(ctxT(t), &managerv1.InputRequest{Name: name, Text: []byte(text), Enter: true}); err != nil {
		t.Fatalf("input %s: %v", name, err)
	}
}

// consumerExists asks the broker, with a provisioner credential, whether a consumer exists.
func consumerExists(t testing.TB, m *machine, stream, name string) bool {
	t.Helper()
	js := m.e.Provisioner(t)
	_, err := js.Consumer(ctxT(t), stream, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("consumer %s on %s: %v", name, stream, err)
	}
	return true
}

// memberRowExists reads one durable membership row with a delivery credential, the rows'
// writer: false when it is absent (never written, deleted or purged).
func memberRowExists(t testing.TB, m *machine, key string) bool {
	t.Helper()
	bucket, err := m.e.N.Bucket(space.Members)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := plane3test.JS(t, m.e.Delivery(t)).KeyValue(ctxT(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(ctxT(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("membership row %s: %v", key, err)
	}
	return true
}

func wantReason(t testing.TB, err error, code codes.Code, reason managerv1.Reason) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("want %v %v, got %v", code, reason, err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == api.ErrorDomain && info.Reason == strings.TrimPrefix(reason.String(), "REASON_") {
			return
		}
	}
	t.Fatalf("want reason %v in %v", reason, st.Details())
}

// TestEndToEnd is the acceptance of issue 11 on one machine: isolation, delivery between two
// agents, Attach and Input, renewal, Stop, the instance lease across kill -9, and Shutdown.
func TestEndToEnd(t *testing.T) {
	m := newMachine(t)
	mgr := m.startManagerd(t, "managerd")
	c := m.client(t, mgr)

	// Two test agents on the durable channel general.
	var agents [2]*managerv1.Agent
	for i, name := range []string{"alice", "bob-1"} {
		a, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: name, Connector: "testagent", Env: map[string]string{"TERM": "xterm"}})
		if err != nil {
			t.Fatalf("spawn %s: %v\n%s", name, err, mgr.out)
		}
		if a.Agent.Process != managerv1.ProcessState_PROCESS_STATE_RUNNING || a.Agent.Pid <= 1 || a.Agent.Owner != plane3test.Owner {
			t.Fatalf("spawned %v", a.Agent)
		}
		agents[i] = a.Agent
	}
	alice, bob := agents[0], agents[1]
	if bob.Actor != "bob_1" {
		t.Fatalf("bob-1's actor is %q, want bob_1", bob.Actor)
	}
	ta, tb := attach(t, c, "alice"), attach(t, c, "bob-1")
	ta.waitFor(t, "ready")
	tb.waitFor(t, "ready")

	t.Run("ok/List shows process and mesh state", func(t *testing.T) {
		testkit.Eventually(t, 15*time.Second, func() error {
			l, err := c.List(ctxT(t), &managerv1.ListRequest{})
			if err != nil {
				return err
			}
			if len(l.Agents) != 2 || l.Agents[0].Name != "alice" || l.Agents[1].Name != "bob-1" {
				return fmt.Errorf("list %v", l.Agents)
			}
			for _, a := range l.Agents {
				if a.Process != managerv1.ProcessState_PROCESS_STATE_RUNNING || a.Mesh != managerv1.MeshState_MESH_STATE_ONLINE || a.LastSeen == nil {
					return fmt.Errorf("agent %s: process %v mesh %v", a.Name, a.Process, a.Mesh)
				}
			}
			return nil
		})
	})

	t.Run("ok/a message from alice reaches bob through deliveryd", func(t *testing.T) {
		input(t, c, "alice", "hello bob, from alice")
		tb.waitFor(t, "recv general local.alice hello bob, from alice")
		ta.waitFor(t, "sent general ")
	})

	aliceUID := uint32(0)
	t.Run("ok/each agent runs as a uid of its own from the range, without the ambient environment or its credential in argv", func(t *testing.T) {
		seen := map[string]bool{}
		for _, a := range []*managerv1.Agent{alice, bob} {
			uids := testkit.ProcUIDs(t, int(a.Pid))
			if len(uids) != 4 {
				t.Fatalf("Uid: %v", uids)
			}
			n, err := strconv.ParseUint(uids[0], 10, 32)
			if err != nil || n < uint64(m.uidFirst) || n >= uint64(m.uidFirst)+8 || seen[uids[0]] {
				t.Fatalf("agent %s Uid: %v, want a uid of %d+8 of its own", a.Name, uids, m.uidFirst)
			}
			seen[uids[0]] = true
			if a == alice {
				aliceUID = uint32(n)
			}
			for _, u := range uids {
				if u != uids[0] {
					t.Fatalf("agent %s Uid: %v, want one uid in all four", a.Name, uids)
				}
			}
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", a.Pid))
			if err != nil {
				t.Fatal(err)
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.Pid))
			if err != nil {
				t.Fatal(err)
			}
			for _, leak := range []string{canary, "eyJ", "SUA", "-----BEGIN"} {
				if bytes.Contains(environ, []byte(leak)) || bytes.Contains(cmdline, []byte(leak)) {
					t.Fatalf("agent %s: %q in its environment or command line", a.Name, leak)
				}
			}
			if !bytes.Contains(environ, []byte("COTAL_LAUNCH_MATERIAL=")) {
				t.Fatalf("agent %s: no COTAL_LAUNCH_MATERIAL", a.Name)
			}
		}
		in, err := c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(in.LaunchMaterialPath, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != aliceUID || st.Mode&0o7777 != 0o600 || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			t.Fatalf("launch material %s: uid %d mode %o, want %d and 0600", in.LaunchMaterialPath, st.Uid, st.Mode, aliceUID)
		}
	})

	t.Run("ok/the agent cannot open the signer's keys or managerd's key, connect to either socket, or handshake with signerd", func(t *testing.T) {
		for _, p := range []string{filepath.Join(m.e.S.Dir, "signer"), m.mgrKey, m.path("mgr-token", "launcher.token"), m.path("api"), m.path("run")} {
			input(t, c, "alice", "!open "+p)
			ta.waitFor(t, "open "+p+" EACCES")
		}
		for _, p := range []string{m.path("run", "launcher.sock"), m.apiSock} {
			input(t, c, "alice", "!unix "+p)
			ta.waitFor(t, "unix "+p+" EACCES")
		}
		input(t, c, "alice", "!tls "+m.e.S.Addr)
		ta.waitFor(t, "tls "+m.e.S.Addr+" refused")
		// Positive control: managerd still mints (a third agent spawns) and is refused by no one.
		if _, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "carol", Connector: "blob"}); err != nil {
			t.Fatalf("positive control spawn: %v", err)
		}
	})

	t.Run("ok/Attach is byte-exact and carries keystrokes", func(t *testing.T) {
		blob, err := os.ReadFile(m.blob)
		if err != nil {
			t.Fatal(err)
		}
		tc := attach(t, c, "carol")
		testkit.Eventually(t, 10*time.Second, func() error {
			if out := tc.output(); out != string(blob) {
				return fmt.Errorf("carol's terminal: %d bytes, want the %d-byte blob exactly", len(out), len(blob))
			}
			return nil
		})
		late := attach(t, c, "carol") // a late attach gets the screen as a snapshot
		if string(late.snap) != string(blob) {
			t.Fatalf("late attach snapshot: %d bytes, want the blob", len(late.snap))
		}
		if err := tc.stream.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Data{Data: []byte("typed")}}); err != nil {
			t.Fatal(err)
		}
		tc.waitFor(t, string(blob)+"typed") // the terminal echoes the keystrokes
	})

	t.Run("ok/renewal replaces the credential and the agent keeps working", func(t *testing.T) {
		first, err := c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "bob-1"})
		if err != nil {
			t.Fatal(err)
		}
		exp0 := first.Renewal.ExpiresAt.AsTime()
		testkit.Eventually(t, 20*time.Second, func() error {
			in, err := c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "bob-1"})
			if err != nil {
				return err
			}
			if !in.Renewal.ExpiresAt.AsTime().After(exp0.Add(4 * time.Second)) {
				return fmt.Errorf("bob-1's credential still expires at %v (first %v)", in.Renewal.ExpiresAt.AsTime(), exp0)
			}
			if in.Renewal.Failures != 0 {
				return fmt.Errorf("renewal failures %d: %s", in.Renewal.Failures, in.Renewal.LastError)
			}
			return nil
		})
		// Past the first credential's expiry, bob still receives.
		testkit.Eventually(t, 15*time.Second, func() error {
			if time.Now().Before(exp0.Add(time.Second)) {
				return errors.New("first credential not expired yet")
			}
			return nil
		})
		input(t, c, "alice", "after renewal")
		tb.waitFor(t, "recv general local.alice after renewal")
	})

	t.Run("ok/with signerd down the last good credential stays, Status shows the debt, renewal resumes", func(t *testing.T) {
		before, err := c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "bob-1"})
		if err != nil {
			t.Fatal(err)
		}
		m.e.S.Stop(t)
		testkit.Eventually(t, 20*time.Second, func() error {
			st, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
			if err != nil {
				return err
			}
			if st.Signer.Reachable || len(st.RenewalDebt) < 2 {
				return fmt.Errorf("signer reachable %v, debt %v", st.Signer.Reachable, st.RenewalDebt)
			}
			for _, d := range st.RenewalDebt {
				if d.Renewal.Failures == 0 || d.Renewal.LastError == "" || strings.Contains(d.Renewal.LastError, "eyJ") {
					return fmt.Errorf("debt row %v", d)
				}
			}
			return nil
		})
		during, err := c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "bob-1"})
		if err != nil {
			t.Fatal(err)
		}
		if during.Renewal.ExpiresAt.AsTime().Before(before.Renewal.ExpiresAt.AsTime()) {
			t.Fatalf("the credential went backwards while signerd was down: %v -> %v", before.Renewal.ExpiresAt.AsTime(), during.Renewal.ExpiresAt.AsTime())
		}
		m.e.S.Restart(t)
		testkit.Eventually(t, 30*time.Second, func() error {
			st, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
			if err != nil {
				return err
			}
			if !st.Signer.Reachable || len(st.RenewalDebt) != 0 {
				return fmt.Errorf("after restart: signer reachable %v, debt %v", st.Signer.Reachable, st.RenewalDebt)
			}
			return nil
		})
		input(t, c, "alice", "after signerd came back")
		tb.waitFor(t, "recv general local.alice after signerd came back")
	})

	t.Run("fail/bad requests leave nothing behind", func(t *testing.T) {
		for _, tc := range []struct {
			req    *managerv1.SpawnRequest
			code   codes.Code
			reason managerv1.Reason
		}{
			{&managerv1.SpawnRequest{Name: "x", Connector: "bash"}, codes.InvalidArgument, managerv1.Reason_REASON_CONNECTOR_UNKNOWN},
			{&managerv1.SpawnRequest{Name: "a/b", Connector: "testagent"}, codes.InvalidArgument, managerv1.Reason_REASON_NAME_INVALID},
			{&managerv1.SpawnRequest{Name: "x", Connector: "testagent", Subscribe: []string{"ops"}, AllowSubscribe: []string{"general"}}, codes.InvalidArgument, managerv1.Reason_REASON_SUBSCRIBE_NOT_ALLOWED},
			{&managerv1.SpawnRequest{Name: "alice", Connector: "testagent"}, codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE},
		} {
			_, err := c.Spawn(ctxT(t), tc.req)
			wantReason(t, err, tc.code, tc.reason)
		}
		l, err := c.List(ctxT(t), &managerv1.ListRequest{})
		if err != nil || len(l.Agents) != 3 {
			t.Fatalf("list after refusals: %v %v", l, err)
		}
		entries, err := os.ReadDir(m.path("agents"))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 3 {
			t.Fatalf("agent directories after refusals: %v", entries)
		}
	})

	t.Run("ok/Stop removes exactly that agent's durables, ACL row and membership row", func(t *testing.T) {
		n := m.e.N
		dmA, _ := n.DMConsumer(plane3test.Owner, alice.Actor, alice.LifecycleUid)
		dlvA, _ := n.DlvConsumer(plane3test.Owner, alice.Actor, alice.LifecycleUid)
		dmB, _ := n.DMConsumer(plane3test.Owner, bob.Actor, bob.LifecycleUid)
		dlvB, _ := n.DlvConsumer(plane3test.Owner, bob.Actor, bob.LifecycleUid)
		aclA, _ := space.ACLKey(plane3test.Owner, alice.Actor, alice.LifecycleUid)
		memberA, _ := space.MemberKey("general", plane3test.Owner, alice.Actor, alice.LifecycleUid)
		memberB, _ := space.MemberKey("general", plane3test.Owner, bob.Actor, bob.LifecycleUid)
		for _, x := range []struct{ stream, name string }{{n.DMStream(), dmA}, {n.DLVStream(), dlvA}} {
			if !consumerExists(t, m, x.stream, x.name) {
				t.Fatalf("%s missing before Stop", x.name)
			}
		}
		// alice joined general durably through deliveryd: her membership row is there.
		if !memberRowExists(t, m, memberA) || !memberRowExists(t, m, memberB) {
			t.Fatalf("membership rows %s and %s missing before Stop", memberA, memberB)
		}
		resp, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{dmA, dlvA, aclA, memberA}; !slices.Equal(resp.Deprovisioned, want) {
			t.Fatalf("deprovisioned %v, want %v", resp.Deprovisioned, want)
		}
		if consumerExists(t, m, n.DMStream(), dmA) || consumerExists(t, m, n.DLVStream(), dlvA) {
			t.Fatal("alice's durables survived Stop")
		}
		if !consumerExists(t, m, n.DMStream(), dmB) || !consumerExists(t, m, n.DLVStream(), dlvB) {
			t.Fatal("Stop of alice removed bob's durables")
		}
		if memberRowExists(t, m, memberA) || !memberRowExists(t, m, memberB) {
			t.Fatalf("after Stop: want %s purged and %s kept", memberA, memberB)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", alice.Pid)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("alice's process still there after Stop: %v", err)
		}
		_, err = c.Inspect(ctxT(t), &managerv1.InspectRequest{Name: "alice"})
		wantReason(t, err, codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN)
	})

	t.Run("fail/a second managerd on this root exits 1 naming the holder", func(t *testing.T) {
		second := m.startManagerd(t, "managerd-second")
		if code := second.exitCode(t, 30*time.Second); code != 1 {
			t.Fatalf("second managerd exited %d, want 1:\n%s", code, second.out)
		}
		if !strings.Contains(second.out.String(), "already serves from this root") {
			t.Fatalf("second managerd's refusal does not name the holder:\n%s", second.out)
		}
	})

	t.Run("ok/Shutdown with agents stops and deprovisions them, runs once", func(t *testing.T) {
		resp, err := c.Shutdown(ctxT(t), &managerv1.ShutdownRequest{WithAgents: true})
		if err != nil {
			t.Fatalf("shutdown: %v\n%s", err, mgr.out)
		}
		if strings.Join(resp.Stopped, ",") != "bob-1,carol" || len(resp.Spared) != 0 {
			t.Fatalf("shutdown stopped %v spared %v", resp.Stopped, resp.Spared)
		}
		if code := mgr.exitCode(t, 20*time.Second); code != 0 {
			t.Fatalf("managerd exited %d after Shutdown:\n%s", code, mgr.out)
		}
		dmB, _ := m.e.N.DMConsumer(plane3test.Owner, bob.Actor, bob.LifecycleUid)
		if consumerExists(t, m, m.e.N.DMStream(), dmB) {
			t.Fatal("bob's dm_ survived Shutdown{with_agents}")
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", bob.Pid)); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("bob's process survived Shutdown{with_agents}")
		}
	})
}

// TestKillRestart: after kill -9 of managerd, a restart on this root waits out the old lease key
// instead of refusing, reaps the killed manager's agent (its custody record), then serves.
func TestKillRestart(t *testing.T) {
	m := newMachine(t)
	first := m.startManagerd(t, "managerd-first")
	c1 := m.client(t, first)
	orphan, err := c1.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "orphan", Connector: "testagent"})
	if err != nil {
		t.Fatal(err)
	}
	dlv, _ := m.e.N.DlvConsumer(plane3test.Owner, orphan.Agent.Actor, orphan.Agent.LifecycleUid)
	if !consumerExists(t, m, m.e.N.DLVStream(), dlv) {
		t.Fatal("the orphan's dlv_ durable is missing")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.exitCode(t, 10*time.Second)
	second := m.startManagerd(t, "managerd-second")
	c := m.client(t, second)
	if !strings.Contains(second.out.String(), "waiting for a dead predecessor") {
		t.Fatalf("the restart did not wait out the killed manager's key:\n%s", second.out)
	}
	// The successor reaped the killed manager's agent from its custody record: the process is
	// gone (its terminal hung up with the manager) and exactly its durables are removed.
	if !strings.Contains(second.out.String(), "reaped a predecessor's agent") {
		t.Fatalf("the successor did not reap the orphan:\n%s", second.out)
	}
	if consumerExists(t, m, m.e.N.DLVStream(), dlv) {
		t.Fatal("the orphan's dlv_ durable survived the successor's start")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan.Agent.Pid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the orphan's process survived: %v", err)
	}
	st, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
	if err != nil || st.Lease != managerv1.LeaseState_LEASE_STATE_HELD {
		t.Fatalf("status after restart: %v %v", st, err)
	}
	// SIGTERM is a default shutdown: exit 0.
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := second.exitCode(t, 20*time.Second); code != 0 {
		t.Fatalf("managerd exited %d on SIGTERM:\n%s", code, second.out)
	}
}

// BenchmarkSpawnToConnected measures, on the whole machine as deployed (root only), the time from
// a Spawn request's admission to the agent's first working broker connection (its first probe of
// the manager's liveness plane), for 1 and for 20 concurrent spawns, with the phases of each:
// provision (a one-shot provisioner credential and the durables), mint, launch, and the signer's
// share (time in signerd calls). Each iteration spawns the batch, waits until every agent is
// connected, and stops them all (deprovisioning) before the next.
func BenchmarkSpawnToConnected(b *testing.B) {
	for _, conc := range []int{1, 20} {
		b.Run(fmt.Sprintf("concurrent=%d", conc), func(b *testing.B) {
			m := newMachine(b)
			m.capacity, m.agentTTL = 32, "1h"
			m.writeManagerConfig(b, "")
			mgr := m.startManagerd(b, "managerd")
			c := m.client(b, mgr)
			var conn, prov, mint, launch, signer []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				names := make([]string, conc)
				var wg sync.WaitGroup
				errs := make(chan error, conc)
				for k := range conc {
					names[k] = fmt.Sprintf("b%d-%d", i, k)
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := c.Spawn(context.Background(), &managerv1.SpawnRequest{Name: names[k], Connector: "testagent"}); err != nil {
							errs <- err
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatalf("spawn: %v\n%s", err, mgr.out)
				}
				for _, name := range names {
					var in *managerv1.InspectResponse
					testkit.Eventually(b, 60*time.Second, func() error {
						var err error
						if in, err = c.Inspect(context.Background(), &managerv1.InspectRequest{Name: name}); err != nil {
							return err
						}
						if in.SpawnPhases.GetConnected() == nil {
							return fmt.Errorf("%s not connected yet", name)
						}
						return nil
					})
					p := in.SpawnPhases
					conn = append(conn, p.Connected.AsDuration())
					prov = append(prov, p.Provision.AsDuration())
					mint = append(mint, p.Mint.AsDuration())
					launch = append(launch, p.Launch.AsDuration())
					signer = append(signer, p.Signer.AsDuration())
				}
				b.StopTimer()
				for _, name := range names {
					if _, err := c.Stop(context.Background(), &managerv1.StopRequest{Name: name}); err != nil {
						b.Fatalf("stop %s: %v", name, err)
					}
				}
				b.StartTimer()
			}
			ms := func(d []time.Duration) float64 { return float64(median(d)) / float64(time.Millisecond) }
			b.ReportMetric(ms(conn), "connected-ms/agent")
			b.ReportMetric(ms(prov), "provision-ms")
			b.ReportMetric(ms(mint), "mint-ms")
			b.ReportMetric(ms(launch), "launch-ms")
			b.ReportMetric(ms(signer), "signer-ms")
			b.ReportMetric(100*float64(median(signer))/float64(median(conn)), "signer-%")
		})
	}
}

// median of d (d is sorted in place).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}
