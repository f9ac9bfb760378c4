package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/internal/watchdog"
	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	uidAlice = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uidBob   = "uidbbbbbbbbbbbbbbbbbbbbbbb"
	uidCarol = "uidcccccccccccccccccccccccc"
	// leaseTTL is the delivery bucket's TTL in these tests (pkg/provision makes it 30 s; the
	// provisioner may update that bucket, so the test shortens it).
	leaseTTL = 3 * time.Second
)

// buildDeliveryd builds this binary into the test's temporary directory.
func buildDeliveryd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "deliveryd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/cotalgo/cotal/deliveryd").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// child is a deliveryd process.
type child struct {
	cmd    *exec.Cmd
	stderr *testkit.SyncBuffer
	exited chan struct{}
	err    error // the Wait result, once exited is closed
}

// spawn runs `deliveryd serve --config` for cfg as a child process, killed at the end of the
// test if still running.
func spawn(t *testing.T, bin string, cfg *config.Config, env ...string) *child {
	t.Helper()
	path := filepath.Join(t.TempDir(), "deliveryd.yaml")
	if err := os.WriteFile(path, []byte(servicetest.YAML(cfg)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(bin, "serve", "--config", path), stderr: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	c.cmd.Env = append(append(os.Environ(), "NOTIFY_SOCKET="), env...)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("%s stderr:\n%s", cfg.Holder, c.stderr)
		}
	})
	return c
}

// exitCode waits for the child to exit and returns its code.
func (c *child) exitCode(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(within):
		t.Fatalf("child still running after %v:\n%s", within, c.stderr)
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		t.Fatalf("child: %v", c.err)
	}
	return 0
}

// postNumbered posts n-<from> to n-<to> as alice, in order.
func postNumbered(t *testing.T, e *plane3test.Env, ajs jetstream.JetStream, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		e.Post(t, ajs, "alice", fmt.Sprintf("n-%d", i), fmt.Sprint("number ", i))
	}
}

// allReceived is, for eventually, whether every member (a receiver of the ids it got, in order)
// got exactly want.
func allReceived[M interface{ IDs() []string }](members map[string]M, want []string) func() error {
	return func() error {
		for name, m := range members {
			if err := servicetest.Exactly(m.IDs(), want); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	}
}

func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFailover runs the deliveryd binary as a child process: (b) a second deliveryd for the space
// exits 1 naming the holder; (c) after kill -9 of the first, a successor takes over once the
// lease TTL has passed, and a numbered sequence posted before the kill, between the kill and
// the successor, and after it reaches each durable member exactly once.
func TestFailover(t *testing.T) {
	bin := buildDeliveryd(t)
	e := plane3test.New(t)
	pjs := e.Provisioner(t)
	servicetest.ShortenLease(t, e, pjs, leaseTTL)
	e.AddLifecycle(t, pjs, "bob", uidBob, []string{"general"})
	e.AddLifecycle(t, pjs, "carol", uidCarol, []string{"general"})
	djs := plane3test.JS(t, e.Delivery(t))
	e.Join(t, djs, "general", "bob", uidBob, 0, 1)
	e.Join(t, djs, "general", "carol", uidCarol, 0, 1)
	kv := servicetest.DeliveryKV(t, e)

	first := spawn(t, bin, servicetest.Config(t, e, "deliveryd-first"))
	row := servicetest.WaitReady(t, kv, "deliveryd-first", 15*time.Second)

	bob, carol := plane3test.Receive(t, e, "bob", uidBob), plane3test.Receive(t, e, "carol", uidCarol)
	ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
	members := map[string]*plane3test.Inbox{"bob": bob, "carol": carol}
	postNumbered(t, e, ajs, 1, 10)
	eventually(t, 10*time.Second, allReceived(members, servicetest.Seq("n", 1, 10)))

	// (b) A second instance exits 1 naming the holder; the first keeps its row.
	second := spawn(t, bin, servicetest.Config(t, e, "deliveryd-second"))
	if code := second.exitCode(t, 20*time.Second); code != 1 {
		t.Fatalf("second deliveryd exited %d, want 1:\n%s", code, second.stderr)
	}
	if out := second.stderr.String(); !strings.Contains(out, `"deliveryd-first" holds its delivery lease`) {
		t.Fatalf("second deliveryd's message does not name the holder:\n%s", out)
	}
	if now, _, err := servicetest.LeaseRow(context.Background(), kv); err != nil || now.Incarnation != row.Incarnation || !now.Ready {
		t.Fatalf("lease row after the refused second = %+v, %v; want the first's", now, err)
	}

	// (c) kill -9 the first; post while no deliveryd runs; a successor takes over.
	if err := first.cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	first.exitCode(t, 10*time.Second)
	postNumbered(t, e, ajs, 11, 20)
	var succ *service.Service
	var refusals int
	eventually(t, 4*leaseTTL, func() error {
		s, err := service.Start(plane3test.Ctx(t), service.Inputs{Config: servicetest.Config(t, e, "deliveryd-successor")},
			service.RuntimeOptions{Getenv: func(string) string { return "" }})
		var se *service.StartError
		if errors.As(err, &se) && se.Code == service.CodeLeaseHeld {
			if se.Details["holder"] != "deliveryd-first" {
				t.Fatalf("successor refused naming %q, want the killed deliveryd-first", se.Details["holder"])
			}
			refusals++
			return err
		}
		if err != nil {
			t.Fatalf("successor: %v", err)
		}
		succ = s
		return nil
	})
	t.Cleanup(func() { _ = succ.Close(context.Background()) })
	if refusals == 0 {
		t.Fatal("the successor started at once: the killed instance's lease did not hold")
	}
	postNumbered(t, e, ajs, 21, 30)
	want := servicetest.Seq("n", 1, 30)
	eventually(t, 15*time.Second, allReceived(members, want))
	for actor, uid := range map[string]string{"bob": uidBob, "carol": uidCarol} {
		if n := servicetest.DLVCount(t, e, pjs, actor, uid); n != uint64(len(want)) {
			t.Errorf("DLV holds %d messages for %s, want %d", n, actor, len(want))
		}
	}
	now, _, err := servicetest.LeaseRow(context.Background(), kv)
	if err != nil || now.Holder != "deliveryd-successor" || !now.Ready {
		t.Fatalf("lease row after the failover = %+v, %v", now, err)
	}
}

// TestSIGTERMReleases: `deliveryd serve` stops on SIGTERM with exit 0 and deletes its own lease
// row, so a successor starts at once.
func TestSIGTERMReleases(t *testing.T) {
	bin := buildDeliveryd(t)
	e := plane3test.New(t)
	kv := servicetest.DeliveryKV(t, e)
	c := spawn(t, bin, servicetest.Config(t, e, "deliveryd-term"))
	servicetest.WaitReady(t, kv, "deliveryd-term", 15*time.Second)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := c.exitCode(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, c.stderr)
	}
	if _, _, err := servicetest.LeaseRow(context.Background(), kv); !errors.Is(err, servicetest.ErrNoRow) {
		t.Fatalf("lease row after SIGTERM: %v; want none", err)
	}
	if out := c.stderr.String(); !strings.Contains(out, "delivery lease released") || strings.Contains(out, "eyJ") {
		t.Fatalf("stderr:\n%s", out)
	}
}

// TestBrokerGoneExits: with the broker stopped, `deliveryd serve` exits 1 once the window set by
// COTAL_DELIVERY_BROKER_GONE_MS has passed, saying why.
func TestBrokerGoneExits(t *testing.T) {
	bin := buildDeliveryd(t)
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	ns := s.StartBrokerServer(t)
	e := plane3test.On(t, s, ns.ClientURL())
	c := spawn(t, bin, servicetest.Config(t, e, "deliveryd-gone"), watchdog.EnvWindow+"=700")
	servicetest.WaitReady(t, servicetest.DeliveryKV(t, e), "deliveryd-gone", 15*time.Second)
	ns.Shutdown()
	if code := c.exitCode(t, 15*time.Second); code != 1 {
		t.Fatalf("exit %d with the broker gone, want 1:\n%s", code, c.stderr)
	}
	if out := c.stderr.String(); !strings.Contains(out, "deliveryd: watchdog: broker gone: no broker for") || !strings.Contains(out, "the window is 700ms") {
		t.Fatalf("stderr does not say the broker is gone after the 700ms window:\n%s", out)
	}
}
