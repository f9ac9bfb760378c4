package service_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

func perm(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestStartReadyClose: Start returns ready (discovery file 0600 in a 0700 dir, written last,
// naming this pid with a 32-byte cap; Ready and /health agree; the plane row is ours and
// ready), and Close withdraws the file and releases the claim; Close is idempotent.
func TestStartReadyClose(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	s := start(t, cfg)
	path := daemon.DiscoveryPath(cfg.StateDir, service.FileName)
	if perm(t, path) != 0o600 || perm(t, cfg.StateDir) != 0o700 {
		t.Fatalf("modes: file %v dir %v", perm(t, path), perm(t, cfg.StateDir))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d daemon.Discovery
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if capb, err := hex.DecodeString(d.Cap); d.Ver != 1 || d.PID != os.Getpid() || d.URL != s.URL() || err != nil || len(capb) != 32 || d.State != service.StateReady {
		t.Fatalf("discovery file %+v (cap ok: %v)", d, err == nil)
	}
	if s.Cap() != d.Cap || s.State() != service.StateReady || !s.Ready() || s.PublicURL() != "" {
		t.Fatalf("handle: cap matches the file %v, state %s, ready %v, public url %q", s.Cap() == d.Cap, s.State(), s.Ready(), s.PublicURL())
	}
	if str := fmt.Sprintf("%v %+v %s", s, s, s); strings.Contains(str, d.Cap) {
		t.Fatal("the service's printed form holds its cap")
	}
	info, err := daemon.Ready(readyCtx(t), cfg.StateDir, service.FileName, os.Getpid())
	if err != nil || info.URL != s.URL() {
		t.Fatalf("Ready = %+v, %v", info, err)
	}
	resp, err := http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health = %v, %v", resp, err)
	}
	resp.Body.Close()
	row, ok := e.planeRow(t)
	if !ok || row["ready"] != true || !strings.HasSuffix(row["holder"].(string), " pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("plane row %v", row)
	}
	for i := range 2 { // idempotent: the second Close has the first's verdict
		if err := s.Close(ctxT(t)); err != nil {
			t.Fatalf("Close #%d = %v", i+1, err)
		}
	}
	<-s.Done()
	if !errors.Is(s.Err(), daemon.ErrStopped) || s.State() != service.StateStopped || s.Ready() {
		t.Fatalf("Err = %v, state %s", s.Err(), s.State())
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("discovery file after Close: %v", err)
	}
	if row, ok := e.planeRow(t); ok {
		t.Fatalf("plane row after Close: %v", row)
	}
	if _, err := http.Get(s.URL() + "/health"); err == nil {
		t.Fatal("listener still up after Close")
	}
	// The released plane is free at once.
	start(t, e.config(t))
}

// TestSecondAuthdRefuses: a second authd for the space (a real child process) refuses at start,
// naming the holder of the plane claim, writes the refusal file for its own pid (which Ready
// returns at once as a typed error), exits 1, and leaves the first's discovery file alone.
func TestSecondAuthdRefuses(t *testing.T) {
	e := newEnv(t)
	first := e.config(t)
	start(t, first)
	row, _ := e.planeRow(t)

	second := e.config(t)
	second.StateDir = first.StateDir // same state dir: the refusal must not touch the first's file
	c := startChild(t, second)
	_, err := daemon.Ready(readyCtx(t), second.StateDir, service.FileName, c.cmd.Process.Pid)
	var re *daemon.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Ready(second) = %v, want a refusal", err)
	}
	if re.Refusal.Code != service.CodePlaneHeld || re.Refusal.Details["holder"] != row["holder"] || !strings.Contains(re.Refusal.Reason, row["holder"].(string)) {
		t.Fatalf("refusal %+v, want PLANE_HELD naming %v", re.Refusal, row["holder"])
	}
	if code := c.exitCode(t); code != 1 {
		t.Fatalf("second authd exit %d, want 1; stderr:\n%s", code, c.stderr)
	}
	if perm(t, daemon.RefusalPath(second.StateDir, service.FileName)) != 0o600 {
		t.Fatal("refusal file mode")
	}
	if _, err := daemon.Ready(readyCtx(t), first.StateDir, service.FileName, os.Getpid()); err != nil {
		t.Fatalf("first authd no longer ready after the refusal: %v", err)
	}
}

// TestKill9: an authd child killed with SIGKILL leaves its claim; Ready on its pid ends at once.
// A successor whose sweep cannot be conclusive (a configured server does not answer) refuses
// naming it, then starts once the claim expired: the TTL still frees a claim no sweep can prove
// free. (A conclusive sweep reclaims it at once: TestPlaneReclaim.)
func TestKill9(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	// Long enough that the successor's first start surely falls inside it on a loaded machine.
	cfg.PlaneTTL = yamlx.Duration(6 * time.Second)
	c := startChild(t, cfg)
	pid := c.cmd.Process.Pid
	if _, err := daemon.Ready(readyCtx(t), cfg.StateDir, service.FileName, pid); err != nil {
		t.Fatalf("Ready(child) = %v; stderr:\n%s", err, c.stderr)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ee *daemon.ExitedError
	if _, err := daemon.Ready(readyCtx(t), cfg.StateDir, service.FileName, pid); !errors.As(err, &ee) {
		t.Fatalf("Ready after kill -9 = %v, want exited", err)
	}
	succ := e.config(t)
	succ.Brokers = []string{e.url, deadBroker(t)}
	_, err := service.Start(ctxT(t), service.Inputs{Config: succ}, service.RuntimeOptions{})
	var se *service.StartError
	if !errors.As(err, &se) || se.Code != service.CodePlaneHeld || !strings.HasSuffix(se.Details["holder"], " pid "+strconv.Itoa(pid)) {
		t.Fatalf("successor Start = %v, want PLANE_HELD naming pid %d", err, pid)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		s, err := service.Start(ctxT(t), service.Inputs{Config: succ}, service.RuntimeOptions{})
		if err == nil {
			closeAtEnd(t, s)
		}
		return err
	})
}

// TestSIGTERMRemovesDiscovery: authd serve removes its discovery file and releases its claim on
// SIGTERM, and exits 0.
func TestSIGTERMRemovesDiscovery(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	c := startChild(t, cfg)
	if _, err := daemon.Ready(readyCtx(t), cfg.StateDir, service.FileName, c.cmd.Process.Pid); err != nil {
		t.Fatalf("Ready = %v; stderr:\n%s", err, c.stderr)
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := c.exitCode(t); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, c.stderr)
	}
	if _, err := os.Stat(daemon.DiscoveryPath(cfg.StateDir, service.FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("discovery file after SIGTERM: %v", err)
	}
	if row, ok := e.planeRow(t); ok {
		t.Fatalf("plane row after SIGTERM: %v", row)
	}
}

// TestServeWritesConfigRefusal: `authd serve` whose state dir holds an account seed exits 1 and
// leaves a CONFIG refusal naming the file, which Ready returns at once.
func TestServeWritesConfigRefusal(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	kp, _ := nkeys.CreateAccount()
	seed, _ := kp.Seed()
	bad := filepath.Join(cfg.StateDir, "acct.nk")
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, cfg)
	_, err := service.Ready(readyCtx(t), cfg.StateDir, c.cmd.Process.Pid)
	var re *daemon.RefusedError
	if !errors.As(err, &re) || re.Refusal.Code != service.CodeConfig || !strings.Contains(re.Refusal.Reason, bad) {
		t.Fatalf("Ready = %v, want a CONFIG refusal naming %s", err, bad)
	}
	if code := c.exitCode(t); code != 1 || !strings.Contains(c.stderr.String(), bad) {
		t.Fatalf("exit %d, stderr %q", code, c.stderr.String())
	}
}

// TestStartRefusals: a start that must not happen writes the refusal file and returns a typed
// error naming the cause.
func TestStartRefusals(t *testing.T) {
	e := newEnv(t)
	t.Run("fail/account-seed-in-state-dir", func(t *testing.T) {
		cfg := e.config(t)
		kp, _ := nkeys.CreateAccount()
		seed, _ := kp.Seed()
		p := filepath.Join(cfg.StateDir, "leftover", "acct.nk")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "account seed") {
			t.Fatalf("Start = %v", err)
		}
		if _, err := daemon.Ready(readyCtx(t), cfg.StateDir, service.FileName, os.Getpid()); !errors.As(err, new(*daemon.RefusedError)) {
			t.Fatalf("Ready = %v, want the refusal", err)
		}
	})
	t.Run("fail/signerd-refuses-identity", func(t *testing.T) {
		cfg := e.config(t)
		other := e.sg.ClientFor(t, "deliveryd", sp) // not allowed auth-plane
		cfg.Signer.Cert, cfg.Signer.Key = other.CertFile, other.KeyFile
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeSigner {
			t.Fatalf("Start = %v, want SIGNER", err)
		}
	})
	t.Run("fail/canceled-writes-no-refusal", func(t *testing.T) {
		cfg := e.config(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := service.Start(ctx, service.Inputs{Config: cfg}, service.RuntimeOptions{})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeCanceled {
			t.Fatalf("Start(canceled) = %v, want CANCELED", err)
		}
		if _, err := os.Stat(daemon.RefusalPath(cfg.StateDir, service.FileName)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a canceled start wrote a refusal file: %v", err)
		}
		if row, ok := e.planeRow(t); ok {
			t.Fatalf("a canceled start left a plane row: %v", row)
		}
	})
	t.Run("fail/loose-callout-seed", func(t *testing.T) {
		cfg := e.config(t)
		seed, err := os.ReadFile(cfg.CalloutSeed)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "callout.nk")
		if err := os.WriteFile(p, seed, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.CalloutSeed = p
		_, err = service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("Start = %v, want a refusal naming %s", err, p)
		}
	})
}
