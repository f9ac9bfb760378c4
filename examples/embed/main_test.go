package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	authd "github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const sp = "demo"

// rig is a provisioned space on a real signerd and broker, and the three configuration files.
type rig struct {
	opts    options
	account string // the space's data account
	dirs    map[string]string
	api     string // managerd's API socket
}

func newRig(t *testing.T) *rig {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{sp}})
	url := s.StartBroker(t)
	mc, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindManagerd, sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := provision.Run(ctx, provision.Config{Signer: mc, Space: sp, NatsURL: url}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	_, spaces := s.Trust(t)
	dir := t.TempDir()
	r := &rig{account: spaces[0].DataAccountPublicKey(), dirs: map[string]string{}}
	q := strconv.Quote
	signer := func(kind string) string {
		f := s.ClientFor(t, kind, sp)
		return fmt.Sprintf("signer: {address: %s, ca: %s, cert: %s, key: %s}\n", q(s.Addr), q(f.ServerCAFile), q(f.CertFile), q(f.KeyFile))
	}
	for _, d := range []string{"authd", "deliveryd", "managerd"} {
		r.dirs[d] = filepath.Join(dir, d, "state")
	}
	r.api = filepath.Join(dir, "managerd", "api", "manager.sock")
	if err := os.MkdirAll(filepath.Dir(r.api), 0o700); err != nil { // the host makes the socket's directory
		t.Fatal(err)
	}
	files := map[string]string{
		"authd": "space: demo\nbrokers: [" + q(url) + "]\n" + signer(mtls.KindAuthd) +
			"callout_seed: " + q(filepath.Join(s.Dir, "authd", space.Segment(sp), "callout.nk")) + "\n" +
			"state_dir: " + q(r.dirs["authd"]) + "\n",
		"deliveryd": "space: demo\nbrokers: [" + q(url) + "]\n" + signer(mtls.KindDeliveryd) +
			"state_dir: " + q(r.dirs["deliveryd"]) + "\nholder: embedded\n",
		"managerd": "space: demo\nbrokers: [" + q(url) + "]\n" + signer(mtls.KindManagerd) +
			"state_dir: " + q(r.dirs["managerd"]) + "\ninstance_id: inst0aaaaaaaaaaaaaaaaaaaaaaa\n" +
			"root: " + q(filepath.Join(dir, "managerd", "root")) + "\nowner: m1\nactor: s1\nagent_owner: demo\n" +
			"launcher: {socket: " + q(filepath.Join(dir, "l", "launcher.sock")) + ", token_file: " + q(filepath.Join(dir, "t", "token")) + "}\n" +
			"api: {socket: " + q(r.api) + ", allow_uids: [" + strconv.Itoa(os.Getuid()) + "]}\n" +
			"connectors: [echo]\ncapacity: 2\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		switch name {
		case "authd":
			r.opts.authd = p
		case "deliveryd":
			r.opts.deliveryd = p
		case "managerd":
			r.opts.managerd = p
		}
	}
	return r
}

// result is what one run of the example left.
type result struct {
	err error
	out string
	h   running
	// checked is what up saw while the three served.
	checked error
}

// runExample runs the example until check returns, then stops it as SIGTERM would (ctx ends).
func runExample(t *testing.T, o options, check func(running) error) result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuf
	var res result
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, o, &out, func(h running) {
			res.h = h
			res.checked = check(h)
			cancel()
		})
	}()
	select {
	case res.err = <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the example did not return within 90 s:\n%s", out.String())
	}
	res.out = out.String()
	return res
}

func TestEmbed(t *testing.T) {
	r := newRig(t)

	t.Run("ok/cli-path: all three serve in one process, then stop cleanly", func(t *testing.T) {
		res := runExample(t, r.opts, func(h running) error {
			if !h.Auth.Ready() || !h.Delivery.Ready() || !h.Manager.Ready() {
				return fmt.Errorf("states authd %s, deliveryd %s, managerd %s; want ready", h.Auth.State(), h.Delivery.State(), h.Manager.State())
			}
			if err := health(h.Auth.URL()); err != nil {
				return err
			}
			for _, f := range []string{filepath.Join(r.dirs["authd"], "auth-service.json"), filepath.Join(r.dirs["deliveryd"], "delivery-service.json")} {
				if _, err := os.Stat(f); err != nil {
					return fmt.Errorf("the CLI path's file: %w", err)
				}
			}
			return managerStatus(r.api)
		})
		if res.err != nil || res.checked != nil {
			t.Fatalf("run: %v; while serving: %v\n%s", res.err, res.checked, res.out)
		}
		t.Logf("%s", res.out)
		for name, st := range map[string]daemon.State{"authd": res.h.Auth.State(), "deliveryd": res.h.Delivery.State(), "managerd": res.h.Manager.State()} {
			if st != daemon.StateStopped {
				t.Errorf("%s is %s after the run, want stopped", name, st)
			}
		}
		if !strings.Contains(res.out, "embedded: authd ready on http://127.0.0.1:") {
			t.Errorf("output lacks the embedded line:\n%s", res.out)
		}
		if regexp.MustCompile(`SU[A-Z2-7]{50,}|eyJ[A-Za-z0-9_-]{20,}|` + regexp.QuoteMeta(res.h.Auth.Cap())).MatchString(res.out) {
			t.Errorf("output carries a seed, a JWT or the cap:\n%s", res.out)
		}
		if _, err := os.Stat(filepath.Join(r.dirs["authd"], "auth-service.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("auth-service.json after close: %v, want it removed", err)
		}
	})

	t.Run("ok/hosted: the assigned account, no file written", func(t *testing.T) {
		clearFiles(t, r)
		o := r.opts
		o.account, o.lifecycle, o.store = r.account, "lcembedaaaaaaaaaaaaaaaaaaa", "store:embed/1"
		res := runExample(t, o, func(h running) error {
			if !h.Auth.Ready() || !h.Delivery.Ready() {
				return fmt.Errorf("hosted states authd %s, deliveryd %s; want ready", h.Auth.State(), h.Delivery.State())
			}
			for _, f := range []string{"auth-service.json", "auth-service-refusal.json"} {
				if _, err := os.Stat(filepath.Join(r.dirs["authd"], f)); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("hosted authd wrote %s (%v)", f, err)
				}
			}
			if _, err := os.Stat(filepath.Join(r.dirs["deliveryd"], "delivery-service.json")); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("hosted deliveryd wrote delivery-service.json (%v)", err)
			}
			return health(h.Auth.URL())
		})
		if res.err != nil || res.checked != nil {
			t.Fatalf("run: %v; while serving: %v\n%s", res.err, res.checked, res.out)
		}
	})

	t.Run("fail/hosted for another account: nothing starts, nothing is left", func(t *testing.T) {
		clearFiles(t, r)
		other, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		o := r.opts
		o.account, _ = other.PublicKey()
		o.lifecycle, o.store = "lcembedaaaaaaaaaaaaaaaaaaa", "store:embed/1"
		res := runExample(t, o, func(running) error { return errors.New("started for a foreign account") })
		var se *daemon.StartError
		if !errors.As(res.err, &se) || se.Code != authd.CodeAccount || !strings.HasPrefix(res.err.Error(), "authd: ") {
			t.Fatalf("run = %v, want authd's *StartError with code %s\n%s", res.err, authd.CodeAccount, res.out)
		}
		if res.h.Auth != nil {
			t.Fatal("up was called")
		}
		for _, f := range []string{filepath.Join(r.dirs["authd"], "auth-service.json"), filepath.Join(r.dirs["authd"], "auth-service-refusal.json")} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after a hosted refusal: %v, want none", f, err)
			}
		}
		// Nothing was held: the CLI path starts at once, with no PLANE_HELD or LEASE_HELD.
		res = runExample(t, r.opts, func(h running) error { return nil })
		if res.err != nil {
			t.Fatalf("a start after the refusal: %v\n%s", res.err, res.out)
		}
	})
}

// clearFiles removes what an earlier subtest's CLI run left (refusal files), so each subtest
// reads only its own.
func clearFiles(t *testing.T, r *rig) {
	t.Helper()
	for _, d := range []string{"authd", "deliveryd"} {
		for _, f := range []string{"auth-service.json", "auth-service-refusal.json", "delivery-service.json", "delivery-service-refusal.json"} {
			if err := os.Remove(filepath.Join(r.dirs[d], f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
}

// health asks the exchange face's /health.
func health(url string) error {
	resp, err := http.Get(url + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `{"ok":true}` {
		return fmt.Errorf("/health = %d %q", resp.StatusCode, b)
	}
	return nil
}

// managerStatus asks the embedded manager's ManagerService for its status.
func managerStatus(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, closer, err := managerclient.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer closer.Close()
	st, err := c.Status(ctx, &managerv1.StatusRequest{})
	if err != nil {
		return err
	}
	if st.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD {
		return fmt.Errorf("manager lease %s, want held", st.GetLease())
	}
	return nil
}

// TestNoSignerdDeps: the embedding links no signerd package: a host that embeds the three
// daemons holds no signing seed.
func TestNoSignerdDeps(t *testing.T) {
	testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/examples/embed"}, "github.com/cotalgo/cotal/deliveryd/service", "github.com/cotalgo/cotal/signerd")
}

// syncBuf is a bytes.Buffer safe for the three daemons' events.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
