package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

const sp = "leasespace"

// fullUser connects as a data-account user with no permission limits: the lease mechanism is
// tested apart from any profile (pkg/profiles proves the auth-plane profile can do exactly what
// a claim needs).
func fullUser(t *testing.T, b *testkit.Broker) *nats.Conn {
	t.Helper()
	tok, kp := b.Space(sp).MintUnlimited(t)
	nc, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type env struct {
	b      *testkit.Broker
	bucket string
	kv     jetstream.KeyValue
}

func setup(t *testing.T, ttl time.Duration) env {
	return setupCfg(t, jetstream.KeyValueConfig{TTL: ttl})
}

// setupKeyTTL makes the bucket the way pkg/provision makes cotal_auth_<space>: no max_age,
// per-key TTLs on.
func setupKeyTTL(t *testing.T) env {
	return setupCfg(t, jetstream.KeyValueConfig{LimitMarkerTTL: time.Hour})
}

func setupCfg(t *testing.T, cfg jetstream.KeyValueConfig) env {
	t.Helper()
	b := testkit.StartBroker(t, sp)
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	bucket, _ := n.Bucket(space.Auth)
	js, err := jetstream.New(fullUser(t, b))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bucket = bucket
	kv, err := js.CreateKeyValue(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env{b: b, bucket: bucket, kv: kv}
}

func (e env) acquire(t *testing.T, holder string) (*lease.Lease, error) {
	t.Helper()
	return lease.Acquire(ctxT(t), lease.Config{Conn: fullUser(t, e.b), Bucket: e.bucket, Key: "plane", Holder: holder, OpTimeout: 2 * time.Second})
}

func mustAcquire(t *testing.T, e env, holder string) *lease.Lease {
	t.Helper()
	l, err := e.acquire(t, holder)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", holder, err)
	}
	return l
}

func TestLease(t *testing.T) {
	t.Run("ok/acquire-ready-renew-release", func(t *testing.T) {
		e := setup(t, time.Minute)
		before := time.Now()
		l := mustAcquire(t, e, "one")
		created := l.LastWritten()
		if created.Before(before) {
			t.Fatalf("LastWritten after acquire = %v, want after %v", created, before)
		}
		ent, err := e.kv.Get(ctxT(t), "plane")
		if err != nil || !strings.Contains(string(ent.Value()), `"holder":"one"`) || !strings.Contains(string(ent.Value()), `"ready":false`) {
			t.Fatalf("row after acquire: %v %s", err, ent.Value())
		}
		if err := l.SetReady(ctxT(t), true); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
		if !l.LastWritten().After(created) {
			t.Fatalf("LastWritten did not advance with the renewal: %v, created %v", l.LastWritten(), created)
		}
		ent, _ = e.kv.Get(ctxT(t), "plane")
		if !strings.Contains(string(ent.Value()), `"ready":true`) {
			t.Fatalf("renew lost ready: %s", ent.Value())
		}
		if l.RenewInterval() != 30*time.Second {
			t.Fatalf("RenewInterval = %v, want half the TTL", l.RenewInterval())
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.kv.Get(ctxT(t), "plane"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("row after release: %v", err)
		}
		if st, err := l.Renew(ctxT(t)); !errors.Is(err, lease.ErrNotHeld) || st != lease.Gone {
			t.Fatalf("Renew after Release = %v, %v", st, err)
		}
		mustAcquire(t, e, "two") // the released key is free at once
	})
	t.Run("fail/second-holder-named", func(t *testing.T) {
		e := setup(t, time.Minute)
		one := mustAcquire(t, e, "authd host-a pid 1")
		_, err := e.acquire(t, "authd host-b pid 2")
		var he *lease.HeldError
		if !errors.As(err, &he) || he.Row.Holder != "authd host-a pid 1" || he.Row.Incarnation != one.Row().Incarnation || !strings.Contains(err.Error(), `"authd host-a pid 1"`) {
			t.Fatalf("second Acquire = %v; want a HeldError naming the first holder", err)
		}
		// The same holder name with a new incarnation (a restart) is refused too.
		if _, err := e.acquire(t, "authd host-a pid 1"); !errors.As(err, &he) {
			t.Fatalf("restart Acquire = %v; want HeldError", err)
		}
	})
	t.Run("fail/taken-release-leaves-successor", func(t *testing.T) {
		e := setup(t, time.Minute)
		one := mustAcquire(t, e, "one")
		if err := e.kv.Delete(ctxT(t), "plane"); err != nil {
			t.Fatal(err)
		}
		two := mustAcquire(t, e, "two")
		st, err := one.Renew(ctxT(t))
		var he *lease.HeldError
		if st != lease.Taken || !errors.As(err, &he) || he.Row.Holder != "two" {
			t.Fatalf("Renew = %v, %v; want taken by two", st, err)
		}
		if err := one.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		ent, err := e.kv.Get(ctxT(t), "plane")
		if err != nil || !strings.Contains(string(ent.Value()), two.Row().Incarnation) {
			t.Fatalf("Release deleted the successor's row: %v", err)
		}
	})
	t.Run("ok/gone-then-reacquire", func(t *testing.T) {
		e := setup(t, time.Minute)
		l := mustAcquire(t, e, "one")
		if err := e.kv.Delete(ctxT(t), "plane"); err != nil {
			t.Fatal(err)
		}
		if st, _ := l.Renew(ctxT(t)); st != lease.Gone {
			t.Fatalf("Renew = %v, want gone", st)
		}
		if err := l.Reacquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew after Reacquire = %v, %v", st, err)
		}
	})
	t.Run("ok/held-after-foreign-rewrite-of-own-row", func(t *testing.T) {
		// Our own row rewritten (same holder and incarnation) moves the revision: the CAS fails,
		// the re-read proves the row ours, and Renew adopts the broker's revision.
		e := setup(t, time.Minute)
		l := mustAcquire(t, e, "one")
		ent, _ := e.kv.Get(ctxT(t), "plane")
		if _, err := e.kv.Put(ctxT(t), "plane", ent.Value()); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
	})
	t.Run("ok/expired-claim-is-free", func(t *testing.T) {
		e := setup(t, time.Second)
		mustAcquire(t, e, "crashed")
		var err error
		testkit.Eventually(t, 10*time.Second, func() error {
			_, err = e.acquire(t, "successor")
			return err
		})
	})
	t.Run("ok/per-key-ttl-bucket", func(t *testing.T) {
		e := setupKeyTTL(t)
		l, err := lease.Acquire(ctxT(t), lease.Config{Conn: fullUser(t, e.b), Bucket: e.bucket, Key: "plane", Holder: "one", KeyTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL() != time.Second {
			t.Fatalf("TTL = %v", l.TTL())
		}
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
		if _, err := e.acquire(t, "two"); err == nil {
			t.Fatal("a live per-key claim was taken")
		}
		// Renewed rows carry the TTL too: with no more renewals the claim expires.
		testkit.Eventually(t, 10*time.Second, func() error {
			_, err := e.acquire(t, "successor")
			return err
		})
		if st, _ := l.Renew(ctxT(t)); st != lease.Taken {
			t.Fatalf("Renew after expiry and takeover = %v, want taken", st)
		}
	})
	t.Run("fail/unknown-when-broker-unreachable", func(t *testing.T) {
		e := setup(t, time.Minute)
		nc := fullUser(t, e.b)
		l, err := lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: e.bucket, Key: "plane", Holder: "one", OpTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		if st, err := l.Renew(ctxT(t)); st != lease.Unknown || err == nil {
			t.Fatalf("Renew = %v, %v; want unknown", st, err)
		}
		if err := l.Release(ctxT(t)); err == nil || !strings.Contains(err.Error(), "TTL") {
			t.Fatalf("Release = %v; want 'left to the TTL'", err)
		}
	})
	t.Run("ok/failed-release-retried", func(t *testing.T) {
		e := setup(t, time.Minute)
		l := mustAcquire(t, e, "one")
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		if err := l.Release(gone); err == nil || !strings.Contains(err.Error(), "TTL") {
			t.Fatalf("Release(canceled) = %v; want 'left to the TTL'", err)
		}
		if _, err := e.kv.Get(ctxT(t), "plane"); err != nil {
			t.Fatalf("row after the failed release: %v", err)
		}
		if st, err := l.Renew(ctxT(t)); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Renew after a failed Release = %v, %v; want ErrNotHeld", st, err)
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatalf("Release retried: %v", err)
		}
		if _, err := e.kv.Get(ctxT(t), "plane"); !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
			t.Fatalf("row after the retried release: %v", err)
		}
	})
	t.Run("fail/no-ttl", func(t *testing.T) {
		e := setup(t, 0)
		if _, err := e.acquire(t, "one"); !errors.Is(err, lease.ErrNoTTL) {
			t.Fatalf("Acquire = %v, want ErrNoTTL", err)
		}
	})
	t.Run("fail/missing-bucket", func(t *testing.T) {
		b := testkit.StartBroker(t, sp)
		_, err := lease.Acquire(ctxT(t), lease.Config{Conn: fullUser(t, b), Bucket: "cotal_auth_nope", Key: "plane", Holder: "one"})
		if err == nil || !strings.Contains(err.Error(), "cotal_auth_nope does not exist") {
			t.Fatalf("Acquire = %v", err)
		}
	})
	t.Run("fail/permission-reported-as-such", func(t *testing.T) {
		e := setup(t, time.Minute)
		tok, kp := e.b.Space(sp).MintUser(t, profiles.Probe, profiles.Params{}, 0)
		nc, err := e.b.Connect(t, tok, kp)
		if err != nil {
			t.Fatal(err)
		}
		_, err = lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: e.bucket, Key: "plane", Holder: "one", OpTimeout: time.Second})
		var pe *lease.PermissionError
		var he *lease.HeldError
		if !errors.As(err, &pe) || errors.As(err, &he) || !strings.Contains(err.Error(), "Permissions Violation") {
			t.Fatalf("Acquire as probe = %v; want a PermissionError", err)
		}
	})
}

// TestFence: the fence is the send time of the last write the broker stored, plus the TTL, less
// the margin; only a stored write moves it, and a released claim is fenced.
func TestFence(t *testing.T) {
	t.Run("ok/follows-stored-writes-on-the-injected-clock", func(t *testing.T) {
		e := setup(t, 30*time.Second)
		clk := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		nc := fullUser(t, e.b)
		l, err := lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: e.bucket, Key: "plane", Holder: "one", OpTimeout: time.Second, Clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		if l.Margin() != 3*time.Second {
			t.Fatalf("Margin = %v, want a tenth of the 30s TTL", l.Margin())
		}
		t0 := clk.Now()
		if want := t0.Add(27 * time.Second); !l.Fence().Equal(want) || !l.LastWritten().Equal(t0) {
			t.Fatalf("after Acquire: Fence %v LastWritten %v; want %v and %v", l.Fence(), l.LastWritten(), want, t0)
		}
		clk.Add(27*time.Second - time.Nanosecond)
		if l.Fenced() {
			t.Fatal("fenced before the fence")
		}
		clk.Add(time.Nanosecond)
		if !l.Fenced() {
			t.Fatal("not fenced at the fence")
		}
		// A renewal that the broker stores moves the fence from its send time.
		if st, err := l.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
		t1 := clk.Now()
		if want := t1.Add(27 * time.Second); !l.Fence().Equal(want) || l.Fenced() {
			t.Fatalf("after Renew: Fence %v (fenced %v); want %v", l.Fence(), l.Fenced(), want)
		}
		// A renewal that fails leaves it.
		nc.Close()
		clk.Add(10 * time.Second)
		if st, _ := l.Renew(ctxT(t)); st != lease.Unknown {
			t.Fatalf("Renew on a closed connection = %v", st)
		}
		if !l.Fence().Equal(t1.Add(27 * time.Second)) {
			t.Fatalf("a failed renewal moved the fence to %v", l.Fence())
		}
		_ = l.Release(ctxT(t))
		if !l.Fenced() || !l.Fence().IsZero() {
			t.Fatalf("after Release: Fenced %v Fence %v; want fenced", l.Fenced(), l.Fence())
		}
	})
	t.Run("ok/margin-bounds", func(t *testing.T) {
		for _, tc := range []struct {
			ttl, want time.Duration
		}{{time.Second, 100 * time.Millisecond}, {2 * time.Second, 200 * time.Millisecond}, {time.Minute, 5 * time.Second}} {
			e := setup(t, tc.ttl)
			if m := mustAcquire(t, e, "one").Margin(); m != tc.want {
				t.Fatalf("TTL %v: Margin %v, want %v", tc.ttl, m, tc.want)
			}
		}
	})
	for _, tc := range []struct {
		name string
		env  func(*testing.T) env
	}{
		{"fail/fenced-before-a-successor-acquires/max-age", func(t *testing.T) env { return setup(t, time.Second) }},
		{"fail/fenced-before-a-successor-acquires/per-key-ttl", setupKeyTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The holder stops renewing; a successor tries to acquire as fast as it can. The
			// holder's fence must fall before the successor holds the key, on the real broker's
			// expiry.
			e := tc.env(t)
			l, err := lease.Acquire(ctxT(t), lease.Config{Conn: fullUser(t, e.b), Bucket: e.bucket, Key: "plane", Holder: "old", KeyTTL: time.Second, OpTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if l.Fenced() {
				t.Fatal("fenced right after Acquire")
			}
			succ := fullUser(t, e.b)
			fencedFirst := false
			testkit.Eventually(t, 10*time.Second, func() error {
				fenced := l.Fenced() // read before the attempt: the successor's success comes after
				if _, err := lease.Acquire(ctxT(t), lease.Config{Conn: succ, Bucket: e.bucket, Key: "plane", Holder: "successor", KeyTTL: time.Second, OpTimeout: 2 * time.Second}); err != nil {
					return err
				}
				fencedFirst = fenced
				return nil
			})
			if !fencedFirst {
				t.Fatalf("a successor acquired while the old holder was not fenced (fence %v)", l.Fence())
			}
		})
	}
}

// TestReclaim: Config.Reclaim lets Acquire take a live row only on its nil, only by a
// compare-and-set at the revision it read before asking, and with the row's TTL kept.
func TestReclaim(t *testing.T) {
	reclaimCfg := func(e env, holder string, ask func(context.Context, lease.Row) error) lease.Config {
		return lease.Config{Conn: fullUser(t, e.b), Bucket: e.bucket, Key: "plane", Holder: holder, KeyTTL: time.Minute,
			Instance: "inst-" + holder, User: "U-" + holder, ConnName: "conn-" + holder, Reclaim: ask}
	}
	t.Run("ok/taken-at-read-revision-keeping-the-ttl", func(t *testing.T) {
		e := setupKeyTTL(t)
		one, err := lease.Acquire(ctxT(t), reclaimCfg(e, "one", nil))
		if err != nil {
			t.Fatal(err)
		}
		var asked lease.Row
		cfg := reclaimCfg(e, "two", func(_ context.Context, held lease.Row) error { asked = held; return nil })
		cfg.KeyTTL = time.Second
		two, err := lease.Acquire(ctxT(t), cfg)
		if err != nil {
			t.Fatalf("reclaim Acquire = %v", err)
		}
		if asked.Incarnation != one.Row().Incarnation || asked.Instance != "inst-one" || asked.User != "U-one" || asked.Conn != "conn-one" {
			t.Fatalf("Reclaim was asked about %+v, want one's row with its instance, user and conn", asked)
		}
		if r := two.Reclaimed(); r == nil || r.Incarnation != one.Row().Incarnation {
			t.Fatalf("Reclaimed = %v, want one's row", r)
		}
		if st, _ := one.Renew(ctxT(t)); st != lease.Taken {
			t.Fatalf("the replaced holder's Renew = %v, want taken", st)
		}
		// The reclaiming write carried the TTL: left alone, it expires.
		testkit.Eventually(t, 10*time.Second, func() error {
			_, err := e.acquire(t, "three")
			return err
		})
	})
	t.Run("fail/refused-leaves-the-row", func(t *testing.T) {
		e := setupKeyTTL(t)
		one, err := lease.Acquire(ctxT(t), reclaimCfg(e, "one", nil))
		if err != nil {
			t.Fatal(err)
		}
		why := errors.New("holder still connected")
		_, err = lease.Acquire(ctxT(t), reclaimCfg(e, "two", func(context.Context, lease.Row) error { return why }))
		var he *lease.HeldError
		if !errors.As(err, &he) || !errors.Is(err, why) || he.Row.Incarnation != one.Row().Incarnation || he.Details()["reclaim"] != why.Error() || he.Details()["instance"] != "inst-one" {
			t.Fatalf("Acquire = %v; want a HeldError carrying the refusal", err)
		}
		if st, err := one.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("holder's Renew = %v, %v; want held", st, err)
		}
	})
	t.Run("fail/holder-wrote-during-the-sweep", func(t *testing.T) {
		e := setupKeyTTL(t)
		one, err := lease.Acquire(ctxT(t), reclaimCfg(e, "one", nil))
		if err != nil {
			t.Fatal(err)
		}
		_, err = lease.Acquire(ctxT(t), reclaimCfg(e, "two", func(ctx context.Context, _ lease.Row) error {
			if st, err := one.Renew(ctx); st != lease.Held {
				t.Errorf("holder's Renew = %v, %v", st, err)
			}
			return nil // a sweep that wrongly concluded: the CAS must still lose
		}))
		var he *lease.HeldError
		if !errors.As(err, &he) || he.Reclaim == nil || !strings.Contains(he.Reclaim.Error(), "compare-and-set") {
			t.Fatalf("Acquire = %v; want a HeldError for the lost compare-and-set", err)
		}
		if st, err := one.Renew(ctxT(t)); st != lease.Held || err != nil {
			t.Fatalf("holder's Renew = %v, %v; want held", st, err)
		}
	})
	t.Run("ok/reacquire-never-reclaims", func(t *testing.T) {
		e := setupKeyTTL(t)
		asked := 0
		one, err := lease.Acquire(ctxT(t), reclaimCfg(e, "one", func(context.Context, lease.Row) error { asked++; return nil }))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.kv.Delete(ctxT(t), "plane"); err != nil {
			t.Fatal(err)
		}
		if _, err := lease.Acquire(ctxT(t), reclaimCfg(e, "two", nil)); err != nil {
			t.Fatal(err)
		}
		var he *lease.HeldError
		if err := one.Reacquire(ctxT(t)); !errors.As(err, &he) || he.Row.Holder != "two" || asked != 0 {
			t.Fatalf("Reacquire = %v (asked %d); want a HeldError naming two, Reclaim never asked", err, asked)
		}
	})
}
