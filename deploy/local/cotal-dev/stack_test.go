package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// The binaries `make run` builds, built once per test binary run. The dev users run managerd
// and the test agent from copies; the directory (0755) must be reachable for cotal-dev to copy
// them, which it is as root.
var binaries = testkit.Binaries{Prefix: "cotal-dev-bin-", Pkgs: []string{
	"github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd", "github.com/cotalgo/cotal/deliveryd",
	"github.com/cotalgo/cotal/managerd", "github.com/cotalgo/cotal/managerd/internal/testagent",
	"github.com/cotalgo/cotal/deploy/local/cotal-dev",
}}

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

// devRun is one `cotal-dev` run as a real child process.
type devRun struct {
	cmd    *exec.Cmd
	out    *testkit.SyncBuffer
	exited chan struct{}
	err    error
}

func startDev(t *testing.T, bin, dir string) *devRun {
	t.Helper()
	r := &devRun{cmd: exec.Command(filepath.Join(bin, "cotal-dev"), "--dir", dir, "--bin", bin, "--nats-port", "-1"), out: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.exited:
			case <-time.After(30 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.exited
			}
		}
		if t.Failed() {
			t.Logf("cotal-dev output:\n%s", r.out)
		}
	})
	return r
}

// waitTable waits until the status table's last row (the bearer) is printed.
func (r *devRun) waitTable(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := r.out.String()
		if regexp.MustCompile(`(?m)^bearer .*\n`).MatchString(s) {
			return s
		}
		select {
		case <-r.exited:
			t.Fatalf("cotal-dev exited before the status table (%v):\n%s", r.err, s)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status table after 60s:\n%s", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// interrupt sends SIGINT and requires exit 0 with every child stopped with exit 0.
func (r *devRun) interrupt(t *testing.T) string {
	t.Helper()
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("cotal-dev still running 60s after SIGINT:\n%s", r.out)
	}
	if r.err != nil {
		t.Fatalf("cotal-dev after SIGINT: %v, want exit 0\n%s", r.err, r.out)
	}
	s := r.out.String()
	want := []string{"signerd", "deliveryd", "authd"}
	if os.Geteuid() == 0 {
		want = append(want, "launcher", "managerd")
	}
	for _, d := range want {
		if !strings.Contains(s, "stopped: "+d+" (exit 0)\n") {
			t.Fatalf("output lacks %q:\n%s", "stopped: "+d+" (exit 0)", s)
		}
	}
	if !strings.HasSuffix(s, "stopped: broker\n") {
		t.Fatalf("output does not end with the broker stopped:\n%s", s)
	}
	return s
}

// row returns the status table's row for name, split on runs of two or more spaces.
func row(t *testing.T, out, name string) []string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(sc.Text()), -1); len(f) == 5 && f[0] == name {
			return f
		}
	}
	t.Fatalf("no status row %q:\n%s", name, out)
	return nil
}

var (
	secretText = regexp.MustCompile(`eyJ|\bS[OAUX][A-Z2-7]{56}\b|BEGIN [A-Z ]*PRIVATE KEY`)
	rfc3339    = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
)

func checkTable(t *testing.T, out string) {
	t.Helper()
	if m := secretText.FindString(out); m != "" {
		t.Fatalf("output holds JWT, seed or key text %q:\n%s", m, out)
	}
	if !strings.Contains(out, "DAEMON  ") || !strings.Contains(out, "CREDENTIAL EXPIRES") {
		t.Fatalf("no status table header:\n%s", out)
	}
	for _, c := range []struct{ name, id, ready string }{
		{"broker", "operator O", "serving nats://127.0.0.1:"},
		{"signerd", "spiffe://cotal.local/signerd", "serving mTLS on 127.0.0.1:"},
		{"deliveryd", "spiffe://cotal.local/deliveryd/demo", "lease ready"},
		{"authd", "spiffe://cotal.local/authd/demo", "exchange http://127.0.0.1:"},
		{"authd callout", "callout service user", "serving the callout"},
		{"bearer", "u_", "callout connect made"},
	} {
		r := row(t, out, c.name)
		if !strings.HasPrefix(r[1], c.id) || !strings.HasPrefix(r[3], c.ready) {
			t.Fatalf("row %s = %q, want identity %q and readiness %q", c.name, r, c.id, c.ready)
		}
	}
	for _, name := range []string{"deliveryd", "authd", "authd callout"} {
		if r := row(t, out, name); !regexp.MustCompile(`^U[A-Z2-7]{55}$`).MatchString(r[2]) {
			t.Fatalf("row %s: user key %q", name, r[2])
		}
	}
	// Every expiry printed is a time after the table was printed.
	for _, name := range []string{"signerd", "deliveryd", "authd", "authd callout", "bearer"} {
		r := row(t, out, name)
		ts := rfc3339.FindString(r[4])
		exp, err := time.Parse(time.RFC3339, ts)
		if err != nil || !exp.After(time.Now()) {
			t.Fatalf("row %s: expiry %q is not in the future (%v)", name, r[4], err)
		}
	}
	if !strings.Contains(out, "callout:   bearer for u_") || !strings.Contains(out, ".console.general, refused as u_") {
		t.Fatalf("no callout connect line:\n%s", out)
	}
}

func checkAgents(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, "bob's terminal (Attach): recv general local.alice hello bob, from alice\n") {
		t.Fatalf("the message did not reach bob's terminal:\n%s", out)
	}
	if !strings.Contains(out, "no --dev-allow-readable-seeds") {
		t.Fatalf("managerd line:\n%s", out)
	}
	mgr := row(t, out, "managerd")
	if !strings.HasPrefix(mgr[1], "spiffe://cotal.local/managerd/demo (uid ") || mgr[3] != "lease held, signer reachable true" {
		t.Fatalf("managerd row %q", mgr)
	}
	agentUIDs := map[string]bool{}
	for _, name := range []string{"alice", "bob"} {
		r := row(t, out, "agent "+name)
		if !strings.HasPrefix(r[1], "local."+name+" (uid ") || !strings.HasPrefix(r[3], "running, online") {
			t.Fatalf("agent %s row %q", name, r)
		}
		// Each agent runs as a uid of its own from the dev launcher's range.
		uid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(r[1], "local."+name+" (uid "), ")"))
		if err != nil || uid < devAgentUIDFirst || uid >= devAgentUIDFirst+devAgentUIDs || agentUIDs[r[1][len("local."+name):]] {
			t.Fatalf("agent %s row %q: want a uid of %d+%d of its own (%v)", name, r, devAgentUIDFirst, devAgentUIDs, err)
		}
		agentUIDs[r[1][len("local."+name):]] = true
		exp, err := time.Parse(time.RFC3339, r[4])
		if err != nil || !exp.After(time.Now()) {
			t.Fatalf("agent %s: expiry %q is not in the future (%v)", name, r[4], err)
		}
	}
	if r := row(t, out, "agent bob"); r[3] != "running, online, message received" {
		t.Fatalf("bob row %q", r)
	}
	// The bearer's post through the callout reached bob through deliveryd too.
	if !regexp.MustCompile(`(?m)^message:   bob's terminal \(Attach\): recv general u_[a-z2-7]{26}\.console hello from the callout$`).MatchString(out) {
		t.Fatalf("the callout post did not reach bob's terminal:\n%s", out)
	}
	if r := row(t, out, "bearer"); r[3] != "callout connect made, bob received its post" {
		t.Fatalf("bearer row %q", r)
	}
}

// keyDigest hashes every file under the key, certificate and trust directories: a second run
// must leave them byte for byte as the first made them.
func keyDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	for _, sub := range []string{"trust/signer", "trust/operator", "trust/authd", "pki"} {
		err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s %x\n", p, sha256.Sum256(b))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestDevStack runs `make run`'s stack twice on one state directory, each time as the real
// cotal-dev binary with every daemon a child process: it waits for the status table, checks it
// (and, as root, the two agents and the message between them), interrupts it with SIGINT and
// requires exit 0 with each daemon stopped cleanly. The second run must reuse the keys: no
// init, the key, certificate and trust files unchanged, the IdP pin kept.
func TestDevStack(t *testing.T) {
	bin := binaries.Dir(t)
	base := t.TempDir()
	if os.Geteuid() == 0 {
		// managerd and the agents run as the dev users and must reach the state directory.
		for _, d := range []string{filepath.Dir(base), base} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(base, "dev")

	first := startDev(t, bin, dir)
	out := first.waitTable(t)
	if !strings.Contains(out, "signerd init:") || !strings.Contains(out, "signerd pki init:") || !strings.Contains(out, "pinned the dev IdP") {
		t.Fatalf("first run did not initialise:\n%s", out)
	}
	checkTable(t, out)
	disc, err := os.ReadFile(filepath.Join(dir, "authd", "state", "auth-service.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Cap string }
	if err := json.Unmarshal(disc, &d); err != nil || len(d.Cap) != 64 {
		t.Fatalf("auth-service.json: cap of %d characters (%v)", len(d.Cap), err)
	}
	t.Run("root/agents", func(t *testing.T) {
		if os.Geteuid() != 0 {
			if !strings.Contains(out, "agents:    skipped: the agent demo needs root") {
				t.Fatalf("no line saying the agent demo needs root:\n%s", out)
			}
			t.Skip("root test: the launcher drops to the agent uid and managerd runs as its own user; cotal-dev started everything else")
		}
		checkAgents(t, out)
	})
	out = first.interrupt(t)
	if strings.Contains(out, d.Cap) {
		t.Fatal("output holds authd's capability")
	}
	digest := keyDigest(t, dir)

	second := startDev(t, bin, dir)
	out2 := second.waitTable(t)
	for _, bad := range []string{"signerd init:", "pki init:", "pinned the dev IdP", "already exists"} {
		if strings.Contains(out2, bad) {
			t.Fatalf("second run printed %q:\n%s", bad, out2)
		}
	}
	if !strings.Contains(out2, "state:     reusing "+dir) || !strings.Contains(out2, "provision: space demo: 0 created") {
		t.Fatalf("second run did not reuse the state:\n%s", out2)
	}
	checkTable(t, out2)
	if os.Geteuid() == 0 {
		checkAgents(t, out2)
	}
	second.interrupt(t)
	if got := keyDigest(t, dir); got != digest {
		t.Fatal("the second run changed a key, certificate or trust file")
	}
	if _, err := os.Stat(filepath.Join(dir, "authd", "state", "auth-service.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("authd's discovery file after stop: %v, want it removed", err)
	}
}

// TestDevStackWithoutRoot runs cotal-dev as an unprivileged user (the agent dev user), as a
// developer without root would: everything but the launcher and the agents starts, one line says
// the agent demo needs root, managerd runs with --dev-allow-readable-seeds, and the bearer and
// callout connect are still made. It needs root to switch to that user.
func TestDevStackWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: switching to an unprivileged user needs root (TestDevStack covers this path when the tests run without root)")
	}
	bin := binaries.Dir(t)
	u, err := ensureDevUsers()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(base, int(u.agentUID), int(u.agentGID)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "dev")
	cmd := exec.Command(filepath.Join(bin, "cotal-dev"), "--dir", dir, "--bin", bin, "--nats-port", "-1", "--once")
	cmd.Dir = base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.agentUID, Gid: u.agentGID, Groups: []uint32{}}}
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("cotal-dev as uid %d: %v\n%s", u.agentUID, err, out)
	}
	checkTable(t, out)
	if !strings.Contains(out, "agents:    skipped: the agent demo needs root") {
		t.Fatalf("no line saying the agent demo needs root:\n%s", out)
	}
	if r := row(t, out, "managerd"); r[1] != fmt.Sprintf("spiffe://cotal.local/managerd/demo (uid %d)", u.agentUID) || r[3] != "lease held, signer reachable true" {
		t.Fatalf("managerd row %q", r)
	}
	if r := row(t, out, "launcher"); r[3] != "not started: needs root" {
		t.Fatalf("launcher row %q", r)
	}
	if strings.Contains(out, "agent alice") || strings.Contains(out, "uid 0") {
		t.Fatalf("agents or root processes without root:\n%s", out)
	}
	for _, d := range []string{"managerd", "authd", "deliveryd", "signerd"} {
		if !strings.Contains(out, "stopped: "+d+" (exit 0)\n") {
			t.Fatalf("output lacks %q:\n%s", "stopped: "+d+" (exit 0)", out)
		}
	}
}

// TestTraversable: as root the state directory must be reachable by the dev users through every
// directory above it; a parent others may not search is refused, naming it.
func TestTraversable(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	closed := filepath.Join(base, "closed")
	for _, c := range []struct {
		dir  string
		mode os.FileMode
	}{{base, 0o755}, {open, 0o755}, {closed, 0o750}} {
		if err := os.MkdirAll(c.dir, c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(c.dir, c.mode); err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir's own parent is 0700 on some systems: test below a directory we opened.
	if err := os.Chmod(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("ok/every parent searchable", func(t *testing.T) {
		if err := traversable(filepath.Join(open, "dev")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("fail/a parent others may not search", func(t *testing.T) {
		err := traversable(filepath.Join(closed, "dev"))
		if err == nil || !strings.Contains(err.Error(), closed+" is mode 0750") {
			t.Fatalf("traversable = %v, want a refusal naming %s", err, closed)
		}
	})
}
