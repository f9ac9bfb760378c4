package reader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const uid1 = "uidaaaaaaaaaaaaaaaaaaaaaaa"

// records counts log records by level and message.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }
func (r *records) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m == s {
			return true
		}
	}
	return false
}

type fixture struct {
	e   *plane3test.Env
	djs jetstream.JetStream
	pjs jetstream.JetStream
	log *records
}

// start runs the reader alone (entries are published straight into INBOX) with a short nak delay.
func start(t *testing.T, mayAct func() bool) *fixture {
	t.Helper()
	return startFenced(t, func(*fixture) func() bool { return mayAct })
}

// startFenced is start with the fence fence(f) makes from the fixture.
func startFenced(t *testing.T, fence func(*fixture) func() bool) *fixture {
	t.Helper()
	return startAfter(t, fence, nil)
}

// startAfter is startFenced with before(f) run before the reader starts (nil: nothing), so that
// what it publishes is waiting for the reader's first pass.
func startAfter(t *testing.T, fence func(*fixture) func() bool, before func(*fixture)) *fixture {
	t.Helper()
	e := plane3test.New(t)
	dc := e.Delivery(t)
	f := &fixture{e: e, djs: plane3test.JS(t, dc), pjs: e.Provisioner(t), log: &records{}}
	if before != nil {
		before(f)
	}
	r, err := reader.New(plane3test.Ctx(t), dc, reader.Config{Names: e.N, NakDelay: 20 * time.Millisecond, MayAct: fence(f), Logger: slog.New(f.log)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// entry publishes an inbox entry for local.a1.<uid1> as the fan-out writer would.
func (f *fixture) entry(t *testing.T, subject string, e plane3.Entry) {
	t.Helper()
	b, _ := json.Marshal(e)
	f.raw(t, subject, string(b))
}

func (f *fixture) raw(t *testing.T, subject, body string) {
	t.Helper()
	if _, err := f.djs.Publish(plane3test.Ctx(t), subject, []byte(body)); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) dinbox(t *testing.T) string {
	s, err := f.e.N.Dinbox(plane3test.Owner, "a1", uid1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readerState returns the reader durable's info.
func (f *fixture) readerState(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := f.djs.Consumer(plane3test.Ctx(t), f.e.N.InboxStream(), "reader")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := c.Info(plane3test.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

// settled waits until the reader has acked or terminated every entry stored in INBOX.
func (f *fixture) settled(t *testing.T) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, func() error {
		s, err := f.djs.Stream(plane3test.Ctx(t), f.e.N.InboxStream())
		if err != nil {
			return err
		}
		last := s.CachedInfo().State.LastSeq
		if ci := f.readerState(t); ci.NumPending != 0 || ci.NumAckPending != 0 || ci.AckFloor.Stream != last {
			return fmt.Errorf("reader: pending %d, unacked %d, ack floor %d of %d", ci.NumPending, ci.NumAckPending, ci.AckFloor.Stream, last)
		}
		return nil
	})
}

// dlvCount is how many messages DLV holds for local.a1.<uid1> (stream info by subject, which the
// delivery credential may read; it reads no DLV body).
func (f *fixture) dlvCount(t *testing.T) int {
	t.Helper()
	subj, _ := f.e.N.Dlv(plane3test.Owner, "a1", uid1)
	s, err := f.djs.Stream(plane3test.Ctx(t), f.e.N.DLVStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(plane3test.Ctx(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Subjects[subj])
}

// dlvMsgs reads local.a1's DLV messages as the agent does, through its own dlv_ durable.
func (f *fixture) dlvMsgs(t *testing.T, want int) []jetstream.Msg {
	t.Helper()
	name, _ := f.e.N.DlvConsumer(plane3test.Owner, "a1", uid1)
	c, err := plane3test.JS(t, f.e.Agent(t, "a1", uid1)).Consumer(plane3test.Ctx(t), f.e.N.DLVStream(), name)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(want+1, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	return out
}

func msg(id string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"id":%q,"from":{"id":"local.a0"},"channel":"general","text":"x"}`, id))
}

// TestReaderPublishesTheFrame: an entry for a lifecycle whose ACL allows the channel and whose
// member interval holds the sequence becomes one DLV message with the frame, the header and the
// dedup id; a second copy of the same entry is collapsed by that id.
func TestReaderPublishesTheFrame(t *testing.T) {
	f := start(t, nil)
	f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
	f.e.Join(t, f.djs, "general", "a1", uid1, 0, 3)
	e := plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 5, Reason: plane3.ReasonDurable, Generation: 3}
	f.entry(t, f.dinbox(t), e)
	f.entry(t, f.dinbox(t), e) // a catch-up copy racing the fan-out copy
	f.settled(t)
	got := f.dlvMsgs(t, 1)
	if len(got) != 1 || f.dlvCount(t) != 1 {
		t.Fatalf("DLV holds %d copies, want 1", len(got))
	}
	m := got[0]
	if m.Headers().Get(dlvclient.FrameHeader) != "1" || m.Headers().Get(jetstream.MsgIDHeader) != "m1:local.a1:"+uid1+":3" {
		t.Fatalf("headers %v", m.Headers())
	}
	fr, id, err := dlvclient.DecodeFrame(m.Data())
	if err != nil || id != "m1" || fr.Channel != "general" {
		t.Fatalf("frame %+v id %q: %v", fr, id, err)
	}
}

// TestReaderSharedMessage: the reader decodes and frames each distinct message of a pass once for
// all the entries carrying it; each copy still gets its own entry's channel, lifecycle and dedup
// id, and a message that does not decode drops every entry carrying it. All the entries wait for
// the reader's first pass.
func TestReaderSharedMessage(t *testing.T) {
	x := msg("m1")
	bad := json.RawMessage(`{"id":7,"text":"x"}`)
	f := startAfter(t, func(*fixture) func() bool { return nil }, func(f *fixture) {
		f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general", "other"})
		f.e.AddLifecycle(t, f.pjs, "a2", uid2, []string{"general"})
		a2, err := f.e.N.Dinbox(plane3test.Owner, "a2", uid2)
		if err != nil {
			t.Fatal(err)
		}
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: x, Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
		f.entry(t, a2, plane3.Entry{Msg: x, Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: x, Channel: "other", Seq: 2, Reason: plane3.ReasonMention, Generation: 1})
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: bad, Channel: "general", Seq: 3, Reason: plane3.ReasonMention})
		f.entry(t, a2, plane3.Entry{Msg: bad, Channel: "general", Seq: 3, Reason: plane3.ReasonMention})
	})
	f.settled(t)
	if ci := f.readerState(t); ci.Delivered.Consumer != 5 {
		t.Fatalf("%d deliveries, want each of the 5 entries once", ci.Delivered.Consumer)
	}
	frames := func(actor, uid string, want int) []string {
		name, _ := f.e.N.DlvConsumer(plane3test.Owner, actor, uid)
		c, err := plane3test.JS(t, f.e.Agent(t, actor, uid)).Consumer(plane3test.Ctx(t), f.e.N.DLVStream(), name)
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.Fetch(want+1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			fr, id, err := dlvclient.DecodeFrame(m.Data())
			if err != nil {
				t.Fatalf("%s: frame %q: %v", actor, m.Data(), err)
			}
			got = append(got, fr.Channel+" "+id+" "+m.Headers().Get(jetstream.MsgIDHeader))
		}
		return got
	}
	if got, want := frames("a1", uid1, 2), []string{"general m1 m1:local.a1:" + uid1 + ":0", "other m1 m1:local.a1:" + uid1 + ":1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a1's copies %q, want %q", got, want)
	}
	if got, want := frames("a2", uid2, 1), []string{"general m1 m1:local.a2:" + uid2 + ":0"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a2's copies %q, want %q", got, want)
	}
	f.log.mu.Lock()
	defer f.log.mu.Unlock()
	dropped := 0
	for _, m := range f.log.msgs {
		if m == "WARN dropped an entry that does not decode" {
			dropped++
		}
	}
	if dropped != 2 {
		t.Fatalf("%d entries dropped as not decoding, want the 2 carrying the bad message", dropped)
	}
}

// TestReaderGate is §1.4's table: what is dropped, what waits, what gives up.
func TestReaderGate(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, f *fixture)
		send  func(t *testing.T, f *fixture)
		check func(t *testing.T, f *fixture)
	}{
		{"fail/channel outside the ACL row is dropped (revocation)",
			func(t *testing.T, f *fixture) { f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"other"}) },
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
			},
			func(t *testing.T, f *fixture) { f.settled(t); wantDLV(t, f, 0) }},
		{"fail/durable entry at the join cursor is dropped",
			func(t *testing.T, f *fixture) {
				f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
				f.e.Join(t, f.djs, "general", "a1", uid1, 7, 1)
			},
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 7, Reason: plane3.ReasonDurable, Generation: 1})
			},
			func(t *testing.T, f *fixture) { f.settled(t); wantDLV(t, f, 0) }},
		{"fail/durable entry without a member row is dropped",
			func(t *testing.T, f *fixture) { f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"}) },
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 9, Reason: plane3.ReasonDurable, Generation: 1})
			},
			func(t *testing.T, f *fixture) { f.settled(t); wantDLV(t, f, 0) }},
		{"fail/undecodable entry and short subject are dropped",
			func(t *testing.T, f *fixture) { f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"}) },
			func(t *testing.T, f *fixture) {
				f.raw(t, f.dinbox(t), `{"msg":{"id":"m1"},"channel":"general","seq":1,"reason":"because"}`)
				f.raw(t, f.dinbox(t), `not json`)
			},
			func(t *testing.T, f *fixture) { f.settled(t); wantDLV(t, f, 0) }},
		{"ok/missing ACL row waits and delivers once the row appears",
			func(t *testing.T, f *fixture) { f.e.AddLifecycle(t, f.pjs, "a1", uid1, nil) },
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
			},
			func(t *testing.T, f *fixture) {
				testkit.Eventually(t, 5*time.Second, func() error {
					if ci := f.readerState(t); ci.NumRedelivered == 0 {
						return fmt.Errorf("not redelivered yet")
					}
					return nil
				})
				wantDLV(t, f, 0)
				f.e.SetACL(t, f.pjs, "a1", uid1, []string{"general"})
				testkit.Eventually(t, 5*time.Second, func() error {
					if n := f.dlvCount(t); n != 1 {
						return fmt.Errorf("DLV holds %d", n)
					}
					return nil
				})
				f.settled(t)
			}},
		{"fail/a departed lifecycle's durable entry is dropped at its first delivery",
			func(t *testing.T, f *fixture) {
				// Provisioned and joined, then deprovisioned as managerd's Stop does (ACL row
				// purged by a deprovisioner) and its membership row closed as the fan-out writer
				// closes a departed member's.
				f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
				f.e.Join(t, f.djs, "general", "a1", uid1, 3, 1)
				nc := f.e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_DEPROVISIONER,
					&signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "a1", LifecycleUid: uid1})
				if _, err := provision.DeprovisionAgent(plane3test.Ctx(t), plane3test.JS(t, nc), f.e.N, plane3test.Owner, "a1", uid1, nil); err != nil {
					t.Fatal(err)
				}
				f.depart(t, "general", "a1", uid1)
			},
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 5, Reason: plane3.ReasonDurable, Generation: 1})
			},
			func(t *testing.T, f *fixture) {
				f.settled(t)
				wantDLV(t, f, 0)
				if ci := f.readerState(t); ci.Delivered.Consumer != 1 {
					t.Fatalf("delivered %d times, want 1 (no retry)", ci.Delivered.Consumer)
				}
				if f.log.has("ERROR gave up on an entry") {
					t.Fatalf("a departed lifecycle's entry was retried to the end: %v", f.log.msgs)
				}
			}},
		{"fail/missing ACL row is terminated after 10 deliveries",
			func(t *testing.T, f *fixture) { f.e.AddLifecycle(t, f.pjs, "a1", uid1, nil) },
			func(t *testing.T, f *fixture) {
				f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
			},
			func(t *testing.T, f *fixture) {
				f.settled(t)
				wantDLV(t, f, 0)
				if !f.log.has("ERROR gave up on an entry") {
					t.Fatalf("no give-up logged: %v", f.log.msgs)
				}
				if ci := f.readerState(t); ci.Delivered.Consumer != 10 {
					t.Fatalf("delivered %d times, want 10", ci.Delivered.Consumer)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, nil)
			tt.setup(t, f)
			tt.send(t, f)
			tt.check(t, f)
		})
	}
}

// TestReaderFence: with the lease fence down the reader publishes and acks nothing, and an entry
// it fetched is handed back (nak'd at once, not acked, deferred or terminated) instead of
// waiting out the ack wait (plane3.AckWait), so it is delivered as soon as the fence lifts.
func TestReaderFence(t *testing.T) {
	// acted waits for the entry to be acked with one DLV copy, in well under the ack wait
	// (plane3.AckWait, 15 s): an entry left unacked by a fenced pass would not be redelivered
	// before it.
	acted := func(t *testing.T, f *fixture) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			if ci := f.readerState(t); ci.AckFloor.Stream < 1 {
				return fmt.Errorf("ack floor %d, want 1", ci.AckFloor.Stream)
			}
			return nil
		})
		wantDLV(t, f, 1)
	}
	t.Run("ok/down-from-the-start-fetches-nothing", func(t *testing.T) {
		fc := &plane3test.Fence{}
		f := start(t, fc.MayAct)
		f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
		// The reader looks at its fence before every fetch: once it has looked several times
		// after the entry was stored, it has had the chance to fetch and must not have.
		from := fc.Downs.Load()
		testkit.Eventually(t, 5*time.Second, func() error {
			if n := fc.Downs.Load() - from; n < 3 {
				return fmt.Errorf("the fence was looked at %d times since the entry", n)
			}
			return nil
		})
		if ci := f.readerState(t); ci.Delivered.Consumer != 0 || ci.AckFloor.Consumer != 0 || f.dlvCount(t) != 0 {
			t.Fatalf("a fenced reader fetched %d, acked %d, DLV holds %d", ci.Delivered.Consumer, ci.AckFloor.Consumer, f.dlvCount(t))
		}
		fc.Lifted.Store(true)
		acted(t, f)
	})
	t.Run("ok/fence-falling-mid-pass-hands-the-entry-back", func(t *testing.T) {
		// The fence falls once the entry's DLV copy is stored, before its ack: the pass must
		// hand it back rather than leave it to the ack wait; redelivered once the fence lifts,
		// it is published again and its copy collapses on its Nats-Msg-Id.
		fc := &plane3test.Fence{}
		f := startFenced(t, func(f *fixture) func() bool {
			fc.Fall = func() bool { return f.dlvCountErr() != 0 }
			return fc.MayAct
		})
		f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
		// Down three times: the pass that saw it fall has settled and the loop waits.
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := fc.Downs.Load(); n < 3 {
				return fmt.Errorf("the fence answered down %d times", n)
			}
			return nil
		})
		if ci := f.readerState(t); ci.Delivered.Stream < 1 || ci.AckFloor.Stream != 0 {
			t.Fatalf("delivered up to %d, acked up to %d; want the entry delivered and not acked", ci.Delivered.Stream, ci.AckFloor.Stream)
		}
		fc.Lifted.Store(true)
		acted(t, f)
	})
}

// dlvCountErr is dlvCount for a fence's goroutine: a failed read counts as nothing stored.
func (f *fixture) dlvCountErr() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	subj, _ := f.e.N.Dlv(plane3test.Owner, "a1", uid1)
	s, err := f.djs.Stream(ctx, f.e.N.DLVStream())
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0
	}
	return info.State.Subjects[subj]
}

// depart closes local.<actor>.<uid>'s membership row on channel as the fan-out writer closes a
// departed lifecycle's (plane3.Member.Depart), with the delivery credential.
func (f *fixture) depart(t *testing.T, channel, actor, uid string) {
	t.Helper()
	kv, err := f.djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := space.MemberKey(channel, plane3test.Owner, actor, uid)
	e, err := kv.Get(plane3test.Ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := plane3.DecodeMember(key, e.Value())
	if err != nil {
		t.Fatal(err)
	}
	closed, _ := m.Depart("test", time.Now().UnixMilli())
	b, _ := json.Marshal(closed)
	if _, err := kv.Update(plane3test.Ctx(t), key, b, e.Revision()); err != nil {
		t.Fatal(err)
	}
}

func wantDLV(t *testing.T, f *fixture, n int) {
	t.Helper()
	if got := f.dlvCount(t); got != n {
		t.Fatalf("DLV holds %d, want %d", got, n)
	}
}

// TestReaderManyRows: a pass of 40 entries for 40 lifecycles reads 40 ACL rows and 40 membership
// rows from the buckets' mirrors; its decisions are those of reads by key: 38 copies, one entry
// outside its member's interval and one whose ACL no longer allows the channel dropped.
func TestReaderManyRows(t *testing.T) {
	t.Run("ok/one-pass-gates-each-entry", func(t *testing.T) {
		fc := &plane3test.Fence{} // down until every entry is stored: they make one pass
		f := start(t, fc.MayAct)
		const n = 40
		for i := range n {
			actor, uid := fmt.Sprintf("s%02d", i), fmt.Sprintf("uid%023d", i)
			allow := []string{"general"}
			if i == n-1 {
				allow = []string{"other"} // revoked
			}
			f.e.AddLifecycle(t, f.pjs, actor, uid, allow)
			join := uint64(0)
			if i == n-2 {
				join = 7 // the entry's sequence 5 is before the join
			}
			f.e.Join(t, f.djs, "general", actor, uid, join, 1)
			subj, _ := f.e.N.Dinbox(plane3test.Owner, actor, uid)
			f.entry(t, subj, plane3.Entry{Msg: msg("m1"), Channel: "general", Seq: 5, Reason: plane3.ReasonDurable, Generation: 1})
		}
		fc.Lifted.Store(true)
		f.settled(t)
		s, err := f.djs.Stream(plane3test.Ctx(t), f.e.N.DLVStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(plane3test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != n-2 {
			t.Fatalf("DLV holds %d copies, want %d", info.State.Msgs, n-2)
		}
		for _, want := range []string{
			"INFO dropped a durable entry outside its member's interval",
			"INFO dropped an entry: the lifecycle's ACL no longer allows the channel",
		} {
			if !f.log.has(want) {
				t.Errorf("no log %q", want)
			}
		}
		if f.log.has("DEBUG deferred an entry") {
			t.Error("an entry was deferred: a row the mirror should have held was missing")
		}
	})
}

// TestReaderRowsAtDelivery: with the reader's mirrors open (after a first copy), each ACL or
// membership change answered before an entry is stored decides that entry, with no wait between
// the write and the entry: a revocation drops it, the ACL restored delivers the next, a rejoin
// whose interval starts after the entry drops it. Twenty revoke and restore rounds, so a pass that
// read its rows before its mirror caught up with a write fails here.
func TestReaderRowsAtDelivery(t *testing.T) {
	f := start(t, plane3.Always)
	f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
	f.e.Join(t, f.djs, "general", "a1", uid1, 0, 1)
	post := func(id string, seq uint64) {
		t.Helper()
		f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg(id), Channel: "general", Seq: seq, Reason: plane3.ReasonDurable, Generation: 1})
		f.settled(t)
	}
	want := func(n int) {
		t.Helper()
		if got := f.dlvCount(t); got != n {
			t.Fatalf("DLV holds %d copies, want %d", got, n)
		}
	}
	post("m0", 5)
	want(1)
	for i := range 20 {
		f.e.SetACL(t, f.pjs, "a1", uid1, []string{"other"})
		post(fmt.Sprintf("r%d", i), 5)
		want(1 + i)
		f.e.SetACL(t, f.pjs, "a1", uid1, []string{"general"})
		post(fmt.Sprintf("g%d", i), 5)
		want(2 + i)
	}
	f.e.Join(t, f.djs, "general", "a1", uid1, 7, 1)
	post("late", 5)
	want(21)
	for _, log := range []string{
		"INFO dropped an entry: the lifecycle's ACL no longer allows the channel",
		"INFO dropped a durable entry outside its member's interval",
	} {
		if !f.log.has(log) {
			t.Errorf("no log %q", log)
		}
	}
}
