package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/managerd/manager"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// childEnv names the spec file of a managerd child process (TestManagerdChildProcess).
const childEnv = "COTAL_TEST_MANAGERD_CHILD"

// childSpec is what a managerd child process runs: a remote managerd on Config whose host
// launcher writes under Root, and whose host RemoteAuthority (the stock HTTP client) stops
// before its first retirement-requester mint: it creates Requester and waits there, so the
// parent can kill the process after a prepare and before the rail.
type childSpec struct {
	Config    *manager.Config
	Root      string
	Ready     string // created once manager.Start has returned
	Requester string // created when the manager asks for a retirement requester
}

// stallRequester is the child's host RemoteAuthority: the stock client, except that a
// retirement-requester mint marks Requester and waits for the caller's deadline (the process
// is killed meanwhile).
type stallRequester struct {
	*manager.HTTPAuthority
	marker string
}

func (s stallRequester) MintRetirementRequester(ctx context.Context, _ *managerauthority.Request) (*managerauthority.Material, error) {
	if err := os.WriteFile(s.marker, nil, 0o600); err != nil {
		return nil, err
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestManagerdChildProcess is not a test of its own: it is the body of the managerd child
// process TestRemoteManagerdKill re-executes this test binary as (childEnv names its spec). It
// runs until it is killed or its stdin (a pipe from the parent) closes.
func TestManagerdChildProcess(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("runs only as TestRemoteManagerdKill's child process")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec childSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	stock, err := manager.NewHTTPAuthority(spec.Config.AuthorityURL, spec.Config.IdPTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	lnch := &hostLauncher{root: spec.Root, children: map[string]manager.Child{}}
	m, err := manager.Start(context.Background(), manager.Inputs{Config: spec.Config, RemoteAuthority: stallRequester{stock, spec.Requester}},
		manager.RuntimeOptions{Launcher: lnch, Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := os.WriteFile(spec.Ready, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent's pipe: EOF when the parent goes
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = m.Close(ctx)
}

// managerdChild is a remote managerd running as a child process of the test.
type managerdChild struct {
	cmd    *exec.Cmd
	stderr *testkit.SyncBuffer // its log
	exited chan struct{}       // closed once it has been waited for
	state  *os.ProcessState
}

// startManagerdChild re-executes the test binary as a remote managerd child on spec and waits
// until it serves.
func startManagerdChild(t *testing.T, spec childSpec) *managerdChild {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "child.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	c := &managerdChild{stderr: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestManagerdChildProcess$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), childEnv+"="+path)
	c.cmd.Stderr, c.cmd.Stdout = c.stderr, c.stderr
	stdin, err := c.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		c.state = c.cmd.ProcessState
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	testkit.Eventually(t, 30*time.Second, func() error {
		select {
		case <-c.exited:
			t.Fatalf("the managerd child exited before it served: %v\n%s", c.state, c.stderr.String())
		default:
		}
		_, err := os.Stat(spec.Ready)
		return err
	})
	return c
}

// TestRemoteManagerdKill is issue 25's "prepare failing: no rail call, alias kept; after
// `kill -9` of managerd the host finishes through the retire door", with managerd a real child
// process (this test binary re-executed, running manager.Start in remote mode against the real
// authd, its host launcher and the stock HTTP authority) killed with SIGKILL.
//
// With deliveryd down, Stop's prepare fails: no requester, no rail, the alias and the managed
// grant kept, a pending-retirement record; the retire door refuses (409) while the grant is
// held. Once deliveryd is back the manager's background retry prepares (the grant is revoked,
// the head still active) and asks its host authority for the retirement requester, where the
// host hook holds it; the test kills the process there with SIGKILL, so no rail call is ever
// made. The host then finishes through authd's loopback retire door with the cap: 200
// retired:true at the uid, the head retired, a repeat alreadyRetired.
//
// The host does not prepare itself: authd's only prepare writer is the manager-service
// authority's prepare-retirement, which needs the manager's current registration proof, held
// in the dead process's memory only. The door needs the grant revoked, so the host finishes a
// retirement whose prepare a manager completed before it died; a retirement whose prepare
// never succeeded stays pending until a managerd restarts on that state directory
// (TestRemoteManagerdStop's last subtest).
func TestRemoteManagerdKill(t *testing.T) {
	r := newRemoteRig(t)
	h := r.h
	d := h.e.startDeliveryd(t)
	cfg := r.config()
	marks := t.TempDir()
	root := filepath.Join(r.dir, "agents")
	child := startManagerdChild(t, childSpec{Config: cfg, Root: root,
		Ready: filepath.Join(marks, "ready"), Requester: filepath.Join(marks, "requester")})
	c := r.client(t, cfg)
	st := h.e.lifecycleStore(t)
	lnch := &hostLauncher{root: root} // only its root: where the child's launcher wrote the material
	pending := filepath.Join(cfg.StateDir, "retire", "b1.json")
	var ag *managerv1.Agent

	t.Run("ok/the child managerd spawns an agent that activates", func(t *testing.T) {
		resp, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "b1", Connector: "echo", Subscribe: []string{"general"}})
		if err != nil {
			t.Fatalf("spawn: %v\nmanagerd:\n%s", err, child.stderr.String())
		}
		ag = resp.GetAgent()
		activate(t, r, lnch, "b1")
		head, _, found, err := st.Head(ctxT(t), h.owner, "b1")
		if err != nil || !found || head.State != lifecycle.HeadActive || head.LifecycleUID != ag.GetLifecycleUid() {
			t.Fatalf("head %+v found %v err %v, want active at %s", head, found, err, ag.GetLifecycleUid())
		}
	})
	if ag == nil {
		t.Fatal("no agent")
	}
	uid := ag.GetLifecycleUid()

	t.Run("fail/prepare unavailable: no requester, no rail, grant and alias kept, the door refuses", func(t *testing.T) {
		if err := d.Close(ctxT(t)); err != nil {
			t.Fatalf("stop deliveryd: %v", err)
		}
		from := len(strings.Split(r.logs.String(), "\n")) - 1
		_, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: "b1"})
		if msg := status.Convert(err).Message(); status.Code(err) != codes.Unavailable || !strings.Contains(msg, "retirement is pending") ||
			!strings.Contains(msg, "(503 unavailable)") {
			t.Fatalf("stop = %v, want UNAVAILABLE naming the pending retirement and the prepare's 503", err)
		}
		logs := r.logs.String()
		if logIndex(logs, from, `"operation":"retire"`) >= 0 || logIndex(logs, from, `"msg":"retire rail: retirement requested"`) >= 0 {
			t.Fatal("a requester was minted or the rail asked after a failed prepare")
		}
		if _, err := os.Stat(filepath.Join(marks, "requester")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the manager asked for a requester after a failed prepare (%v)", err)
		}
		if row, _, err := h.led.Get(h.owner, "b1"); err != nil || row.LifecycleUID != uid {
			t.Fatalf("grant uid %s err %v, want kept at %s", row.LifecycleUID, err, uid)
		}
		if fi, err := os.Stat(pending); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("pending record %v err %v, want mode 0600", fi, err)
		}
		if _, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "b1", Connector: "echo"}); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("spawn of the held alias = %v, want ALREADY_EXISTS", err)
		}
		if code, body := h.retireCall(t, "b1", uid); code != http.StatusConflict || !strings.Contains(body, "revoke it first") {
			t.Fatalf("door with the grant held = %d %s, want 409", code, body)
		}
		if head, _, _, err := st.Head(ctxT(t), h.owner, "b1"); err != nil || head.State != lifecycle.HeadActive {
			t.Fatalf("head %+v err %v, want still active", head, err)
		}
	})

	t.Run("ok/the retry prepares; SIGKILL before the rail; the host finishes through the retire door", func(t *testing.T) {
		h.e.startDeliveryd(t)
		testkit.Eventually(t, 30*time.Second, func() error {
			if _, err := os.Stat(filepath.Join(marks, "requester")); err != nil {
				return fmt.Errorf("no requester asked yet: %w", err)
			}
			return nil
		})
		if _, _, err := h.led.Get(h.owner, "b1"); err == nil {
			t.Fatal("the manager asked for a requester with the grant still held")
		}
		if err := child.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-child.exited:
		case <-ctxT(t).Done():
			t.Fatal("the killed managerd was not reaped")
		}
		ws, ok := child.state.Sys().(syscall.WaitStatus)
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("managerd ended %v, want killed by SIGKILL", child.state)
		}
		if logIndex(r.logs.String(), 0, `"msg":"retire rail: retirement requested"`, `"uid":"`+uid+`"`) >= 0 {
			t.Fatal("the rail was asked: the kill came too late to prove the door")
		}
		if _, err := os.Stat(pending); err != nil {
			t.Fatalf("the dead manager's pending record: %v", err)
		}
		head, _, _, err := st.Head(ctxT(t), h.owner, "b1")
		if err != nil || head.State != lifecycle.HeadActive || head.LifecycleUID != uid {
			t.Fatalf("head %+v err %v, want still active at %s before the host's call", head, err, uid)
		}

		if code, body := h.retireCall(t, "b1", uid); code != http.StatusOK || body != `{"retired":true,"lifecycleUid":"`+uid+`"}` {
			t.Fatalf("door = %d %s, want 200 retired", code, body)
		}
		head, _, found, err := st.Head(ctxT(t), h.owner, "b1")
		if err != nil || !found || head.State != lifecycle.HeadRetired || head.LifecycleUID != uid {
			t.Fatalf("head %+v found %v err %v, want retired at %s", head, found, err, uid)
		}
		if code, body := h.retireCall(t, "b1", uid); code != http.StatusOK || body != `{"retired":true,"lifecycleUid":"`+uid+`","alreadyRetired":true}` {
			t.Fatalf("repeat = %d %s, want 200 alreadyRetired", code, body)
		}
	})
}
