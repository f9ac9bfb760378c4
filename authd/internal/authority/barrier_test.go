package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestBarrierOrder: the nine steps run in order, each leaving the rows the next one builds on
// (read after every step), and the revisions of each stream rise in that order; the frontier's
// cutoff covers the head's retiring write and precedes its retired one.
func TestBarrierOrder(t *testing.T) {
	s, _, _ := provisioned(t)
	activate(t, s, tOwner, tActor, tUID)
	a := testAuthority(t, s, nil)
	op, _ := lifecycle.ManagedRetirementOpID(tUID)
	var steps []int
	seen := map[int]rows{}
	a.afterStep = func(n int) error {
		steps = append(steps, n)
		seen[n] = readRows(t, s, tOwner, tActor, tUID)
		return nil
	}
	res, err := a.Retire(ctxT(t), tOwner, tActor, tUID)
	if err != nil {
		t.Fatal(err)
	}
	if res.OpID != op || res.LifecycleUID != tUID || res.AlreadyRetired || len(res.EvictedPrincipals) != 1 || res.EvictedPrincipals[0] != tOwner+"."+tActor {
		t.Fatalf("result %+v", res)
	}
	if fmt.Sprint(steps) != "[1 2 3 4 5 6 7 8 9]" {
		t.Fatalf("steps %v", steps)
	}
	s1, s2, s3, s4, s7, s8, s9 := seen[1], seen[2], seen[3], seen[4], seen[7], seen[8], seen[9]
	switch {
	case s1.stageRev == 0 || s1.gate.State != lifecycle.GateOpen || s1.head.State != lifecycle.HeadActive:
		t.Fatalf("after step 1: %+v", s1)
	case s2.gate.State != lifecycle.GateFrozen || !retiredBy(s2.gate.Op, op) || s2.head.State != lifecycle.HeadActive:
		t.Fatalf("after step 2: %+v", s2)
	case s3.gate.State != lifecycle.GateFrozen || s3.head.State != lifecycle.HeadRetiring || s3.frontierRev != 0:
		t.Fatalf("after step 3: %+v", s3)
	case s4.frontierRev != 0 || s4.headRev != s3.headRev || s4.gateRev != s3.gateRev:
		t.Fatalf("containment wrote something: %+v", s4)
	case s7.frontierRev == 0 || s7.gate.State != lifecycle.GateFrozen || s7.head.State != lifecycle.HeadRetiring:
		t.Fatalf("after step 7: %+v", s7)
	case s8.gate.State != lifecycle.GateRetired || s8.head.State != lifecycle.HeadRetiring:
		t.Fatalf("after step 8: %+v", s8)
	case s9.head.State != lifecycle.HeadRetired:
		t.Fatalf("after step 9: %+v", s9)
	}
	// Auth stream: stage < freeze < gate retired. Records stream: retiring < frontier < retired.
	if !(s1.stageRev < s2.gateRev && s2.gateRev < s8.gateRev) {
		t.Fatalf("auth revisions: stage %d, freeze %d, gate retired %d", s1.stageRev, s2.gateRev, s8.gateRev)
	}
	if !(s3.headRev < s7.frontierRev && s7.frontierRev < s9.headRev) {
		t.Fatalf("records revisions: retiring %d, frontier %d, retired %d", s3.headRev, s7.frontierRev, s9.headRev)
	}
	if cut := s7.frontier.Streams[0].Seq; cut < s3.headRev || cut >= s7.frontierRev {
		t.Fatalf("frontier cutoff %d: want at or above the retiring head %d and below the frontier %d", cut, s3.headRev, s7.frontierRev)
	}
	final := retiredAt(t, s, tOwner, tActor, tUID)
	if a.freezes.Load() != 1 || final.stageRev != s1.stageRev {
		t.Fatalf("freezes %d, stage rev %d -> %d", a.freezes.Load(), s1.stageRev, final.stageRev)
	}

	// Again: the head is retired at the uid, nothing is written.
	w := s.Writes()
	again, err := a.Retire(ctxT(t), tOwner, tActor, tUID)
	if err != nil || !again.AlreadyRetired || s.Writes() != w {
		t.Fatalf("second Retire = %+v, %v; %d writes", again, err, s.Writes()-w)
	}
}

// TestRetireRefusals: the barrier's own refusals, each before any write.
func TestRetireRefusals(t *testing.T) {
	s, _, _ := provisioned(t)
	a := testAuthority(t, s, nil)
	ctx := ctxT(t)
	check := func(t *testing.T, want Code, owner, actor, uid string) {
		t.Helper()
		w := s.Writes()
		_, err := a.Retire(ctx, owner, actor, uid)
		if CodeOf(err) != want || s.Writes() != w {
			t.Fatalf("Retire = %v (%d writes), want %s", err, s.Writes()-w, want)
		}
	}
	t.Run("fail/no-head", func(t *testing.T) { check(t, CodeFailedPrecondition, tOwner, tActor, tUID) })
	t.Run("fail/bad-uid", func(t *testing.T) { check(t, CodeBadRequest, tOwner, tActor, "short") })
	activate(t, s, tOwner, tActor, tUID)
	t.Run("fail/head-at-another-uid", func(t *testing.T) { check(t, CodeExpired, tOwner, tActor, tUID2) })
	t.Run("fail/gate-frozen-by-its-activation", func(t *testing.T) {
		owner, uid := "u_"+strings.Repeat("b", 26), strings.Repeat("e", 26)
		activating(t, s, owner, tActor, uid)
		check(t, CodeConflict, owner, tActor, uid)
	})
	t.Run("fail/plane-not-held", func(t *testing.T) {
		fenced := testAuthority(t, s, func(c *Config) { c.Held = func() error { return errors.New("fenced") } })
		w := s.Writes()
		if _, err := fenced.Retire(ctx, tOwner, tActor, tUID); CodeOf(err) != CodeUnavailable || s.Writes() != w {
			t.Fatalf("fenced Retire = %v, %d writes", err, s.Writes()-w)
		}
		if r := readRows(t, s, tOwner, tActor, tUID); r.stageRev != 0 || r.gate.State != lifecycle.GateOpen {
			t.Fatalf("fenced Retire left %+v", r)
		}
	})
}

// TestRetireFlight: a caller that stops waiting gets unavailable and the barrier goes on; the
// same opId for other coordinates is a conflict while the flight is in flight; a second caller
// of the same coordinates joins it.
func TestRetireFlight(t *testing.T) {
	s, _, _ := provisioned(t)
	activate(t, s, tOwner, tActor, tUID)
	a := testAuthority(t, s, nil)
	hold, release := make(chan struct{}), make(chan struct{})
	a.afterStep = func(n int) error {
		if n == stepFreeze {
			close(hold)
			<-release
		}
		return nil
	}
	short, cancel := context.WithCancel(ctxT(t))
	first := make(chan error, 1)
	go func() {
		_, err := a.Retire(short, tOwner, tActor, tUID)
		first <- err
	}()
	<-hold
	cancel()
	if err := <-first; CodeOf(err) != CodeUnavailable {
		t.Fatalf("the caller that left got %v, want unavailable", err)
	}
	other := "u_" + strings.Repeat("b", 26)
	if _, err := a.Retire(ctxT(t), other, tActor, tUID); CodeOf(err) != CodeConflict {
		t.Fatalf("same opId, other owner: %v, want conflict", err)
	}
	joined := make(chan error, 1)
	go func() {
		_, err := a.Retire(ctxT(t), tOwner, tActor, tUID)
		joined <- err
	}()
	testkit.Eventually(t, 10*time.Second, func() error {
		if r := readRows(t, s, tOwner, tActor, tUID); r.gate.State != lifecycle.GateFrozen {
			return errors.New("not frozen yet")
		}
		return nil
	})
	close(release)
	if err := <-joined; err != nil {
		t.Fatalf("joined caller: %v", err)
	}
	retiredAt(t, s, tOwner, tActor, tUID)
	if a.freezes.Load() != 1 {
		t.Fatalf("%d freezes", a.freezes.Load())
	}
}

// agentConn connects as an agent of owner.actor the way a callout grant names it (JWT name
// <owner>-<actor>, a bound inbox nonce as connection name), expiring after ttl.
func agentConn(t *testing.T, b *testkit.Broker, owner, actor, uid string, ttl time.Duration) *nats.Conn {
	t.Helper()
	nonce, err := space.BoundInboxNonce(owner, actor, "suffix0123")
	if err != nil {
		t.Fatal(err)
	}
	jwt, kp := b.Space(testSpace).MintUser(t, profiles.Agent, profiles.Params{Owner: owner, Actor: actor, LifecycleUID: uid,
		AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}, Subscribe: []string{"general"}, InboxNonce: nonce}, ttl)
	nc, err := b.Connect(t, jwt, kp, nats.Name(nonce))
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// TestContainment: a live connection of the alias holds containment. While it is connected the
// barrier does not pass step 4 (gate frozen, head retiring); once the freeze + ContainWindow
// passes on the authority's clock it gives up with unavailable and leaves them so; when the
// connection's credential expires (the broker drops it), a new call completes the retirement.
// Another principal's connection does not hold it.
func TestContainment(t *testing.T) {
	b, s, _, _ := provisionedBroker(t)
	activate(t, s, tOwner, tActor, tUID)
	clk := testkit.NewClock(time.Now())
	a := testAuthority(t, s, func(c *Config) { c.Now = clk.Now })
	_ = agentConn(t, b, "u_"+strings.Repeat("b", 26), tActor, tUID2, time.Hour) // someone else
	live := agentConn(t, b, tOwner, tActor, tUID, time.Hour)
	done := make(chan error, 1)
	go func() {
		_, err := a.Retire(ctxT(t), tOwner, tActor, tUID)
		done <- err
	}()
	testkit.Eventually(t, 20*time.Second, func() error {
		r := readRows(t, s, tOwner, tActor, tUID)
		if r.head.State != lifecycle.HeadRetiring {
			return errors.New("not retiring yet")
		}
		return nil
	})
	// Several CONNZ rounds see the connection, and the barrier stays at step 4.
	from := a.rounds.Load()
	testkit.Eventually(t, 20*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("the barrier finished (%v) while the alias is connected", err)
		default:
		}
		if a.rounds.Load() < from+3 {
			return errors.New("fewer than three rounds yet")
		}
		return nil
	})
	clk.Add(ContainWindow)
	err := <-done
	if CodeOf(err) != CodeUnavailable || !strings.Contains(err.Error(), "still live") {
		t.Fatalf("barrier past the window = %v, want unavailable naming the live connection", err)
	}
	r := readRows(t, s, tOwner, tActor, tUID)
	if r.gate.State != lifecycle.GateFrozen || r.head.State != lifecycle.HeadRetiring || r.frontierRev != 0 {
		t.Fatalf("after the refusal: gate %s, head %s, frontier %d; want frozen, retiring, none", r.gate.State, r.head.State, r.frontierRev)
	}
	// The callout gate read (another helper's) refuses a reconnect while the gate is not open;
	// here the row it reads is frozen by this retirement.
	op, _ := lifecycle.ManagedRetirementOpID(tUID)
	if r.gate.State == lifecycle.GateOpen || !retiredBy(r.gate.Op, op) {
		t.Fatalf("gate %+v would admit a reconnect", r.gate)
	}

	// A connection whose credential expires: the broker drops it and the barrier completes.
	live.Close()
	short := agentConn(t, b, tOwner, tActor, tUID, 2*time.Second)
	finished := make(chan error, 1)
	go func() {
		_, err := a.Retire(ctxT(t), tOwner, tActor, tUID)
		finished <- err
	}()
	select {
	case err := <-finished:
		if !short.IsClosed() {
			t.Fatalf("the barrier finished (%v) while the alias was connected", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the barrier did not finish after the credential expired")
	}
	retiredAt(t, s, tOwner, tActor, tUID)
}

// TestContainmentNoAnswer: a CONNZ round that gets no answer is unavailable, the gate frozen.
func TestContainmentNoAnswer(t *testing.T) {
	b, s, _, _ := provisionedBroker(t)
	activate(t, s, tOwner, tActor, tUID)
	a := testAuthority(t, s, nil)
	jwt, kp := b.Space(testSpace).MintUnlimited(t)
	gone, err := b.Connect(t, jwt, kp)
	if err != nil {
		t.Fatal(err)
	}
	gone.Close() // the CONNZ rounds go over a connection that gets no answer
	a.connzNC = gone
	_, err = a.Retire(ctxT(t), tOwner, tActor, tUID)
	if CodeOf(err) != CodeUnavailable || !strings.Contains(err.Error(), "connections could not be listed") {
		t.Fatalf("Retire = %v, want unavailable: no CONNZ answer", err)
	}
	if r := readRows(t, s, tOwner, tActor, tUID); r.gate.State != lifecycle.GateFrozen || r.head.State != lifecycle.HeadRetiring {
		t.Fatalf("after no answer: gate %s, head %s; want frozen, retiring", r.gate.State, r.head.State)
	}
}

// idleCounter is an Idler that counts its calls and answers err.
type idleCounter struct {
	calls atomic.Int64
	err   error
}

func (c *idleCounter) WaitIdle(context.Context) error {
	c.calls.Add(1)
	return c.err
}

// TestContainWaitsForCallouts: containment asks the callout responder (set late, as authd sets
// it after boot resume) to drain before its CONNZ rounds, and a wait that fails is unavailable
// with the gate frozen.
func TestContainWaitsForCallouts(t *testing.T) {
	s, _, _ := provisioned(t)
	late := &LateIdler{}
	if err := late.WaitIdle(ctxT(t)); err != nil {
		t.Fatalf("WaitIdle before Set = %v", err)
	}
	a := testAuthority(t, s, func(c *Config) { c.Callouts = late })
	activate(t, s, tOwner, tActor, tUID)
	failing := &idleCounter{err: context.DeadlineExceeded}
	late.Set(failing)
	if _, err := a.Retire(ctxT(t), tOwner, tActor, tUID); CodeOf(err) != CodeUnavailable || failing.calls.Load() != 1 || a.rounds.Load() != 0 {
		t.Fatalf("Retire = %v after %d waits and %d rounds; want unavailable after one wait, no round", err, failing.calls.Load(), a.rounds.Load())
	}
	if r := readRows(t, s, tOwner, tActor, tUID); r.gate.State != lifecycle.GateFrozen {
		t.Fatalf("gate %s, want frozen", r.gate.State)
	}
	ok := &idleCounter{}
	late.Set(ok)
	if _, err := a.Retire(ctxT(t), tOwner, tActor, tUID); err != nil || ok.calls.Load() != 1 {
		t.Fatalf("Retire = %v after %d waits", err, ok.calls.Load())
	}
	retiredAt(t, s, tOwner, tActor, tUID)
}
