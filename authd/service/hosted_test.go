package service_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
)

// uid is a lifecycle UID (26 to 32 characters of [a-z0-9]).
const uid = "01j9q3v6x8k2m4n5p7r9s1t3v5"

// hosted is a hosted assignment of e's space: its data account, a lifecycle uid and a store
// identity.
func (e *env) hosted(t *testing.T) *service.Hosted {
	t.Helper()
	_, spaces := e.sg.Trust(t)
	return &service.Hosted{Account: spaces[0].DataAccountPublicKey(), LifecycleUID: uid, StoreIdentity: "store:alpha/1"}
}

// stateDirFiles lists what a start left in dir (none when dir does not exist).
func stateDirFiles(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	for _, p := range []string{daemon.DiscoveryPath(dir, service.FileName), daemon.RefusalPath(dir, service.FileName)} {
		if _, err := os.Stat(p); err == nil {
			names = append(names, filepath.Base(p))
		}
	}
	return names
}

// authdConns lists the broker connections authd ever opened on e's broker (open or closed).
func (e *env) authdConns(t *testing.T) []string {
	t.Helper()
	cz, err := e.ns.Connz(&server.ConnzOptions{State: server.ConnAll})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cz.Conns {
		if strings.HasPrefix(c.Name, "authd-") {
			names = append(names, c.Name)
		}
	}
	return names
}

// TestHostedAccount (issue 22 row 2): a hosted start whose first credential (the auth-plane one)
// is not of the assigned account refuses with CodeAccount and leaves nothing behind: no plane row,
// no file, no broker connection ever opened under authd's names. The assigned account starts.
// Malformed hosted inputs are refused before anything is dialled.
func TestHostedAccount(t *testing.T) {
	e := newEnv(t)
	t.Run("fail/wrong-assigned-account", func(t *testing.T) {
		cfg := e.config(t)
		h := e.hosted(t)
		_, spaces := e.sg.Trust(t)
		h.Account = spaces[0].AuthAccountPublicKey() // an account of the same operator, not this one
		var ev events
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg, Hosted: h}, service.RuntimeOptions{Events: ev.on})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeAccount || !strings.Contains(se.Reason, h.Account) {
			t.Fatalf("Start = %v, want an ACCOUNT refusal naming %s", err, h.Account)
		}
		if row, ok := e.planeRow(t); ok {
			t.Fatalf("a refused hosted start left a plane row: %v", row)
		}
		if f := stateDirFiles(t, cfg.StateDir); len(f) != 0 {
			t.Fatalf("a refused hosted start left %v", f)
		}
		if c := e.authdConns(t); len(c) != 0 {
			t.Fatalf("a refused hosted start opened broker connections %v", c)
		}
		ev.waitStates(t, 0, "stopped/"+service.CodeAccount)
	})
	t.Run("ok/assigned-account-starts", func(t *testing.T) {
		cfg := e.config(t)
		s := startWith(t, service.Inputs{Config: cfg, Hosted: e.hosted(t)}, service.RuntimeOptions{})
		if !s.Ready() {
			t.Fatalf("state %s", s.State())
		}
		if row, ok := e.planeRow(t); !ok || row["ready"] != true {
			t.Fatalf("plane row %v", row)
		}
	})
	acct, _ := nkeys.CreateAccount()
	acctPub, _ := acct.PublicKey()
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	for _, tc := range []struct {
		name string
		h    service.Hosted
		want string
	}{
		{"fail/account-not-an-account-key", service.Hosted{Account: userPub, LifecycleUID: uid, StoreIdentity: "st"}, "account"},
		{"fail/account-empty", service.Hosted{LifecycleUID: uid, StoreIdentity: "st"}, "account"},
		{"fail/lifecycle-empty", service.Hosted{Account: acctPub, StoreIdentity: "st"}, "lifecycle uid"},
		{"fail/lifecycle-not-a-uid", service.Hosted{Account: acctPub, LifecycleUID: "lc-0001", StoreIdentity: "st"}, "lifecycle uid"},
		{"fail/store-empty", service.Hosted{Account: acctPub, LifecycleUID: uid}, "store identity"},
		{"fail/store-not-utf8", service.Hosted{Account: acctPub, LifecycleUID: uid, StoreIdentity: "st\xff"}, "store identity"},
		{"fail/store-control-byte", service.Hosted{Account: acctPub, LifecycleUID: uid, StoreIdentity: "st\n"}, "store identity"},
		{"fail/store-too-long", service.Hosted{Account: acctPub, LifecycleUID: uid, StoreIdentity: strings.Repeat("s", 257)}, "store identity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.config(t)
			_, err := service.Start(ctxT(t), service.Inputs{Config: cfg, Hosted: &tc.h}, service.RuntimeOptions{})
			var se *service.StartError
			if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want a CONFIG refusal naming the %s", err, tc.want)
			}
			if f := stateDirFiles(t, cfg.StateDir); len(f) != 0 {
				t.Fatalf("a refused hosted start left %v", f)
			}
		})
	}
}

// TestHostedNoDiscoveryFile (issue 22 row 2): a hosted auth context serves (its handle carries
// the URL and cap the file would) but writes no auth-service.json, neither at start nor when it
// closes, and a refused hosted start writes no refusal file (TestHostedAccount).
func TestHostedNoDiscoveryFile(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	s := startWith(t, service.Inputs{Config: cfg, Hosted: e.hosted(t)}, service.RuntimeOptions{})
	if f := stateDirFiles(t, cfg.StateDir); len(f) != 0 {
		t.Fatalf("a hosted context wrote %v", f)
	}
	if len(s.Cap()) != 64 || !s.Ready() {
		t.Fatalf("handle: cap of %d characters, state %s", len(s.Cap()), s.State())
	}
	resp, err := http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health = %v, %v", resp, err)
	}
	resp.Body.Close()
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if f := stateDirFiles(t, cfg.StateDir); len(f) != 0 {
		t.Fatalf("a hosted context left %v after Close", f)
	}
	if row, ok := e.planeRow(t); ok {
		t.Fatalf("plane row after Close: %v", row)
	}
}
