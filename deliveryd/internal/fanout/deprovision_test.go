package fanout_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestDeprovisionedMembersCostNothing is issue 20 item 6: 50 agents provisioned (dm_, dlv_, ACL
// row by pkg/provision), joined to a durable channel and routed to, then deprovisioned on
// deprovisioner credentials as managerd's Stop does; a later post reaches the two live members,
// puts no entry in INBOX for a departed lifecycle, costs the reader no redelivery and logs no
// warning or error, and the departed lifecycles' membership rows are closed.
func TestDeprovisionedMembersCostNothing(t *testing.T) {
	const departed = 50
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)

	type lifecycle struct{ actor, uid string }
	live := []lifecycle{{"l1", uid1}, {"l2", uid2}}
	var gone []lifecycle
	for i := range departed {
		gone = append(gone, lifecycle{fmt.Sprintf("d%02d", i), fmt.Sprintf("uid%023d", i)})
	}
	for _, lc := range append(append([]lifecycle{}, live...), gone...) {
		if _, err := provision.ProvisionAgent(plane3test.Ctx(t), pjs, e.N, provision.Agent{
			Owner: plane3test.Owner, Actor: lc.actor, LifecycleUID: lc.uid, AllowSubscribe: []string{"general"},
		}); err != nil {
			t.Fatal(err)
		}
		e.Join(t, djs, "general", lc.actor, lc.uid, 0, 1)
	}

	logs := &testkit.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// A short nak delay: a retry the change is meant to prevent shows up in milliseconds.
	startLoopsWith(t, dc, fanout.Config{Names: e.N, Logger: logger},
		reader.Config{Names: e.N, Logger: logger, NakDelay: 20 * time.Millisecond})
	in1, in2 := plane3test.Receive(t, e, "l1", uid1), plane3test.Receive(t, e, "l2", uid2)
	sender := plane3test.JS(t, e.Agent(t, "a0", uid0))

	e.Post(t, sender, "a0", "m01", "while all are members")
	testkit.Eventually(t, 15*time.Second, func() error {
		if !sameSet(in1.IDs(), []string{"m01"}) || !sameSet(in2.IDs(), []string{"m01"}) {
			return fmt.Errorf("l1 has %v, l2 has %v", in1.IDs(), in2.IDs())
		}
		return nil
	})
	drained(t, e, djs)
	if got := streamMsgs(t, djs, e.N.DLVStream()); got != departed+2 {
		t.Fatalf("DLV holds %d copies of the first post, want %d (every member routed)", got, departed+2)
	}

	for _, lc := range gone {
		nc := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_DEPROVISIONER,
			&signerv1.ProfileParams{Owner: plane3test.Owner, Actor: lc.actor, LifecycleUid: lc.uid})
		// No member channels: the membership rows are left for the fan-out writer to close.
		res, err := provision.DeprovisionAgent(plane3test.Ctx(t), plane3test.JS(t, nc), e.N, plane3test.Owner, lc.actor, lc.uid, nil)
		nc.Close()
		if err != nil || len(res.Removed) != 3 || res.Deleted == nil || *res.Deleted != 3 {
			t.Fatalf("deprovision %s: %+v: %v", lc.actor, res, err)
		}
	}
	inboxBefore := streamLast(t, djs, e.N.InboxStream())

	e.Post(t, sender, "a0", "m02", "after 50 members were deprovisioned")
	testkit.Eventually(t, 15*time.Second, func() error {
		if !sameSet(in1.IDs(), []string{"m01", "m02"}) || !sameSet(in2.IDs(), []string{"m01", "m02"}) {
			return fmt.Errorf("l1 has %v, l2 has %v", in1.IDs(), in2.IDs())
		}
		return nil
	})
	drained(t, e, djs)

	t.Run("ok/the post is routed only to the live members", func(t *testing.T) {
		if got := streamLast(t, djs, e.N.InboxStream()) - inboxBefore; got != 2 {
			t.Fatalf("the post put %d entries in INBOX, want 2 (the live members only)", got)
		}
		if got := streamMsgs(t, djs, e.N.DLVStream()); got != departed+4 {
			t.Fatalf("DLV holds %d copies, want %d", got, departed+4)
		}
	})
	t.Run("ok/the reader never redelivered an entry", func(t *testing.T) {
		ci := consumerInfo(t, djs, e.N.InboxStream(), "reader")
		if ci.NumRedelivered != 0 || ci.Delivered.Stream != ci.Delivered.Consumer {
			t.Fatalf("reader: %d redelivered, %d deliveries of %d entries", ci.NumRedelivered, ci.Delivered.Consumer, ci.Delivered.Stream)
		}
		if n := strings.Count(logs.String(), "deferred an entry"); n != 0 {
			t.Fatalf("the reader deferred %d entries", n)
		}
	})
	t.Run("ok/no warning or error line", func(t *testing.T) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				t.Fatalf("the loops logged: %s", line)
			}
		}
	})
	t.Run("ok/the departed lifecycles' membership rows are closed", func(t *testing.T) {
		kv, err := djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+e.N.Token())
		if err != nil {
			t.Fatal(err)
		}
		rows := append(append([]lifecycle{}, live...), gone...)
		testkit.Eventually(t, 10*time.Second, func() error {
			for i, lc := range rows {
				key, _ := space.MemberKey("general", plane3test.Owner, lc.actor, lc.uid)
				en, err := kv.Get(plane3test.Ctx(t), key)
				if err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				m, _, err := plane3.DecodeMember(key, en.Value())
				if err != nil {
					return err
				}
				if i < len(live) {
					if m.LeaveCursor != nil || m.State != "durable-active" {
						return fmt.Errorf("live member %s was closed: %s", lc.actor, en.Value())
					}
					continue
				}
				if m.LeaveCursor == nil || *m.LeaveCursor != m.JoinCursor || m.State != plane3.StateTombstone || m.Generation != 1 {
					b, _ := json.Marshal(m)
					return fmt.Errorf("departed %s: row %s, want a generation-1 tombstone with an empty interval", lc.actor, b)
				}
			}
			return nil
		})
	})
}

func streamInfo(t *testing.T, djs jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := djs.Stream(plane3test.Ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo()
}

// streamMsgs is how many messages a stream holds.
func streamMsgs(t *testing.T, djs jetstream.JetStream, name string) uint64 {
	t.Helper()
	return streamInfo(t, djs, name).State.Msgs
}

// streamLast is a stream's last sequence.
func streamLast(t *testing.T, djs jetstream.JetStream, name string) uint64 {
	t.Helper()
	return streamInfo(t, djs, name).State.LastSeq
}

func consumerInfo(t *testing.T, djs jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := djs.Consumer(plane3test.Ctx(t), stream, name)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := c.Info(plane3test.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

// TestDeprovisionIsPerLifecycle: a principal deprovisioned and provisioned again under a new
// lifecycle UID (managerd's Stop, then Spawn of the same name) is routed to under the new UID
// while only the old UID's membership row is closed: the skip is keyed on the lifecycle, never on
// the principal.
func TestDeprovisionIsPerLifecycle(t *testing.T) {
	const uidNew = "uidnnnnnnnnnnnnnnnnnnnnnnn"
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	pjs := e.Provisioner(t)
	provisionAndJoin := func(uid string) {
		if _, err := provision.ProvisionAgent(plane3test.Ctx(t), pjs, e.N, provision.Agent{
			Owner: plane3test.Owner, Actor: "a1", LifecycleUID: uid, AllowSubscribe: []string{"general"},
		}); err != nil {
			t.Fatal(err)
		}
		e.Join(t, djs, "general", "a1", uid, 0, 1)
	}
	provisionAndJoin(uid1)
	nc := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_DEPROVISIONER,
		&signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "a1", LifecycleUid: uid1})
	if _, err := provision.DeprovisionAgent(plane3test.Ctx(t), plane3test.JS(t, nc), e.N, plane3test.Owner, "a1", uid1, nil); err != nil {
		t.Fatal(err)
	}
	provisionAndJoin(uidNew)

	startLoops(t, e, dc)
	in := plane3test.Receive(t, e, "a1", uidNew)
	e.Post(t, plane3test.JS(t, e.Agent(t, "a0", uid0)), "a0", "m01", "to the successor")
	testkit.Eventually(t, 15*time.Second, func() error {
		if !sameSet(in.IDs(), []string{"m01"}) {
			return fmt.Errorf("the successor has %v", in.IDs())
		}
		return nil
	})
	drained(t, e, djs)
	if got := dlvCount(t, e, djs, "a1", uid1); got != 0 {
		t.Fatalf("the departed lifecycle's DLV holds %d", got)
	}
	kv, err := djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, c := range []struct {
			uid    string
			closed bool
		}{{uid1, true}, {uidNew, false}} {
			key, _ := space.MemberKey("general", plane3test.Owner, "a1", c.uid)
			en, err := kv.Get(plane3test.Ctx(t), key)
			if err != nil {
				return err
			}
			m, _, err := plane3.DecodeMember(key, en.Value())
			if err != nil {
				return err
			}
			if closed := m.LeaveCursor != nil; closed != c.closed {
				return fmt.Errorf("%s: closed %v, want %v", key, closed, c.closed)
			}
		}
		return nil
	})
}
