package instlease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/managerd/internal/instlease"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	// short is the space whose manager bucket the test makes with a 2 s max_age, so a dead
	// predecessor's row expires quickly; full is provisioned by pkg/provision (10 s).
	short = "alpha"
	full  = "beta"
	// bare has no manager bucket until a test makes one without max_age.
	bare     = "gamma"
	shortTTL = 2 * time.Second
	// childEnv re-executes the test binary as a lease-holding child process.
	childEnv = "INSTLEASE_TEST_CHILD"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild is the child process: it connects with the creds file it was given, acquires the
// lease, says so on stdout, and renews until it is killed.
func runChild() int {
	nc, err := nats.Connect(os.Getenv("URL"), nats.UserCredentials(os.Getenv("CREDS")), nats.CustomInboxPrefix(os.Getenv("INBOX")))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	n, err := space.NewNames(short)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx := context.Background()
	l, err := instlease.Acquire(ctx, instlease.Config{Conn: nc, Names: n, InstanceID: os.Getenv("ID"), Holder: "local.child", Runtime: "pty", Root: os.Getenv("ROOT")})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("held", os.Getpid())
	_ = l.Run(ctx)
	return 0
}

type env struct {
	s   *signerdtest.Signer
	url string
	sc  map[string]*signerclient.Client
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newEnv starts signerd and a broker; space full is provisioned by pkg/provision, space short
// gets only its manager bucket, with a 2 s max_age, created with a signerd-minted provisioner.
func newEnv(t *testing.T) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{short, full, bare}})
	e := &env{s: s, url: s.StartBroker(t), sc: map[string]*signerclient.Client{}}
	for _, sp := range []string{short, full, bare} {
		c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindManagerd, sp)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		e.sc[sp] = c
	}
	if _, err := provision.Run(ctxT(t), provision.Config{Signer: e.sc[full], Space: full, NatsURL: e.url}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	plan, err := provision.Plan(names(t, short))
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := names(t, short).Bucket(space.Manager)
	i := slices.IndexFunc(plan, func(it provision.Item) bool { return it.Name == bucket })
	cfg := plan[i].Config
	cfg.MaxAge, cfg.Duplicates = shortTTL, shortTTL
	js, err := jetstream.New(e.conn(t, short, signerv1.Profile_PROFILE_PROVISIONER, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctxT(t), cfg); err != nil {
		t.Fatalf("create %s: %v", cfg.Name, err)
	}
	return e
}

func names(t *testing.T, sp string) space.Names {
	t.Helper()
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mint has signerd mint a credential of profile for a fresh user key.
func (e *env) mint(t *testing.T, sp string, p signerv1.Profile, params *signerv1.ProfileParams) (string, nkeys.KeyPair) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	cred, err := e.sc[sp].Mint(ctxT(t), &signerv1.MintRequest{Space: sp, Profile: p, UserPublicKey: pub, Params: params})
	if err != nil {
		t.Fatalf("mint %v: %v", p, err)
	}
	return cred.GetJwt(), kp
}

func (e *env) conn(t *testing.T, sp string, p signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	return e.connTo(t, e.url, sp, p, params)
}

// connTo is conn through another broker URL (a proxy).
func (e *env) connTo(t *testing.T, url, sp string, p signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	tok, kp := e.mint(t, sp, p, params)
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(url, nats.UserJWT(func() (string, error) { return tok, nil }, kp.Sign),
		nats.CustomInboxPrefix("_INBOX_"+pub), nats.NoReconnect(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

var supervisorParams = &signerv1.ProfileParams{Owner: "local", Actor: "mgr"}

// supervisor is a connection on a signerd-minted supervisor credential, as managerd holds.
func (e *env) supervisor(t *testing.T, sp string) *nats.Conn {
	t.Helper()
	return e.conn(t, sp, signerv1.Profile_PROFILE_SUPERVISOR, supervisorParams)
}

// kv is the manager bucket seen through a supervisor credential (the test's hand on the key).
func (e *env) kv(t *testing.T, sp string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(e.supervisor(t, sp))
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := names(t, sp).Bucket(space.Manager)
	kv, err := js.KeyValue(ctxT(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// id is a distinct instance id per case (UID grammar).
func id(tag string) string { return tag + strings.Repeat("0", 26-len(tag)) }

func (e *env) cfg(t *testing.T, sp, instance, root string) instlease.Config {
	t.Helper()
	return instlease.Config{Conn: e.supervisor(t, sp), Names: names(t, sp), InstanceID: instance, Holder: "local.mgr", Runtime: "pty", Root: root}
}

func acquire(t *testing.T, cfg instlease.Config) *instlease.Lease {
	t.Helper()
	l, err := instlease.Acquire(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("Acquire(%s, root %s): %v", cfg.InstanceID, cfg.Root, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// rowAt reads the key's row, or reports that there is none.
func rowAt(t *testing.T, kv jetstream.KeyValue, key string) (instlease.Row, bool) {
	t.Helper()
	ent, err := kv.Get(ctxT(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return instlease.Row{}, false
	}
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	r, err := instlease.DecodeRow(ent.Value())
	if err != nil {
		t.Fatalf("row at %s: %v (%q)", key, err, ent.Value())
	}
	return r, true
}

func TestInstanceLease(t *testing.T) {
	e := newEnv(t)
	rootA, rootB := t.TempDir(), t.TempDir()

	t.Run("ok/provisioned-bucket-upstream-row-renew-release", func(t *testing.T) {
		inst := id("provisioned")
		l := acquire(t, e.cfg(t, full, inst, rootA))
		if l.TTL() != provision.ManagerLeaseTTL || l.RenewInterval() != 2500*time.Millisecond {
			t.Fatalf("TTL %v, renew every %v; want 10s and 2.5s", l.TTL(), l.RenewInterval())
		}
		kv := e.kv(t, full)
		ent, err := kv.Get(ctxT(t), "lease."+inst)
		if err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		if err := json.Unmarshal(ent.Value(), &raw); err != nil {
			t.Fatal(err)
		}
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range raw {
				if !yield(k) {
					return
				}
			}
		})
		if want := []string{"holder", "instanceId", "pid", "root", "runtime", "since"}; !slices.Equal(keys, want) {
			t.Fatalf("row fields %v, want upstream's %v", keys, want)
		}
		if raw["holder"] != "local.mgr" || raw["instanceId"] != inst || raw["runtime"] != "pty" || raw["root"] != rootA || raw["pid"] != float64(os.Getpid()) {
			t.Fatalf("row %s", ent.Value())
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
		if ent2, _ := kv.Get(ctxT(t), "lease."+inst); ent2 == nil || ent2.Revision() <= ent.Revision() {
			t.Fatal("Renew did not rewrite the row")
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if _, ok := rowAt(t, kv, "lease."+inst); ok {
			t.Fatal("row still there after Release")
		}
		// Another instance id is another key: two instances coexist.
		a := acquire(t, e.cfg(t, full, id("one"), rootA))
		b := acquire(t, e.cfg(t, full, id("two"), rootA))
		if a.Row().InstanceID == b.Row().InstanceID {
			t.Fatal("two instances share a key")
		}
	})

	t.Run("fail/double-start-live-in-this-process", func(t *testing.T) {
		inst := id("double")
		acquire(t, e.cfg(t, short, inst, rootA))
		_, err := instlease.Acquire(ctxT(t), e.cfg(t, short, inst, rootA))
		var held *instlease.LeaseHeld
		if !errors.As(err, &held) || !held.SameRoot || held.Row.PID != os.Getpid() || held.Row.Root != rootA || !strings.Contains(err.Error(), "already serves from this root") {
			t.Fatalf("second Acquire = %v; want LeaseHeld on this root naming this pid", err)
		}
	})

	t.Run("fail/holder-on-another-root", func(t *testing.T) {
		inst := id("otherroot")
		acquire(t, e.cfg(t, short, inst, rootA))
		_, err := instlease.Acquire(ctxT(t), e.cfg(t, short, inst, rootB))
		var held *instlease.LeaseHeld
		if !errors.As(err, &held) || held.SameRoot || held.Row.Root != rootA || !strings.Contains(err.Error(), "another root") {
			t.Fatalf("Acquire from another root = %v; want LeaseHeld, other root %s", err, rootA)
		}
	})

	t.Run("fail/dead-holder-on-another-root-is-still-held", func(t *testing.T) {
		// A pid means nothing across roots: a row from another root is refused even when its
		// pid is not a process here.
		inst := id("deadother")
		dead := deadPID(t)
		kv := e.kv(t, short)
		putRow(t, kv, instlease.Row{Holder: "local.old", InstanceID: inst, Runtime: "pty", Root: rootB, PID: dead, Since: 1})
		_, err := instlease.Acquire(ctxT(t), e.cfg(t, short, inst, rootA))
		var held *instlease.LeaseHeld
		if !errors.As(err, &held) || held.SameRoot || held.Row.PID != dead {
			t.Fatalf("Acquire = %v; want LeaseHeld, other root", err)
		}
	})

	t.Run("ok/kill-9-then-restart-waits-out-the-old-key", func(t *testing.T) {
		inst := id("killed")
		child := e.startChild(t, inst, rootA)
		// Double start against a live process on this root: refused, naming it.
		_, err := instlease.Acquire(ctxT(t), e.cfg(t, short, inst, rootA))
		var held *instlease.LeaseHeld
		if !errors.As(err, &held) || !held.SameRoot || held.Row.PID != child.Process.Pid || held.Row.Holder != "local.child" {
			t.Fatalf("Acquire beside a live child = %v; want LeaseHeld naming pid %d", err, child.Process.Pid)
		}
		if err := child.Process.Signal(os.Kill); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait() // reap: a zombie would still be in /proc
		kv := e.kv(t, short)
		if r, ok := rowAt(t, kv, "lease."+inst); !ok || r.PID != child.Process.Pid {
			t.Fatalf("the killed child's row is not there (%v, %+v): the restart would not wait", ok, r)
		}
		var logs testkit.SyncBuffer
		cfg := e.cfg(t, short, inst, rootA)
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		l, err := instlease.Acquire(ctxT(t), cfg)
		if err != nil {
			t.Fatalf("restart after kill -9 = %v; want it to wait out the old key\n%s", err, logs.String())
		}
		if !strings.Contains(logs.String(), "waiting for a dead predecessor") || !strings.Contains(logs.String(), "pid="+strconv.Itoa(child.Process.Pid)) {
			t.Fatalf("the restart did not wait for the dead child's row:\n%s", logs.String())
		}
		if r, ok := rowAt(t, kv, "lease."+inst); !ok || r != l.Row() || r.PID != os.Getpid() {
			t.Fatalf("row after the restart = %+v, %v; want ours", r, ok)
		}
	})

	t.Run("ok/own-earlier-start-waits", func(t *testing.T) {
		// A row of this very process that no live lease holds (an earlier start whose release
		// failed) is a dead predecessor: wait for it, do not refuse.
		inst := id("ownearlier")
		kv := e.kv(t, short)
		putRow(t, kv, instlease.Row{Holder: "local.mgr", InstanceID: inst, Runtime: "pty", Root: rootA, PID: os.Getpid(), Since: 1})
		l := acquire(t, e.cfg(t, short, inst, rootA))
		if r, _ := rowAt(t, kv, "lease."+inst); r != l.Row() || r.Since == 1 {
			t.Fatalf("row = %+v; want the new start's", r)
		}
	})

	t.Run("fail/wait-cancelled-by-ctx", func(t *testing.T) {
		// The wait for a dead predecessor's row ends with ctx: cancelled once the wait is logged.
		inst := id("cancelled")
		putRow(t, e.kv(t, short), instlease.Row{Holder: "local.mgr", InstanceID: inst, Runtime: "pty", Root: rootA, PID: deadPID(t), Since: 1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := e.cfg(t, short, inst, rootA)
		cfg.Logger = slog.New(slog.NewTextHandler(cancelOn{"waiting for a dead predecessor", cancel}, nil))
		_, err := instlease.Acquire(ctx, cfg)
		var held *instlease.LeaseHeld
		if !errors.Is(err, context.Canceled) || errors.As(err, &held) || !strings.Contains(err.Error(), "to expire") {
			t.Fatalf("Acquire cancelled while waiting = %v; want context.Canceled from the wait", err)
		}
	})

	t.Run("fail/unreadable-lease-permission", func(t *testing.T) {
		cfg := e.cfg(t, short, id("noperm"), rootA)
		cfg.Conn = e.conn(t, short, signerv1.Profile_PROFILE_PROBE, nil)
		cfg.OpTimeout = time.Second
		_, err := instlease.Acquire(ctxT(t), cfg)
		var pe *lease.PermissionError
		var held *instlease.LeaseHeld
		if !errors.As(err, &pe) || errors.As(err, &held) || !strings.Contains(err.Error(), "Permissions Violation") || !strings.Contains(err.Error(), "refused this credential") {
			t.Fatalf("Acquire with a probe credential = %v; want a permission error, not LeaseHeld", err)
		}
	})

	t.Run("fail/unwritable-lease-permission", func(t *testing.T) {
		// The provisioner may read the bucket's configuration but not write a lease key: the
		// refused create is a permission error, not a holder.
		cfg := e.cfg(t, short, id("nowrite"), rootA)
		cfg.Conn = e.conn(t, short, signerv1.Profile_PROFILE_PROVISIONER, nil)
		cfg.OpTimeout = time.Second
		_, err := instlease.Acquire(ctxT(t), cfg)
		var pe *lease.PermissionError
		var held *instlease.LeaseHeld
		if !errors.As(err, &pe) || errors.As(err, &held) || !strings.Contains(err.Error(), "Permissions Violation for Publish") || !strings.Contains(err.Error(), "lease."+id("nowrite")) {
			t.Fatalf("Acquire with a provisioner credential = %v; want a permission error on the lease key", err)
		}
	})

	t.Run("fail/broker-unreachable-is-unknown-not-held", func(t *testing.T) {
		cfg := e.cfg(t, short, id("unreachable"), rootA)
		cfg.OpTimeout = time.Second
		l := acquire(t, cfg)
		cfg.Conn.Close()
		st, err := l.Renew(ctxT(t))
		var held *instlease.LeaseHeld
		if st != lease.Unknown || err == nil || errors.As(err, &held) || !strings.Contains(err.Error(), "could not be read") {
			t.Fatalf("Renew without a broker = %v, %v; want unknown, a plain error", st, err)
		}
		if l.State() != lease.Unknown {
			t.Fatalf("State = %v", l.State())
		}
		if err := l.Release(ctxT(t)); err == nil || !strings.Contains(err.Error(), "left to the TTL") {
			t.Fatalf("Release without a broker = %v; want 'left to the TTL'", err)
		}
	})

	t.Run("fail/missing-bucket-then-bucket-without-ttl", func(t *testing.T) {
		_, err := instlease.Acquire(ctxT(t), e.cfg(t, bare, id("bare"), rootA))
		if err == nil || !strings.Contains(err.Error(), "cotal_manager_gamma does not exist") {
			t.Fatalf("Acquire without a bucket = %v", err)
		}
		plan, err := provision.Plan(names(t, bare))
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(plan, func(it provision.Item) bool { return it.Name == "cotal_manager_gamma" })
		cfg := plan[i].Config
		cfg.MaxAge, cfg.Duplicates = 0, 2*time.Minute
		js, err := jetstream.New(e.conn(t, bare, signerv1.Profile_PROFILE_PROVISIONER, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctxT(t), cfg); err != nil {
			t.Fatal(err)
		}
		// A row that never expires would make a dead predecessor's wait unbounded: refused.
		if _, err := instlease.Acquire(ctxT(t), e.cfg(t, bare, id("bare"), rootA)); !errors.Is(err, lease.ErrNoTTL) {
			t.Fatalf("Acquire on a bucket without max_age = %v; want ErrNoTTL", err)
		}
	})

	t.Run("fail/corrupt-row-named", func(t *testing.T) {
		kv := e.kv(t, short)
		for _, tc := range []struct{ name, value, want string }{
			{"not-json", "garbage", "not a manager lease row"},
			{"unknown-field", `{"holder":"h","instanceId":"%s","runtime":"pty","root":"/r","pid":1,"since":1,"ready":true}`, "not a manager lease row"},
			{"other-instance", `{"holder":"h","instanceId":"` + id("someoneelse") + `","runtime":"pty","root":"/r","pid":1,"since":1}`, "holds a row of instance"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				inst := id("corrupt" + strings.ReplaceAll(tc.name, "-", ""))
				v := tc.value
				if strings.Contains(v, "%s") {
					v = fmt.Sprintf(v, inst)
				}
				if _, err := kv.Put(ctxT(t), "lease."+inst, []byte(v)); err != nil {
					t.Fatal(err)
				}
				_, err := instlease.Acquire(ctxT(t), e.cfg(t, short, inst, rootA))
				var held *instlease.LeaseHeld
				if err == nil || errors.As(err, &held) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "cotal_manager_alpha/lease."+inst) {
					t.Fatalf("Acquire over %s = %v; want a plain error naming the key", tc.name, err)
				}
			})
		}
	})

	t.Run("ok/deleted-key-re-put-on-renew", func(t *testing.T) {
		inst := id("deleted")
		l := acquire(t, e.cfg(t, short, inst, rootA))
		kv := e.kv(t, short)
		if err := kv.Delete(ctxT(t), "lease."+inst); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew after delete = %v, %v; want held (re-put)", st, err)
		}
		if r, ok := rowAt(t, kv, "lease."+inst); !ok || r != l.Row() {
			t.Fatalf("row after re-put = %+v, %v", r, ok)
		}
		// The renew loop does the same by itself.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		if err := kv.Delete(ctxT(t), "lease."+inst); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if r, ok := rowAt(t, kv, "lease."+inst); !ok || r != l.Row() {
				return errors.New("not re-put yet")
			}
			return nil
		})
	})

	t.Run("ok/stopped-lease-never-re-put", func(t *testing.T) {
		inst := id("stopped")
		l := acquire(t, e.cfg(t, short, inst, rootA))
		done := make(chan error, 1)
		go func() { done <- l.Run(context.Background()) }()
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after Release")
		}
		kv := e.kv(t, short)
		if _, ok := rowAt(t, kv, "lease."+inst); ok {
			t.Fatal("row there after Release")
		}
		if st, err := l.Renew(ctxT(t)); !errors.Is(err, instlease.ErrStopping) || st != lease.Gone {
			t.Fatalf("Renew after Release = %v, %v; want ErrStopping", st, err)
		}
		if _, ok := rowAt(t, kv, "lease."+inst); ok {
			t.Fatal("a stopping lease put its row again")
		}
		// Released, the key is free for the next start at once.
		acquire(t, e.cfg(t, short, inst, rootA))
	})

	t.Run("ok/release-never-deletes-anothers-row", func(t *testing.T) {
		inst := id("successor")
		a := acquire(t, e.cfg(t, short, inst, rootA))
		kv := e.kv(t, short)
		if err := kv.Delete(ctxT(t), "lease."+inst); err != nil {
			t.Fatal(err)
		}
		b := acquire(t, e.cfg(t, short, inst, rootB))
		st, err := a.Renew(ctxT(t))
		var held *instlease.LeaseHeld
		if st != lease.Taken || !errors.As(err, &held) || held.Row.Root != rootB {
			t.Fatalf("Renew of the displaced lease = %v, %v; want taken by root %s", st, err, rootB)
		}
		if r, _ := rowAt(t, kv, "lease."+inst); r != b.Row() {
			t.Fatalf("a taken renew overwrote the successor's row: %+v", r)
		}
		if err := a.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if r, ok := rowAt(t, kv, "lease."+inst); !ok || r != b.Row() {
			t.Fatalf("Release deleted the successor's row: %+v, %v", r, ok)
		}
	})
}

// cancelOn cancels when a log line holds its text.
type cancelOn struct {
	text   string
	cancel context.CancelFunc
}

func (c cancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.text) {
		c.cancel()
	}
	return len(p), nil
}

// putRow writes a row on its key as a predecessor would have.
func putRow(t *testing.T, kv jetstream.KeyValue, r instlease.Row) {
	t.Helper()
	b, err := lifecycle.EncodeManagerLease(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctxT(t), "lease."+r.InstanceID, b); err != nil {
		t.Fatal(err)
	}
}

// deadPID is the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if instlease.ProcAlive(cmd.Process.Pid) {
		t.Fatalf("pid %d still alive after it was reaped", cmd.Process.Pid)
	}
	return cmd.Process.Pid
}

// startChild re-executes the test binary as a process holding the lease on a signerd-minted
// supervisor credential written to a 0600 creds file, and returns once it says it holds it.
func (e *env) startChild(t *testing.T, inst, root string) *exec.Cmd {
	t.Helper()
	tok, kp := e.mint(t, short, signerv1.Profile_PROFILE_SUPERVISOR, supervisorParams)
	pub, _ := kp.PublicKey()
	cmd, said := testkit.StartChild(t, 20*time.Second, childEnv+"=1", "URL="+e.url, "CREDS="+testkit.WriteCredsFile(t, tok, kp),
		"INBOX=_INBOX_"+pub, "ID="+inst, "ROOT="+root)
	if said != "held "+strconv.Itoa(cmd.Process.Pid) {
		t.Fatalf("child said %q, want it to hold the lease", said)
	}
	return cmd
}

// TestSetRegistration: the row rewritten with a registration is what renewals write and what
// Release compares (and deletes); after Release nothing is written.
func TestSetRegistration(t *testing.T) {
	e := newEnv(t)
	inst := id("registered")
	l := acquire(t, e.cfg(t, full, inst, t.TempDir()))
	kv := e.kv(t, full)
	before, _ := rowAt(t, kv, "lease."+inst)
	if before.Registered() {
		t.Fatalf("a fresh row records a registration: %+v", before)
	}
	if err := l.SetRegistration(ctxT(t), 0, 7); err != nil {
		t.Fatal(err)
	}
	want := before
	want.RegistrationRevision = 7
	if r, ok := rowAt(t, kv, "lease."+inst); !ok || r != want || l.Row() != want {
		t.Fatalf("row after SetRegistration = %+v (found %v), Row() = %+v; want %+v", r, ok, l.Row(), want)
	}
	if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
		t.Fatalf("Renew = %v, %v", st, err)
	}
	if err := l.SetRegistration(ctxT(t), 1, 9); err != nil {
		t.Fatal(err)
	}
	want.ProcessEpoch, want.RegistrationRevision = 1, 9
	if r, _ := rowAt(t, kv, "lease."+inst); r != want {
		t.Fatalf("row after the second SetRegistration = %+v, want %+v", r, want)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if r, ok := rowAt(t, kv, "lease."+inst); ok {
		t.Fatalf("Release left the rewritten row: %+v", r)
	}
	if err := l.SetRegistration(ctxT(t), 2, 11); !errors.Is(err, instlease.ErrStopping) {
		t.Fatalf("SetRegistration after Release = %v, want ErrStopping", err)
	}
	if _, ok := rowAt(t, kv, "lease."+inst); ok {
		t.Fatal("SetRegistration after Release wrote a row")
	}
}
