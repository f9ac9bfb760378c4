package manager

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/managerd/internal/instlease"
	"github.com/cotalgo/cotal/pkg/creds"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// These tests run the Manager in process on a real signerd and broker: start refusals, the
// instance lease at start, admission (which refuses before any signer call, so no launcher is
// needed), Status and Shutdown. Spawning needs the root launcher and managerd under its own uid:
// the e2e tests in managerd/ run those.

const instanceA = "inst0aaaaaaaaaaaaaaaaaaaaaaa"

func testConfig(t *testing.T, e *plane3test.Env) *Config {
	t.Helper()
	files := e.S.ClientFor(t, mtls.KindManagerd, plane3test.Space)
	dir := t.TempDir()
	return &Config{
		Space: plane3test.Space, Brokers: []string{e.URL},
		Signer:   signerclient.FileConfig{Address: e.S.Addr, CA: files.ServerCAFile, Cert: files.CertFile, Key: files.KeyFile},
		StateDir: filepath.Join(dir, "state"), InstanceID: instanceA, Root: filepath.Join(dir, "root"),
		Owner: "m1", Actor: "s1", AgentOwner: plane3test.Owner,
		Launcher:   LauncherConfig{Socket: filepath.Join(dir, "l", "launcher.sock"), TokenFile: filepath.Join(dir, "t", "token")},
		API:        APIConfig{Socket: filepath.Join(dir, "api", "manager.sock"), AllowUIDs: []uint32{uint32(os.Getuid())}},
		Connectors: []string{"echo"}, EnvAllow: []string{"TERM"}, Capacity: 2,
	}
}

// runCtx is a manager's lifetime in a test: it ends when the test does.
func runCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func startManager(t *testing.T, cfg *Config, mod func(*Inputs, *RuntimeOptions)) (*Manager, error) {
	t.Helper()
	in := Inputs{Config: cfg}
	var opts RuntimeOptions
	if mod != nil {
		mod(&in, &opts)
	}
	m, err := Start(runCtx(t), in, opts)
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

func mustStart(t *testing.T, cfg *Config) *Manager {
	t.Helper()
	m, err := startManager(t, cfg, nil)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return m
}

// leaseRow reads the instance's lease row with a supervisor credential; found false when absent.
func leaseRow(t *testing.T, e *plane3test.Env, instance string) (instlease.Row, bool) {
	t.Helper()
	nc := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "m1", Actor: "s2"})
	kv, err := plane3test.JS(t, nc).KeyValue(plane3test.Ctx(t), "cotal_manager_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	ent, err := kv.Get(plane3test.Ctx(t), "lease."+instance)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return instlease.Row{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	row, err := instlease.DecodeRow(ent.Value())
	if err != nil {
		t.Fatal(err)
	}
	return row, true
}

func wantRefusal(t *testing.T, err error, code codes.Code, reason managerv1.Reason) {
	t.Helper()
	var r *api.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("want refusal %v/%v, got %v", code, reason, err)
	}
	if r.Code != code || r.Reason != reason {
		t.Fatalf("want refusal %v/%v, got %v/%v: %s", code, reason, r.Code, r.Reason, r.Message)
	}
}

func TestStart(t *testing.T) {
	e := plane3test.New(t)

	t.Run("ok/lease row and status", func(t *testing.T) {
		cfg := testConfig(t, e)
		m := mustStart(t, cfg)
		row, ok := leaseRow(t, e, instanceA)
		if !ok {
			t.Fatal("no lease row after Start")
		}
		if row.InstanceID != instanceA || row.PID != os.Getpid() || row.Root != cfg.Root || row.Holder != "m1.s1" || row.Runtime != "pty" {
			t.Fatalf("lease row %+v", row)
		}
		st, err := m.Backend().Status(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.Lease != managerv1.LeaseState_LEASE_STATE_HELD || !st.Signer.Reachable || st.Space != plane3test.Space ||
			st.InstanceId != instanceA || len(st.Connectors) != 1 || st.Connectors[0] != "echo" || st.Capacity != 2 || st.Agents != 0 ||
			st.Supervisor.GetExpiresAt() == nil || st.ShuttingDown {
			t.Fatalf("status %v", st)
		}
		if err := m.Healthy(); err != nil {
			t.Fatalf("Healthy after Start: %v", err)
		}
		if _, err := m.Shutdown(plane3test.Ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, ok := leaseRow(t, e, instanceA); ok {
			t.Fatal("lease row still there after Shutdown")
		}
		if err := m.Healthy(); err == nil {
			t.Fatal("Healthy after Shutdown: want an error (no more watchdog pings)")
		}
	})

	t.Run("fail/double start on this root is LeaseHeld", func(t *testing.T) {
		cfg := testConfig(t, e)
		mustStart(t, cfg)
		_, err := startManager(t, cfg, nil)
		var held *LeaseHeld
		if !errors.As(err, &held) || !held.SameRoot || held.Row.PID != os.Getpid() {
			t.Fatalf("want LeaseHeld on the same root, got %v", err)
		}
		var se *StartError
		if !errors.As(err, &se) || se.Code != CodeLeaseHeld || se.Details["pid"] != strconv.Itoa(os.Getpid()) || se.Details["root"] != cfg.Root {
			t.Fatalf("want a LEASE_HELD StartError naming the holder, got %#v", se)
		}
	})

	t.Run("fail/holder on another root is LeaseHeld", func(t *testing.T) {
		cfg := testConfig(t, e)
		mustStart(t, cfg)
		other := *cfg
		other.Root = filepath.Join(t.TempDir(), "elsewhere")
		_, err := startManager(t, &other, nil)
		var held *instlease.LeaseHeld
		if !errors.As(err, &held) || held.SameRoot || held.Row.Root != cfg.Root {
			t.Fatalf("want LeaseHeld from another root, got %v", err)
		}
	})

	t.Run("fail/a readable signer seed stops the start", func(t *testing.T) {
		cfg := testConfig(t, e)
		cfg.SignerSeedPaths = []string{e.S.Dir}
		_, err := startManager(t, cfg, nil)
		var rs *ReadableSeedError
		var se *StartError
		if !errors.As(err, &rs) || !filepath.IsAbs(rs.Path) || !errors.As(err, &se) || se.Code != CodeSeeds {
			t.Fatalf("want a READABLE_SEEDS StartError caused by ReadableSeedError, got %v", err)
		}
		if _, ok := leaseRow(t, e, instanceA); ok {
			t.Fatal("a refused start left a lease row")
		}
	})

	t.Run("ok/the development flag starts with a readable seed", func(t *testing.T) {
		cfg := testConfig(t, e)
		cfg.SignerSeedPaths = []string{e.S.Dir}
		var logged testkit.SyncBuffer
		var ev eventLog
		if _, err := startManager(t, cfg, func(in *Inputs, opts *RuntimeOptions) {
			in.AllowReadableSeeds = true
			opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			opts.Events = ev.add
		}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logged.String(), "DEVELOPMENT MODE") {
			t.Fatalf("no loud warning in the log: %s", logged.String())
		}
		// The warning is raised while starting, then the manager is ready.
		got := ev.all()
		if len(got) != 2 || got[0].Kind != EventWarning || got[0].Code != CodeSeeds || got[0].State != StateStarting ||
			got[1].Kind != EventState || got[1].State != StateReady {
			t.Fatalf("events %v: want a READABLE_SEEDS warning while starting, then ready", got)
		}
	})

	t.Run("fail/a missing seed path is an error, not unreadable", func(t *testing.T) {
		cfg := testConfig(t, e)
		cfg.SignerSeedPaths = []string{filepath.Join(e.S.Dir, "no-such-dir")}
		_, err := startManager(t, cfg, nil)
		if err == nil || errors.As(err, new(*ReadableSeedError)) {
			t.Fatalf("want a missing-path error, got %v", err)
		}
	})
}

func TestStartSignerUnreachable(t *testing.T) {
	e := plane3test.New(t)
	cfg := testConfig(t, e)
	e.S.Stop(t)
	_, err := startManager(t, cfg, nil)
	if err == nil || !errors.Is(err, signerclient.ErrUnavailable) {
		t.Fatalf("want a start refused for signerd unreachable, got %v", err)
	}
	e.S.Restart(t)
	if _, ok := leaseRow(t, e, instanceA); ok {
		t.Fatal("a refused start left a lease row")
	}
}

// streamCounts is the consumer count of DM and DLV and the message count of the ACL bucket.
func streamCounts(t *testing.T, e *plane3test.Env) [3]uint64 {
	t.Helper()
	js := e.Provisioner(t)
	var out [3]uint64
	for i, s := range []string{e.N.DMStream(), e.N.DLVStream(), "KV_cotal_acl_" + e.N.Token()} {
		st, err := js.Stream(plane3test.Ctx(t), s)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			out[i] = uint64(info.State.Consumers)
		} else {
			out[i] = info.State.Msgs
		}
	}
	return out
}

func TestAdmission(t *testing.T) {
	e := plane3test.New(t)
	cfg := testConfig(t, e)
	m := mustStart(t, cfg)
	b := m.Backend()
	before := streamCounts(t, e)
	for _, tt := range []struct {
		name   string
		req    *managerv1.SpawnRequest
		code   codes.Code
		reason managerv1.Reason
	}{
		{"fail/unknown connector", &managerv1.SpawnRequest{Name: "a1", Connector: "bash"}, codes.InvalidArgument, managerv1.Reason_REASON_CONNECTOR_UNKNOWN},
		{"fail/name with a slash", &managerv1.SpawnRequest{Name: "../a1", Connector: "echo"}, codes.InvalidArgument, managerv1.Reason_REASON_NAME_INVALID},
		{"fail/name with a dot", &managerv1.SpawnRequest{Name: "a.1", Connector: "echo"}, codes.InvalidArgument, managerv1.Reason_REASON_NAME_INVALID},
		{"fail/empty name", &managerv1.SpawnRequest{Connector: "echo"}, codes.InvalidArgument, managerv1.Reason_REASON_NAME_INVALID},
		{"fail/subscribe outside allow_subscribe", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Subscribe: []string{"general", "ops"}, AllowSubscribe: []string{"general"}}, codes.InvalidArgument, managerv1.Reason_REASON_SUBSCRIBE_NOT_ALLOWED},
		{"fail/subscribe outside a pattern", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Subscribe: []string{"ops.x"}, AllowSubscribe: []string{"team.>"}}, codes.InvalidArgument, managerv1.Reason_REASON_SUBSCRIBE_NOT_ALLOWED},
		{"fail/malformed channel", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Subscribe: []string{"gen eral"}}, codes.InvalidArgument, managerv1.Reason_REASON_CHANNEL_INVALID},
		{"fail/wildcard subscribe", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Subscribe: []string{"team.>"}}, codes.InvalidArgument, managerv1.Reason_REASON_CHANNEL_INVALID},
		{"fail/environment not allowed", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Env: map[string]string{"LD_PRELOAD": "/x.so"}}, codes.InvalidArgument, managerv1.Reason_REASON_ENV_NOT_ALLOWED},
		{"fail/bad role", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Role: "a.b"}, codes.InvalidArgument, managerv1.Reason_REASON_INVALID_ARGUMENT},
		{"fail/huge terminal", &managerv1.SpawnRequest{Name: "a1", Connector: "echo", Rows: 5000}, codes.InvalidArgument, managerv1.Reason_REASON_INVALID_ARGUMENT},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Spawn(plane3test.Ctx(t), tt.req)
			wantRefusal(t, err, tt.code, tt.reason)
		})
	}
	// Nothing was left behind: no agent, no consumer, no ACL row.
	if list, err := b.List(plane3test.Ctx(t)); err != nil || len(list) != 0 {
		t.Fatalf("List after refusals: %v %v", list, err)
	}
	if after := streamCounts(t, e); after != before {
		t.Fatalf("refused spawns changed DM/DLV consumers or ACL rows: %v -> %v", before, after)
	}
	st, _ := b.Status(plane3test.Ctx(t))
	if st.Agents != 0 {
		t.Fatalf("refused spawns hold %d slots", st.Agents)
	}
}

func TestUnknownAgent(t *testing.T) {
	e := plane3test.New(t)
	m := mustStart(t, testConfig(t, e))
	b := m.Backend()
	_, err := b.Stop(plane3test.Ctx(t), "nobody")
	wantRefusal(t, err, codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN)
	_, err = b.Inspect(plane3test.Ctx(t), "nobody")
	wantRefusal(t, err, codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN)
	_, err = b.Terminal("nobody")
	wantRefusal(t, err, codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN)
}

func TestShutdownOnce(t *testing.T) {
	e := plane3test.New(t)
	m := mustStart(t, testConfig(t, e))
	b := m.Backend()
	const callers = 4
	var wg sync.WaitGroup
	resps := make([]*managerv1.ShutdownResponse, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[i], errs[i] = b.Shutdown(plane3test.Ctx(t), true)
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || resps[i] != resps[0] {
			t.Fatalf("caller %d: %v %p, want the shared result %p", i, errs[i], resps[i], resps[0])
		}
	}
	_, err := b.Shutdown(plane3test.Ctx(t), false)
	wantRefusal(t, err, codes.FailedPrecondition, managerv1.Reason_REASON_SHUTDOWN_CONFLICT)
	again, err := b.Shutdown(plane3test.Ctx(t), true)
	if err != nil || again != resps[0] {
		t.Fatalf("a later joining Shutdown: %v %p", err, again)
	}
	// Done follows once ManagerService has drained (the answer to a Shutdown it serves is sent
	// before it stops).
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after Shutdown")
	}
	if m.State() != StateStopped || m.Err() != nil {
		t.Fatalf("after Shutdown: state %s, Err %v", m.State(), m.Err())
	}
	if _, ok := leaseRow(t, e, instanceA); ok {
		t.Fatal("lease row still there after Shutdown")
	}
	_, err = b.Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "late", Connector: "echo"})
	wantRefusal(t, err, codes.FailedPrecondition, managerv1.Reason_REASON_SHUTTING_DOWN)
	st, err := b.Status(plane3test.Ctx(t))
	if err != nil || !st.ShuttingDown || st.Lease != managerv1.LeaseState_LEASE_STATE_RELEASED {
		t.Fatalf("status after shutdown: %v %v", st, err)
	}
}

// TestLeaseDeletedIsPutBack: a deleted lease key is re-put by the next renewal, and after
// Shutdown begins it never is.
func TestLeaseDeletedIsPutBack(t *testing.T) {
	e := plane3test.New(t)
	var ev eventLog
	m, err := startManager(t, testConfig(t, e), func(_ *Inputs, opts *RuntimeOptions) { opts.Events = ev.add })
	if err != nil {
		t.Fatal(err)
	}
	nc := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "m1", Actor: "s3"})
	kv, err := plane3test.JS(t, nc).KeyValue(plane3test.Ctx(t), "cotal_manager_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(plane3test.Ctx(t), "lease."+instanceA); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, ok := leaseRow(t, e, instanceA); !ok {
			return errors.New("lease row not put back yet")
		}
		if !ev.has(EventWarning, CodeLease) {
			return errors.New("no LEASE warning yet")
		}
		return nil
	})
	if _, err := m.Shutdown(plane3test.Ctx(t), false); err != nil {
		t.Fatal(err)
	}
	if _, ok := leaseRow(t, e, instanceA); ok {
		t.Fatal("lease row there after Shutdown")
	}
}

// recordingProv records what the manager provisions.
type recordingProv struct {
	inner Provisioner
	mu    sync.Mutex
	specs []AgentSpec
}

func (r *recordingProv) Provision(ctx context.Context, a AgentSpec) ([]string, error) {
	r.mu.Lock()
	r.specs = append(r.specs, a)
	r.mu.Unlock()
	return r.inner.Provision(ctx, a)
}

func (r *recordingProv) Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error) {
	return r.inner.Deprovision(ctx, owner, actor, uid, memberChannels)
}

// TestSpawnLaunchFails: a spawn that passes admission, provisions and mints, then cannot be
// launched (no launcher runs here) undoes its provisioning: no consumer, no ACL row, no slot.
func TestSpawnLaunchFails(t *testing.T) {
	e := plane3test.New(t)
	var ev eventLog
	m := newManager(Inputs{Config: testConfig(t, e)}, RuntimeOptions{Events: ev.add})
	rec := &recordingProv{inner: m.prov}
	m.prov = rec
	if err := m.start(runCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	b := m.Backend()
	before := streamCounts(t, e)
	_, err := b.Spawn(plane3test.Ctx(t), &managerv1.SpawnRequest{Name: "a1", Connector: "echo"})
	wantRefusal(t, err, codes.Unavailable, managerv1.Reason_REASON_LAUNCH_FAILED)
	if !ev.has(EventWarning, CodeLauncher) {
		t.Fatalf("no LAUNCHER warning for an unreachable launcher: %v", ev.all())
	}
	if len(rec.specs) != 1 {
		t.Fatalf("provisioned %d times, want once before the launch", len(rec.specs))
	}
	if after := streamCounts(t, e); after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("a failed launch left DM/DLV consumers: %v -> %v", before, after)
	}
	spec := rec.specs[0]
	kv, err := e.Provisioner(t).KeyValue(plane3test.Ctx(t), "cotal_acl_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, err := space.ACLKey(spec.Owner, spec.Actor, spec.LifecycleUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(plane3test.Ctx(t), key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("ACL row %s after a failed launch: %v", key, err)
	}
	if list, err := b.List(plane3test.Ctx(t)); err != nil || len(list) != 0 {
		t.Fatalf("List after a failed launch: %v %v", list, err)
	}
	st, _ := b.Status(plane3test.Ctx(t))
	if st.Agents != 0 || !st.Signer.Reachable {
		t.Fatalf("status after a failed launch: %v", st)
	}
}

// TestReapPredecessor: a custody record a killed predecessor left, for an agent whose process is
// gone, is reaped at start: exactly that lifecycle's dlv_ durable and ACL row are removed and the
// record goes; a malformed record is left for the operator, and another lifecycle is untouched.
func TestReapPredecessor(t *testing.T) {
	e := plane3test.New(t)
	cfg := testConfig(t, e)
	pjs := e.Provisioner(t)
	ghost, _ := newUID()
	other, _ := newUID()
	e.AddLifecycle(t, pjs, "ghost", ghost, []string{"general"})
	e.AddLifecycle(t, pjs, "other", other, []string{"general"})

	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "agents"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(custody{Name: "ghost", Owner: plane3test.Owner, Actor: "ghost", LifecycleUID: ghost,
		Pid: dead.Process.Pid, StartTime: 1, Dir: "/nonexistent/ghost", InstanceID: "inst0predecessoraaaaaaaaaa"})
	if err := creds.WriteFileAtomic(filepath.Join(cfg.StateDir, "agents", "ghost.json"), rec); err != nil {
		t.Fatal(err)
	}
	if err := creds.WriteFileAtomic(filepath.Join(cfg.StateDir, "agents", "junk.json"), []byte(`{"name":"junk","extra":1}`)); err != nil {
		t.Fatal(err)
	}
	mustStart(t, cfg)

	dlv := func(actor, uid string) bool {
		name, _ := e.N.DlvConsumer(plane3test.Owner, actor, uid)
		_, err := pjs.Consumer(plane3test.Ctx(t), e.N.DLVStream(), name)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	kv, err := pjs.KeyValue(plane3test.Ctx(t), "cotal_acl_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	acl := func(actor, uid string) bool {
		key, _ := space.ACLKey(plane3test.Owner, actor, uid)
		_, err := kv.Get(plane3test.Ctx(t), key)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	if dlv("ghost", ghost) || acl("ghost", ghost) {
		t.Fatal("the predecessor's agent was not deprovisioned")
	}
	if !dlv("other", other) || !acl("other", other) {
		t.Fatal("reaping touched another lifecycle")
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "agents", "ghost.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the reaped record is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "agents", "junk.json")); err != nil {
		t.Fatalf("the malformed record was not left alone: %v", err)
	}
}

// FuzzDecodeCustody: a custody record is read from disk at start; decoding never panics and
// what it accepts names a valid lifecycle and process.
func FuzzDecodeCustody(f *testing.F) {
	good, _ := json.Marshal(custody{Name: "a-1", Owner: "local", Actor: "a_1", LifecycleUID: "abcdefghijklmnopqrstuvwxyz",
		Pid: 42, StartTime: 7, Dir: "/x", InstanceID: "i"})
	f.Add(good)
	f.Add([]byte(`{"name":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCustody(b)
		if err != nil {
			return
		}
		if _, err := space.ACLKey(c.Owner, c.Actor, c.LifecycleUID); err != nil || c.Pid <= 1 || c.StartTime == 0 || !nameRE.MatchString(c.Name) {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// FuzzDecodePending: a pending-retirement record read back is a v 1 record of a valid name and
// a valid lifecycle whose opId is that lifecycle's managed retirement opId, and it round-trips.
func FuzzDecodePending(f *testing.F) {
	uid := "abcdefghijklmnopqrstuvwxyz"
	op, _ := lifecycle.ManagedRetirementOpID(uid)
	good, _ := json.Marshal(pendingRetirement{V: 1, Name: "a-1", Target: managerauthority.Target{Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "a_1", LifecycleUID: uid}, OpID: op})
	f.Add(good)
	f.Add([]byte(`{"v":1,"name":"x"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePending(b)
		if err != nil {
			return
		}
		want, _ := lifecycle.ManagedRetirementOpID(p.Target.LifecycleUID)
		if _, err := space.ACLKey(p.Target.Owner, p.Target.Actor, p.Target.LifecycleUID); err != nil || p.V != 1 || p.OpID != want || !nameRE.MatchString(p.Name) {
			t.Fatalf("accepted %+v", p)
		}
		again, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := decodePending(again); err != nil || back != p {
			t.Fatalf("round trip of %+v = %+v, %v", p, back, err)
		}
	})
}
