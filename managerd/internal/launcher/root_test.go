package launcher

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// The root tests run the real launcher (the built managerd binary) as root, and its clients as
// managerd's uid and as other uids in child processes: this test binary, re-executed with
// clientEnv set, runs one clientSpec and reports a clientResult as JSON lines on stdout.

const clientEnv = "LAUNCHER_TEST_CLIENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(clientEnv); spec != "" {
		os.Exit(clientMain(spec))
	}
	if mode := os.Getenv(sleeperEnv); mode != "" {
		sleeperMain(mode)
	}
	os.Exit(m.Run())
}

// clientSpec is what a client child process does.
type clientSpec struct {
	Socket    string `json:"socket"`
	TokenFile string `json:"token_file"`
	// Raw, when set, is sent as the request body as is (no token added); RawLen, when set,
	// replaces the frame's announced length.
	Raw    string  `json:"raw,omitempty"`
	RawLen *uint32 `json:"raw_len,omitempty"`
	// Otherwise Request goes through Client.Launch; on success the client reads the terminal up
	// to "END\n", reports, waits for a line on stdin, then runs Terminate with Grace.
	Request Request       `json:"request"`
	Grace   time.Duration `json:"grace"`
	// NewMaterial is what a "replace" line on stdin hands to ReplaceMaterial.
	NewMaterial []byte `json:"new_material,omitempty"`
	// Probes, when set, are opened (no launcher call): "r:PATH" for reading, "w:PATH" for
	// writing; the result holds "ok" or the error for each.
	Probes []string `json:"probes,omitempty"`
}

// clientResult is one report line.
type clientResult struct {
	Err    string `json:"err,omitempty"`
	Reason Reason `json:"reason,omitempty"`
	Child  *Child `json:"child,omitempty"`
	Output []byte `json:"output,omitempty"`
	// After a "replace" line.
	Replaced bool `json:"replaced,omitempty"`
	// After Terminate.
	Terminated bool `json:"terminated,omitempty"`
	Killed     bool `json:"killed,omitempty"`
	// ReplaceAfter is ReplaceMaterial's refusal once the child is gone.
	ReplaceAfter Reason `json:"replace_after,omitempty"`
	// Probed is one entry per clientSpec.Probes.
	Probed []string `json:"probed,omitempty"`
}

func clientMain(specJSON string) int {
	var spec clientSpec
	out := json.NewEncoder(os.Stdout)
	report := func(r clientResult) int {
		if err := out.Encode(r); err != nil {
			return 3
		}
		return 0
	}
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return report(clientResult{Err: err.Error()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errResult := func(err error) clientResult {
		return clientResult{Err: err.Error(), Reason: reasonOf(err)}
	}
	if len(spec.Probes) > 0 {
		var probed []string
		for _, p := range spec.Probes {
			flag := os.O_RDONLY
			if strings.HasPrefix(p, "w:") {
				flag = os.O_WRONLY | syscall.O_NOCTTY
			}
			f, err := os.OpenFile(p[2:], flag, 0)
			if err != nil {
				probed = append(probed, err.Error())
				continue
			}
			f.Close()
			probed = append(probed, "ok")
		}
		return report(clientResult{Probed: probed})
	}
	if spec.Raw != "" || spec.RawLen != nil {
		resp, err := rawCall(ctx, spec.Socket, []byte(spec.Raw), spec.RawLen)
		if err != nil {
			return report(errResult(err))
		}
		return report(clientResult{Reason: resp.Reason, Err: resp.Message})
	}
	c := &Client{Socket: spec.Socket, TokenFile: spec.TokenFile}
	child, master, err := c.Launch(ctx, spec.Request)
	if err != nil {
		return report(errResult(err))
	}
	defer master.Close()
	output, err := readUntil(master, []byte("END\n"), 10*time.Second)
	if err != nil {
		return report(clientResult{Err: fmt.Sprintf("reading the terminal: %v (got %q)", err, output)})
	}
	report(clientResult{Child: &child, Output: output})
	stdin := bufio.NewReader(os.Stdin)
	for {
		line, err := stdin.ReadString('\n')
		if err != nil {
			return report(clientResult{Err: "stdin: " + err.Error()})
		}
		if line != "replace\n" {
			break // terminate
		}
		if err := c.ReplaceMaterial(ctx, child, spec.NewMaterial); err != nil {
			report(errResult(err))
			continue
		}
		report(clientResult{Replaced: true})
	}
	killed, err := Terminate(ctx, child, spec.Grace, c.Signal)
	if err != nil {
		return report(errResult(err))
	}
	// Asked again once gone, the launcher no longer knows the child.
	serr := c.Signal(ctx, child, syscall.SIGTERM)
	rerr := c.ReplaceMaterial(ctx, child, []byte("late"))
	return report(clientResult{Terminated: true, Killed: killed, Reason: reasonOf(serr), ReplaceAfter: reasonOf(rerr)})
}

// readUntil reads r until the data ends with suffix, or the deadline passes.
func readUntil(f *os.File, suffix []byte, d time.Duration) ([]byte, error) {
	if err := f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.HasSuffix(got, suffix) {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// rawCall sends body as one frame (announcing length, when set, instead of its own) and reads
// the answer.
func rawCall(ctx context.Context, socket string, body []byte, length *uint32) (*response, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fr := frame(body)
	if length != nil {
		fr = binary32(*length)
	}
	_, werr := conn.Write(fr)
	resp, master, err := readResponse(conn)
	if master != nil {
		master.Close()
		return nil, errors.New("a refusal carried a descriptor")
	}
	if err != nil {
		return nil, fmt.Errorf("%w (write: %v)", err, werr)
	}
	return resp, nil
}

func binary32(n uint32) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }

// rootEnv is one launcher running as root for the test, with its users and files.
type rootEnv struct {
	base, bin, socket, tokenFile, agentRoot string
	mgrUID, mgrGID                          uint32
	uidFirst, uidCount                      uint32
	cgParent                                string
	canary                                  string
	testBin                                 string
	secret                                  string // a root-only file the launcher holds open as fd 9
}

// testUIDFirst is the root tests' agent range: above UID_MAX (60000) of login.defs and below
// nobody, so no user of the machine has these uids.
const testUIDFirst = 64200

func (e *rootEnv) inRange(uid uint32) bool { return uid >= e.uidFirst && uid < e.uidFirst+e.uidCount }

// testCgroupParent makes a cgroup v2 directory for one test's agents under this process's own
// cgroup and removes it (after draining anything left) at cleanup.
func testCgroupParent(t *testing.T) string {
	t.Helper()
	own, err := ownCgroup()
	if err != nil {
		t.Fatalf("root test needs cgroup v2: %v", err)
	}
	p := filepath.Join(own, "cotal-launcher-test-"+randHex(4))
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatalf("root test needs a writable cgroup v2: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			if e.IsDir() {
				if err := drainCgroup(ctx, filepath.Join(p, e.Name())); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		if err := unix.Rmdir(p); err != nil {
			t.Errorf("cleanup: removing %s: %v", p, err)
		}
	})
	return p
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func goBuild(t *testing.T, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// startRootLauncher makes the manager user, builds managerd and the test agent, and runs
// `managerd launcher` as root with a canary variable in its environment, fd 9 open on a root-only
// file, agents uidCount uids from testUIDFirst (8 when 0) and a cgroup parent of its own.
func startRootLauncher(t *testing.T, uidCount uint32) *rootEnv {
	t.Helper()
	return startRootLauncherWith(t, uidCount, false)
}

// launcherCaps are the capabilities the launcher unit keeps (CapabilityBoundingSet=).
var launcherCaps = "-all,+setuid,+setgid,+setpcap,+chown,+dac_override,+fowner,+kill"

// startRootLauncherWith is startRootLauncher; sandboxed runs the launcher as its unit would in
// the respects that could break it: a /proc of its own mounted hidepid=invisible,subset=pid
// (ProtectProc=invisible, ProcSubset=pid) and only the unit's seven capabilities. Stricter than
// the unit: its gid is 65534, not root's, because hidepid exempts the root group (the unit's
// Group=root launcher does see its agents); with no CAP_SYS_PTRACE either, it cannot see its
// agents' /proc entries at all, which proves it does not need them.
func startRootLauncherWith(t *testing.T, uidCount uint32, sandboxed bool) *rootEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("root test: starting the launcher, changing uid and creating users need root (CI runs as root)")
	}
	if uidCount == 0 {
		uidCount = 8
	}
	e := &rootEnv{canary: "COTAL_CANARY_" + randHex(4), uidFirst: testUIDFirst, uidCount: uidCount}
	e.mgrUID, e.mgrGID = testkit.AddUser(t, 64101)
	e.cgParent = testCgroupParent(t)
	e.base = t.TempDir()
	for _, d := range []string{filepath.Dir(e.base), e.base} { // traversable by the test's users
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.bin = filepath.Join(e.base, "bin")
	if err := os.Mkdir(e.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	goBuild(t, filepath.Join(e.bin, "managerd"), "github.com/cotalgo/cotal/managerd")
	goBuild(t, filepath.Join(e.bin, "agent"), "./testdata/agent")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e.testBin = filepath.Join(e.bin, "launcher.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.testBin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	e.socket = filepath.Join(e.base, "run", "launcher.sock")
	e.tokenFile = filepath.Join(e.base, "mgr", "launcher.token")
	e.agentRoot = filepath.Join(e.base, "agents")
	cfg := fmt.Sprintf(`socket: %s
token_file: %s
manager: {uid: %d, gid: %d}
agents: {uid_first: %d, uid_count: %d}
cgroup_parent: %s
agent_root: %s
connectors:
  report: {argv: [%s, report]}
  stubborn: {argv: [%s, stubborn]}
  escape: {argv: [%s, escape]}
  missing: {argv: [%s]}
env_allow: [TERM, COTAL_SUBSCRIBE]
log_level: debug
`, e.socket, e.tokenFile, e.mgrUID, e.mgrGID, e.uidFirst, e.uidCount, e.cgParent, e.agentRoot,
		filepath.Join(e.bin, "agent"), filepath.Join(e.bin, "agent"), filepath.Join(e.bin, "agent"), filepath.Join(e.bin, "no-such-agent"))
	cfgPath := filepath.Join(e.base, "launcher.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.bin, "managerd"), "launcher", "--config", cfgPath)
	if sandboxed {
		for _, tool := range []string{"unshare", "setpriv"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("sandboxed launcher test needs %s", tool)
			}
		}
		cmd = exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
			`mount -t proc -o hidepid=invisible,subset=pid proc /proc && exec setpriv --regid=65534 --clear-groups --bounding-set="$1" --inh-caps=-all -- "$2" launcher --config "$3"`,
			"sh", launcherCaps, filepath.Join(e.bin, "managerd"), cfgPath)
	}
	cmd.Env = append(os.Environ(), e.canary+"=leaked", "TERM=launcher-term", "HOME=/root")
	// Whoever starts the launcher may leave a descriptor open: fd 9 on a root-only file.
	e.secret = filepath.Join(e.base, "root-only")
	if err := os.WriteFile(e.secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret, err := os.Open(e.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	cmd.ExtraFiles = []*os.File{nil, nil, nil, nil, nil, nil, secret} // fd 3+6 = 9
	var logs testkit.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("launcher exit: %v\n%s", err, logs.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("launcher did not stop on SIGTERM\n%s", logs.String())
		}
		if t.Failed() {
			t.Logf("launcher log:\n%s", logs.String())
		}
	})
	// Ready: the socket has its final mode and group.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st unix.Stat_t
		if unix.Lstat(e.socket, &st) == nil && st.Mode&0o777 == 0o660 && st.Gid == e.mgrGID {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("launcher exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("launcher socket not ready\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return e
}

// client runs one clientSpec as uid:gid in a child process and returns it with its report
// stream and stdin.
type clientProc struct {
	cmd   *exec.Cmd
	out   *json.Decoder
	stdin io.WriteCloser
}

func (e *rootEnv) client(t *testing.T, uid, gid uint32, spec clientSpec) *clientProc {
	t.Helper()
	if spec.Socket == "" {
		spec.Socket = e.socket
	}
	if spec.TokenFile == "" {
		spec.TokenFile = e.tokenFile
	}
	js, _ := json.Marshal(spec)
	cmd := exec.Command(e.testBin)
	cmd.Env = []string{clientEnv + "=" + string(js), e.canary + "=client-leaked", "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	var stderr testkit.SyncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("client stderr:\n%s", stderr.String())
		}
	})
	return &clientProc{cmd: cmd, out: json.NewDecoder(stdout), stdin: stdin}
}

func (c *clientProc) next(t *testing.T) clientResult {
	t.Helper()
	var r clientResult
	if err := c.out.Decode(&r); err != nil {
		t.Fatalf("client report: %v", err)
	}
	return r
}

// refusal runs a one-shot client and returns its result.
func (e *rootEnv) refusal(t *testing.T, uid, gid uint32, spec clientSpec) clientResult {
	t.Helper()
	return e.client(t, uid, gid, spec).next(t)
}

func (e *rootEnv) token(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(e.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func statOf(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func procStatusLine(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key+":") {
			return l
		}
	}
	t.Fatalf("no %s line in /proc/%d/status", key, pid)
	return ""
}

// TestRootLaunch: the launcher as root, managerd's uid as the client. The agent runs as the
// agent uid in all four Uid fields (from its own /proc/self/status and from outside), with no
// supplementary group, as a session leader on its PTY, in its directory (agent:manager 0750), with
// exactly PATH, HOME, the allowed request variables and COTAL_LAUNCH_MATERIAL (a 0600 file of
// its own): no canary from the launcher's or the client's environment. The PTY master reaches the
// client by fd passing and carries the agent's output byte-exact. Terminate ends it through the
// launcher's signal operation (SIGTERM alone; SIGKILL after the grace for an agent that ignores
// SIGTERM) and proves it gone from /proc, after which the launcher no longer knows the child.
func TestRootLaunch(t *testing.T) {
	e := startRootLauncher(t, 0)

	// The files the launcher made: token 0600 in 0700, managerd's; socket dir 0750 root:manager.
	if st := statOf(t, e.tokenFile); st.Mode&0o777 != 0o600 || st.Uid != e.mgrUID || st.Gid != e.mgrGID {
		t.Fatalf("token file mode %#o owner %d:%d", st.Mode&0o777, st.Uid, st.Gid)
	}
	if st := statOf(t, filepath.Dir(e.tokenFile)); st.Mode&0o777 != 0o700 || st.Uid != e.mgrUID {
		t.Fatalf("token dir mode %#o owner %d", st.Mode&0o777, st.Uid)
	}
	if st := statOf(t, filepath.Dir(e.socket)); st.Mode&0o777 != 0o750 || st.Uid != 0 || st.Gid != e.mgrGID {
		t.Fatalf("socket dir mode %#o owner %d:%d", st.Mode&0o777, st.Uid, st.Gid)
	}
	if tok := e.token(t); len(tok) != 2*tokenBytes {
		t.Fatalf("token of %d hex characters", len(tok))
	}

	for _, tc := range []struct {
		name, connector string
		grace           time.Duration
		killed          bool
	}{
		{"ok/report-sigterm", "report", 5 * time.Second, false},
		{"ok/stubborn-sigkill", "stubborn", 200 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "agent-" + tc.connector
			material := []byte(`{"creds":"/x","servers":["nats://127.0.0.1:4222"]}`)
			c := e.client(t, e.mgrUID, e.mgrGID, clientSpec{Grace: tc.grace, Request: Request{
				Name: name, Connector: tc.connector, Rows: 40, Cols: 120,
				Env:      map[string]string{"TERM": "xterm-256color", "COTAL_SUBSCRIBE": "general"},
				Material: material,
			}})
			r := c.next(t)
			if r.Err != "" || r.Child == nil {
				t.Fatalf("launch: %s (%s)", r.Err, r.Reason)
			}
			child := *r.Child
			dir := filepath.Join(e.agentRoot, name)
			if child.Dir != dir {
				t.Fatalf("child dir %q, want %q", child.Dir, dir)
			}
			matPath := filepath.Join(dir, materialName)
			if !e.inRange(child.UID) {
				t.Fatalf("agent uid %d is outside the range %d+%d", child.UID, e.uidFirst, e.uidCount)
			}
			u := strconv.Itoa(int(child.UID))
			g := u // the gid is the uid's number
			env := []string{
				EnvLaunchMaterial + "=" + matPath,
				"COTAL_SUBSCRIBE=general",
				"HOME=" + dir,
				"PATH=" + DefaultPath,
				"TERM=xterm-256color",
			}
			sort.Strings(env)
			var want bytes.Buffer
			// No supplementary group (the kernel ends the Groups line with a space).
			fmt.Fprintf(&want, "Uid:\t%s\t%s\t%s\t%s\nGid:\t%s\t%s\t%s\t%s\nGroups:\t \n", u, u, u, u, g, g, g, g)
			want.WriteString("session-leader=true pgrp-leader=true controlling-tty=true\n")
			fmt.Fprintf(&want, "cwd=%s\n", dir)
			for _, v := range env {
				fmt.Fprintf(&want, "env %s\n", v)
			}
			fmt.Fprintf(&want, "material 0600 %s:%s %q\n", u, g, material)
			want.WriteString("bytes:")
			for i := range 256 {
				want.WriteByte(byte(i))
			}
			want.WriteString("END\n")
			if !bytes.Equal(r.Output, want.Bytes()) {
				t.Fatalf("terminal output differs:\n got %q\nwant %q", r.Output, want.Bytes())
			}
			if bytes.Contains(r.Output, []byte(e.canary)) || bytes.Contains(r.Output, []byte("launcher-term")) {
				t.Fatalf("the launcher's environment leaked: %q", r.Output)
			}
			// From outside: the live process is the agent uid in all four fields, and its start
			// time is what the launcher answered.
			if got, want := procStatusLine(t, child.Pid, "Uid"), "Uid:\t"+u+"\t"+u+"\t"+u+"\t"+u; got != want {
				t.Fatalf("/proc/%d/status %q, want %q", child.Pid, got, want)
			}
			if st, err := ReadProcStat(child.Pid); err != nil || st.StartTime != child.StartTime {
				t.Fatalf("/proc/%d/stat start %d (%v), launcher said %d", child.Pid, st.StartTime, err, child.StartTime)
			}
			if gone, err := child.Gone(); gone || err != nil {
				t.Fatalf("running child reported gone=%v err=%v", gone, err)
			}
			if st := statOf(t, dir); st.Mode&0o7777 != 0o750 || st.Uid != child.UID || st.Gid != e.mgrGID {
				t.Fatalf("agent dir mode %#o owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
			}
			// No privilege left: no_new_privs, every capability set empty, the bounding set too.
			for key, want := range map[string]string{"NoNewPrivs": "NoNewPrivs:\t1", "CapBnd": "CapBnd:\t0000000000000000",
				"CapPrm": "CapPrm:\t0000000000000000", "CapEff": "CapEff:\t0000000000000000", "CapAmb": "CapAmb:\t0000000000000000",
				"CapInh": "CapInh:\t0000000000000000"} {
				if got := procStatusLine(t, child.Pid, key); got != want {
					t.Fatalf("/proc/%d/status %q, want %q", child.Pid, got, want)
				}
			}
			// The descriptor the launcher's starter left open (fd 9, a root-only file) is not
			// the agent's.
			if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/9", child.Pid)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the agent holds fd 9 (%q, %v): the launcher's inherited descriptor reached it", target, err)
			}
			// It runs in its own cgroup, named by its uid.
			cg := cgroupDir(e.cgParent, child.UID)
			if procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs")); err != nil || !strings.Contains("\n"+string(procs), "\n"+strconv.Itoa(child.Pid)+"\n") {
				t.Fatalf("%s/cgroup.procs %q (%v) does not hold pid %d", cg, procs, err, child.Pid)
			}
			// While it runs, its name is taken.
			if r := e.refusal(t, e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: name, Connector: "report"}}); r.Reason != ReasonNameInUse {
				t.Fatalf("second launch of %s: %q (%s), want NAME_IN_USE", name, r.Reason, r.Err)
			}
			if _, err := io.WriteString(c.stdin, "terminate\n"); err != nil {
				t.Fatal(err)
			}
			r = c.next(t)
			if r.Err != "" || !r.Terminated {
				t.Fatalf("terminate: %s", r.Err)
			}
			if r.Killed != tc.killed {
				t.Fatalf("killed=%v, want %v", r.Killed, tc.killed)
			}
			if r.Reason != ReasonChildUnknown {
				t.Fatalf("signal after exit: reason %q, want CHILD_UNKNOWN", r.Reason)
			}
			if gone, err := child.Gone(); !gone || err != nil {
				t.Fatalf("terminated child gone=%v err=%v", gone, err)
			}
			// Its cgroup is removed, its directory parked (the launcher's, no material), so the
			// next holder of its uid cannot enter it.
			if _, err := os.Stat(cgroupDir(e.cgParent, child.UID)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the agent's cgroup after Terminate: %v", err)
			}
			if st := statOf(t, dir); st.Uid != 0 || st.Gid != e.mgrGID || st.Mode&0o7777 != 0o750 {
				t.Fatalf("parked agent dir mode %#o owner %d:%d, want 0750 0:%d", st.Mode&0o7777, st.Uid, st.Gid, e.mgrGID)
			}
			if _, err := os.Lstat(matPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("launch material after Terminate: %v", err)
			}
			// Proven gone, the name is free again at once.
			again := e.client(t, e.mgrUID, e.mgrGID, clientSpec{Grace: 5 * time.Second, Request: Request{Name: name, Connector: "report"}})
			if r := again.next(t); r.Err != "" || r.Child == nil || r.Child.Pid == child.Pid {
				t.Fatalf("relaunch of %s: %+v", name, r)
			}
			if _, err := io.WriteString(again.stdin, "terminate\n"); err != nil {
				t.Fatal(err)
			}
			if r := again.next(t); r.Err != "" || !r.Terminated {
				t.Fatalf("terminate relaunched: %+v", r)
			}
		})
	}
}

// TestRootReplaceMaterial: managerd's uid replaces a running agent's launch material through the
// launcher: the new file is the agent's, 0600, with exactly the new content, and a symbolic link
// planted at launch-material is replaced, never followed (its target keeps its content). A child
// the launcher never started (the test's own pid), one named with the wrong start time, and a
// terminated (reaped) child are refused CHILD_UNKNOWN; over-long material is TOO_LARGE.
func TestRootReplaceMaterial(t *testing.T) {
	e := startRootLauncher(t, 0)
	newMaterial := []byte(`{"version":1,"renewed":"` + randHex(8) + `"}`)
	c := e.client(t, e.mgrUID, e.mgrGID, clientSpec{Grace: 5 * time.Second, NewMaterial: newMaterial,
		Request: Request{Name: "renewed", Connector: "report", Material: []byte("old material")}})
	r := c.next(t)
	if r.Err != "" || r.Child == nil {
		t.Fatalf("launch: %s (%s)", r.Err, r.Reason)
	}
	child := *r.Child
	matPath := filepath.Join(child.Dir, materialName)
	checkMaterial := func(t *testing.T, want []byte) {
		t.Helper()
		st := statOf(t, matPath)
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o600 || st.Uid != child.UID || st.Gid != child.UID {
			t.Fatalf("launch-material mode %#o owner %d:%d, want a regular file 0600 %d:%d", st.Mode, st.Uid, st.Gid, child.UID, child.UID)
		}
		if got, err := os.ReadFile(matPath); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("launch-material %q (%v), want %q", got, err, want)
		}
	}
	checkMaterial(t, []byte("old material"))
	replace := func(t *testing.T) clientResult {
		t.Helper()
		if _, err := io.WriteString(c.stdin, "replace\n"); err != nil {
			t.Fatal(err)
		}
		return c.next(t)
	}

	t.Run("ok/replaced", func(t *testing.T) {
		if r := replace(t); r.Err != "" || !r.Replaced {
			t.Fatalf("replace: %s (%s)", r.Err, r.Reason)
		}
		checkMaterial(t, newMaterial)
		// No temporary file is left beside it.
		ents, err := os.ReadDir(child.Dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name() != materialName {
			t.Fatalf("agent directory holds %d entries, want launch-material alone", len(ents))
		}
	})
	t.Run("ok/symlink-replaced-not-followed", func(t *testing.T) {
		victim := filepath.Join(e.base, "victim")
		if err := os.WriteFile(victim, []byte("victim"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(matPath); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, matPath); err != nil {
			t.Fatal(err)
		}
		if r := replace(t); r.Err != "" || !r.Replaced {
			t.Fatalf("replace: %s (%s)", r.Err, r.Reason)
		}
		checkMaterial(t, newMaterial)
		if got, err := os.ReadFile(victim); err != nil || string(got) != "victim" {
			t.Fatalf("symlink target now %q (%v)", got, err)
		}
		if st := statOf(t, victim); st.Uid != 0 || st.Mode&0o777 != 0o644 {
			t.Fatalf("symlink target mode %#o owner %d changed", st.Mode&0o777, st.Uid)
		}
	})

	tok := e.token(t)
	raw := func(pid int, start uint64, material string) string {
		return fmt.Sprintf(`{"op":"replace_material","token":%q,"pid":%d,"start_time":%d,"material":%q}`, tok, pid, start, material)
	}
	self, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("A", (MaxMaterialBytes+3)/3*4+4) // base64 of more than MaxMaterialBytes
	for _, tc := range []struct {
		name, body string
		want       Reason
	}{
		{"fail/not-a-child", raw(os.Getpid(), self.StartTime, "eA=="), ReasonChildUnknown},
		{"fail/wrong-start-time", raw(child.Pid, child.StartTime+1, "eA=="), ReasonChildUnknown},
		{"fail/over-long", raw(child.Pid, child.StartTime, long), ReasonTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.refusal(t, e.mgrUID, e.mgrGID, clientSpec{Raw: tc.body})
			if r.Reason != tc.want {
				t.Fatalf("reason %q (%s), want %s", r.Reason, r.Err, tc.want)
			}
			checkMaterial(t, newMaterial)
		})
	}

	t.Run("fail/reaped-child", func(t *testing.T) {
		if _, err := io.WriteString(c.stdin, "terminate\n"); err != nil {
			t.Fatal(err)
		}
		r := c.next(t)
		if r.Err != "" || !r.Terminated {
			t.Fatalf("terminate: %s", r.Err)
		}
		if r.ReplaceAfter != ReasonChildUnknown {
			t.Fatalf("replace after the child is gone: reason %q, want CHILD_UNKNOWN", r.ReplaceAfter)
		}
		// Proven gone, its material (a credential valid until it expires) is removed.
		if _, err := os.Lstat(matPath); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("launch material of a gone agent: %v", err)
		}
	})
}

// TestRootRefusals: against the same root launcher, each refusal has its reason and leaves no
// agent directory: a peer uid other than managerd's (with managerd's group, so the socket's mode
// lets it connect, and with the right token), root itself (with and without the token), a wrong
// token, no token, another target uid or gid, a traversing name, an unknown connector, a command
// in the request, a body over the bound, a connector whose binary is missing (its directory and
// material are removed again); and the agent uid with its own group cannot even connect (EACCES)
// nor read the token.
func TestRootRefusals(t *testing.T) {
	e := startRootLauncher(t, 0)
	tok := e.token(t)
	req := func(extra string) string {
		return `{"op":"launch","token":"` + tok + `","name":"refused","connector":"report"` + extra + `}`
	}
	noTok := `{"op":"launch","name":"refused","connector":"report"}`
	// A wrong token, in a file the manager owns, as Client requires.
	wrongDir := filepath.Join(e.base, "wrong")
	if err := os.Mkdir(wrongDir, 0o700); err != nil {
		t.Fatal(err)
	}
	wrongTok := filepath.Join(wrongDir, "token")
	if err := os.WriteFile(wrongTok, []byte(randHex(tokenBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{wrongDir, wrongTok} {
		if err := os.Chown(p, int(e.mgrUID), int(e.mgrGID)); err != nil {
			t.Fatal(err)
		}
	}
	zero := uint32(0)
	other := e.mgrUID
	inRange := e.uidFirst
	agentUID, agentGID := e.uidFirst+1, e.uidFirst+1 // an agent's uid and gid
	big := uint32(MaxRequestBytes + 1)
	for _, tc := range []struct {
		name     string
		uid, gid uint32
		spec     clientSpec
		want     Reason
	}{
		{"fail/peer-agent-uid-in-manager-group", agentUID, e.mgrGID, clientSpec{Raw: req("")}, ReasonPeerNotAllowed},
		{"fail/wrong-token", e.mgrUID, e.mgrGID, clientSpec{TokenFile: wrongTok, Request: Request{Name: "refused", Connector: "report"}}, ReasonTokenInvalid},
		{"fail/no-token", e.mgrUID, e.mgrGID, clientSpec{Raw: noTok}, ReasonTokenInvalid},
		{"fail/target-uid-root", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", UID: &zero}}, ReasonTargetNotAllowed},
		{"fail/target-uid-manager", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", UID: &other}}, ReasonTargetNotAllowed},
		{"fail/target-uid-in-range", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", UID: &inRange}}, ReasonTargetNotAllowed},
		{"fail/target-gid-root", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", GID: &zero}}, ReasonTargetNotAllowed},
		{"fail/name-traversal", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "../refused", Connector: "report"}}, ReasonNameInvalid},
		{"fail/name-slash", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "a/refused", Connector: "report"}}, ReasonNameInvalid},
		{"fail/connector-unknown", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "sh"}}, ReasonConnectorUnknown},
		{"fail/command-field", e.mgrUID, e.mgrGID, clientSpec{Raw: req(`,"argv":["/bin/sh"]`)}, ReasonBadRequest},
		{"fail/env-not-allowed", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", Env: map[string]string{"LD_PRELOAD": "/x"}}}, ReasonEnvNotAllowed},
		{"fail/over-long", e.mgrUID, e.mgrGID, clientSpec{RawLen: &big}, ReasonTooLarge},
		{"fail/connector-binary-missing", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "missing", Material: []byte("m")}}, ReasonLaunchFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.refusal(t, tc.uid, tc.gid, tc.spec)
			if r.Reason != tc.want {
				t.Fatalf("reason %q (%s), want %s", r.Reason, r.Err, tc.want)
			}
		})
	}
	t.Run("fail/agent-cannot-connect", func(t *testing.T) {
		r := e.refusal(t, agentUID, agentGID, clientSpec{Raw: req("")})
		if r.Reason != "" || !strings.Contains(r.Err, "permission denied") {
			t.Fatalf("agent connect: %q (%s), want permission denied", r.Err, r.Reason)
		}
	})
	t.Run("fail/agent-cannot-read-token", func(t *testing.T) {
		r := e.refusal(t, agentUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report"}})
		if r.Reason != "" || !strings.Contains(r.Err, "permission denied") {
			t.Fatalf("agent token read: %q (%s), want permission denied", r.Err, r.Reason)
		}
	})
	// Root itself (this test process) is not managerd's uid: refused with or without the token.
	for name, body := range map[string]string{"fail/root-with-token": req(""), "fail/root-without-token": noTok} {
		t.Run(name, func(t *testing.T) {
			resp, err := rawCall(context.Background(), e.socket, []byte(body), nil)
			if err != nil || resp.OK || resp.Reason != ReasonPeerNotAllowed {
				t.Fatalf("root: %+v, %v; want PEER_NOT_ALLOWED", resp, err)
			}
		})
	}
	// Nothing was created for any refused request.
	ents, err := os.ReadDir(e.agentRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("refused requests left %d entries in the agent root (first %q)", len(ents), ents[0].Name())
	}
}

// TestRootStartRefusals: Start refuses, naming the path, a directory above the agent root, the
// token file or the socket that another uid owns or a group may write (the launcher chowns what
// it makes there as root), a non-socket at the socket path and a socket another server listens
// on; and `managerd launcher` run as a uid without CAP_SETUID/CAP_SETGID exits 1 naming them.
func TestRootStartRefusals(t *testing.T) {
	e := startRootLauncher(t, 0)
	u := func(v uint32) *uint32 { return &v }
	base := t.TempDir()
	mk := func(p string, mode os.FileMode, uid int) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := mk(filepath.Join(base, "foreign"), 0o755, int(e.mgrUID))
	groupW := mk(filepath.Join(base, "groupw"), 0o775, 0)
	good := mk(filepath.Join(base, "good"), 0o755, 0)
	notSock := filepath.Join(mk(filepath.Join(base, "sockdir"), 0o750, 0), "l.sock")
	if err := os.WriteFile(notSock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func(mut func(c *Config)) Config {
		c := Config{
			Socket: filepath.Join(good, "run", "l.sock"), TokenFile: filepath.Join(good, "tok", "t"),
			AgentRoot: filepath.Join(good, "agents"),
			Manager:   IDs{UID: u(e.mgrUID), GID: u(e.mgrGID)}, Agents: UIDRange{UIDFirst: u(e.uidFirst + 100), UIDCount: 4},
			CgroupParent: e.cgParent,
			Connectors:   map[string]Connector{"x": {Argv: []string{"/bin/true"}}},
		}
		mut(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"fail/agent-root-under-foreign-dir", cfg(func(c *Config) { c.AgentRoot = filepath.Join(foreign, "agents") }), foreign + " (above"},
		{"fail/token-under-group-writable", cfg(func(c *Config) { c.TokenFile = filepath.Join(groupW, "tok", "t") }), groupW + " (above"},
		{"fail/token-dir-under-foreign", cfg(func(c *Config) { c.TokenFile = filepath.Join(foreign, "tok", "t") }), "owned by uid"},
		{"fail/socket-under-foreign", cfg(func(c *Config) { c.Socket = filepath.Join(foreign, "run", "l.sock") }), foreign},
		{"fail/socket-not-a-socket", cfg(func(c *Config) { c.Socket = notSock }), "exists and is not a socket"},
		{"fail/socket-in-use", cfg(func(c *Config) { c.Socket = e.socket }), "another server is listening"},
		{"fail/cgroup-parent-not-cgroup2", cfg(func(c *Config) { c.CgroupParent = good }), good + " is not on a cgroup2 file system"},
		{"fail/cgroup-parent-missing", cfg(func(c *Config) { c.CgroupParent = filepath.Join(e.cgParent, "none") }), "containment needs a cgroup v2 directory"},
		{"fail/agent-root-missing-parent", cfg(func(c *Config) { c.AgentRoot = filepath.Join(good, "no", "agents") }), "parent of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := Start(context.Background(), Inputs{Config: tc.cfg})
			if err == nil {
				srv.Close()
				t.Fatalf("Start succeeded, want a refusal naming %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v; want it to name %q", err, tc.want)
			}
		})
	}
	t.Run("ok/good-config-starts-and-closes", func(t *testing.T) {
		srv, err := Start(context.Background(), Inputs{Config: cfg(func(*Config) {})})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(good, "run", "l.sock")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket after Close: %v", err)
		}
	})
	t.Run("fail/unprivileged", func(t *testing.T) {
		c := cfg(func(*Config) {})
		cfgPath := filepath.Join(e.base, "unpriv.yaml")
		body := fmt.Sprintf("socket: %s\ntoken_file: %s\nmanager: {uid: %d, gid: %d}\nagents: {uid_first: %d, uid_count: 4}\nagent_root: %s\nconnectors: {x: {argv: [/bin/true]}}\n",
			c.Socket, c.TokenFile, e.mgrUID, e.mgrGID, e.uidFirst+100, c.AgentRoot)
		if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(e.bin, "managerd"), "launcher", "--config", cfgPath)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: e.mgrUID, Gid: e.mgrGID, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("unprivileged launcher: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "CAP_SETUID") || !strings.Contains(string(out), "CAP_SETGID") {
			t.Fatalf("refusal does not name the capabilities: %s", out)
		}
	})
}

// launchAgent launches name with connector through a managerd-uid client and returns the client
// (terminate it with terminate) and its first report.
func (e *rootEnv) launchAgent(t *testing.T, name, connector string, material []byte) (*clientProc, Child, []byte) {
	t.Helper()
	c := e.client(t, e.mgrUID, e.mgrGID, clientSpec{Grace: 200 * time.Millisecond,
		Request: Request{Name: name, Connector: connector, Material: material}})
	r := c.next(t)
	if r.Err != "" || r.Child == nil {
		t.Fatalf("launch %s: %s (%s)", name, r.Err, r.Reason)
	}
	return c, *r.Child, r.Output
}

// terminate asks the client to Terminate its agent and checks it was proven gone.
func (c *clientProc) terminate(t *testing.T) clientResult {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "terminate\n"); err != nil {
		t.Fatal(err)
	}
	r := c.next(t)
	if r.Err != "" || !r.Terminated || r.Reason != ReasonChildUnknown {
		t.Fatalf("terminate: %+v", r)
	}
	return r
}

// TestRootAgentIsolation: two agents of one launcher run as two uids of the range (and gids of
// the same numbers), so agent A's uid cannot open B's launch material, read B's /proc/<pid>/mem
// or environ, or open B's terminal for writing; it can open its own material (the probe really
// runs as A).
func TestRootAgentIsolation(t *testing.T) {
	e := startRootLauncher(t, 0)
	ca, a, _ := e.launchAgent(t, "iso-a", "report", []byte("a's material"))
	cb, b, _ := e.launchAgent(t, "iso-b", "report", []byte("b's material"))
	if a.UID == b.UID || !e.inRange(a.UID) || !e.inRange(b.UID) {
		t.Fatalf("agent uids %d and %d: want two distinct uids of %d+%d", a.UID, b.UID, e.uidFirst, e.uidCount)
	}
	if got := procStatusLine(t, b.Pid, "Uid"); !strings.HasPrefix(got, fmt.Sprintf("Uid:\t%d\t", b.UID)) {
		t.Fatalf("B runs as %q, launcher said uid %d", got, b.UID)
	}
	bTTY, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", b.Pid))
	if err != nil || !strings.HasPrefix(bTTY, "/dev/pts/") {
		t.Fatalf("B's terminal %q (%v)", bTTY, err)
	}
	aTTY, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", a.Pid))
	if err != nil {
		t.Fatal(err)
	}
	r := e.refusal(t, a.UID, a.UID, clientSpec{Probes: []string{
		"r:" + filepath.Join(b.Dir, materialName),
		"r:" + fmt.Sprintf("/proc/%d/mem", b.Pid),
		"r:" + fmt.Sprintf("/proc/%d/environ", b.Pid),
		"w:" + bTTY,
		"r:" + filepath.Join(a.Dir, materialName),
		"w:" + aTTY,
	}})
	want := []string{"permission denied", "permission denied", "permission denied", "permission denied", "ok", "ok"}
	if len(r.Probed) != len(want) {
		t.Fatalf("probe: %+v", r)
	}
	for i, w := range want {
		if !strings.Contains(r.Probed[i], w) {
			t.Fatalf("probe %d as A (uid %d): %q, want %q (all: %q)", i, a.UID, r.Probed[i], w, r.Probed)
		}
	}
	ca.terminate(t)
	cb.terminate(t)
}

// procStatFields is /proc/<pid>/stat after the command: [0] state, [1] ppid, [2] pgrp, [3]
// session, ..., [19] start time.
func procStatFields(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, errors.New("malformed stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return nil, errors.New("malformed stat")
	}
	return f, nil
}

// TestRootContainment: an agent that leaves a descendant behind in another session and process
// group (setsid, then a double fork; the descendant ignores SIGTERM and SIGHUP) is contained:
// the descendant is in the agent's cgroup, and Terminate, which the launcher answers CHILD_UNKNOWN
// only once the cgroup is proven empty, leaves it dead (its pid gone, or another process's) and
// the cgroup removed.
func TestRootContainment(t *testing.T) {
	e := startRootLauncher(t, 0)
	c, child, out := e.launchAgent(t, "escaper", "escape", nil)
	var orphan int
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "orphan "); ok {
			orphan, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if orphan <= 1 {
		t.Fatalf("no orphan line in the agent's output %q", out)
	}
	f, err := procStatFields(orphan)
	if err != nil {
		t.Fatalf("the orphan %d is not running: %v", orphan, err)
	}
	if f[2] == strconv.Itoa(child.Pid) || f[3] == strconv.Itoa(child.Pid) {
		t.Fatalf("the orphan is in the agent's process group %s or session %s: it did not escape them", f[2], f[3])
	}
	orphanStart := f[19]
	cg := cgroupDir(e.cgParent, child.UID)
	procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil || !strings.Contains("\n"+string(procs), "\n"+strconv.Itoa(orphan)+"\n") {
		t.Fatalf("%s/cgroup.procs %q (%v) does not hold the orphan %d", cg, procs, err, orphan)
	}
	c.terminate(t)
	// Dead: no such pid, another process's, or a zombie (it was reparented away from the
	// launcher, to whichever reaper this machine has; a zombie runs no code).
	if f, err := procStatFields(orphan); err == nil && f[19] == orphanStart && f[0] != "Z" && f[0] != "X" {
		t.Fatalf("the orphan %d survived Terminate (state %s)", orphan, f[0])
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the agent's cgroup after Terminate: %v", err)
	}
}

// TestRootUIDRange: with a range of two uids, two running agents hold both, a third launch is
// refused UIDS_EXHAUSTED (and leaves no directory); once one agent is proven gone its uid is
// handed out again.
func TestRootUIDRange(t *testing.T) {
	e := startRootLauncher(t, 2)
	ca, a, _ := e.launchAgent(t, "range-a", "report", nil)
	cb, b, _ := e.launchAgent(t, "range-b", "report", nil)
	if a.UID == b.UID || !e.inRange(a.UID) || !e.inRange(b.UID) {
		t.Fatalf("agent uids %d and %d: want the two uids of %d+2", a.UID, b.UID, e.uidFirst)
	}
	r := e.refusal(t, e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "range-c", Connector: "report"}})
	if r.Reason != ReasonUIDsExhausted {
		t.Fatalf("third launch: %q (%s), want UIDS_EXHAUSTED", r.Reason, r.Err)
	}
	if _, err := os.Lstat(filepath.Join(e.agentRoot, "range-c")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused launch left its directory: %v", err)
	}
	ca.terminate(t)
	cc, c, _ := e.launchAgent(t, "range-c", "report", nil)
	if c.UID != a.UID {
		t.Fatalf("after A was proven gone, C got uid %d, want A's %d", c.UID, a.UID)
	}
	cc.terminate(t)
	cb.terminate(t)
}

// TestRootSandboxedLauncher: the launcher as its unit runs it (its own /proc hidepid=invisible,
// subset=pid; only the unit's seven capabilities, no CAP_SYS_PTRACE) still launches, contains and
// proves gone: it reads nothing of its agents from /proc (the start time comes from the
// trampoline, liveness from waitid and cgroup.events).
func TestRootSandboxedLauncher(t *testing.T) {
	e := startRootLauncherWith(t, 0, true)
	c, child, out := e.launchAgent(t, "sandboxed", "escape", []byte("m"))
	var orphan int
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "orphan "); ok {
			orphan, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if orphan <= 1 || !e.inRange(child.UID) {
		t.Fatalf("launch: orphan %d, uid %d (output %q)", orphan, child.UID, out)
	}
	f, err := procStatFields(orphan)
	if err != nil {
		t.Fatalf("the orphan %d is not running: %v", orphan, err)
	}
	orphanStart := f[19]
	if got := procStatusLine(t, child.Pid, "CapBnd"); got != "CapBnd:\t0000000000000000" {
		t.Fatalf("agent %s", got)
	}
	c.terminate(t)
	if f, err := procStatFields(orphan); err == nil && f[19] == orphanStart && f[0] != "Z" && f[0] != "X" {
		t.Fatalf("the orphan %d survived Terminate (state %s)", orphan, f[0])
	}
	if _, err := os.Stat(cgroupDir(e.cgParent, child.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the agent's cgroup after Terminate: %v", err)
	}
}
