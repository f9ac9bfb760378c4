package ctl_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestInFlightPerCaller: one caller holding its limit of requests in flight (joins parked after
// their commit) gets its next request refused at once with TOO_MANY_IN_FLIGHT, run for nothing;
// another caller is served meanwhile; once the parked joins finish, the first caller is served
// again.
func TestInFlightPerCaller(t *testing.T) {
	const limit = 2
	var parked atomic.Int32
	release := make(chan struct{})
	var gate atomic.Bool
	f := setup(t, func(c *ctl.Config) { c.MaxInFlightPerCaller = limit }, func(_ *fixture, r *ctl.Responders) {
		ctl.SetAfterCommit(r, func() {
			if gate.Load() {
				parked.Add(1)
				<-release
			}
		})
	})
	a1, a2 := f.e.Agent(t, "a1", uid1), f.e.Agent(t, "a2", uid2)
	list := func(nc *nats.Conn, actor, uid string) reply {
		return call(t, nc, actor, ctl.OpListMemberships, map[string]any{"lifecycleUid": uid})
	}

	gate.Store(true)
	joins := make(chan reply, limit)
	for range limit {
		go func() {
			r, ok := send(t, a1, space.CtlServiceDelivery, "a1", body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a1"), "", 20*time.Second)
			if !ok {
				r = reply{Error: "no reply"}
			}
			joins <- r
		}()
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := parked.Load(); n != limit {
			return fmt.Errorf("%d joins parked, want %d", n, limit)
		}
		return nil
	})

	t.Run("fail/the caller's next request is refused with TOO_MANY_IN_FLIGHT", func(t *testing.T) {
		before := f.state(t)
		r := list(a1, "a1", uid1)
		if r.OK || r.Code != ctl.CodeTooManyInFlight || !strings.Contains(r.Error, "2 requests in flight") {
			t.Fatalf("got ok=%v code %q error %q, want the TOO_MANY_IN_FLIGHT refusal", r.OK, r.Code, r.Error)
		}
		if after := f.state(t); after != before {
			t.Fatalf("a refused request moved %s to %s", before, after)
		}
	})
	t.Run("ok/another caller is served meanwhile", func(t *testing.T) {
		r := list(a2, "a2", uid2)
		if !r.OK || r.Code != "" {
			t.Fatalf("a2 got ok=%v code %q error %q", r.OK, r.Code, r.Error)
		}
	})
	t.Run("ok/the parked requests finish and the caller is served again", func(t *testing.T) {
		gate.Store(false)
		close(release)
		for range limit {
			select {
			case r := <-joins:
				if got := data[ctl.JoinResult](t, r); got.Generation != 1 || got.LifecycleUID != uid1 {
					t.Fatalf("join = %+v", got)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("a parked join never answered")
			}
		}
		type listed struct {
			Memberships []ctl.Membership `json:"memberships"`
		}
		got := data[listed](t, list(a1, "a1", uid1))
		if len(got.Memberships) != 1 || got.Memberships[0] != (ctl.Membership{Channel: "general", Generation: 1, Activated: true}) {
			t.Fatalf("a1 lists %+v", got.Memberships)
		}
	})
}

// TestListMembershipsIndex: listMemberships answers from the index, correct right after each
// change whoever made it (a join, a leave, a rejoin, a row another instance wrote, a deleted
// row, a row that does not decode), and it does not replay the bucket per request: with 200
// other rows in the bucket, 20 lists cost the responders' connection a few messages each, where
// a watch per request received every row every time.
func TestListMembershipsIndex(t *testing.T) {
	f := setup(t, nil, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	type listed struct {
		Memberships []ctl.Membership `json:"memberships"`
	}
	list := func(t *testing.T) string {
		t.Helper()
		got := data[listed](t, call(t, a1, "a1", ctl.OpListMemberships, map[string]any{"lifecycleUid": uid1}))
		var parts []string
		for _, m := range got.Memberships {
			parts = append(parts, fmt.Sprintf("%s@%d/%v", m.Channel, m.Generation, m.Activated))
		}
		return strings.Join(parts, " ")
	}
	kv, err := f.djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name string
		do   func(t *testing.T)
		want string
	}{
		{"ok/empty", func(*testing.T) {}, ""},
		{"ok/after two joins", func(t *testing.T) {
			for _, ch := range []string{"general", "team.backend"} {
				if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": ch}); !r.OK {
					t.Fatal(r.Error)
				}
			}
		}, "general@1/true team.backend@1/true"},
		{"ok/after a leave", func(t *testing.T) {
			if r := call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "team.backend", "generation": 1, "lifecycleUid": uid1}); !r.OK {
				t.Fatal(r.Error)
			}
		}, "general@1/true"},
		{"ok/after a rejoin", func(t *testing.T) {
			if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "team.backend"}); !r.OK {
				t.Fatal(r.Error)
			}
		}, "general@1/true team.backend@2/true"},
		{"ok/a row another instance wrote is listed at once", func(t *testing.T) {
			f.putMember(t, plane3.Member{Channel: "ops", Owner: "local.a1", LifecycleUID: uid1, State: ctl.StateActive,
				JoinCursor: 1, Generation: 3, WriterIdentity: "other"}, "a1")
		}, "general@1/true ops@3/false team.backend@2/true"},
		{"ok/a deleted row is gone at once", func(t *testing.T) {
			key, _ := space.MemberKey("ops", "local", "a1", uid1)
			if err := kv.Delete(plane3test.Ctx(t), key); err != nil {
				t.Fatal(err)
			}
		}, "general@1/true team.backend@2/true"},
		{"ok/a row that no longer decodes is not listed", func(t *testing.T) {
			key, _ := space.MemberKey("general", "local", "a1", uid1)
			if _, err := kv.Put(plane3test.Ctx(t), key, []byte("not json")); err != nil {
				t.Fatal(err)
			}
		}, "team.backend@2/true"},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.do(t)
			if got := list(t); got != step.want {
				t.Fatalf("lists %q, want %q", got, step.want)
			}
		})
	}

	t.Run("ok/a list does not replay the bucket", func(t *testing.T) {
		const others, lists = 200, 20
		for i := range others {
			b, _ := json.Marshal(plane3.Member{Channel: "general", Owner: "local.b1", LifecycleUID: fmt.Sprintf("uid%023d", i),
				State: ctl.StateActive, JoinCursor: 1, Generation: 1, WriterIdentity: "other"})
			key, _ := space.MemberKey("general", "local", "b1", fmt.Sprintf("uid%023d", i))
			if _, err := kv.Put(plane3test.Ctx(t), key, b); err != nil {
				t.Fatal(err)
			}
		}
		if got := list(t); got != "team.backend@2/true" { // the index has caught up with every row
			t.Fatalf("lists %q", got)
		}
		before := f.dc.Stats().InMsgs
		for range lists {
			if got := list(t); got != "team.backend@2/true" {
				t.Fatalf("lists %q", got)
			}
		}
		// Per list: the request, and the bucket state's reply.
		in := f.dc.Stats().InMsgs - before
		t.Logf("%d lists with %d other rows in the bucket: %d messages in on the responders' connection", lists, others, in)
		if in > 3*lists {
			t.Fatalf("%d lists brought %d messages to the responders' connection; a watch per request brings every row (%d)", lists, in, others)
		}
	})
}
