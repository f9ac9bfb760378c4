package service_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
)

// dirFiles lists every path under dir (nil if dir does not exist).
func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

// TestSelectionOptionRefusedBeforeEffects: an unknown InteractiveManagerSelection, or
// local-primary without a local manager reader, refuses Start with CONFIG before any effect: no
// file in the state directory (no refusal file either), no event, no plane claim.
func TestSelectionOptionRefusedBeforeEffects(t *testing.T) {
	e := newEnv(t)
	reader := service.LocalManagerFile(filepath.Join(t.TempDir(), service.ManagerIdentityFile))
	for _, tc := range []struct {
		name   string
		policy string
		local  service.LocalManager
	}{
		{"unknown", "remote-first", reader},
		{"case", "Local-Primary", reader},
		{"local-primary-without-reader", service.SelectLocalPrimary, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.config(t)
			if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			before := dirFiles(t, cfg.StateDir)
			var ev events
			_, err := service.Start(ctxT(t), service.Inputs{Config: cfg, LocalManager: tc.local},
				service.RuntimeOptions{InteractiveManagerSelection: tc.policy, Events: ev.on})
			var se *service.StartError
			if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), "interactive manager selection") {
				t.Fatalf("Start = %v, want a CONFIG refusal of the selection", err)
			}
			if after := dirFiles(t, cfg.StateDir); !slices.Equal(after, before) {
				t.Fatalf("state dir %v after the refusal, want %v", after, before)
			}
			ev.mu.Lock()
			n := len(ev.all)
			ev.mu.Unlock()
			if n != 0 {
				t.Fatalf("%d events, want none", n)
			}
			if row, ok := e.planeRow(t); ok {
				t.Fatalf("a refused start left a plane row: %v", row)
			}
		})
	}
}

// TestHooks: OnReady once Start returns, OnStopping once when the service stops, in that order;
// no hook, no call (the hosted composition).
func TestHooks(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var calls []string
	hook := func(name string) func() {
		return func() { mu.Lock(); calls = append(calls, name); mu.Unlock() }
	}
	got := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(calls) }
	s := startWith(t, service.Inputs{Config: e.config(t)}, service.RuntimeOptions{Hooks: service.Hooks{OnReady: hook("ready"), OnStopping: hook("stopping")}})
	if c := got(); !slices.Equal(c, []string{"ready"}) {
		t.Fatalf("hooks after Start: %v, want [ready]", c)
	}
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	_ = s.Close(ctxT(t))
	if c := got(); !slices.Equal(c, []string{"ready", "stopping"}) {
		t.Fatalf("hooks after Close: %v, want [ready stopping]", c)
	}
}

// TestHooksPanic: OnReady and OnStopping that panic are recovered: authd serves after Start,
// each panic is a HOOK warning with its text, and Close still stops it.
func TestHooksPanic(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var warned []string
	events := func(ev service.Event) {
		var rj *daemon.Rejection
		if ev.Kind == service.EventWarning && ev.Code == service.CodeHook && errors.As(ev.Err, &rj) {
			mu.Lock()
			warned = append(warned, rj.Error())
			mu.Unlock()
		}
	}
	got := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(warned) }
	s := startWith(t, service.Inputs{Config: e.config(t)}, service.RuntimeOptions{Events: events, Hooks: service.Hooks{
		OnReady:    func() { panic("ready hook broke") },
		OnStopping: func() { panic(nil) },
	}})
	if s.State() != service.StateReady {
		t.Fatalf("state %s after a panicking OnReady", s.State())
	}
	if w := got(); !slices.Equal(w, []string{"the OnReady hook panicked: ready hook broke"}) {
		t.Fatalf("HOOK warnings after Start: %q", w)
	}
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatalf("Close after a panicking OnStopping: %v", err)
	}
	if s.State() != service.StateStopped {
		t.Fatalf("state %s after Close", s.State())
	}
	if w := got(); !slices.Equal(w, []string{"the OnReady hook panicked: ready hook broke", "the OnStopping hook panicked: nil"}) {
		t.Fatalf("HOOK warnings after Close: %q", w)
	}
}

// exchangeManager posts a human manager-caller exchange to h's authd.
func (h *human) exchangeManager(t *testing.T) (int, map[string]string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"idpToken": h.idp.Token(t, h.idp.Claims(idpSub, time.Now(), time.Hour), nil), "actor": "alice", "view": "manager-caller"})
	req, err := http.NewRequest(http.MethodPost, h.s.URL()+"/exchange", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.cap)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestLocalPrimaryWired: Start hands the policy and Inputs.LocalManager to the exchange: with no
// manager-identity.json, an unpinned human manager-caller exchange is refused as "no local
// manager" (404) without reading the store. (The live rows are exercised in the authority and
// exchange packages; reading them with authd's own credential needs the auth-plane profile's
// MSG.GET and STREAM.INFO grants.)
func TestLocalPrimaryWired(t *testing.T) {
	p := filepath.Join(t.TempDir(), service.ManagerIdentityFile)
	h := newHumanWith(t, newEnv(t), true, nil, func(in *service.Inputs, o *service.RuntimeOptions) {
		in.LocalManager = service.LocalManagerFile(p)
		o.InteractiveManagerSelection = service.SelectLocalPrimary
	})
	status, body := h.exchangeManager(t)
	if status != http.StatusNotFound || !strings.Contains(body["error"], "no local manager") {
		t.Fatalf("exchange = %d %v, want 404 no local manager", status, body)
	}
	if err := os.WriteFile(p, []byte(`{"v":1,"space":"`+sp+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if status, body = h.exchangeManager(t); status != http.StatusServiceUnavailable || !strings.Contains(body["error"], "unreadable") {
		t.Fatalf("exchange = %d %v, want 503 unreadable", status, body)
	}
}

// TestRemoteFirstWired: by default an unpinned human manager-caller exchange runs remote-first:
// authd lists the space's manager gates (STREAM.INFO, which the auth-plane credential may send)
// and, with none and no local manager, refuses it as "no manager instance" (404).
func TestRemoteFirstWired(t *testing.T) {
	h := newHuman(t)
	status, body := h.exchangeManager(t)
	if status != http.StatusNotFound || !strings.Contains(body["error"], "no manager instance is registered") {
		t.Fatalf("exchange = %d %v, want 404 no manager instance", status, body)
	}
}
