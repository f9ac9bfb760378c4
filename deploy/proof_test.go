package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestIsolationProof is `make proof` (issue 12, item 5), and part of `make test` as root: the four
// daemon users, the files laid out by install.sh itself (into a staging root whose passwd maps the
// four names onto throwaway users of this machine; the agent runs as a uid of the space's range), each daemon started under its own uid from that
// layout (no systemd: the key paths the units would pass through LoadCredential point at their
// source files, as docs/deploying.md says for a run by hand), an agent spawned through managerd, and
// then, never printing a secret: the signer's keys are readable by cotal-signer alone; no daemon
// directory but signerd's holds an operator, account or curve seed, and authd's callout user seed
// is the only seed outside it, 0600 and cotal-auth's; the agent (its uid checked in /proc) can
// read no seed and no daemon's client key, cannot get past signerd's mTLS, and cannot connect to
// the launcher's or managerd's socket; managerd still mints, before and after.
func TestIsolationProof(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the isolation proof needs root (CI runs as root): it creates four users and runs each daemon under its own")
	}
	for _, tool := range []string{"bash", "useradd", "userdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the isolation proof needs %s", tool)
		}
	}
	bins := stack.Dir(t)
	p := &proof{t: t, tok: space.Token("proof")}

	// The five users: throwaway users of this machine, under the names install.sh knows.
	top := t.TempDir()
	for _, d := range []string{top, filepath.Dir(top)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p.dest = filepath.Join(top, "root")
	p.users = map[string][2]uint32{}
	var passwd, group strings.Builder
	passwd.WriteString("root:x:0:0:root:/root:/bin/bash\n")
	group.WriteString("root:x:0:\n")
	for _, name := range []string{"cotal-signer", "cotal-auth", "cotal-delivery", "cotal-manager"} {
		uid, gid := testkit.AddUser(t, 0)
		p.users[name] = [2]uint32{uid, gid}
		fmt.Fprintf(&passwd, "%s:x:%d:%d::/:/usr/sbin/nologin\n", name, uid, gid)
		fmt.Fprintf(&group, "%s:x:%d:\n", name, gid)
	}
	mustMkdirAll(t, filepath.Join(p.dest, "etc"), 0o755)
	mustWrite(t, filepath.Join(p.dest, "etc", "passwd"), passwd.String(), 0o644)
	mustWrite(t, filepath.Join(p.dest, "etc", "group"), group.String(), 0o644)

	out, err := exec.Command("bash", "install.sh", "--destdir", p.dest, "--bin-dir", bins, "--space", "proof").CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	// install.sh kept the users it found: the layout is owned by this machine's throwaway uids.
	if fi := p.stat(filepath.Join(p.dest, "var/lib/cotal/signerd/signer")); fi.Uid != p.uid("cotal-signer") {
		t.Fatalf("signer key directory owned by %d, want cotal-signer's %d", fi.Uid, p.uid("cotal-signer"))
	}

	p.start(bins)
	c := p.client()

	// Positive control, before: managerd mints an agent credential (the spawn needs one).
	agent := p.spawn(c, "prover")
	uidLine := testkit.ProcUIDs(t, int(agent.Pid))
	// install.sh gave the space's launcher the first block of agent uids, 70000+1000.
	agentUID64, err := strconv.ParseUint(uidLine[0], 10, 32)
	if err != nil || agentUID64 < 70000 || agentUID64 >= 71000 || strings.Join(uidLine, " ") != strings.Join([]string{uidLine[0], uidLine[0], uidLine[0], uidLine[0]}, " ") {
		t.Fatalf("agent pid %d Uid: %v, want one uid of the space's range 70000+1000 four times", agent.Pid, uidLine)
	}
	agentUID := uint32(agentUID64)
	term := p.attach(c, "prover")
	term.waitFor(t, "ready")

	signerFiles := p.files(filepath.Join(p.dest, "var/lib/cotal/signerd/signer"), filepath.Join(p.dest, "var/lib/cotal/signerd/operator"))
	if len(signerFiles) < 8 {
		t.Fatalf("only %d files in the signer's key directories", len(signerFiles))
	}

	t.Run("ok/the signer's keys are readable by cotal-signer only", func(t *testing.T) {
		for _, f := range signerFiles {
			for name := range p.users {
				err := p.readAs(name, f)
				if name == "cotal-signer" && err != nil {
					t.Fatalf("cotal-signer cannot read its own key %s: %v", p.rel(f), err)
				}
				if name != "cotal-signer" && err == nil {
					t.Fatalf("%s can read the signer's key %s", name, p.rel(f))
				}
			}
		}
	})

	t.Run("ok/no seed outside the signer's directory but authd's callout user seed", func(t *testing.T) {
		seedRE := regexp.MustCompile(`S[UOAXNCP][A-Z2-7]{56}`)
		var found []string // "<path>: <prefix>…", path relative to the staging root
		signerDir := filepath.Join(p.dest, "var/lib/cotal/signerd")
		for _, root := range []string{filepath.Join(p.dest, "var/lib/cotal"), filepath.Join(p.dest, "etc/cotal"), filepath.Join(p.dest, "run/cotal")} {
			for _, f := range p.files(root) {
				if strings.HasPrefix(f, signerDir+"/") {
					continue
				}
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range seedRE.FindAll(data, -1) {
					found = append(found, p.rel(f)+": "+string(m[:2])+"…")
				}
			}
		}
		// An agent's launch material carries the agent's own user seed (its credential): that is
		// the agent's, 0600 in its directory, and no daemon's.
		agents := filepath.Join(p.dest, "var/lib/cotal/agents") + "/"
		var daemons []string
		for _, f := range found {
			if strings.HasPrefix(p.dest+f, agents) {
				path := p.dest + f[:strings.Index(f, ": ")]
				fi := p.stat(path)
				if filepath.Base(path) != "launch-material" || !strings.HasSuffix(f, ": SU…") || fi.Uid != agentUID || fi.Mode&0o7777 != 0o600 {
					t.Fatalf("agent directory seed %s: uid %d mode %o; want a user seed in launch-material, the agent's (%d), 0600", f, fi.Uid, fi.Mode&0o7777, agentUID)
				}
				continue
			}
			daemons = append(daemons, f)
		}
		callout := filepath.Join(p.dest, "var/lib/cotal/authd", p.tok, "callout.nk")
		if len(daemons) != 1 || daemons[0] != p.rel(callout)+": SU…" {
			t.Fatalf("seeds outside the signer's and the agents' directories: %v; want only %s (a user seed)", daemons, p.rel(callout))
		}
		fi := p.stat(callout)
		if fi.Uid != p.uid("cotal-auth") || fi.Mode&0o7777 != 0o600 {
			t.Fatalf("callout seed: uid %d mode %o, want cotal-auth and 0600", fi.Uid, fi.Mode&0o7777)
		}
	})

	t.Run("ok/the agent reads no seed or client key, gets past no socket and not past signerd's mTLS", func(t *testing.T) {
		targets := append([]string{}, signerFiles...)
		for _, d := range []string{"authd", "deliveryd", "managerd"} {
			targets = append(targets, filepath.Join(p.dest, "var/lib/cotal", d, p.tok, "client.key"))
		}
		targets = append(targets, filepath.Join(p.dest, "var/lib/cotal/signerd/tls/signerd.key"),
			filepath.Join(p.dest, "var/lib/cotal/authd", p.tok, "callout.nk"), filepath.Join(p.dest, "var/lib/cotal/pki/ca.key"),
			// authd's discovery file holds the loopback doors' cap (activate, retire, exchange).
			filepath.Join(p.dest, "var/lib/cotal/authd", p.tok, "state", "auth-service.json"))
		for _, f := range targets {
			p.input(c, "prover", "!open "+f)
			term.waitFor(t, "open "+f+" EACCES")
		}
		for _, s := range []string{p.launcherSock, p.apiSock} {
			p.input(c, "prover", "!unix "+s)
			term.waitFor(t, "unix "+s+" EACCES")
		}
		p.input(c, "prover", "!tls "+p.signerAddr)
		term.waitFor(t, "tls "+p.signerAddr+" refused")
		if out := term.output(); strings.Contains(out, "eyJ") || seedText.MatchString(out) {
			t.Fatal("the agent's terminal shows a JWT or a seed")
		}
	})

	// Positive control, after: managerd still mints.
	p.spawn(c, "prover2")
}

var seedText = regexp.MustCompile(`S[UOAXNCP][A-Z2-7]{20}`)

// proof is the running stack of TestIsolationProof.
type proof struct {
	t                                *testing.T
	dest, tok                        string
	users                            map[string][2]uint32
	signerAddr, natsURL              string
	launcherSock, apiSock, configDir string
	procs                            []*exec.Cmd
}

func (p *proof) uid(name string) uint32 { return p.users[name][0] }
func (p *proof) gid(name string) uint32 { return p.users[name][1] }

func (p *proof) rel(path string) string { return strings.TrimPrefix(path, p.dest) }

func (p *proof) stat(path string) *syscall.Stat_t {
	p.t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		p.t.Fatal(err)
	}
	return &st
}

// files lists the regular files under roots (as root).
func (p *proof) files(roots ...string) []string {
	p.t.Helper()
	var out []string
	for _, r := range roots {
		err := filepath.WalkDir(r, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				out = append(out, path)
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.t.Fatal(err)
		}
	}
	return out
}

// readAs opens path for reading as user name (a child process with that uid, its group and no
// other), discarding what it reads.
func (p *proof) readAs(name, path string) error {
	cmd := exec.Command("/bin/cat", path)
	cmd.Stdout = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid(name), Gid: p.gid(name), Groups: []uint32{}}}
	return cmd.Run()
}

// configFor rewrites an installed configuration for a run by hand from the staging root: every
// absolute Cotal path moved under it, each LoadCredential path replaced by its source file (the
// "from" comment install.sh writes), and the fixed ports replaced by this run's. It is written
// next to the others (root, the daemon's group, 0640).
func (p *proof) configFor(installed, name, group string, extra func(string) string) string {
	p.t.Helper()
	data, err := os.ReadFile(installed)
	if err != nil {
		p.t.Fatal(err)
	}
	s := string(data)
	credFrom := regexp.MustCompile(`/run/credentials/[^\s]+\s+#\s*(?:from|LoadCredential of) (\S+)`)
	s = credFrom.ReplaceAllString(s, "$1")
	for _, prefix := range []string{"/etc/cotal", "/var/lib/cotal", "/run/cotal"} {
		s = strings.ReplaceAll(s, " "+prefix, " "+p.dest+prefix)
		s = strings.ReplaceAll(s, "["+prefix, "["+p.dest+prefix)
	}
	s = strings.ReplaceAll(s, "127.0.0.1:7443", p.signerAddr)
	s = strings.ReplaceAll(s, "nats://127.0.0.1:4222", p.natsURL)
	if strings.Contains(s, "/run/credentials/") {
		p.t.Fatalf("%s: a credential path without its source:\n%s", installed, s)
	}
	if extra != nil {
		s = extra(s)
	}
	out := filepath.Join(p.configDir, name)
	mustWrite(p.t, out, s, 0o640)
	if err := os.Chown(out, 0, int(p.gid(group))); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// run starts a daemon as user (root when empty) and waits until a line of its output contains
// ready.
func (p *proof) run(label, user, ready string, argv ...string) *exec.Cmd {
	p.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	if user != "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid(user), Gid: p.gid(user), Groups: []uint32{}}}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	var mu sync.Mutex
	var lines []string
	seen := make(chan struct{})
	var once sync.Once
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("%s: %v", label, err)
	}
	p.procs = append(p.procs, cmd)
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			mu.Lock()
			if len(lines) < 300 {
				lines = append(lines, sc.Text())
			}
			mu.Unlock()
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(seen) })
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	p.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if p.t.Failed() {
			mu.Lock()
			p.t.Logf("%s output:\n%s", label, strings.Join(lines, "\n"))
			mu.Unlock()
		}
	})
	select {
	case <-seen:
	case <-exited:
		mu.Lock()
		defer mu.Unlock()
		p.t.Fatalf("%s exited before %q:\n%s", label, ready, strings.Join(lines, "\n"))
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		p.t.Fatalf("%s: no %q within 60s:\n%s", label, ready, strings.Join(lines, "\n"))
	}
	return cmd
}

// start runs the broker and every daemon from the installed layout, each under its user.
func (p *proof) start(bins string) {
	t := p.t
	p.configDir = filepath.Join(filepath.Dir(p.dest), "run-configs")
	mustMkdirAll(t, p.configDir, 0o755)
	p.signerAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	natsPort := freePort(t)
	p.natsURL = "nats://127.0.0.1:" + strconv.Itoa(natsPort)

	// The broker (not a Cotal daemon; root here), on the trust install.sh placed.
	conf, err := os.ReadFile(filepath.Join(p.dest, "etc/cotal/broker/nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	nc := regexp.MustCompile(`(?m)^port: \d+$`).ReplaceAllString(string(conf), "port: "+strconv.Itoa(natsPort))
	nc = regexp.MustCompile(`store_dir: "[^"]*"`).ReplaceAllString(nc, `store_dir: "`+filepath.Join(filepath.Dir(p.dest), "jetstream")+`"`)
	natsConf := filepath.Join(p.configDir, "nats.conf")
	mustWrite(t, natsConf, nc, 0o644)
	p.run("nats-server", "", "Server is ready", filepath.Join(bins, "nats-server"), "-c", natsConf)

	signerCfg := p.configFor(filepath.Join(p.dest, "etc/cotal/signerd/signerd.yaml"), "signerd.yaml", "cotal-signer", nil)
	p.run("signerd", "cotal-signer", `"signerd serving"`, filepath.Join(bins, "signerd"), "serve", "--config", signerCfg)

	prov := p.configFor(filepath.Join(p.dest, "etc/cotal/managerd", p.tok+".provision.yaml"), "provision.yaml", "cotal-manager", nil)
	cmd := exec.Command(filepath.Join(bins, "managerd"), "provision", "--space", "proof", "--config", prov)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid("cotal-manager"), Gid: p.gid("cotal-manager"), Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("managerd provision as cotal-manager: %v\n%s", err, out)
	}

	authCfg := p.configFor(filepath.Join(p.dest, "etc/cotal/authd", p.tok+".yaml"), "authd.yaml", "cotal-auth", nil)
	p.run("authd", "cotal-auth", `"authd ready"`, filepath.Join(bins, "authd"), "serve", "--config", authCfg)
	dlvCfg := p.configFor(filepath.Join(p.dest, "etc/cotal/deliveryd", p.tok+".yaml"), "deliveryd.yaml", "cotal-delivery", nil)
	p.run("deliveryd", "cotal-delivery", `"deliveryd ready"`, filepath.Join(bins, "deliveryd"), "serve", "--config", dlvCfg)

	testagent := filepath.Join(bins, "testagent")
	lcfg := p.configFor(filepath.Join(p.dest, "etc/cotal/launcher", p.tok+".yaml"), "launcher.yaml", "", func(s string) string {
		return regexp.MustCompile(`(?m)^  claude: \{argv: \[[^\]]*\]\}`).ReplaceAllString(s, "  testagent: {argv: ["+testagent+", --probe-every, 1s]}")
	})
	p.launcherSock = filepath.Join(p.dest, "run/cotal/launcher", p.tok, "launcher.sock")
	p.run("launcher", "", `"launcher listening"`, filepath.Join(bins, "managerd"), "launcher", "--config", lcfg)

	// systemd's RuntimeDirectory= would make managerd's socket directory: here, by hand.
	apiDir := filepath.Join(p.dest, "run/cotal/manager", p.tok)
	mustMkdirAll(t, apiDir, 0o750)
	if err := os.Chown(apiDir, int(p.uid("cotal-manager")), int(p.gid("cotal-manager"))); err != nil {
		t.Fatal(err)
	}
	p.apiSock = filepath.Join(apiDir, "manager.sock")
	mcfg := p.configFor(filepath.Join(p.dest, "etc/cotal/managerd", p.tok+".yaml"), "managerd.yaml", "cotal-manager", func(s string) string {
		return strings.ReplaceAll(s, "connectors: [claude]", "connectors: [testagent]")
	})
	p.run("managerd", "cotal-manager", `"ManagerService serving"`, filepath.Join(bins, "managerd"), "serve", "--config", mcfg)
}

func (p *proof) client() managerv1.ManagerServiceClient {
	p.t.Helper()
	c, closer, err := managerclient.Dial(context.Background(), p.apiSock)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { closer.Close() })
	if _, err := c.Status(p.ctx(), &managerv1.StatusRequest{}); err != nil {
		p.t.Fatalf("managerd Status: %v", err)
	}
	return c
}

func (p *proof) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	p.t.Cleanup(cancel)
	return ctx
}

func (p *proof) spawn(c managerv1.ManagerServiceClient, name string) *managerv1.Agent {
	p.t.Helper()
	resp, err := c.Spawn(p.ctx(), &managerv1.SpawnRequest{Name: name, Connector: "testagent"})
	if err != nil {
		p.t.Fatalf("spawn %s (managerd minting its credential): %v", name, err)
	}
	in, err := c.Inspect(p.ctx(), &managerv1.InspectRequest{Name: name})
	if err != nil || in.Agent.Pid != resp.Agent.Pid || in.Renewal.GetExpiresAt() == nil {
		p.t.Fatalf("inspect %s: %v %v", name, in, err)
	}
	return in.Agent
}

func (p *proof) input(c managerv1.ManagerServiceClient, name, text string) {
	p.t.Helper()
	if _, err := c.Input(p.ctx(), &managerv1.InputRequest{Name: name, Text: []byte(text), Enter: true}); err != nil {
		p.t.Fatal(err)
	}
}

// terminal collects an Attach stream.
type terminal struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.buf.String()
}

func (tm *terminal) waitFor(t *testing.T, sub string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(tm.output(), sub) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent's terminal lacks %q", sub)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proof) attach(c managerv1.ManagerServiceClient, name string) *terminal {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.t.Cleanup(cancel)
	st, err := c.Attach(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := st.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: name}}}); err != nil {
		p.t.Fatal(err)
	}
	tm := &terminal{}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			tm.mu.Lock()
			tm.buf.Write(r.GetSnapshot())
			tm.buf.Write(r.GetData())
			tm.mu.Unlock()
		}
	}()
	return tm
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func mustMkdirAll(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// stack is every binary the proof runs, built once per test binary into one directory that
// install.sh takes as --bin-dir (it installs the four daemons; the test agent and nats-server are
// run from there).
var stack = testkit.Binaries{Prefix: "cotal-proof-bin-", Pkgs: []string{
	"github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd", "github.com/cotalgo/cotal/deliveryd",
	"github.com/cotalgo/cotal/managerd", "github.com/cotalgo/cotal/managerd/internal/testagent",
	"github.com/nats-io/nats-server/v2",
}}
