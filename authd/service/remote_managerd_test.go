package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/managerd/manager"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// remoteCredLifetime is the remote-manager lifetime the test's signerd policy allows, so the
// manager's supervisor rail renews (at 75 % of it) through the authority within the test.
const remoteCredLifetime = "4s"

// remoteRig is authd's real service (real signerd whose policy caps remote-manager credentials
// at remoteCredLifetime, embedded broker, pinned fake IdP, public face on loopback), the IdP's
// owner holding an interactive row cli with supervise, and a remote managerd configuration
// pointing at the public face with an IdP token file.
type remoteRig struct {
	h     *human
	pub   string
	logs  *testkit.SyncBuffer
	dir   string
	token string // the IdP token file
}

func newRemoteRig(t *testing.T) *remoteRig {
	t.Helper()
	return newRemoteRigURL(t, "https://auth.example/t")
}

// newRemoteRigURL is newRemoteRig with authd publishing its public face at publicURL (a TLS
// proxy's, say); managerd is still pointed at the face's listen address.
func newRemoteRigURL(t *testing.T, publicURL string) *remoteRig {
	t.Helper()
	policy := strings.Replace(signerdtest.DefaultPolicy, "remote-manager: {ttl_max: 24h", "remote-manager: {ttl_max: "+remoteCredLifetime, 1)
	if policy == signerdtest.DefaultPolicy {
		t.Fatal("the default policy has no remote-manager row to shorten")
	}
	logs := &testkit.SyncBuffer{}
	h := newHumanWith(t, newEnvWith(t, signerdtest.Options{Spaces: []string{sp}, Policy: policy}), true, func(c *config.Config) *config.Config {
		c.PublicListen, c.PublicURL = "127.0.0.1:0", publicURL
		return c
	}, func(_ *service.Inputs, o *service.RuntimeOptions) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	r := &remoteRig{h: h, pub: "http://" + publicAddr(t, logs), logs: logs, dir: t.TempDir()}
	(&msa{h: h}).grant(t, h.owner, "cli", "supervise")
	secrets := filepath.Join(r.dir, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	r.token = filepath.Join(secrets, "idp-token")
	if err := os.WriteFile(r.token, []byte(h.idp.Token(t, h.idp.Claims(idpSub, time.Now(), time.Hour), nil)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// config is a remote managerd configuration: no signer section, no instance id.
func (r *remoteRig) config() *manager.Config {
	return &manager.Config{
		Authority: manager.AuthorityRemote, AuthorityURL: r.pub, IdPTokenFile: r.token,
		Space: sp, Brokers: []string{r.h.e.url}, StateDir: filepath.Join(r.dir, "state"), Root: filepath.Join(r.dir, "root"),
		Owner: r.h.owner, Actor: "cli",
		Launcher:   manager.LauncherConfig{Socket: filepath.Join(r.dir, "l", "launcher.sock"), TokenFile: filepath.Join(r.dir, "t", "token")},
		API:        manager.APIConfig{Socket: filepath.Join(r.dir, "api", "m.sock"), AllowUIDs: []uint32{uint32(os.Getuid())}},
		Connectors: []string{"echo"},
	}
}

// configAt is config for a second managerd beside the first: its own state, root and API
// socket, named by suffix.
func (r *remoteRig) configAt(suffix string) *manager.Config {
	c := r.config()
	c.StateDir, c.Root = filepath.Join(r.dir, "state"+suffix), filepath.Join(r.dir, "root"+suffix)
	c.API.Socket = filepath.Join(r.dir, "api"+suffix, "m.sock")
	return c
}

// secondManagerd starts a second managerd at configAt(suffix) on the stock HTTP authority as
// wrap makes it into the manager's RemoteAuthority, and returns its config.
func (r *remoteRig) secondManagerd(t *testing.T, suffix string, wrap func(*manager.HTTPAuthority) manager.RemoteAuthority,
	opts manager.RuntimeOptions, mlogs *testkit.SyncBuffer) (*manager.Config, *manager.Manager) {
	t.Helper()
	cfg := r.configAt(suffix)
	stock, err := manager.NewHTTPAuthority(cfg.AuthorityURL, cfg.IdPTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, r.startWith(t, manager.Inputs{Config: cfg, RemoteAuthority: wrap(stock)}, opts, mlogs)
}

// hookWarnings collects, from a manager's events, the hook of each HOOK warning's rejection.
type hookWarnings struct {
	mu    sync.Mutex
	hooks []string
}

func (w *hookWarnings) events(e manager.Event) {
	var rj *manager.Rejection
	if e.Kind == manager.EventWarning && e.Code == manager.CodeHook && errors.As(e.Err, &rj) {
		w.mu.Lock()
		w.hooks = append(w.hooks, rj.Hook)
		w.mu.Unlock()
	}
}

// list is the hooks warned of so far, in order.
func (w *hookWarnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.hooks)
}

// start runs a remote managerd; it is closed when the test ends.
func (r *remoteRig) start(t *testing.T, cfg *manager.Config, mlogs *testkit.SyncBuffer) (*manager.Manager, error) {
	t.Helper()
	m, err := manager.Start(context.Background(), manager.Inputs{Config: cfg}, manager.RuntimeOptions{Logger: slog.New(slog.NewJSONHandler(mlogs, nil))})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m, nil
}

func (r *remoteRig) client(t *testing.T, cfg *manager.Config) managerv1.ManagerServiceClient {
	t.Helper()
	c, closer, err := managerclient.Dial(ctxT(t), cfg.API.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return c
}

// answered counts authd's log lines answering a manager-service-authority operation.
func (r *remoteRig) answered(op string) int {
	n := 0
	for _, l := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(l, `"msg":"manager service authority: answered"`) && strings.Contains(l, `"operation":"`+op+`"`) {
			n++
		}
	}
	return n
}

// TestRemoteManagerd is issue 25 item 6's start path end to end: a managerd with authority:
// remote and no signerd client prepares at authd's public face (its supervisor credential is
// authd-minted remote-manager, proven on the broker), takes its instance lease as the gate
// principal, activates (the epoch and registration revision land in the lease row and in
// Status), serves ManagerService, renews its credential through the authority at 75 % of its
// life, and after a restart reuses its identity
// state (same instance, epoch one more).
func TestRemoteManagerd(t *testing.T) {
	r := newRemoteRig(t)
	cfg := r.config()
	mlogs := &testkit.SyncBuffer{}
	m, err := r.start(t, cfg, mlogs)
	if err != nil {
		t.Fatalf("start: %v\nmanagerd:\n%s", err, mlogs.String())
	}
	c := r.client(t, cfg)
	st := r.h.e.lifecycleStore(t)
	var iid string
	var firstExp time.Time

	t.Run("ok/prepared, leased as the gate principal, activated, serving", func(t *testing.T) {
		s, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		iid = s.GetInstanceId()
		if s.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD || !s.GetRegistration().GetRegistered() || s.GetRegistration().GetProcessEpoch() != 0 {
			t.Fatalf("status lease %v registration %v", s.GetLease(), s.GetRegistration())
		}
		serve, err := lifecycle.ServePrincipal(r.h.owner, iid)
		if err != nil {
			t.Fatal(err)
		}
		row, _, found, err := st.Lease(ctxT(t), iid)
		if err != nil || !found || row.Holder != serve || row.ProcessEpoch != 0 || row.RegistrationRevision != s.GetRegistration().GetRegistrationRevision() {
			t.Fatalf("lease row %+v found %v err %v, want holder %s epoch 0 revision %d", row, found, err, serve, s.GetRegistration().GetRegistrationRevision())
		}
		g, _, found, err := st.EndpointGate(ctxT(t), lifecycle.ManagerEndpoint, iid)
		if err != nil || !found || g.State != lifecycle.GateOpen || g.Principal != serve || g.ProcessEpoch != 0 || g.RegistrationRevision != row.RegistrationRevision {
			t.Fatalf("gate %+v found %v err %v", g, found, err)
		}
		firstExp = s.GetSupervisor().GetExpiresAt().AsTime()
		if firstExp.IsZero() || s.GetSigner().GetReachable() {
			t.Fatalf("supervisor %v signer %v: want an authority-issued credential and no signerd contact", s.GetSupervisor(), s.GetSigner())
		}
		if r.answered("prepare") != 1 || r.answered("activate") != 1 {
			t.Fatalf("authd answered prepare %d activate %d times, want 1 each", r.answered("prepare"), r.answered("activate"))
		}
		if !m.Ready() {
			t.Fatalf("state %v, want ready", m.State())
		}
	})

	t.Run("ok/identity state is a secret file", func(t *testing.T) {
		fi, err := os.Stat(filepath.Join(cfg.StateDir, manager.RemoteIdentityFile))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("identity file %v err %v, want mode 0600", fi, err)
		}
		di, err := os.Stat(cfg.StateDir)
		if err != nil || di.Mode().Perm() != 0o700 {
			t.Fatalf("state dir %v err %v, want mode 0700", di, err)
		}
		if strings.Contains(mlogs.String(), "eyJ") || strings.Contains(mlogs.String(), `"SU`) {
			t.Fatal("managerd logged a JWT or a seed")
		}
	})

	t.Run("ok/renews its credential through the authority", func(t *testing.T) {
		testkit.Eventually(t, 20*time.Second, func() error {
			s, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
			if err != nil {
				return err
			}
			if exp := s.GetSupervisor().GetExpiresAt().AsTime(); !exp.After(firstExp) {
				return fmt.Errorf("supervisor credential still expires at %v", exp)
			}
			if r.answered("renew") == 0 {
				return errors.New("authd answered no renew")
			}
			return nil
		})
		// The renewed credential serves: the lease stays held across the first one's expiry.
		testkit.Eventually(t, 20*time.Second, func() error {
			s, err := c.Status(ctxT(t), &managerv1.StatusRequest{})
			if err != nil {
				return err
			}
			if time.Now().Before(firstExp.Add(time.Second)) {
				return errors.New("the first credential has not expired yet")
			}
			if s.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD || !m.Ready() {
				return fmt.Errorf("lease %v state %v", s.GetLease(), m.State())
			}
			return nil
		})
	})

	t.Run("ok/restart reuses the identity and advances the epoch", func(t *testing.T) {
		before, err := os.ReadFile(filepath.Join(cfg.StateDir, manager.RemoteIdentityFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(ctxT(t)); err != nil {
			t.Fatalf("close: %v", err)
		}
		m2, err := r.start(t, r.config(), mlogs)
		if err != nil {
			t.Fatalf("restart: %v", err)
		}
		after, err := os.ReadFile(filepath.Join(cfg.StateDir, manager.RemoteIdentityFile))
		if err != nil || !bytes.Equal(before, after) {
			t.Fatalf("identity file changed across the restart (err %v)", err)
		}
		c2 := r.client(t, cfg)
		s, err := c2.Status(ctxT(t), &managerv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s.GetInstanceId() != iid || s.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD || s.GetRegistration().GetProcessEpoch() != 1 {
			t.Fatalf("after restart: instance %s (want %s) lease %v registration %v", s.GetInstanceId(), iid, s.GetLease(), s.GetRegistration())
		}
		row, _, _, err := st.Lease(ctxT(t), iid)
		if err != nil || row.ProcessEpoch != 1 {
			t.Fatalf("lease row %+v err %v, want epoch 1", row, err)
		}
		reg, ok, _ := m2.Registration()
		if !ok || reg.ProcessEpoch != 1 || reg.RegistrationRevision != row.RegistrationRevision {
			t.Fatalf("registration %+v ok %v, want epoch 1 at revision %d", reg, ok, row.RegistrationRevision)
		}
		var id struct {
			InstanceID string `json:"instanceId"`
		}
		if err := json.Unmarshal(after, &id); err != nil || id.InstanceID != iid {
			t.Fatalf("identity instance %q err %v", id.InstanceID, err)
		}
	})
}

// TestRemoteManagerdRefusals: a remote managerd whose authority refuses it starts nothing: an
// owner the IdP token does not derive, or an IdP subject without a supervise row.
func TestRemoteManagerdRefusals(t *testing.T) {
	r := newRemoteRig(t)
	t.Run("fail/the configured owner is not the one the IdP token derives", func(t *testing.T) {
		cfg := r.config()
		cfg.Owner = "u_someoneelse"
		_, err := r.start(t, cfg, &testkit.SyncBuffer{})
		var se *manager.StartError
		if !errors.As(err, &se) || se.Code != manager.CodeAuthority || !strings.Contains(err.Error(), "derived owner "+r.h.owner) {
			t.Fatalf("start = %v, want an AUTHORITY refusal naming the derived owner", err)
		}
	})
	t.Run("fail/no supervise row", func(t *testing.T) {
		cfg := r.config()
		cfg.Actor = "nosuper"
		cfg.StateDir = filepath.Join(r.dir, "state2")
		_, err := r.start(t, cfg, &testkit.SyncBuffer{})
		var se *manager.StartError
		if !errors.As(err, &se) || se.Code != manager.CodeAuthority || !strings.Contains(err.Error(), "permission-denied") {
			t.Fatalf("start = %v, want an AUTHORITY refusal (permission-denied)", err)
		}
	})
}
