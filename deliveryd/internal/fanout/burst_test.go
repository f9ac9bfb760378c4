package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const (
	uid4 = "uiddddddddddddddddddddddddd"
)

// logLines records log messages with their lifecycle attribute.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	lc := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "lifecycle" {
			lc = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Message+" "+lc)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// count is how many lines start with prefix and name lifecycle.
func (l *logLines) count(prefix, lifecycle string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.HasPrefix(s, prefix) && strings.HasSuffix(s, " "+lifecycle) {
			n++
		}
	}
	return n
}

// member is one lifecycle's dlvclient, recording frames (by id) and gaps ("gap <n>") in order.
type member struct {
	mu     sync.Mutex
	events []string
	stop   func()
}

func (m *member) add(s string) {
	m.mu.Lock()
	m.events = append(m.events, s)
	m.mu.Unlock()
}

func (m *member) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.events...)
}

// runMember starts local.<actor>'s dlvclient for uid with an OnGap handler.
func runMember(t *testing.T, e *plane3test.Env, actor, uid string) *member {
	t.Helper()
	m := &member{}
	c, err := dlvclient.New(plane3test.Ctx(t), plane3test.JS(t, e.Agent(t, actor, uid)), dlvclient.Config{
		Space: plane3test.Space, Owner: plane3test.Owner, Actor: actor, LifecycleUID: uid,
		OnGap: func(_ context.Context, g dlvclient.Gap) error { m.add(fmt.Sprint("gap ", g.Missing)); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(_ context.Context, d dlvclient.Delivery) error { m.add(d.ID); return nil })
	}()
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("dlvclient %s: %v", actor, err)
			}
		})
	}
	t.Cleanup(m.stop)
	return m
}

// metric is the value of a gate metric in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// postBurst posts n chat messages as local.a0 on general, ids prefix0000.., asynchronously in
// windows of 250. Before each window it waits until the fanout consumer has at most 250 messages
// in hand: CHAT keeps 1000 per subject too, and this test is about DLV and INBOX, not about a
// poster outrunning the fan-out writer by more than CHAT keeps.
func postBurst(t *testing.T, e *plane3test.Env, ajs, djs jetstream.JetStream, prefix string, n int) {
	t.Helper()
	subj, _ := e.N.Chat(plane3test.Owner, "a0", "general")
	fc, err := djs.Consumer(plane3test.Ctx(t), e.N.ChatStream(), "fanout")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if i%250 == 0 {
			testkit.Eventually(t, 30*time.Second, func() error {
				ci, err := fc.Info(plane3test.Ctx(t))
				if err != nil {
					return err
				}
				if held := ci.NumPending + uint64(ci.NumAckPending); held > 250 {
					return fmt.Errorf("fanout holds %d", held)
				}
				return nil
			})
		}
		b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("%s%04d", prefix, i), "from": map[string]string{"id": "local.a0"}, "text": "x"})
		if _, err := ajs.PublishAsync(subj, b); err != nil {
			t.Fatal(err)
		}
		if i%250 == 249 || i == n-1 {
			select {
			case <-ajs.PublishAsyncComplete():
			case <-plane3test.Ctx(t).Done():
				t.Fatal("posts not stored")
			}
		}
	}
}

func ids(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%04d", prefix, i))
	}
	return out
}

// durableSettled waits until local.<actor>'s dlv_ durable has nothing pending or unacked and
// its ack floor has reached the last frame stored on its subject (NumPending alone can trail a
// frame already stored: the broker counts it on a goroutine of its own).
func durableSettled(t *testing.T, e *plane3test.Env, djs jetstream.JetStream, actor, uid string) {
	t.Helper()
	name, _ := e.N.DlvConsumer(plane3test.Owner, actor, uid)
	subj, _ := e.N.Dlv(plane3test.Owner, actor, uid)
	testkit.Eventually(t, 30*time.Second, func() error {
		c, err := djs.Consumer(plane3test.Ctx(t), e.N.DLVStream(), name)
		if err != nil {
			return err
		}
		ci := c.CachedInfo()
		if ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("%s: pending %d, unacked %d", name, ci.NumPending, ci.NumAckPending)
		}
		s, err := djs.Stream(plane3test.Ctx(t), e.N.DLVStream())
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(plane3test.Ctx(t), subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream < m.Sequence {
			return fmt.Errorf("%s: floor %d below the last frame %d", name, ci.AckFloor.Stream, m.Sequence)
		}
		return nil
	})
}

// TestBurstToAStoppedMember is issue 27's third goal: a burst of 5000 to a stopped member, then
// the member back. Every copy is delivered or inside the gap it is shown: the member gets the
// copies its durable could hold, in order, then one gap marker with the rest, then the copies
// posted after; the counts add up to 5000 and the metric and the two log lines say the same. A
// live member gets all 5000 and no marker; a member with no durable is not gated (its subject
// holds the cap, the broker discarding the oldest as before); restarting the reader does not
// double the marker.
func TestBurstToAStoppedMember(t *testing.T) {
	const burst = 5000
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs, pjs := plane3test.JS(t, dc), e.Provisioner(t)
	for _, m := range []struct{ actor, uid string }{{"a1", uid1}, {"a2", uid2}} {
		e.AddLifecycle(t, pjs, m.actor, m.uid, []string{"general"})
		e.Join(t, djs, "general", m.actor, m.uid, 0, 1)
	}
	e.SetACL(t, pjs, "a4", uid4, []string{"general"}) // a4: ACL and membership rows, no dlv_ durable
	e.Join(t, djs, "general", "a4", uid4, 0, 1)
	reg, logs := prometheus.NewRegistry(), &logLines{}
	rc := reader.Config{Names: e.N, Registerer: reg, Logger: slog.New(logs)}
	stop := startLoopsWith(t, dc, fanout.Config{Names: e.N}, rc)

	live := runMember(t, e, "a2", uid2)
	ajs := plane3test.JS(t, e.Agent(t, "a0", uid0))
	began := time.Now()
	postBurst(t, e, ajs, djs, "p", burst)
	drained(t, e, djs)
	testkit.Eventually(t, 30*time.Second, func() error {
		if n := len(live.got()); n != burst {
			name, _ := e.N.DlvConsumer(plane3test.Owner, "a2", uid2)
			c, err := djs.Consumer(plane3test.Ctx(t), e.N.DLVStream(), name)
			if err != nil {
				return err
			}
			ci := c.CachedInfo()
			return fmt.Errorf("live member has %d of %d; durable pending %d ackpending %d floor %d delivered %d", n, burst, ci.NumPending, ci.NumAckPending, ci.AckFloor.Stream, ci.Delivered.Stream)
		}
		return nil
	})
	t.Logf("burst of %d fanned out and the live member served in %v", burst, time.Since(began).Round(time.Millisecond))
	if got := live.got(); strings.Join(got, ",") != strings.Join(ids("p", 0, burst), ",") {
		t.Fatalf("ok/live member: %d events, not p0000..p4999 in order (first %v)", len(got), got[:3])
	}
	dropped := metric(t, reg, "cotal_delivery_copies_dropped_total")
	if dropped == 0 || metric(t, reg, "cotal_delivery_members_overflowing") != 1 || metric(t, reg, "cotal_delivery_gap_markers_total") != 0 {
		t.Fatalf("while a1 is stopped: dropped %v, overflowing %v, markers %v", dropped,
			metric(t, reg, "cotal_delivery_members_overflowing"), metric(t, reg, "cotal_delivery_gap_markers_total"))
	}
	if n := dlvCount(t, e, djs, "a4", uid4); n != provision.MaxMsgsPerSubject {
		t.Fatalf("ok/ungated member without a durable: DLV holds %d, want the cap %d", n, provision.MaxMsgsPerSubject)
	}

	// a1 comes back: the timer sees room and stores the marker; once a1 has caught up, three
	// more posts. (Posts while a1 still holds hundreds unacked could overflow it again: a second
	// marker, which is right but not what this test counts.)
	stopped := runMember(t, e, "a1", uid1)
	testkit.Eventually(t, 30*time.Second, func() error {
		if metric(t, reg, "cotal_delivery_gap_markers_total") != 1 {
			return fmt.Errorf("no marker yet")
		}
		return nil
	})
	durableSettled(t, e, djs, "a1", uid1) // caught up: the next copies have room
	postBurst(t, e, ajs, djs, "q", 3)
	drained(t, e, djs)
	durableSettled(t, e, djs, "a1", uid1)
	before, missing, after := gapSplit(t, stopped.got())
	if strings.Join(before, ",") != strings.Join(ids("p", 0, len(before)), ",") || strings.Join(after, ",") != "q0000,q0001,q0002" {
		first := 0
		for first < len(before) && before[first] == fmt.Sprintf("p%04d", first) {
			first++
		}
		logs.mu.Lock()
		t.Logf("log: %v", logs.lines)
		logs.mu.Unlock()
		t.Fatalf("order: %d before the gap of %d (want p0000..; first difference at %d: %v), after %v", len(before), missing, first, before[first:min(first+5, len(before))], after)
	}
	if len(before)+missing != burst || float64(missing) != metric(t, reg, "cotal_delivery_copies_dropped_total") {
		t.Fatalf("counts: delivered %d + gap %d != %d, or metric %v", len(before), missing, burst, metric(t, reg, "cotal_delivery_copies_dropped_total"))
	}
	if metric(t, reg, "cotal_delivery_members_overflowing") != 0 {
		t.Fatal("a1 still counted as overflowing")
	}
	a1 := plane3test.Owner + ".a1." + uid1
	if s, m := logs.count("dropping copies", a1), logs.count("published a gap marker", a1); s != 1 || m != 1 {
		t.Fatalf("log lines for a1: %d starts, %d markers; want 1 and 1", s, m)
	}
	for _, other := range []string{plane3test.Owner + ".a2." + uid2, plane3test.Owner + ".a4." + uid4} {
		if n := logs.count("dropping copies", other); n != 0 {
			t.Fatalf("%s logged %d overflows", other, n)
		}
	}
	t.Logf("stopped member: %d delivered, gap of %d, then 3", len(before), missing)

	// A restart of the loops does not publish a1's marker again: a1 gets the next posts and no
	// second gap.
	stop()
	reg2 := prometheus.NewRegistry()
	startLoopsWith(t, dc, fanout.Config{Names: e.N}, reader.Config{Names: e.N, Registerer: reg2, Logger: slog.New(logs)})
	postBurst(t, e, ajs, djs, "r", 2)
	drained(t, e, djs)
	durableSettled(t, e, djs, "a1", uid1)
	if got := stopped.got(); len(got) != len(before)+1+3+2 || got[len(got)-1] != "r0001" {
		t.Fatalf("after the restart a1 got %v", got[len(before):])
	}
	if metric(t, reg2, "cotal_delivery_gap_markers_total") != 0 {
		t.Fatal("a marker after the restart")
	}
}

// TestBurstUnderTheCap: a stopped member whose burst stays under what its durable holds loses
// nothing and sees no marker: 900 posts, the member back, 900 frames in order, nothing dropped.
func TestBurstUnderTheCap(t *testing.T) {
	const burst = 900
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs, pjs := plane3test.JS(t, dc), e.Provisioner(t)
	e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
	e.Join(t, djs, "general", "a1", uid1, 0, 1)
	reg, logs := prometheus.NewRegistry(), &logLines{}
	startLoopsWith(t, dc, fanout.Config{Names: e.N}, reader.Config{Names: e.N, Registerer: reg, Logger: slog.New(logs)})
	postBurst(t, e, plane3test.JS(t, e.Agent(t, "a0", uid0)), djs, "p", burst)
	drained(t, e, djs)
	m := runMember(t, e, "a1", uid1)
	durableSettled(t, e, djs, "a1", uid1)
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(m.got()); n != burst {
			return fmt.Errorf("member has %d of %d", n, burst)
		}
		return nil
	})
	if got := m.got(); strings.Join(got, ",") != strings.Join(ids("p", 0, burst), ",") {
		t.Fatalf("ok/under the cap: %d events, not p0000..p0899 in order", len(got))
	}
	if d, mk := metric(t, reg, "cotal_delivery_copies_dropped_total"), metric(t, reg, "cotal_delivery_gap_markers_total"); d != 0 || mk != 0 {
		t.Fatalf("dropped %v, markers %v; want none", d, mk)
	}
	if n := logs.count("dropping copies", plane3test.Owner+".a1."+uid1); n != 0 {
		t.Fatalf("%d overflow lines", n)
	}
}
