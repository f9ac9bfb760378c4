package service_test

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// reclaimTTL is the plane TTL of the reclaim tests: long enough that a start within half of it
// can only be a reclaim, never an expiry.
const reclaimTTL = 60 * time.Second

// deadBroker is a loopback nats:// URL on which nothing listens.
func deadBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return "nats://" + addr
}

// instanceOf reads the instance id of a state directory's instance.json.
func instanceOf(t *testing.T, stateDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, service.InstanceFileName))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		InstanceID string `json:"instance_id"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.InstanceID == "" {
		t.Fatalf("instance.json %s: %v", b, err)
	}
	return rec.InstanceID
}

// planeHeld asserts err is a PLANE_HELD refusal wrapping want.
func planeHeld(t *testing.T, err, want error) *service.StartError {
	t.Helper()
	var se *service.StartError
	if !errors.As(err, &se) || se.Code != service.CodePlaneHeld || !errors.Is(err, want) {
		t.Fatalf("Start = %v; want PLANE_HELD wrapping %v", err, want)
	}
	return se
}

// TestPlaneReclaim: a held plane claim is taken before its TTL only after a conclusive sweep
// shows the holder's connection gone: never while the holder (a real authd process) is
// connected, never on an inconclusive sweep, and well before the TTL once it was killed.
func TestPlaneReclaim(t *testing.T) {
	e := newEnv(t)
	cfgA := e.config(t)
	cfgA.PlaneTTL = yamlx.Duration(reclaimTTL)
	a := startChild(t, cfgA)
	if _, err := service.Ready(readyCtx(t), cfgA.StateDir, a.cmd.Process.Pid); err != nil {
		t.Fatalf("holder not ready: %v\n%s", err, a.stderr.String())
	}
	held, ok := e.planeRow(t)
	if !ok || held["instance"] != instanceOf(t, cfgA.StateDir) || held["conn"] != "authd-plane" || !strings.HasPrefix(held["user"].(string), "U") {
		t.Fatalf("holder's row %v: want its instance id, user key and connection name", held)
	}
	second := func() *config.Config {
		c := e.config(t)
		c.PlaneTTL = yamlx.Duration(reclaimTTL)
		return c
	}
	rowIntact := func(t *testing.T) {
		t.Helper()
		row, ok := e.planeRow(t)
		if !ok || row["incarnation"] != held["incarnation"] {
			t.Fatalf("the holder's row was touched: %v", row)
		}
	}

	t.Run("fail/holder-still-connected", func(t *testing.T) {
		cfg := second()
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		se := planeHeld(t, err, service.ErrHolderLive)
		if se.Details["instance"] != held["instance"] || !strings.Contains(se.Reason, "stop it first") || !strings.Contains(err.Error(), `"authd-plane"`) {
			t.Fatalf("refusal %q (details %v): want the live holder named", err, se.Details)
		}
		rowIntact(t)
		if _, err := service.Ready(readyCtx(t), cfgA.StateDir, a.cmd.Process.Pid); err != nil {
			t.Fatalf("holder no longer ready: %v", err)
		}
	})

	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.exitCode(t)
	killed := time.Now()

	t.Run("fail/inconclusive-sweep-a-server-missing", func(t *testing.T) {
		// The holder is gone, but a configured server does not answer: the sweep proves
		// nothing, so the claim is not taken. Until the broker has seen the holder's connection
		// close the refusal is ErrHolderLive; either way it is never a start.
		cfg := second()
		cfg.Brokers = []string{e.url, deadBroker(t)}
		var err error
		testkit.Eventually(t, 20*time.Second, func() error {
			var s *service.Service
			s, err = service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
			if err == nil {
				closeNow(s)
				t.Fatal("reclaimed on an inconclusive sweep")
			}
			if errors.Is(err, service.ErrSweepInconclusive) {
				return nil
			}
			return err
		})
		se := planeHeld(t, err, service.ErrSweepInconclusive)
		if !strings.Contains(err.Error(), "1 of the 2 servers") || strings.Contains(err.Error(), "stop") || !strings.Contains(se.Reason, "fail-safe") {
			t.Fatalf("refusal %q: want a fail-safe inconclusive refusal naming the missing server", err)
		}
		rowIntact(t)
	})

	t.Run("ok/holder-gone-reclaimed-before-the-ttl", func(t *testing.T) {
		cfg := second()
		var s *service.Service
		testkit.Eventually(t, reclaimTTL/2, func() error {
			var err error
			s, err = service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
			return err
		})
		closeAtEnd(t, s)
		took := time.Since(killed)
		t.Logf("reclaimed %v after the holder was killed (TTL %v)", took.Round(time.Millisecond), reclaimTTL)
		if took >= reclaimTTL/2 {
			t.Fatalf("reclaim took %v, not well before the TTL %v", took, reclaimTTL)
		}
		row, ok := e.planeRow(t)
		if !ok || row["instance"] != s.InstanceID() || row["incarnation"] == held["incarnation"] || row["ready"] != true {
			t.Fatalf("row after the reclaim %v: want the successor's, ready", row)
		}
		if _, err := service.Ready(readyCtx(t), cfg.StateDir, os.Getpid()); err != nil {
			t.Fatalf("successor not ready: %v", err)
		}
		closeNow(s)
	})

	t.Run("fail/row-names-no-connection", func(t *testing.T) {
		// A row without a user key (an authd from before instance identities) cannot be swept.
		nc, _, bucket := e.planeConn(t)
		old, err := lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: bucket, Key: "plane", Holder: "authd old", KeyTTL: reclaimTTL})
		if err != nil {
			t.Fatal(err)
		}
		_, err = service.Start(ctxT(t), service.Inputs{Config: second()}, service.RuntimeOptions{})
		planeHeld(t, err, service.ErrSweepInconclusive)
		if row, ok := e.planeRow(t); !ok || row["incarnation"] != old.Row().Incarnation {
			t.Fatalf("the old row was touched: %v", row)
		}
	})
}

// TestInstanceIdentity: instance.json holds a stable id made on the first start, is read back
// with its mode and content checked, and a divergent identity is refused with both records left
// as they are.
func TestInstanceIdentity(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	path := filepath.Join(cfg.StateDir, service.InstanceFileName)
	s := start(t, cfg)
	id := s.InstanceID()
	closeNow(s)
	refused := func(t *testing.T, c *config.Config, want ...string) {
		t.Helper()
		before, _ := os.ReadFile(path)
		beforeFI, _ := os.Stat(path)
		_, err := service.Start(ctxT(t), service.Inputs{Config: c}, service.RuntimeOptions{})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeIdentity || !strings.Contains(err.Error(), path) {
			t.Fatalf("Start = %v; want IDENTITY naming %s", err, path)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Start = %v; want it to say %q", err, w)
			}
		}
		after, _ := os.ReadFile(path)
		afterFI, _ := os.Stat(path)
		if string(after) != string(before) || afterFI.Mode() != beforeFI.Mode() {
			t.Fatalf("instance.json changed by a refused start: %q %v -> %q %v", before, beforeFI.Mode(), after, afterFI.Mode())
		}
	}

	t.Run("ok/stable-across-restarts", func(t *testing.T) {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 || len(id) != 32 || instanceOf(t, cfg.StateDir) != id {
			t.Fatalf("instance.json %v %v, id %q", fi, err, id)
		}
		s := start(t, cfg)
		if s.InstanceID() != id {
			t.Fatalf("id after a restart %q, want %q", s.InstanceID(), id)
		}
		if row, ok := e.planeRow(t); !ok || row["instance"] != id {
			t.Fatalf("row %v: want instance %s", row, id)
		}
		closeNow(s)
		other := start(t, e.config(t))
		if other.InstanceID() == id {
			t.Fatal("another state directory has the same instance id")
		}
		closeNow(other)
	})
	t.Run("ok/pinned-id-on-first-start", func(t *testing.T) {
		c := e.config(t)
		c.InstanceID = strings.Repeat("ab", 16)
		s := start(t, c)
		if s.InstanceID() != c.InstanceID || instanceOf(t, c.StateDir) != c.InstanceID {
			t.Fatalf("pinned id %s, got %s", c.InstanceID, s.InstanceID())
		}
		closeNow(s)
	})
	t.Run("fail/divergent-pinned-id", func(t *testing.T) {
		c := *cfg
		c.InstanceID = strings.Repeat("cd", 16)
		refused(t, &c, "divergent", id, c.InstanceID)
	})
	t.Run("fail/looser-mode", func(t *testing.T) {
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		c := *cfg
		refused(t, &c)
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, content, want string }{
		{"fail/malformed", `{"ver":1,"instance_id":"` + id + `"`, "malformed"},
		{"fail/unknown-field", strings.Replace(string(good), `"ver":1`, `"ver":1,"seed":"x"`, 1), "malformed"},
		{"fail/bad-id", strings.Replace(string(good), id, "not-an-id", 1), "malformed"},
		{"fail/other-space", strings.Replace(string(good), `"space":"alpha"`, `"space":"beta"`, 1), "divergent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.content == string(good) {
				t.Fatal("test case changed nothing")
			}
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			c := *cfg
			refused(t, &c, tc.want)
		})
	}
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	s = start(t, cfg)
	if s.InstanceID() != id {
		t.Fatalf("id after the refusals %q, want %q", s.InstanceID(), id)
	}
}

// TestPlaneReconnect: the broker drops the holder's plane connection; it reconnects, and the
// holder proves its claim again at once (a renewal well before its renew interval) before its
// callout answers again, so a successor that swept while it was away and took the claim would
// find it silent (planeGate).
func TestPlaneReconnect(t *testing.T) {
	e := newEnv(t)
	h := newHumanEnv(t, e, true, func(c *config.Config) *config.Config { c.PlaneTTL = yamlx.Duration(reclaimTTL); return c })
	c := h.client(t, 0)
	if _, err := h.connect(t, c); err != nil {
		t.Fatalf("connect before the drop: %v", err)
	}
	_, kv, _ := e.planeConn(t)
	before, err := kv.Get(ctxT(t), "plane")
	if err != nil {
		t.Fatal(err)
	}
	row, _ := e.planeRow(t)
	cz, err := e.ns.Connz(&server.ConnzOptions{User: row["user"].(string)})
	if err != nil {
		t.Fatal(err)
	}
	var cid uint64
	for _, ci := range cz.Conns {
		if ci.Name == "authd-plane" {
			cid = ci.Cid
		}
	}
	if cid == 0 {
		t.Fatalf("no authd-plane connection of the row's user key among %d", len(cz.Conns))
	}
	dropped := time.Now()
	if err := e.ns.DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, reclaimTTL/4, func() error {
		now, err := kv.Get(ctxT(t), "plane")
		if err != nil {
			return err
		}
		if now.Revision() == before.Revision() {
			return errors.New("plane row not rewritten since the drop")
		}
		return nil
	})
	t.Logf("claim re-proven %v after the drop (renew interval %v)", time.Since(dropped).Round(time.Millisecond), reclaimTTL/2)
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := h.connect(t, c)
		return err
	})
	select {
	case <-h.s.Done():
		t.Fatalf("authd stopped: %v", h.s.Err())
	default:
	}
}
