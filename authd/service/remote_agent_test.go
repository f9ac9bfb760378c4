package service_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/managerd/manager"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// agentBinaries is the real test agent managerd's tests spawn, built once per test binary run
// (TestMain removes it).
var agentBinaries = testkit.Binaries{Prefix: "authd-service-testagent-", Pkgs: []string{"github.com/cotalgo/cotal/managerd/internal/testagent"}}

// tenantProxy is the TLS reverse proxy a deployment runs in front of authd's public face:
// https on 127.0.0.1 with a self-signed certificate, serving the face under the tenant path
// /<tenant>/, which it strips before forwarding to the face's listen address (set once authd
// listens). It counts the exchanges it forwarded and authd answered 200.
type tenantProxy struct {
	srv       *httptest.Server
	backend   atomic.Pointer[url.URL]
	exchanged atomic.Int64
	certFile  string // the proxy's certificate, PEM
}

func newTenantProxy(t *testing.T, tenant string) *tenantProxy {
	t.Helper()
	p := &tenantProxy{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(p.backend.Load())
			pr.SetXForwarded()
		},
		// Counted before the answer is passed on, so the count is there once the client has it.
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request.Method == http.MethodPost && resp.Request.URL.Path == "/exchange" && resp.StatusCode == http.StatusOK {
				p.exchanged.Add(1)
			}
			return nil
		},
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/"+tenant+"/")
		if !ok || p.backend.Load() == nil {
			http.NotFound(w, r)
			return
		}
		r.URL.Path, r.URL.RawPath = "/"+rest, ""
		rp.ServeHTTP(w, r)
	}))
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.certFile = filepath.Join(t.TempDir(), "proxy-ca.pem")
	if err := os.WriteFile(p.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// forwardTo points the proxy at authd's public face.
func (p *tenantProxy) forwardTo(t *testing.T, base string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	p.backend.Store(u)
}

// terminal is an Attach stream on one agent and what it has shown (snapshot, then data).
type terminal struct {
	name string
	mu   sync.Mutex
	out  bytes.Buffer
	end  error // why the stream ended, once it has
}

// attachTerminal opens an Attach stream on name through managerd's API and collects its output
// until ctx ends.
func attachTerminal(t *testing.T, ctx context.Context, c managerv1.ManagerServiceClient, name string) *terminal {
	t.Helper()
	st, err := c.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: name}}}); err != nil {
		t.Fatal(err)
	}
	term := &terminal{name: name}
	first := make(chan error, 1)
	go func() {
		for n := 0; ; n++ {
			r, err := st.Recv()
			if n == 0 {
				first <- err
			}
			if err != nil {
				term.mu.Lock()
				term.end = err
				term.mu.Unlock()
				return
			}
			term.mu.Lock()
			switch f := r.Frame.(type) {
			case *managerv1.AttachResponse_Snapshot:
				term.out.Write(f.Snapshot)
			case *managerv1.AttachResponse_Data:
				term.out.Write(f.Data)
			}
			term.mu.Unlock()
		}
	}()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("attach %s: %v", name, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("attach %s: no snapshot frame within 10 s", name)
	}
	return term
}

func (term *terminal) output() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()
}

// waitFor polls until the terminal shows sub, for at most 30 s.
func (term *terminal) waitFor(t *testing.T, sub string) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(term.output(), sub) {
			term.mu.Lock()
			end := term.end
			term.mu.Unlock()
			return fmt.Errorf("%s's terminal lacks %q (stream ended: %v); it shows:\n%s", term.name, sub, end, term.output())
		}
		return nil
	})
}

// agentConns are the broker's connections authorized as the agent <owner>-<name> (CONNZ).
func agentConns(t *testing.T, h *human, name string) []*server.ConnInfo {
	t.Helper()
	cz, err := h.e.ns.Connz(&server.ConnzOptions{Username: true, Limit: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var out []*server.ConnInfo
	for _, ci := range cz.Conns {
		if ci.AuthorizedUser == h.owner+"-"+name {
			out = append(out, ci)
		}
	}
	return out
}

// TestRemoteManagerdRealAgent is issue 25's first acceptance point with the real agent: a
// remote managerd (no signerd certificate) spawns two testagent processes on PTYs; each
// exchanges its actor token at authd's published public_url, an https TLS proxy that strips
// the tenant path (the agent trusts it through SSL_CERT_FILE, as a deployed agent trusts its
// CA), connects through the auth callout, joins general through deliveryd and receives there
// what the other posts from its terminal; both despawn through the retirement path (prepare,
// requester, rail, in that order), their heads are retired, and the names are free. The same
// material run by an agent that lacks the proxy's CA gets no exchange: the TLS is verified.
func TestRemoteManagerdRealAgent(t *testing.T) {
	bin := filepath.Join(agentBinaries.Dir(t), "testagent")
	proxy := newTenantProxy(t, "t")
	r := newRemoteRigURL(t, proxy.srv.URL+"/t")
	proxy.forwardTo(t, r.pub)
	h := r.h
	h.e.startDeliveryd(t)
	cfg := r.config()
	lnch := newHostLauncher(t)
	lnch.argv = []string{bin}
	lnch.env = []string{"SSL_CERT_FILE=" + proxy.certFile} // as a deployed agent trusts its CA
	mlogs := &testkit.SyncBuffer{}
	mgr := r.startWith(t, manager.Inputs{Config: cfg}, manager.RuntimeOptions{Launcher: lnch}, mlogs)
	c := r.client(t, cfg)
	st := h.e.lifecycleStore(t)
	spawn := func(t *testing.T, name string) *managerv1.Agent {
		t.Helper()
		// The rig's remote-manager credential lives 4 s: at each expiry the broker cuts
		// managerd's connection, which it restores with the renewed one.
		waitManagerReady(t, mgr)
		resp, err := c.Spawn(ctxT(t), &managerv1.SpawnRequest{Name: name, Connector: "echo", Subscribe: []string{"general"},
			AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}})
		if err != nil {
			t.Fatalf("spawn %s: %v\nmanagerd:\n%s", name, err, mlogs.String())
		}
		return resp.GetAgent()
	}
	// stop despawns name and checks authd's log has prepare, requester, rail for uid, in order.
	stop := func(t *testing.T, name, uid string) {
		t.Helper()
		waitManagerReady(t, mgr)
		from := len(strings.Split(r.logs.String(), "\n")) - 1
		resp, err := c.Stop(ctxT(t), &managerv1.StopRequest{Name: name})
		if err != nil {
			t.Fatalf("stop %s: %v\nmanagerd:\n%s", name, err, mlogs.String())
		}
		if resp.GetAgent().GetProcess() != managerv1.ProcessState_PROCESS_STATE_EXITED {
			t.Fatalf("stopped %s: %v", name, resp.GetAgent())
		}
		if gone, err := lnch.child(name).Gone(); err != nil || !gone {
			t.Fatalf("%s's process gone %v err %v", name, gone, err)
		}
		logs := r.logs.String()
		prep := logIndex(logs, from, `"msg":"manager service authority: answered"`, `"kind":"manager-managed-agent-prepare-retirement"`)
		mint := logIndex(logs, max(prep, 0), `"msg":"manager service authority: answered"`, `"operation":"retire"`)
		rail := logIndex(logs, max(mint, 0), `"msg":"retire rail: retirement requested"`, `"uid":"`+uid+`"`)
		if prep < 0 || mint <= prep || rail <= mint {
			t.Fatalf("%s: authd log order prepare %d, requester %d, rail %d: want all three, in that order", name, prep, mint, rail)
		}
		head, _, found, err := st.Head(ctxT(t), h.owner, name)
		if err != nil || !found || head.State != lifecycle.HeadRetired || head.LifecycleUID != uid {
			t.Fatalf("head of %s %+v found %v err %v, want retired at %s", name, head, found, err, uid)
		}
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "retire", name+".json")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a pending-retirement record of %s after a finished retirement (%v)", name, err)
		}
		// Its process gone, the broker has dropped its callout connection.
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := len(agentConns(t, h, name)); n != 0 {
				return fmt.Errorf("%d CONNZ connections as %s-%s after its stop", n, h.owner, name)
			}
			return nil
		})
	}

	t.Cleanup(func() {
		if t.Failed() { // authd's view of the agents' exchanges and callouts
			for _, l := range strings.Split(r.logs.String(), "\n") {
				if strings.Contains(l, `"msg":"exchange: `) || strings.Contains(l, `"msg":"callout: `) {
					t.Log(l)
				}
			}
		}
	})
	// The terminals stay attached across the subtests, until the test ends.
	attached, detach := context.WithCancel(context.Background())
	t.Cleanup(detach)
	agents := map[string]*managerv1.Agent{}
	terms := map[string]*terminal{}
	t.Run("ok/two real agents exchange at public_url through the proxy, connect through the callout and join", func(t *testing.T) {
		for _, name := range []string{"rx", "tx"} {
			agents[name] = spawn(t, name)
			terms[name] = attachTerminal(t, attached, c, name)
		}
		for _, name := range []string{"rx", "tx"} {
			ag := agents[name]
			// The launcher wrote the exchange form: the published public_url (the proxy's), no creds.
			mat, err := material.ReadFile(filepath.Join(lnch.root, name, "launch-material"))
			if err != nil || !mat.Exchange() || mat.Creds != "" || mat.ExchangeURL != proxy.srv.URL+"/t" || mat.LifecycleUID != ag.GetLifecycleUid() {
				t.Fatalf("%s's material (err %v) exchange %v, %d bytes of creds, URL %s, uid %s: want the exchange form at %s/t, uid %s",
					name, err, mat.Exchange(), len(mat.Creds), mat.ExchangeURL, mat.LifecycleUID, proxy.srv.URL, ag.GetLifecycleUid())
			}
			terms[name].waitFor(t, "connected "+h.owner+"."+name+" "+ag.GetLifecycleUid())
			terms[name].waitFor(t, "joined general ")
			terms[name].waitFor(t, "ready")
			if !strings.Contains(r.logs.String(), `"msg":"exchange: granted","arm":"agent","owner":"`+h.owner+`","actor":"`+name+`"`) {
				t.Fatalf("authd logged no agent exchange granted to %s", name)
			}
			// The exchange activated the lifecycle at the uid the authority chose and managerd bound.
			head, _, found, err := st.Head(ctxT(t), h.owner, name)
			if err != nil || !found || head.State != lifecycle.HeadActive || head.LifecycleUID != ag.GetLifecycleUid() {
				t.Fatalf("head of %s %+v found %v err %v, want active at the spawned uid %s", name, head, found, err, ag.GetLifecycleUid())
			}
		}
		// Both exchanges came through the TLS proxy at the published URL (the only URL in the
		// agents' material), and authd answered them.
		if n := proxy.exchanged.Load(); n < 2 {
			t.Fatalf("the proxy forwarded %d answered exchanges, want at least 2 (one per agent)", n)
		}
		// The broker's own view: each agent's connection is the callout's, in the data account as
		// <owner>-<actor>, named with a nonce bound to its principal.
		gs, err := h.api.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: sp})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"rx", "tx"} {
			found := agentConns(t, h, name)
			if len(found) != 1 || found[0].Account != gs.GetAccountPublicKey() || space.ValidateBoundInboxNonce(found[0].Name, h.owner, name) != nil {
				t.Fatalf("%s: %d CONNZ connections as %s-%s, want one in the data account %s named with its bound nonce", name, len(found), h.owner, name, gs.GetAccountPublicKey())
			}
		}
	})

	t.Run("ok/a line typed on tx's terminal reaches rx through deliveryd", func(t *testing.T) {
		if terms["tx"] == nil || terms["rx"] == nil {
			t.Fatal("no agents (the spawn failed)")
		}
		text := "hello rx through the proxy " + rand.Text()
		if _, err := c.Input(ctxT(t), &managerv1.InputRequest{Name: "tx", Text: []byte(text), Enter: true}); err != nil {
			t.Fatalf("input tx: %v", err)
		}
		terms["tx"].waitFor(t, "sent general ")
		terms["rx"].waitFor(t, "recv general "+h.owner+".tx "+text)
	})

	t.Run("fail/an agent without the proxy's CA in its roots gets no exchange", func(t *testing.T) {
		// tx's material, run again by hand with the system roots only: the exchange URL is
		// verified TLS, so the agent's exchange (made as it connects) fails the proxy's
		// certificate; it keeps trying, says so on its terminal, and never connects.
		raw, err := os.ReadFile(filepath.Join(lnch.root, "tx", "launch-material"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "launch-material")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		before := proxy.exchanged.Load()
		out := &testkit.SyncBuffer{}
		cmd := exec.Command(bin)
		cmd.Env = []string{material.EnvVar + "=" + path}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := <-exited; err != nil {
				t.Errorf("the agent ended with %v, want status 0 on SIGTERM", err)
			}
		}()
		testkit.Eventually(t, 20*time.Second, func() error {
			if !strings.Contains(out.String(), "error connect: ") || !strings.Contains(out.String(), "x509: certificate signed by unknown authority") {
				return fmt.Errorf("the agent has not reported the proxy's certificate refused; it printed:\n%s", out.String())
			}
			return nil
		})
		if strings.Contains(out.String(), "connected ") || proxy.exchanged.Load() != before || len(agentConns(t, h, "tx")) != 1 {
			t.Fatalf("an agent without the proxy's CA exchanged (%d exchanges, %d before) or connected (%d connections as tx):\n%s",
				proxy.exchanged.Load(), before, len(agentConns(t, h, "tx")), out.String())
		}
	})

	t.Run("ok/despawn: prepare, requester, rail; retired; the name is free", func(t *testing.T) {
		for _, name := range []string{"rx", "tx"} {
			if agents[name] == nil {
				t.Fatal("no agents (the spawn failed)")
			}
			stop(t, name, agents[name].GetLifecycleUid())
		}
		again := spawn(t, "rx")
		if again.GetLifecycleUid() == "" || again.GetLifecycleUid() == agents["rx"].GetLifecycleUid() {
			t.Fatalf("respawn uid %q, want a new one (was %s)", again.GetLifecycleUid(), agents["rx"].GetLifecycleUid())
		}
		term := attachTerminal(t, attached, c, "rx")
		term.waitFor(t, "connected "+h.owner+".rx "+again.GetLifecycleUid())
		term.waitFor(t, "ready")
		stop(t, "rx", again.GetLifecycleUid())
	})

	if strings.Contains(mlogs.String(), "eyJ") || strings.Contains(r.logs.String(), "eyJ") {
		t.Fatal("a JWT or bearer was logged")
	}
}
