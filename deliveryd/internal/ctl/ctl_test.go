package ctl_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const (
	uid1 = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uid2 = "uidbbbbbbbbbbbbbbbbbbbbbbb"
	uid3 = "uidcccccccccccccccccccccccc"
	uid0 = "uidzzzzzzzzzzzzzzzzzzzzzzz"
	// quiet is how long a test waits to conclude that no reply is coming: a request timeout, not
	// a synchronisation sleep (a reply that should come is awaited with the long deadline).
	quiet = 500 * time.Millisecond
)

// fixture is a provisioned space with the responders bound on a delivery connection.
type fixture struct {
	e     *plane3test.Env
	dc    *nats.Conn
	djs   jetstream.JetStream
	pjs   jetstream.JetStream
	r     *ctl.Responders
	fence atomic.Bool
}

// setup provisions the space, gives local.a1 (uid1), local.a2 (uid2) and local.a0 (uid0) a dlv_
// durable and an ACL row (a1: general and team.backend; a2 and a0: general), and binds the
// responders. prepare may adjust the config and the responders before Start.
func setup(t *testing.T, prepare func(*ctl.Config), hook func(*fixture, *ctl.Responders)) *fixture {
	t.Helper()
	f := &fixture{e: plane3test.New(t)}
	f.fence.Store(true)
	f.dc = f.e.Delivery(t)
	f.djs = plane3test.JS(t, f.dc)
	f.pjs = f.e.Provisioner(t)
	f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general", "team.backend"})
	f.e.AddLifecycle(t, f.pjs, "a2", uid2, []string{"general"})
	f.e.AddLifecycle(t, f.pjs, "a0", uid0, []string{"general"})
	cfg := ctl.Config{Names: f.e.N, WriterIdentity: "UDELIVERYTEST", MayAct: f.fence.Load, StoreIdentity: f.e.S.Addr}
	if prepare != nil {
		prepare(&cfg)
	}
	r, err := ctl.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if hook != nil {
		hook(f, r)
	}
	// Started as deliveryd starts it: with its serving context, which has no deadline.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.Start(ctx, f.dc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	f.r = r
	return f
}

// reply is a decoded control reply.
type reply struct {
	OK    bool            `json:"ok"`
	Data  json.RawMessage `json:"data"`
	Error string          `json:"error"`
	Code  string          `json:"code"`
}

func nonce(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// send publishes body on the service's request subject of local.<actor> with replyTo (empty:
// the caller's own bound reply lane) and returns the reply, or ok=false after wait.
func send(t *testing.T, nc *nats.Conn, service, actor string, body []byte, replyTo string, wait time.Duration) (reply, bool) {
	t.Helper()
	subj := "cotal." + plane3test.Space + ".ctl." + service + "." + plane3test.Owner + "." + actor
	if replyTo == "" {
		replyTo = subj + ".reply." + nonce(t)
	}
	sub, err := nc.SubscribeSync(replyTo)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Reply: replyTo, Data: body}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(wait)
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return reply{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var r reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply %q is not a control reply: %v", m.Data, err)
	}
	return r, true
}

func body(t *testing.T, op string, args any, from string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"op": op, "args": args, "from": map[string]string{"id": from, "name": "agent"}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// call sends op as local.<actor> on ctl.delivery and waits for the reply.
func call(t *testing.T, nc *nats.Conn, actor, op string, args any) reply {
	t.Helper()
	r, ok := send(t, nc, space.CtlServiceDelivery, actor, body(t, op, args, plane3test.Owner+"."+actor), "", 20*time.Second)
	if !ok {
		t.Fatalf("%s: no reply", op)
	}
	return r
}

func data[T any](t *testing.T, r reply) T {
	t.Helper()
	if !r.OK {
		t.Fatalf("refused: %s", r.Error)
	}
	var v T
	if err := json.Unmarshal(r.Data, &v); err != nil {
		t.Fatalf("data %s: %v", r.Data, err)
	}
	return v
}

func wantRefusal(t *testing.T, r reply, want string) {
	t.Helper()
	if r.OK || !strings.Contains(r.Error, want) {
		t.Fatalf("got ok=%v error %q data %s, want a refusal containing %q", r.OK, r.Error, r.Data, want)
	}
}

// member reads a membership row with the delivery credential (nil when there is none).
func (f *fixture) member(t *testing.T, channel, actor, uid string) *plane3.Member {
	t.Helper()
	kv, err := f.djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := space.MemberKey(channel, plane3test.Owner, actor, uid)
	e, err := kv.Get(plane3test.Ctx(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := plane3.DecodeMember(key, e.Value())
	if err != nil {
		t.Fatal(err)
	}
	return &m
}

// putMember writes a membership row directly (what another instance of the daemon would have
// left), with the delivery credential.
func (f *fixture) putMember(t *testing.T, m plane3.Member, actor string) {
	t.Helper()
	kv, err := f.djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := space.MemberKey(m.Channel, plane3test.Owner, actor, m.LifecycleUID)
	b, _ := json.Marshal(m)
	if _, err := kv.Put(plane3test.Ctx(t), key, b); err != nil {
		t.Fatal(err)
	}
}

// lastSeq is a stream's last sequence: the members bucket's or INBOX's revision counter.
func (f *fixture) lastSeq(t *testing.T, stream string) uint64 {
	t.Helper()
	s, err := f.djs.Stream(plane3test.Ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(plane3test.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// state is what "changes nothing" compares: the members bucket's and INBOX's last sequences.
func (f *fixture) state(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("members@%d inbox@%d", f.lastSeq(t, "KV_cotal_members_"+f.e.N.Token()), f.lastSeq(t, f.e.N.InboxStream()))
}

func (f *fixture) frontier(t *testing.T) uint64 {
	t.Helper()
	return f.lastSeq(t, f.e.N.ChatStream())
}

// TestDurableJoin covers durableJoin's generation and CAS cases one after another on one space.
func TestDurableJoin(t *testing.T) {
	f := setup(t, nil, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	sender := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
	f.e.Post(t, sender, "a0", "m01", "before any join")

	t.Run("ok/a first join commits generation 1 at the CHAT frontier, activated", func(t *testing.T) {
		front := f.frontier(t)
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 || got.LifecycleUID != uid1 || got.Reason != "" {
			t.Fatalf("join = %+v", got)
		}
		m := f.member(t, "general", "a1", uid1)
		if m == nil || m.State != ctl.StateActive || !m.Activated || m.Generation != 1 || m.JoinCursor != front ||
			m.LeaveCursor != nil || m.Owner != "local.a1" || m.WriterIdentity != "UDELIVERYTEST" || m.UpdatedAt == 0 {
			t.Fatalf("row = %+v, want active generation 1 at %d", m, front)
		}
	})
	t.Run("ok/joining an activated membership again changes nothing", func(t *testing.T) {
		before := f.state(t)
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
		if after := f.state(t); after != before {
			t.Fatalf("state moved from %s to %s", before, after)
		}
	})
	t.Run("ok/a rejoin after a leave takes the next generation and a fresh cursor", func(t *testing.T) {
		if r := call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "general", "generation": 1, "lifecycleUid": uid1}); !r.OK {
			t.Fatalf("leave: %s", r.Error)
		}
		f.e.Post(t, sender, "a0", "m02", "between leave and rejoin")
		front := f.frontier(t)
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 2 {
			t.Fatalf("rejoin = %+v", got)
		}
		m := f.member(t, "general", "a1", uid1)
		if m.Generation != 2 || m.JoinCursor != front || m.LeaveCursor != nil || !m.Activated || m.State != ctl.StateActive {
			t.Fatalf("row = %+v, want generation 2 open at %d", m, front)
		}
	})
	t.Run("ok/a second channel of the ACL row is its own membership", func(t *testing.T) {
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "team.backend"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
	})

	a3 := f.e.Agent(t, "a3", uid3)
	for _, tt := range []struct {
		name, actor string
		nc          *nats.Conn
		args        map[string]any
		want        string
		prepare     func(t *testing.T)
	}{
		{"fail/a channel outside the caller's ACL row", "a1", a1, map[string]any{"channel": "secret"}, "not within your read ACL", nil},
		{"fail/a wildcard channel", "a1", a1, map[string]any{"channel": "team.*"}, "must be a concrete channel", nil},
		{"fail/a subtree channel", "a1", a1, map[string]any{"channel": "team.>"}, "must be a concrete channel", nil},
		{"fail/no channel", "a1", a1, map[string]any{}, "channel must be a non-blank string", nil},
		{"fail/a channel that is not a string", "a1", a1, map[string]any{"channel": 7}, "channel must be a string", nil},
		{"fail/a caller without an ACL row", "a3", a3, map[string]any{"channel": "general"}, "no read ACL on record for local.a3", nil},
		{"fail/a caller with two live ACL rows", "a2", f.e.Agent(t, "a2", uid2), map[string]any{"channel": "general"}, "2 live lifecycle rows",
			func(t *testing.T) { f.e.SetACL(t, f.pjs, "a2", uid3, []string{"general"}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.prepare != nil {
				tt.prepare(t)
			}
			before := f.state(t)
			wantRefusal(t, call(t, tt.nc, tt.actor, ctl.OpDurableJoin, tt.args), tt.want)
			if after := f.state(t); after != before {
				t.Fatalf("a refused join moved %s to %s", before, after)
			}
		})
	}
}

// TestDurableLeave covers durableLeave's generation guard and its idempotence.
func TestDurableLeave(t *testing.T) {
	f := setup(t, nil, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	sender := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
	if got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"})); got.Generation != 1 {
		t.Fatalf("join = %+v", got)
	}
	f.e.Post(t, sender, "a0", "m01", "after the join")
	leave := func(gen any, uid string) map[string]any {
		return map[string]any{"channel": "general", "generation": gen, "lifecycleUid": uid}
	}

	for _, tt := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"fail/a stale generation", leave(2, uid1), "stale membership write"},
		{"fail/an older generation", leave(0, uid1), "stale membership write"},
		{"fail/no generation", map[string]any{"channel": "general", "lifecycleUid": uid1}, "generation is required"},
		{"fail/a fractional generation", leave(1.5, uid1), "non-negative integer"},
		{"fail/a negative generation", leave(-1, uid1), "non-negative integer"},
		{"fail/a generation that is a string", leave("1", uid1), "non-negative integer"},
		{"fail/no lifecycleUid", map[string]any{"channel": "general", "generation": 1}, "lifecycleUid: is required"},
		{"fail/a malformed lifecycleUid", leave(1, "UID-1"), "lifecycleUid"},
		{"fail/a wildcard channel", map[string]any{"channel": "*", "generation": 1, "lifecycleUid": uid1}, "concrete channel"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := f.state(t)
			wantRefusal(t, call(t, a1, "a1", ctl.OpDurableLeave, tt.args), tt.want)
			if after := f.state(t); after != before {
				t.Fatalf("a refused leave moved %s to %s", before, after)
			}
			if m := f.member(t, "general", "a1", uid1); m.LeaveCursor != nil || m.Generation != 1 {
				t.Fatalf("row = %+v, want generation 1 open", m)
			}
		})
	}
	t.Run("ok/no row is already left and changes nothing", func(t *testing.T) {
		before := f.state(t)
		got := data[ctl.LeaveResult](t, call(t, a1, "a1", ctl.OpDurableLeave, leave(1, uid2)))
		if !got.AlreadyLeft || got.Channel != "general" {
			t.Fatalf("leave = %+v", got)
		}
		if after := f.state(t); after != before {
			t.Fatalf("state moved from %s to %s", before, after)
		}
	})
	t.Run("ok/a leave tombstones at the CHAT frontier, keeping the generation", func(t *testing.T) {
		// No ACL check: the caller's row no longer allows the channel, and the leave still closes it.
		f.e.SetACL(t, f.pjs, "a1", uid1, []string{})
		front := f.frontier(t)
		got := data[ctl.LeaveResult](t, call(t, a1, "a1", ctl.OpDurableLeave, leave(1, uid1)))
		if got.AlreadyLeft || got.Channel != "general" {
			t.Fatalf("leave = %+v", got)
		}
		m := f.member(t, "general", "a1", uid1)
		if m.LeaveCursor == nil || *m.LeaveCursor != front || m.State != ctl.StateTombstone || m.Generation != 1 || m.JoinCursor >= front {
			t.Fatalf("row = %+v, want a generation-1 tombstone at %d", m, front)
		}
		if !m.Eligible(front) || m.Eligible(front+1) {
			t.Fatalf("the tombstone's interval does not end at the leave cursor %d", front)
		}
	})
	t.Run("ok/leaving again keeps the first leave cursor", func(t *testing.T) {
		f.e.Post(t, sender, "a0", "m02", "after the leave")
		before := f.state(t)
		first := *f.member(t, "general", "a1", uid1).LeaveCursor
		if r := call(t, a1, "a1", ctl.OpDurableLeave, leave(1, uid1)); !r.OK {
			t.Fatalf("second leave: %s", r.Error)
		}
		if m := f.member(t, "general", "a1", uid1); *m.LeaveCursor != first {
			t.Fatalf("leave cursor moved from %d to %d", first, *m.LeaveCursor)
		}
		if after := f.state(t); after != before {
			t.Fatalf("state moved from %s to %s", before, after)
		}
	})
}

// TestJoinSuperseded: a leave (a real request on the same rail) or a rejoin by another instance
// lands while durableJoin runs its catch-up; the join reports durable:false and does not resurrect
// the membership.
func TestJoinSuperseded(t *testing.T) {
	var during atomic.Pointer[func()]
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetAfterCommit(r, func() {
			if g := during.Load(); g != nil {
				(*g)()
			}
		})
	})
	a1 := f.e.Agent(t, "a1", uid1)

	t.Run("fail/a concurrent leave of the same generation supersedes the activation", func(t *testing.T) {
		var left reply
		g := func() {
			left = call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "general", "generation": 1, "lifecycleUid": uid1})
		}
		during.Store(&g)
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		during.Store(nil)
		if !left.OK {
			t.Fatalf("the concurrent leave was refused: %s", left.Error)
		}
		if got.Durable || got.Reason != ctl.ReasonSuperseded || got.Generation != 1 {
			t.Fatalf("join = %+v, want durable:false superseded at generation 1", got)
		}
		m := f.member(t, "general", "a1", uid1)
		if m.LeaveCursor == nil || m.Activated || m.Generation != 1 || m.State != ctl.StateTombstone {
			t.Fatalf("row = %+v, want the leave's tombstone, never activated", m)
		}
	})
	t.Run("fail/a concurrent rejoin at a newer generation supersedes it", func(t *testing.T) {
		g := func() {
			m := *f.member(t, "team.backend", "a1", uid1)
			m.Generation, m.JoinCursor = 2, m.JoinCursor+1
			f.putMember(t, m, "a1")
		}
		during.Store(&g)
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "team.backend"}))
		during.Store(nil)
		if got.Durable || got.Reason != ctl.ReasonSuperseded || got.Generation != 1 {
			t.Fatalf("join = %+v, want durable:false superseded", got)
		}
		if m := f.member(t, "team.backend", "a1", uid1); m.Generation != 2 || m.Activated {
			t.Fatalf("row = %+v, want the newer generation untouched", m)
		}
		wantRefusal(t, call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "team.backend", "generation": 1, "lifecycleUid": uid1}),
			"stale membership write")
	})
	t.Run("fail/a fence that drops mid-join stops its copies, its flip and its reply", func(t *testing.T) {
		sender := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
		a2 := f.e.Agent(t, "a2", uid2)
		g := func() {
			f.e.Post(t, sender, "a0", "q01", "posted during the join")
			f.fence.Store(false)
		}
		during.Store(&g)
		defer f.fence.Store(true)
		inbox := f.lastSeq(t, f.e.N.InboxStream())
		r, ok := send(t, a2, space.CtlServiceDelivery, "a2", body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a2"), "", quiet)
		during.Store(nil)
		if ok {
			t.Fatalf("a join fenced mid-way answered %+v", r)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if m := f.member(t, "general", "a2", uid2); m == nil || m.Generation != 1 {
				return fmt.Errorf("row = %+v, want the pending commit made before the fence dropped", m)
			}
			return nil
		})
		if m := f.member(t, "general", "a2", uid2); m.Activated {
			t.Fatalf("row = %+v was flipped while fenced", m)
		}
		if after := f.lastSeq(t, f.e.N.InboxStream()); after != inbox {
			t.Fatalf("a fenced catch-up copied into INBOX (%d to %d)", inbox, after)
		}
		f.fence.Store(true)
		got := data[ctl.JoinResult](t, call(t, a2, "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("retry = %+v, want the same join completed", got)
		}
		if after := f.lastSeq(t, f.e.N.InboxStream()); after != inbox+1 {
			t.Fatalf("the retried catch-up moved INBOX from %d to %d, want the one message", inbox, after)
		}
	})
	t.Run("ok/a retry of the incomplete join activates it without a new generation", func(t *testing.T) {
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "team.backend"}))
		if !got.Durable || got.Generation != 2 {
			t.Fatalf("retry = %+v, want durable at generation 2", got)
		}
	})
}

// box records what a lifecycle's dlvclient was handed.
// runReader runs the trusted reader (and no fan-out writer: only catch-up fills the inboxes).
func runReader(t *testing.T, f *fixture) {
	t.Helper()
	r, err := reader.New(plane3test.Ctx(t), f.dc, reader.Config{Names: f.e.N})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
}

// TestCatchUp: durableJoin copies (joinCursor, fence] of the channel into the member's inbox in
// the fan-out writer's format, and the trusted reader hands exactly those to the member's DLV.
// No fan-out writer runs, so every copy the member gets is the catch-up's.
func TestCatchUp(t *testing.T) {
	var during atomic.Pointer[func()]
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetAfterCommit(r, func() {
			if g := during.Load(); g != nil {
				(*g)()
			}
		})
	})
	runReader(t, f)
	a0 := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
	a1nc := f.e.Agent(t, "a1", uid1)
	a1 := plane3test.JS(t, a1nc)

	t.Run("ok/a retried activation copies its window, not the member's own posts", func(t *testing.T) {
		f.e.Post(t, a0, "a0", "old", "before the join cursor")
		j := f.frontier(t)
		f.putMember(t, plane3.Member{Channel: "general", Owner: "local.a1", LifecycleUID: uid1, State: ctl.StateActive,
			JoinCursor: j, Generation: 1, WriterIdentity: "earlier"}, "a1")
		for i := 1; i <= 3; i++ {
			f.e.Post(t, a0, "a0", fmt.Sprintf("m%02d", i), "in the window")
		}
		f.e.Post(t, a1, "a1", "own", "the member's own post")
		in := plane3test.Receive(t, f.e, "a1", uid1)
		got := data[ctl.JoinResult](t, call(t, a1nc, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
		testkit.Eventually(t, 15*time.Second, func() error {
			if g := strings.Join(in.IDs(), ","); g != "m01,m02,m03" {
				return fmt.Errorf("a1 has %q", g)
			}
			return nil
		})
		if m := f.member(t, "general", "a1", uid1); !m.Activated || m.JoinCursor != j {
			t.Fatalf("row = %+v, want activated at the original cursor %d", m, j)
		}
	})
	t.Run("ok/messages posted during a fresh join reach the member", func(t *testing.T) {
		in := plane3test.Receive(t, f.e, "a2", uid2)
		g := func() {
			f.e.Post(t, a0, "a0", "d01", "during the join")
			f.e.Post(t, a0, "a0", "d02", "during the join")
		}
		during.Store(&g)
		got := data[ctl.JoinResult](t, call(t, f.e.Agent(t, "a2", uid2), "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		during.Store(nil)
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
		testkit.Eventually(t, 15*time.Second, func() error {
			if g := strings.Join(in.IDs(), ","); g != "d01,d02" {
				return fmt.Errorf("a2 has %q", g)
			}
			return nil
		})
	})
	t.Run("ok/a re-run catch-up collapses on the inbox's Nats-Msg-Id", func(t *testing.T) {
		m := *f.member(t, "general", "a1", uid1)
		m.Activated = false // as a daemon that crashed before the flip left it
		f.putMember(t, m, "a1")
		inbox := f.lastSeq(t, f.e.N.InboxStream())
		got := data[ctl.JoinResult](t, call(t, a1nc, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
		// The window (joinCursor, fence] now also holds d01 and d02, new to a1: two entries more,
		// while m01..m03 collapse on their ids.
		if after := f.lastSeq(t, f.e.N.InboxStream()); after != inbox+2 {
			t.Fatalf("INBOX moved from %d to %d, want +2: the re-copied entries did not deduplicate", inbox, after)
		}
		if m := f.member(t, "general", "a1", uid1); !m.Activated {
			t.Fatalf("row = %+v, want activated", m)
		}
	})
}

// TestJoinEvicted: when retention dropped part of an activation's window, durableJoin closes the
// membership at the fence and reports durable:false; a subject at its cap whose oldest retained
// message precedes the window is not an eviction.
func TestJoinEvicted(t *testing.T) {
	f := setup(t, nil, nil)
	a0 := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
	pending := func(actor, uid string) uint64 {
		j := f.frontier(t)
		f.putMember(t, plane3.Member{Channel: "general", Owner: "local." + actor, LifecycleUID: uid, State: ctl.StateActive,
			JoinCursor: j, Generation: 1, WriterIdentity: "earlier"}, actor)
		return j
	}
	j1 := pending("a1", uid1)
	subj, _ := f.e.N.Chat(plane3test.Owner, "a0", "general")
	const burst = 1001 // one more than CHAT keeps per subject
	for i := range burst {
		if _, err := a0.PublishAsync(subj, []byte(fmt.Sprintf(`{"id":"b%04d","from":{"id":"local.a0"},"text":"burst"}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-a0.PublishAsyncComplete():
	case <-plane3test.Ctx(t).Done():
		t.Fatal("the burst was not stored")
	}
	pending("a2", uid2)
	f.e.Post(t, a0, "a0", "late", "after a2's cursor")

	t.Run("fail/an evicted window tombstones the join at the fence", func(t *testing.T) {
		inbox := f.lastSeq(t, f.e.N.InboxStream())
		front := f.frontier(t)
		got := data[ctl.JoinResult](t, call(t, f.e.Agent(t, "a1", uid1), "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if got.Durable || got.Reason != ctl.ReasonEvicted || got.Generation != 1 {
			t.Fatalf("join = %+v, want durable:false evicted", got)
		}
		m := f.member(t, "general", "a1", uid1)
		if m.LeaveCursor == nil || *m.LeaveCursor != front || m.Activated || m.JoinCursor != j1 || m.State != ctl.StateTombstone {
			t.Fatalf("row = %+v, want a tombstone at the fence %d", m, front)
		}
		if after := f.lastSeq(t, f.e.N.InboxStream()); after != inbox {
			t.Fatalf("an evicted join copied into INBOX (%d to %d)", inbox, after)
		}
	})
	t.Run("ok/a capped subject whose oldest message precedes the window is intact", func(t *testing.T) {
		inbox := f.lastSeq(t, f.e.N.InboxStream())
		got := data[ctl.JoinResult](t, call(t, f.e.Agent(t, "a2", uid2), "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v, want durable", got)
		}
		if after := f.lastSeq(t, f.e.N.InboxStream()); after != inbox+1 {
			t.Fatalf("INBOX moved from %d to %d, want the one message of the window", inbox, after)
		}
	})
	t.Run("ok/a rejoin after the eviction starts a fresh window", func(t *testing.T) {
		got := data[ctl.JoinResult](t, call(t, f.e.Agent(t, "a1", uid1), "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 2 {
			t.Fatalf("rejoin = %+v, want durable at generation 2", got)
		}
	})
}

// TestJoinThenFanout: the rows durableJoin and durableLeave write are the ones the fan-out writer
// routes by: after a join the member gets every later post exactly once through fan-out and the
// trusted reader, and after its leave nothing more.
func TestJoinThenFanout(t *testing.T) {
	f := setup(t, nil, nil)
	w, err := fanout.New(plane3test.Ctx(t), f.dc, fanout.Config{Names: f.e.N})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fanout: %v", err)
		}
	})
	runReader(t, f)
	a0 := plane3test.JS(t, f.e.Agent(t, "a0", uid0))
	a1 := f.e.Agent(t, "a1", uid1)
	in := plane3test.Receive(t, f.e, "a1", uid1)
	f.e.Post(t, a0, "a0", "m00", "before the join")
	got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
	if !got.Durable {
		t.Fatalf("join = %+v", got)
	}
	for i := 1; i <= 5; i++ {
		f.e.Post(t, a0, "a0", fmt.Sprintf("m%02d", i), "after the join")
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		if g := strings.Join(in.IDs(), ","); g != "m01,m02,m03,m04,m05" {
			return fmt.Errorf("a1 has %q", g)
		}
		return nil
	})
	if r := call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "general", "generation": got.Generation, "lifecycleUid": uid1}); !r.OK {
		t.Fatal(r.Error)
	}
	for i := 6; i <= 8; i++ {
		f.e.Post(t, a0, "a0", fmt.Sprintf("m%02d", i), "after the leave")
	}
	f.e.Post(t, plane3test.JS(t, a1), "a1", "x01", "a1 posts, so the chain has drained past the leave")
	testkit.Eventually(t, 15*time.Second, func() error {
		c, err := f.djs.Consumer(plane3test.Ctx(t), f.e.N.ChatStream(), "fanout")
		if err != nil {
			return err
		}
		ci, err := c.Info(plane3test.Ctx(t))
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream < f.frontier(t) {
			return fmt.Errorf("fanout acked up to %d", ci.AckFloor.Stream)
		}
		rc, err := f.djs.Consumer(plane3test.Ctx(t), f.e.N.InboxStream(), "reader")
		if err != nil {
			return err
		}
		ri, err := rc.Info(plane3test.Ctx(t))
		if err != nil {
			return err
		}
		if ri.NumPending != 0 || ri.NumAckPending != 0 {
			return fmt.Errorf("reader: pending %d, unacked %d", ri.NumPending, ri.NumAckPending)
		}
		return nil
	})
	if g := strings.Join(in.IDs(), ","); g != "m01,m02,m03,m04,m05" {
		t.Fatalf("after the leave a1 has %q", g)
	}
}

// TestDrain: Drain takes no new request (the responders are unbound: the broker answers no
// responders), lets the one in flight finish and reply, and returns once it has.
func TestDrain(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetAfterCommit(r, func() {
			once.Do(func() { close(entered); <-release })
		})
	})
	a1 := f.e.Agent(t, "a1", uid1)
	joined := make(chan reply, 1)
	go func() {
		r, _ := send(t, a1, space.CtlServiceDelivery, "a1", body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a1"), "", 20*time.Second)
		joined <- r
	}()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the join never reached its commit")
	}
	drained := make(chan struct{})
	go func() { f.r.Drain(plane3test.Ctx(t)); close(drained) }()
	a2 := f.e.Agent(t, "a2", uid2)
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := a2.Request("cotal."+plane3test.Space+".ctl."+space.CtlServiceDelivery+".local.a2", body(t, ctl.OpListMemberships, map[string]any{"lifecycleUid": uid2}, "local.a2"), quiet)
		if !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("a new request while draining: %v, want no responders", err)
		}
		return nil
	})
	select {
	case <-drained:
		t.Fatal("Drain returned with a request in flight")
	default:
	}
	close(release)
	select {
	case r := <-joined:
		if got := data[ctl.JoinResult](t, r); !got.Durable || got.Generation != 1 {
			t.Fatalf("the join in flight = %+v, want durable at generation 1", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the join in flight never replied")
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return after the request in flight finished")
	}
}
