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
	mgrUID, mgrGID, agentUID, agentGID      uint32
	canary                                  string
	testBin                                 string
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

// startRootLauncher makes the users, builds managerd and the test agent, and runs
// `managerd launcher` as root with a canary variable in its environment.
func startRootLauncher(t *testing.T) *rootEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("root test: starting the launcher, changing uid and creating users need root (CI runs as root)")
	}
	e := &rootEnv{canary: "COTAL_CANARY_" + randHex(4)}
	e.mgrUID, e.mgrGID = testkit.AddUser(t, 64101)
	e.agentUID, e.agentGID = testkit.AddUser(t, 64102)
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
agent: {uid: %d, gid: %d}
agent_root: %s
connectors:
  report: {argv: [%s, report]}
  stubborn: {argv: [%s, stubborn]}
  missing: {argv: [%s]}
env_allow: [TERM, COTAL_SUBSCRIBE]
log_level: debug
`, e.socket, e.tokenFile, e.mgrUID, e.mgrGID, e.agentUID, e.agentGID, e.agentRoot,
		filepath.Join(e.bin, "agent"), filepath.Join(e.bin, "agent"), filepath.Join(e.bin, "no-such-agent"))
	cfgPath := filepath.Join(e.base, "launcher.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.bin, "managerd"), "launcher", "--config", cfgPath)
	cmd.Env = append(os.Environ(), e.canary+"=leaked", "TERM=launcher-term", "HOME=/root")
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
	e := startRootLauncher(t)

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
			agentUID := e.agentUID
			material := []byte(`{"creds":"/x","servers":["nats://127.0.0.1:4222"]}`)
			c := e.client(t, e.mgrUID, e.mgrGID, clientSpec{Grace: tc.grace, Request: Request{
				Name: name, Connector: tc.connector, UID: &agentUID, Rows: 40, Cols: 120,
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
			u := strconv.Itoa(int(e.agentUID))
			g := strconv.Itoa(int(e.agentGID))
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
			if st := statOf(t, dir); st.Mode&0o7777 != 0o750 || st.Uid != e.agentUID || st.Gid != e.mgrGID {
				t.Fatalf("agent dir mode %#o owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
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
	e := startRootLauncher(t)
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
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o600 || st.Uid != e.agentUID || st.Gid != e.agentGID {
			t.Fatalf("launch-material mode %#o owner %d:%d, want a regular file 0600 %d:%d", st.Mode, st.Uid, st.Gid, e.agentUID, e.agentGID)
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
		checkMaterial(t, newMaterial)
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
	e := startRootLauncher(t)
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
	big := uint32(MaxRequestBytes + 1)
	for _, tc := range []struct {
		name     string
		uid, gid uint32
		spec     clientSpec
		want     Reason
	}{
		{"fail/peer-agent-uid-in-manager-group", e.agentUID, e.mgrGID, clientSpec{Raw: req("")}, ReasonPeerNotAllowed},
		{"fail/wrong-token", e.mgrUID, e.mgrGID, clientSpec{TokenFile: wrongTok, Request: Request{Name: "refused", Connector: "report"}}, ReasonTokenInvalid},
		{"fail/no-token", e.mgrUID, e.mgrGID, clientSpec{Raw: noTok}, ReasonTokenInvalid},
		{"fail/target-uid-root", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", UID: &zero}}, ReasonTargetNotAllowed},
		{"fail/target-uid-manager", e.mgrUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report", UID: &other}}, ReasonTargetNotAllowed},
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
		r := e.refusal(t, e.agentUID, e.agentGID, clientSpec{Raw: req("")})
		if r.Reason != "" || !strings.Contains(r.Err, "permission denied") {
			t.Fatalf("agent connect: %q (%s), want permission denied", r.Err, r.Reason)
		}
	})
	t.Run("fail/agent-cannot-read-token", func(t *testing.T) {
		r := e.refusal(t, e.agentUID, e.mgrGID, clientSpec{Request: Request{Name: "refused", Connector: "report"}})
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
	e := startRootLauncher(t)
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
			Manager:   IDs{UID: u(e.mgrUID), GID: u(e.mgrGID)}, Agent: AgentIDs{UID: u(e.agentUID), GID: u(e.agentGID)},
			Connectors: map[string]Connector{"x": {Argv: []string{"/bin/true"}}},
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
		body := fmt.Sprintf("socket: %s\ntoken_file: %s\nmanager: {uid: %d, gid: %d}\nagent: {uid: %d, gid: %d}\nagent_root: %s\nconnectors: {x: {argv: [/bin/true]}}\n",
			c.Socket, c.TokenFile, e.mgrUID, e.mgrGID, e.agentUID, e.agentGID, c.AgentRoot)
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
