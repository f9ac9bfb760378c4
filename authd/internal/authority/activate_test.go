package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

const testOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// rig is an Authority on a provisioned space whose plane check the test controls: held says
// whether the claim is held, and onHeld (if set) runs at every check (before every write).
type rig struct {
	a      *Authority
	s      *Store
	sp     *authoritytest.Space
	lost   atomic.Bool
	mu     sync.Mutex
	onHeld func()
}

func newRig(t *testing.T) *rig {
	t.Helper()
	sp := authoritytest.Provisioned(t, testSpace)
	s, err := NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{s: s, sp: sp}
	r.a = testAuthority(t, s, func(c *Config) { c.Account, c.Held = sp.Account, r.held })
	return r
}

func (r *rig) held() error {
	r.mu.Lock()
	f := r.onHeld
	r.mu.Unlock()
	if f != nil {
		f()
	}
	if r.lost.Load() {
		return errors.New("plane claim lost (test)")
	}
	return nil
}

func (r *rig) setOnHeld(f func()) {
	r.mu.Lock()
	r.onHeld = f
	r.mu.Unlock()
}

// uidN is a distinct lifecycle uid per n.
func uidN(n int) string { return fmt.Sprintf("%026d", n) }

func retireOp(t *testing.T, uid string) *lifecycle.Op {
	t.Helper()
	id, err := lifecycle.ManagedRetirementOpID(uid)
	if err != nil {
		t.Fatal(err)
	}
	return &lifecycle.Op{OpID: id, Kind: lifecycle.OpRetirement}
}

// putHead, putGate and putReservation write a row as an earlier run (or another operation)
// would have left it, by create or by update at the current revision.
func (r *rig) putHead(t *testing.T, h lifecycle.Head) uint64 {
	t.Helper()
	b, err := lifecycle.EncodeHead(h)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := lifecycle.HeadKey(h.Owner, h.Actor)
	return r.put(t, space.Records, key, b)
}

func (r *rig) putGate(t *testing.T, g lifecycle.Gate) uint64 {
	t.Helper()
	b, err := lifecycle.EncodeGate(g)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := lifecycle.GateKey(g.LifecycleUID)
	return r.put(t, space.Auth, key, b)
}

func (r *rig) putReservation(t *testing.T, uid string, res lifecycle.Reservation) uint64 {
	t.Helper()
	b, err := lifecycle.EncodeReservation(res)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := lifecycle.UIDKey(uid)
	return r.put(t, space.Records, key, b)
}

func (r *rig) put(t *testing.T, kind space.BucketKind, key string, b []byte) uint64 {
	t.Helper()
	ctx := context.Background()
	e, ok, err := r.s.GetRaw(ctx, kind, key)
	if err != nil {
		t.Fatal(err)
	}
	var rev uint64
	if ok {
		rev, err = r.s.Update(ctx, kind, key, b, e.Revision)
	} else {
		rev, err = r.s.Create(ctx, kind, key, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// wantActive checks the end state of an activation of actor at uid: reservation for the alias,
// head active at uid at epoch 1 by this authd, gate open at generation 1; and the result's
// revisions are the rows'.
func (r *rig) wantActive(t *testing.T, actor, uid string, res ActivateResult) {
	t.Helper()
	ctx := context.Background()
	rv, _, ok, err := r.s.Reservation(ctx, uid)
	if err != nil || !ok || rv.Owner != testOwner || rv.Actor != actor {
		t.Fatalf("reservation = %+v found %v err %v", rv, ok, err)
	}
	h, hrev, ok, err := r.s.Head(ctx, testOwner, actor)
	want := lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: uid, ManagerInstance: "auth-service:" + testSpace, ProcessEpoch: 1, State: lifecycle.HeadActive}
	if err != nil || !ok || h.Owner != want.Owner || h.Actor != want.Actor || h.LifecycleUID != want.LifecycleUID ||
		h.ManagerInstance != want.ManagerInstance || h.ProcessEpoch != 1 || h.State != lifecycle.HeadActive || h.Op != nil {
		t.Fatalf("head = %+v found %v err %v, want %+v", h, ok, err, want)
	}
	g, grev, ok, err := r.s.Gate(ctx, uid)
	if err != nil || !ok || g.State != lifecycle.GateOpen || g.Generation != 1 || g.Op != nil {
		t.Fatalf("gate = %+v found %v err %v, want open at generation 1", g, ok, err)
	}
	if res.HeadRevision != hrev || res.GateRevision != grev || res.Owner != testOwner || res.Actor != actor || res.LifecycleUID != uid {
		t.Fatalf("result %+v, want head rev %d gate rev %d", res, hrev, grev)
	}
}

func wantRefusal(t *testing.T, res ActivateResult, err error, code Code, outcome Outcome) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("Activate = %+v, %v; want code %s", res, err, code)
	}
	if res.Outcome != outcome || res.AlreadyActive {
		t.Fatalf("outcome %q already %v, want %q", res.Outcome, res.AlreadyActive, outcome)
	}
	return e
}

// TestActivateRows: one test per row of the seed's activation table (and each refusal of
// lifecycle-hosted.md §1.3), every refusal decided before any write.
func TestActivateRows(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	n := 0
	next := func() (string, string) { n++; return fmt.Sprintf("agent%d", n), uidN(n) }

	t.Run("ok/absent", func(t *testing.T) {
		actor, uid := next()
		res, err := r.a.Activate(ctx, testOwner, actor, uid)
		if err != nil || res.AlreadyActive || res.Outcome != "" {
			t.Fatalf("Activate = %+v, %v", res, err)
		}
		r.wantActive(t, actor, uid, res)
		rv, _, _, _ := r.s.Reservation(ctx, uid)
		if rv.MintedBy != "auth-service:"+testSpace {
			t.Fatalf("reservation minted by %q", rv.MintedBy)
		}
	})
	t.Run("ok/retired-at-another-uid", func(t *testing.T) {
		actor, old := next()
		_, uid := next()
		r.putReservation(t, old, lifecycle.Reservation{Owner: testOwner, Actor: actor, MintedBy: "auth-service:" + testSpace})
		r.putGate(t, lifecycle.Gate{LifecycleUID: old, State: lifecycle.GateRetired, Generation: 2, Op: retireOp(t, old)})
		r.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: old, ManagerInstance: "m", ProcessEpoch: 4, State: lifecycle.HeadRetired})
		res, err := r.a.Activate(ctx, testOwner, actor, uid)
		if err != nil || res.AlreadyActive {
			t.Fatalf("Activate = %+v, %v", res, err)
		}
		r.wantActive(t, actor, uid, res)
		if g, _, _, _ := r.s.Gate(ctx, old); g.State != lifecycle.GateRetired {
			t.Fatalf("the old incarnation's gate = %+v, want it retired still", g)
		}
	})
	t.Run("ok/active-here-idempotent", func(t *testing.T) {
		actor, uid := next()
		first, err := r.a.Activate(ctx, testOwner, actor, uid)
		if err != nil {
			t.Fatal(err)
		}
		w := r.s.Writes()
		res, err := r.a.Activate(ctx, testOwner, actor, uid)
		if err != nil || !res.AlreadyActive || res.HeadRevision != first.HeadRevision || res.GateRevision != first.GateRevision {
			t.Fatalf("second Activate = %+v, %v; first %+v", res, err, first)
		}
		if d := r.s.Writes() - w; d != 0 {
			t.Fatalf("an idempotent activation wrote %d rows", d)
		}
	})

	refusals := []struct {
		name    string
		setup   func(t *testing.T, actor, uid string)
		code    Code
		blocked lifecycle.OpKind
		gate    lifecycle.GateState
	}{
		{name: "fail/active-at-another-uid", code: CodeAlreadyExists, setup: func(t *testing.T, actor, uid string) {
			_, other := next()
			if _, err := r.a.Activate(ctx, testOwner, actor, other); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "fail/retiring-at-another-uid", code: CodeFailedPrecondition, blocked: lifecycle.OpRetirement, setup: func(t *testing.T, actor, uid string) {
			_, other := next()
			r.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: other, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetiring, Op: retireOp(t, other)})
		}},
		{name: "fail/retiring-here", code: CodeFailedPrecondition, blocked: lifecycle.OpRetirement, setup: func(t *testing.T, actor, uid string) {
			r.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateFrozen, Generation: 1, Op: retireOp(t, uid)})
			r.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: uid, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetiring, Op: retireOp(t, uid)})
		}},
		{name: "fail/frozen-by-retirement", code: CodeFailedPrecondition, blocked: lifecycle.OpRetirement, gate: lifecycle.GateFrozen, setup: func(t *testing.T, actor, uid string) {
			if _, err := r.a.Activate(ctx, testOwner, actor, uid); err != nil {
				t.Fatal(err)
			}
			r.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateFrozen, Generation: 1, Op: retireOp(t, uid)})
		}},
		{name: "fail/terminally-retired", code: CodePermissionDenied, gate: lifecycle.GateRetired, setup: func(t *testing.T, actor, uid string) {
			r.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateRetired, Generation: 1, Op: retireOp(t, uid)})
			r.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: uid, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetired})
		}},
		{name: "fail/retired-gate-head-moved-on", code: CodePermissionDenied, gate: lifecycle.GateRetired, setup: func(t *testing.T, actor, uid string) {
			// The uid's gate was retired; the alias is now absent (another alias, say): the uid
			// never comes back.
			r.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateRetired, Generation: 1, Op: retireOp(t, uid)})
		}},
		{name: "fail/foreign-reservation", code: CodeConflict, setup: func(t *testing.T, actor, uid string) {
			r.putReservation(t, uid, lifecycle.Reservation{Owner: testOwner, Actor: "someoneelse", MintedBy: "auth-service:" + testSpace})
		}},
		{name: "fail/open-gate-without-head", code: CodeFailedPrecondition, setup: func(t *testing.T, actor, uid string) {
			r.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateOpen, Generation: 1})
		}},
		{name: "fail/corrupt-gate", code: CodeUnavailable, setup: func(t *testing.T, actor, uid string) {
			key, _ := lifecycle.GateKey(uid)
			if _, err := r.s.Create(ctx, space.Auth, key, []byte(`{"state":"open"}`)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			actor, uid := next()
			tc.setup(t, actor, uid)
			w := r.s.Writes()
			res, err := r.a.Activate(ctx, testOwner, actor, uid)
			e := wantRefusal(t, res, err, tc.code, OutcomeNotExecuted)
			if e.BlockedOp != tc.blocked || (tc.gate != "" && e.GateState != tc.gate) {
				t.Fatalf("refusal %+v, want blocked op %q gate %q", e, tc.blocked, tc.gate)
			}
			if want := tc.blocked == lifecycle.OpRetirement || tc.gate == lifecycle.GateRetired; e.RetirementBegun() != want {
				t.Fatalf("RetirementBegun = %v, want %v", e.RetirementBegun(), want)
			}
			if d := r.s.Writes() - w; d != 0 {
				t.Fatalf("a refused activation wrote %d rows", d)
			}
		})
	}

	t.Run("fail/bad-coordinate", func(t *testing.T) {
		reads := r.s.Reads()
		for _, c := range [][3]string{{"p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "a", uidN(1)}, {testOwner, "a.b", uidN(1)}, {testOwner, "a", "short"}} {
			res, err := r.a.Activate(ctx, c[0], c[1], c[2])
			wantRefusal(t, res, err, CodeBadRequest, OutcomeNotExecuted)
		}
		if d := r.s.Reads() - reads; d != 0 {
			t.Fatalf("a refused coordinate read %d rows", d)
		}
	})
	t.Run("fail/plane-not-held", func(t *testing.T) {
		actor, uid := next()
		r.lost.Store(true)
		defer r.lost.Store(false)
		reads, writes := r.s.Reads(), r.s.Writes()
		res, err := r.a.Activate(ctx, testOwner, actor, uid)
		wantRefusal(t, res, err, CodeUnavailable, OutcomeNotExecuted)
		if r.s.Reads() != reads || r.s.Writes() != writes {
			t.Fatal("a fenced authority read or wrote the store")
		}
	})
}

// TestActivateOrder: the saga's four writes in §1.3's order. The plane check runs before each
// write, so what the store holds at each check is what the writes before it left; and within
// the records stream the reservation's revision precedes the head's.
func TestActivateOrder(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	actor, uid := "ordered", uidN(1)
	var seen []string
	r.setOnHeld(func() { seen = append(seen, r.snapshot(t, actor, uid)) })
	res, err := r.a.Activate(ctx, testOwner, actor, uid)
	r.setOnHeld(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"res=- gate=- head=-",                         // the first check, before any read
		"res=- gate=- head=-",                         // before reserving
		"res=ok gate=- head=-",                        // before creating the gate
		"res=ok gate=frozen:activation:0 head=-",      // before the head
		"res=ok gate=frozen:activation:0 head=active", // before reopening the gate
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("store at each plane check:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	r.wantActive(t, actor, uid, res)
	_, resRev, _, _ := r.s.Reservation(ctx, uid)
	if !(resRev < res.HeadRevision) {
		t.Fatalf("reservation revision %d not before head revision %d", resRev, res.HeadRevision)
	}
}

// snapshot describes the rows of actor at uid.
func (r *rig) snapshot(t *testing.T, actor, uid string) string {
	t.Helper()
	ctx := context.Background()
	res, gate, head := "-", "-", "-"
	if _, _, ok, err := r.s.Reservation(ctx, uid); err != nil {
		t.Error(err)
	} else if ok {
		res = "ok"
	}
	if g, _, ok, err := r.s.Gate(ctx, uid); err != nil {
		t.Error(err)
	} else if ok {
		gate = string(g.State)
		if g.Op != nil {
			gate += ":" + string(g.Op.Kind) + fmt.Sprintf(":%d", g.Generation)
		}
	}
	if h, _, ok, err := r.s.Head(ctx, testOwner, actor); err != nil {
		t.Error(err)
	} else if ok {
		head = string(h.State)
	}
	return "res=" + res + " gate=" + gate + " head=" + head
}

// TestActivateCrashPoints: whatever prefix of the saga a crashed run left, the next call
// finishes it with the same result, and the one after answers AlreadyActive.
func TestActivateCrashPoints(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	// leave writes the first steps of the saga as a crashed run left them.
	leave := func(t *testing.T, actor, uid, mintedBy string, steps int) {
		r.putReservation(t, uid, lifecycle.Reservation{Owner: testOwner, Actor: actor, MintedBy: mintedBy})
		if steps >= 2 {
			born, _ := lifecycle.BornGate(uid)
			r.putGate(t, born)
		}
		if steps >= 3 {
			r.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: uid, ManagerInstance: "auth-service:" + testSpace, ProcessEpoch: 1, State: lifecycle.HeadActive})
		}
	}
	for i, tc := range []struct {
		name     string
		mintedBy string
		steps    int
	}{
		{"ok/after-reservation", "auth-service:" + testSpace, 1},
		{"ok/after-frozen-gate", "auth-service:" + testSpace, 2},
		{"ok/after-active-head", "auth-service:" + testSpace, 3},
		{"ok/reservation-minted-by-another-writer", "manager:elsewhere", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			actor, uid := fmt.Sprintf("crash%d", i), uidN(100+i)
			leave(t, actor, uid, tc.mintedBy, tc.steps)
			res, err := r.a.Activate(ctx, testOwner, actor, uid)
			if err != nil || res.AlreadyActive {
				t.Fatalf("resumed Activate = %+v, %v", res, err)
			}
			r.wantActive(t, actor, uid, res)
			again, err := r.a.Activate(ctx, testOwner, actor, uid)
			if err != nil || !again.AlreadyActive || again.GateRevision != res.GateRevision {
				t.Fatalf("Activate after resume = %+v, %v", again, err)
			}
		})
	}

	// A claim lost between two writes stops the saga with outcome unknown; the next call (the
	// claim back) adopts what it left.
	for stop := 2; stop <= 4; stop++ {
		t.Run(fmt.Sprintf("ok/plane-lost-before-write-%d", stop), func(t *testing.T) {
			actor, uid := fmt.Sprintf("lost%d", stop), uidN(200+stop)
			checks := 0
			r.setOnHeld(func() {
				checks++
				if checks == stop+1 { // the first check precedes the reads
					r.lost.Store(true)
				}
			})
			res, err := r.a.Activate(ctx, testOwner, actor, uid)
			r.setOnHeld(nil)
			r.lost.Store(false)
			wantRefusal(t, res, err, CodeUnavailable, OutcomeUnknown)
			res, err = r.a.Activate(ctx, testOwner, actor, uid)
			if err != nil || res.AlreadyActive {
				t.Fatalf("resumed Activate = %+v, %v", res, err)
			}
			r.wantActive(t, actor, uid, res)
		})
	}
}

// TestActivateConcurrent: callers racing on one uid all end active at it; the lost writes are
// re-read and adopted, never overwritten, so the gate is reopened exactly once.
func TestActivateConcurrent(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	actor, uid := "racer", uidN(7)
	const callers = 6
	var wg sync.WaitGroup
	results := make([]ActivateResult, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = r.a.Activate(ctx, testOwner, actor, uid)
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !results[i].AlreadyActive {
			fresh++
		}
	}
	g, grev, _, _ := r.s.Gate(ctx, uid)
	if g.State != lifecycle.GateOpen || g.Generation != 1 {
		t.Fatalf("gate %+v", g)
	}
	for i := range callers {
		if results[i].GateRevision != grev {
			t.Fatalf("caller %d saw gate revision %d, the gate is at %d", i, results[i].GateRevision, grev)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d callers reopened the gate, want exactly 1", fresh)
	}
}
