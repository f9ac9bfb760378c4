package signerdtest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build builds the signerd binary into the test's temporary directory and returns its path, for
// tests that run signerd as a child process (StartProcess) so they can kill -9 it.
func Build(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "signerd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/cotalgo/cotal/signerd").CombinedOutput()
	if err != nil {
		t.Fatalf("signerdtest: go build signerd: %v\n%s", err, out)
	}
	return bin
}

// Process is a signerd replica running as a child process (`signerd serve`) on the Signer's init
// directory, keys, certificate and policy, with its own listener, replica id and audit file.
type Process struct {
	// ID is its replica id; AuditPath its own audit file, named by the id.
	ID, AuditPath string
	// Addr is its listener, host:port on 127.0.0.1.
	Addr string

	bin, cfg string // the binary and its serve configuration
	cmd      *exec.Cmd
	exited   chan struct{}
	mu       sync.Mutex
	stderr   []string
}

// StartProcess runs bin (see Build) as `signerd serve` with replica id id and returns once it
// logs that it serves. The process is killed when the test ends.
func (s *Signer) StartProcess(t testing.TB, bin, id string) *Process {
	t.Helper()
	dir := t.TempDir()
	p := &Process{ID: id, AuditPath: filepath.Join(dir, "audit", id+".audit"), bin: bin, cfg: filepath.Join(dir, "serve.yaml")}
	text := "listen: 127.0.0.1:0\n" + s.cfgText + "log_level: info\n" +
		"audit: {path: " + strconv.Quote(p.AuditPath) + ", replica: " + id + "}\n"
	mustWrite(t, p.cfg, []byte(text), 0o600)
	t.Cleanup(func() { p.Kill(t) })
	p.start(t)
	return p
}

// Restart starts the process again after it exited (Kill), on the same configuration and audit
// file, and returns once it serves; Addr is its new listener. It fails t if the process is
// still running.
func (p *Process) Restart(t testing.TB) {
	t.Helper()
	select {
	case <-p.exited:
	default:
		t.Fatalf("signerdtest: Restart of %s while it runs", p.ID)
	}
	p.start(t)
}

// start runs the process and waits until it logs that it serves.
func (p *Process) start(t testing.TB) {
	t.Helper()
	p.exited = make(chan struct{})
	p.mu.Lock()
	p.stderr = nil
	p.mu.Unlock()
	p.cmd = exec.Command(p.bin, "serve", "--config", p.cfg)
	p.cmd.Env = append(os.Environ(), "CREDENTIALS_DIRECTORY=")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("signerdtest: start %s: %v", p.bin, err)
	}
	listen := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			if len(p.stderr) < 200 {
				p.stderr = append(p.stderr, line)
			}
			p.mu.Unlock()
			var e struct{ Msg, Listen string }
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "signerd serving" && e.Listen != "" {
				select {
				case listen <- e.Listen:
				default:
				}
			}
		}
	}()
	cmd, exited := p.cmd, p.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case p.Addr = <-listen:
	case <-p.exited:
		t.Fatalf("signerdtest: %s exited before serving:\n%s", p.ID, p.log())
	case <-time.After(30 * time.Second):
		p.Kill(t)
		t.Fatalf("signerdtest: %s did not serve within 30s:\n%s", p.ID, p.log())
	}
}

// Log returns the first lines the current run of the process wrote to stderr.
func (p *Process) Log() string { return p.log() }

// Kill kills the process with SIGKILL, as kill -9 does, and waits for it to exit. It is
// idempotent.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if p.cmd == nil || p.cmd.Process == nil {
		return // never started
	}
	select {
	case <-p.exited:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Logf("signerdtest: kill %s: %v", p.ID, err)
	}
	<-p.exited
}

// Audit verifies the process's audit file on its own, as Replica.Audit does; a file not yet
// created is empty.
func (p *Process) Audit(t testing.TB) AuditFile {
	t.Helper()
	if _, err := os.Stat(p.AuditPath); os.IsNotExist(err) {
		return AuditFile{}
	}
	return (&Replica{AuditPath: p.AuditPath}).Audit(t)
}

func (p *Process) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := ""
	for _, l := range p.stderr {
		out += l + "\n"
	}
	return out
}
