package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const (
	uid1 = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uid2 = "uidbbbbbbbbbbbbbbbbbbbbbbb"
	uid0 = "uidzzzzzzzzzzzzzzzzzzzzzzz"
)

// startLoops runs the fan-out writer and the trusted reader on one delivery connection, as
// deliveryd does, until the returned stop or the end of the test.
func startLoops(t testing.TB, e *plane3test.Env, dc *nats.Conn) (stop func()) {
	t.Helper()
	return startLoopsWith(t, dc, fanout.Config{Names: e.N}, reader.Config{Names: e.N})
}

// startLoopsWith is startLoops with each loop's own configuration (a logger, a short nak delay).
func startLoopsWith(t testing.TB, dc *nats.Conn, wc fanout.Config, rc reader.Config) (stop func()) {
	t.Helper()
	w, err := fanout.New(plane3test.Ctx(t), dc, wc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reader.New(plane3test.Ctx(t), dc, rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context, <-chan struct{}) error{w.Run, r.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx, nil); err != nil {
				t.Errorf("loop: %v", err)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// dlvCount is how many messages DLV holds on a lifecycle's subject.
func dlvCount(t *testing.T, e *plane3test.Env, djs jetstream.JetStream, actor, uid string) uint64 {
	t.Helper()
	subj, _ := e.N.Dlv(plane3test.Owner, actor, uid)
	s, err := djs.Stream(plane3test.Ctx(t), e.N.DLVStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(plane3test.Ctx(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// drained waits until fanout and reader have settled everything stored so far.
func drained(t *testing.T, e *plane3test.Env, djs jetstream.JetStream) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, func() error {
		for _, c := range []struct{ stream, name string }{{e.N.ChatStream(), "fanout"}, {e.N.InboxStream(), "reader"}} {
			cons, err := djs.Consumer(plane3test.Ctx(t), c.stream, c.name)
			if err != nil {
				return err
			}
			ci, err := cons.Info(plane3test.Ctx(t))
			if err != nil {
				return err
			}
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				return fmt.Errorf("%s: pending %d, unacked %d", c.name, ci.NumPending, ci.NumAckPending)
			}
		}
		return nil
	})
}

func want(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s%02d", prefix, i))
	}
	return out
}

func sameSet(got, want []string) bool {
	g, w := append([]string(nil), got...), append([]string(nil), want...)
	sort.Strings(g)
	sort.Strings(w)
	return strings.Join(g, ",") == strings.Join(w, ",")
}

// TestDurableChannelTwoMembers is issue 10's first acceptance line: two members of a durable
// channel each receive every message exactly once in their DLV stream, the sender none; then a
// revoked ACL row stops delivery to its lifecycle while the other keeps receiving.
func TestDurableChannelTwoMembers(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)
	for _, m := range []struct{ actor, uid string }{{"a1", uid1}, {"a2", uid2}, {"a0", uid0}} {
		e.AddLifecycle(t, pjs, m.actor, m.uid, []string{"general"})
		e.Join(t, djs, "general", m.actor, m.uid, 0, 1)
	}
	startLoops(t, e, dc)
	in1, in2 := plane3test.Receive(t, e, "a1", uid1), plane3test.Receive(t, e, "a2", uid2)
	sender := plane3test.JS(t, e.Agent(t, "a0", uid0))

	for i := 1; i <= 20; i++ {
		e.Post(t, sender, "a0", fmt.Sprintf("m%02d", i), "hello")
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		if !sameSet(in1.IDs(), want("m", 1, 20)) || !sameSet(in2.IDs(), want("m", 1, 20)) {
			return fmt.Errorf("a1 has %d, a2 has %d", len(in1.IDs()), len(in2.IDs()))
		}
		return nil
	})
	drained(t, e, djs)
	t.Run("ok/each member's DLV holds every message exactly once", func(t *testing.T) {
		for _, m := range []struct{ actor, uid string }{{"a1", uid1}, {"a2", uid2}} {
			if got := dlvCount(t, e, djs, m.actor, m.uid); got != 20 {
				t.Fatalf("%s: DLV holds %d copies, want 20", m.actor, got)
			}
		}
		if got := dlvCount(t, e, djs, "a0", uid0); got != 0 {
			t.Fatalf("the sender got %d copies of its own posts", got)
		}
		if len(in1.IDs()) != 20 || len(in2.IDs()) != 20 {
			t.Fatalf("handed over %d and %d, want 20 each", len(in1.IDs()), len(in2.IDs()))
		}
	})

	t.Run("ok/a revoked ACL row stops delivery to its lifecycle", func(t *testing.T) {
		e.SetACL(t, pjs, "a1", uid1, []string{})
		for i := 21; i <= 25; i++ {
			e.Post(t, sender, "a0", fmt.Sprintf("m%02d", i), "after the revocation")
		}
		testkit.Eventually(t, 15*time.Second, func() error {
			if !sameSet(in2.IDs(), want("m", 1, 25)) {
				return fmt.Errorf("a2 has %d", len(in2.IDs()))
			}
			return nil
		})
		drained(t, e, djs)
		if got := dlvCount(t, e, djs, "a1", uid1); got != 20 {
			t.Fatalf("a1's DLV holds %d after the revocation, want 20", got)
		}
		if !sameSet(in1.IDs(), want("m", 1, 20)) {
			t.Fatalf("a1 was handed %v", in1.IDs())
		}
	})
}

// TestFanoutRefusesWhatIsNotAPrincipalsPost covers the drops of §1.3 step 1 and the interval and
// sender rules, with the reader running: nothing reaches a member.
func TestFanoutRefusesWhatIsNotAPrincipalsPost(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)
	e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
	e.AddLifecycle(t, pjs, "a0", uid0, []string{"general"})
	sender := plane3test.JS(t, e.Agent(t, "a0", uid0))
	before := e.Post(t, sender, "a0", "old", "before a1 joined")
	e.Join(t, djs, "general", "a1", uid1, before+1, 1) // a1 joins after the next post
	startLoops(t, e, dc)
	in1 := plane3test.Receive(t, e, "a1", uid1)

	subj, _ := e.N.Chat(plane3test.Owner, "a0", "general")
	for _, body := range []string{
		`not json`,
		`{"id":"spoof","from":{"id":"local.a1"},"text":"from.id is not the subject's principal"}`,
		`{"id":"nofrom","text":"no from"}`,
	} {
		if _, err := sender.Publish(plane3test.Ctx(t), subj, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	e.Post(t, sender, "a0", "m01", "the only one a1 may get")
	testkit.Eventually(t, 15*time.Second, func() error {
		if got := in1.IDs(); len(got) != 1 || got[0] != "m01" {
			return fmt.Errorf("a1 has %v", got)
		}
		return nil
	})
	drained(t, e, djs)
	if got := dlvCount(t, e, djs, "a1", uid1); got != 1 {
		t.Fatalf("a1's DLV holds %d, want 1 (the message at its join cursor and the refused ones are not routed)", got)
	}
}

// TestLiveMention is §1.3's live branch: on a live channel only a mentioned peer whose ACL row
// allows the channel gets a copy.
func TestLiveMention(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)
	ch, err := pjs.KeyValue(plane3test.Ctx(t), "cotal_channels_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Put(plane3test.Ctx(t), "general", []byte(`{"deliveryClass":"live"}`)); err != nil {
		t.Fatal(err)
	}
	e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
	e.AddLifecycle(t, pjs, "a2", uid2, []string{"other"})
	for _, p := range []struct{ actor, uid, name string }{{"a1", uid1, "Alice"}, {"a2", uid2, "Bob"}} {
		pres, err := plane3test.JS(t, e.Agent(t, p.actor, p.uid)).KeyValue(plane3test.Ctx(t), "cotal_presence_"+e.N.Token())
		if err != nil {
			t.Fatal(err)
		}
		card := fmt.Sprintf(`{"card":{"id":"local.%s","name":%q}}`, p.actor, p.name)
		if _, err := pres.Put(plane3test.Ctx(t), "local."+p.actor, []byte(card)); err != nil {
			t.Fatal(err)
		}
	}
	startLoops(t, e, dc)
	in1, in2 := plane3test.Receive(t, e, "a1", uid1), plane3test.Receive(t, e, "a2", uid2)
	sender := plane3test.JS(t, e.Agent(t, "a0", uid0))
	e.Post(t, sender, "a0", "m01", "no mention")
	e.Post(t, sender, "a0", "m02", "hi both", "alice", "Bob", "nobody")
	testkit.Eventually(t, 15*time.Second, func() error {
		if got := in1.IDs(); len(got) != 1 || got[0] != "m02" {
			return fmt.Errorf("a1 has %v", got)
		}
		return nil
	})
	drained(t, e, djs)
	if got := in2.IDs(); len(got) != 0 {
		t.Fatalf("a2, whose ACL does not allow general, got %v", got)
	}
}

// TestNeverCreatesAStreamOrBucket: on a space nobody provisioned, New fails naming the first
// missing stream, and leaves it missing.
func TestNeverCreatesAStreamOrBucket(t *testing.T) {
	e := plane3test.Unprovisioned(t)
	dc := e.Delivery(t)
	for _, tt := range []struct {
		name, missing string
		make          func() error
	}{
		{"fail/fanout on an unprovisioned space", "stream CHAT_alpha",
			func() error { _, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{Names: e.N}); return err }},
		{"fail/reader on an unprovisioned space", "stream INBOX_alpha",
			func() error { _, err := reader.New(plane3test.Ctx(t), dc, reader.Config{Names: e.N}); return err }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.make()
			if !errors.Is(err, plane3.ErrMissing) || !strings.Contains(err.Error(), tt.missing) {
				t.Fatalf("err = %v, want ErrMissing naming %s", err, tt.missing)
			}
		})
	}
	if _, err := plane3test.JS(t, dc).Stream(plane3test.Ctx(t), e.N.ChatStream()); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("CHAT after New: err = %v, want not found", err)
	}
	if _, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{Names: e.N, Batch: -1}); err == nil {
		t.Fatal("fail/negative batch: no error")
	}
	if _, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{}); err == nil {
		t.Fatal("fail/zero names: no error")
	}
}

// TestFanoutFence: with the lease fence down the writer publishes and acks nothing, and a
// message it fetched is handed back (nak'd at once) instead of waiting out the ack wait (plane3.AckWait), so
// it is fanned out as soon as the fence lifts.
func TestFanoutFence(t *testing.T) {
	// setup runs the writer behind f; fall, if not nil, makes f's fall from the environment.
	setup := func(t *testing.T, f *plane3test.Fence, fall func(*plane3test.Env, jetstream.JetStream) func() bool) (e *plane3test.Env, djs jetstream.JetStream, ajs jetstream.JetStream) {
		e = plane3test.New(t)
		dc := e.Delivery(t)
		djs = plane3test.JS(t, dc)
		pjs := e.Provisioner(t)
		e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
		e.Join(t, djs, "general", "a1", uid1, 0, 1)
		if fall != nil {
			f.Fall = fall(e, djs)
		}
		w, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{Names: e.N, MayAct: f.MayAct})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx, nil) }()
		t.Cleanup(func() { cancel(); <-done })
		return e, djs, plane3test.JS(t, e.Agent(t, "a0", uid0))
	}
	fanoutState := func(t *testing.T, e *plane3test.Env, djs jetstream.JetStream) *jetstream.ConsumerInfo {
		t.Helper()
		c, err := djs.Consumer(plane3test.Ctx(t), e.N.ChatStream(), "fanout")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	// acted waits for the message at seq to be acked with one inbox copy, in well under the
	// ack wait (plane3.AckWait, 15 s): a message left unacked by a fenced pass would not be
	// redelivered before it.
	acted := func(t *testing.T, e *plane3test.Env, djs jetstream.JetStream, seq uint64) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			if ci := fanoutState(t, e, djs); ci.AckFloor.Stream < seq {
				return fmt.Errorf("ack floor %d, want %d", ci.AckFloor.Stream, seq)
			}
			return nil
		})
		if n := inboxCount(t, e, djs); n != 1 {
			t.Fatalf("INBOX holds %d entries, want the one copy", n)
		}
	}

	t.Run("ok/down-from-the-start-fetches-nothing", func(t *testing.T) {
		f := &plane3test.Fence{}
		e, djs, ajs := setup(t, f, nil)
		seq := e.Post(t, ajs, "a0", "m01", "while fenced")
		// The writer looks at its fence before every fetch: once it has looked several times
		// after the post was stored, it has had the chance to fetch and must not have.
		from := f.Downs.Load()
		testkit.Eventually(t, 5*time.Second, func() error {
			if n := f.Downs.Load() - from; n < 3 {
				return fmt.Errorf("the fence was looked at %d times since the post", n)
			}
			return nil
		})
		if ci := fanoutState(t, e, djs); ci.Delivered.Consumer != 0 || ci.AckFloor.Consumer != 0 {
			t.Fatalf("a fenced writer fetched %d and acked %d", ci.Delivered.Consumer, ci.AckFloor.Consumer)
		}
		if n := inboxCount(t, e, djs); n != 0 {
			t.Fatalf("a fenced writer stored %d inbox entries", n)
		}
		f.Lifted.Store(true)
		acted(t, e, djs, seq)
	})
	t.Run("ok/fence-falling-mid-pass-hands-the-message-back", func(t *testing.T) {
		// The fence falls once the message's inbox copy is stored, before its ack: the pass
		// must hand it back rather than leave it to the ack wait; redelivered once the fence
		// lifts, it is routed again and its copy collapses on its Nats-Msg-Id.
		f := &plane3test.Fence{}
		e, djs, ajs := setup(t, f, func(e *plane3test.Env, djs jetstream.JetStream) func() bool {
			return func() bool { return inboxCountErr(e, djs) != 0 }
		})
		seq := e.Post(t, ajs, "a0", "m01", "the fence falls on it")
		// Down three times: the pass that saw it fall has settled and the loop waits.
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := f.Downs.Load(); n < 3 {
				return fmt.Errorf("the fence answered down %d times", n)
			}
			return nil
		})
		if ci := fanoutState(t, e, djs); ci.Delivered.Stream < seq || ci.AckFloor.Stream >= seq {
			t.Fatalf("delivered up to %d, acked up to %d; want %d delivered and not acked", ci.Delivered.Stream, ci.AckFloor.Stream, seq)
		}
		f.Lifted.Store(true)
		acted(t, e, djs, seq)
	})
}

// inboxCount is how many entries INBOX holds.
func inboxCount(t *testing.T, e *plane3test.Env, djs jetstream.JetStream) uint64 {
	t.Helper()
	s, err := djs.Stream(plane3test.Ctx(t), e.N.InboxStream())
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// inboxCountErr is inboxCount for a fence's goroutine: a failed read counts as nothing stored.
func inboxCountErr(e *plane3test.Env, djs jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := djs.Stream(ctx, e.N.InboxStream())
	if err != nil {
		return 0
	}
	return s.CachedInfo().State.Msgs
}

// TestFanoutPassPastTheAsyncWindow: one pass of 200 messages to 25 members publishes 5000 inbox
// copies, more than nats.go's default async window (4000) and the pass window (4096); the pass
// waits for room instead of failing on a stalled publish, each copy's ack received once, so no
// message is redelivered and every member gets every message once.
func TestFanoutPassPastTheAsyncWindow(t *testing.T) {
	t.Run("ok/one-pass-no-redelivery", func(t *testing.T) {
		const members, msgs = 25, 200
		e := plane3test.New(t)
		dc := e.Delivery(t)
		djs := plane3test.JS(t, dc)
		pjs := e.Provisioner(t)
		e.AddLifecycle(t, pjs, "a0", uid0, []string{"general"})
		for i := range members {
			actor, uid := fmt.Sprintf("m%02d", i), fmt.Sprintf("uid%023d", i)
			e.AddLifecycle(t, pjs, actor, uid, []string{"general"})
			e.Join(t, djs, "general", actor, uid, 0, 1)
		}
		fc := &plane3test.Fence{} // the writer waits until every post is stored: one pass
		startLoopsWith(t, dc, fanout.Config{Names: e.N, MayAct: fc.MayAct}, reader.Config{Names: e.N})
		sender := plane3test.JS(t, e.Agent(t, "a0", uid0))
		for i := range msgs {
			e.Post(t, sender, "a0", fmt.Sprintf("w%03d", i), "x")
		}
		fc.Lifted.Store(true)
		drained(t, e, djs)
		s, err := djs.Stream(plane3test.Ctx(t), e.N.DLVStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != members*msgs {
			t.Fatalf("DLV holds %d copies, want %d", info.State.Msgs, members*msgs)
		}
		cons, err := djs.Consumer(plane3test.Ctx(t), e.N.ChatStream(), e.N.FanoutConsumer())
		if err != nil {
			t.Fatal(err)
		}
		ci, err := cons.Info(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumRedelivered != 0 || ci.Delivered.Stream != msgs {
			t.Fatalf("fanout delivered up to %d, %d redelivered; want %d and none", ci.Delivered.Stream, ci.NumRedelivered, msgs)
		}
	})
}

// TestWriterRowsAtPost: a member whose join was answered before a post is stored gets that post,
// with no wait between the join and the post: ten members join one after the other, each right
// before a post, so member j gets posts j to 9 (10 - j copies). A pass that read its membership
// rows before its mirror caught up with a join fails here.
func TestWriterRowsAtPost(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)
	e.AddLifecycle(t, pjs, "a0", uid0, []string{"general"})
	e.Join(t, djs, "general", "a0", uid0, 0, 1)
	startLoops(t, e, dc)
	sender := plane3test.JS(t, e.Agent(t, "a0", uid0))
	const n = 10
	member := func(j int) (string, string) { return fmt.Sprintf("j%02d", j), fmt.Sprintf("uid%023d", 100+j) }
	for i := range n {
		actor, uid := member(i)
		e.AddLifecycle(t, pjs, actor, uid, []string{"general"})
		e.Join(t, djs, "general", actor, uid, 0, 1)
		e.Post(t, sender, "a0", fmt.Sprintf("p%02d", i), "hello")
		drained(t, e, djs)
	}
	for j := range n {
		actor, uid := member(j)
		if got := dlvCount(t, e, djs, actor, uid); got != uint64(n-j) {
			t.Errorf("%s: DLV holds %d copies, want %d", actor, got, n-j)
		}
	}
}
