package service_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/managerd/manager"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// adminHook is a host RemoteAuthority with an authorizeAdmin hook whose answer the test sets; it
// records the callers it was asked about.
type adminHook struct {
	manager.RemoteAuthority
	mu      sync.Mutex
	answer  func() (bool, error)
	callers []manager.AdminCaller
}

func (h *adminHook) AuthorizeAdmin(_ context.Context, c manager.AdminCaller) (bool, error) {
	h.mu.Lock()
	h.callers = append(h.callers, c)
	answer := h.answer
	h.mu.Unlock()
	return answer()
}

func (h *adminHook) set(answer func() (bool, error)) {
	h.mu.Lock()
	h.answer = answer
	h.mu.Unlock()
}

func (h *adminHook) last() (manager.AdminCaller, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.callers) == 0 {
		return manager.AdminCaller{}, 0
	}
	return h.callers[len(h.callers)-1], len(h.callers)
}

// TestRemoteManagerdAdmin is issue 25 item 6's "AuthorizeAdmin fails closed": a remote managerd
// admits its administrative RPC (Shutdown) only when its RemoteAuthority's authorizeAdmin hook
// answers true for the caller (the manager's owner and the socket peer). The stock authority has
// no hook: PERMISSION_DENIED naming it. A hook that answers false, errs or panics refuses too (a
// panic is a HOOK warning); after each refusal the manager still serves. A true lets the
// shutdown run.
func TestRemoteManagerdAdmin(t *testing.T) {
	r := newRemoteRig(t)
	refused := func(t *testing.T, c managerv1.ManagerServiceClient, mgr *manager.Manager, want string) {
		t.Helper()
		_, err := c.Shutdown(ctxT(t), &managerv1.ShutdownRequest{WithAgents: true})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("shutdown = %v, want PERMISSION_DENIED containing %q", err, want)
		}
		st, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
		if err != nil || st == nil {
			t.Fatalf("status after the refusal: %v", err)
		}
		select {
		case <-mgr.Done():
			t.Fatal("the manager stopped after a refused shutdown")
		default:
		}
	}

	t.Run("fail/the stock authority has no hook: Shutdown is refused", func(t *testing.T) {
		cfg := r.config()
		mgr := r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: newHostLauncher(t)}, &testkit.SyncBuffer{})
		refused(t, r.client(t, cfg), mgr, manager.MsgAdminUnavailable)
	})

	var hook *adminHook
	warned := &hookWarnings{}
	mlogs := &testkit.SyncBuffer{}
	cfg, mgr := r.secondManagerd(t, "-h", func(s *manager.HTTPAuthority) manager.RemoteAuthority {
		hook = &adminHook{RemoteAuthority: s}
		return hook
	}, manager.RuntimeOptions{Launcher: newHostLauncher(t), Events: warned.events}, mlogs)
	c := r.client(t, cfg)

	t.Run("fail/the hook answers false", func(t *testing.T) {
		hook.set(func() (bool, error) { return false, nil })
		refused(t, c, mgr, "does not authorize this caller")
		caller, n := hook.last()
		if n != 1 || caller.Owner != cfg.Owner || caller.Operation != "Shutdown" || !caller.PeerKnown || caller.PeerUID != uint32(os.Getuid()) || caller.PeerPID != int32(os.Getpid()) {
			t.Fatalf("the hook was asked %d times, last about %+v; want once, owner %s, Shutdown, this process's uid %d and pid", n, caller, cfg.Owner, os.Getuid())
		}
	})

	t.Run("fail/the hook errs", func(t *testing.T) {
		hook.set(func() (bool, error) { return true, errors.New("authority unavailable") })
		refused(t, c, mgr, "could not authorize the caller: authority unavailable")
	})

	t.Run("fail/the hook panics: a HOOK warning, a refusal, and the manager serves on", func(t *testing.T) {
		hook.set(func() (bool, error) { panic("boom") })
		refused(t, c, mgr, "could not authorize the caller")
		if got := strings.Join(warned.list(), ","); got != "the remote authority's AuthorizeAdmin" {
			t.Fatalf("HOOK warnings %q, want one for AuthorizeAdmin", got)
		}
		if !strings.Contains(mlogs.String(), `"hook":"the remote authority's AuthorizeAdmin","panicked":true`) {
			t.Fatalf("the panic was not logged as a rejection:\n%s", mlogs.String())
		}
	})

	t.Run("ok/the hook answers true: the shutdown runs", func(t *testing.T) {
		hook.set(func() (bool, error) { return true, nil })
		resp, err := c.Shutdown(ctxT(t), &managerv1.ShutdownRequest{WithAgents: true})
		if err != nil || resp == nil {
			t.Fatalf("shutdown = %v, want it admitted", err)
		}
		select {
		case <-mgr.Done():
		case <-ctxT(t).Done():
			t.Fatal("the manager did not stop after an authorized shutdown")
		}
		if _, n := hook.last(); n != 4 {
			t.Fatalf("the hook was asked %d times, want 4", n)
		}
	})
}

// TestRemoteManagerdRetained is issue 25 item 6's "ValidateRetainedAgent fails closed": a remote
// managerd that finds a predecessor's agent still running at start (the predecessor closed
// sparing it, leaving its custody record) does not adopt it: it logs the refusal, stops the
// process, and retires its lifecycle (head retired, the name free: a new spawn gets a new uid).
func TestRemoteManagerdRetained(t *testing.T) {
	r := newRemoteRig(t)
	h := r.h
	h.e.startDeliveryd(t)
	cfg := r.config()
	lnch := newHostLauncher(t)
	first := r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: lnch}, &testkit.SyncBuffer{})
	resp, err := r.client(t, cfg).Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "k1", Connector: "echo", Subscribe: []string{"general"}})
	if err != nil {
		t.Fatalf("spawn: %v", err)
	}
	ag := resp.GetAgent()
	activate(t, r, lnch, "k1")
	if err := first.Close(ctxT(t)); err != nil {
		t.Fatalf("close sparing the agent: %v", err)
	}
	if gone, err := lnch.child("k1").Gone(); err != nil || gone {
		t.Fatalf("the agent gone %v err %v after a close that spares it", gone, err)
	}

	t.Run("fail/the successor does not adopt the retained agent: it stops and retires it", func(t *testing.T) {
		mlogs := &testkit.SyncBuffer{}
		second := r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: lnch}, mlogs)
		if !strings.Contains(mlogs.String(), `"msg":"`+manager.MsgRetainedNotAdopted+`","agent":"k1","uid":"`+ag.GetLifecycleUid()+`"`) {
			t.Fatalf("no refusal of the adoption logged:\n%s", mlogs.String())
		}
		if gone, err := lnch.child("k1").Gone(); err != nil || !gone {
			t.Fatalf("the retained agent gone %v err %v, want stopped", gone, err)
		}
		st := h.e.lifecycleStore(t)
		deadline := time.Now().Add(20 * time.Second)
		for {
			head, _, found, err := st.Head(ctxT(t), h.owner, "k1")
			if err == nil && found && head.State == lifecycle.HeadRetired && head.LifecycleUID == ag.GetLifecycleUid() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("head %+v found %v err %v, want retired at %s\nmanagerd:\n%s", head, found, err, ag.GetLifecycleUid(), mlogs.String())
			}
			time.Sleep(50 * time.Millisecond) // polling interval
		}
		c := r.client(t, cfg)
		deadline = time.Now().Add(20 * time.Second)
		for {
			waitManagerReady(t, second)
			resp, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: "k1", Connector: "echo", Subscribe: []string{"general"}})
			if err == nil {
				if uid := resp.GetAgent().GetLifecycleUid(); uid == "" || uid == ag.GetLifecycleUid() {
					t.Fatalf("respawn uid %q, want a new one (was %s)", uid, ag.GetLifecycleUid())
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("respawn of k1: %v", err)
			}
			time.Sleep(50 * time.Millisecond) // polling interval: the name frees once the retirement is recorded
		}
	})
}
