package fanout_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// shortAckWait is the ack wait these tests give both loops' consumers, so that a pass held past
// it takes about a second (deliveryd's is plane3.AckWait).
const shortAckWait = time.Second

// firstDelivery reports whether msgs hold the chat message with id, delivered for the first time.
func firstDelivery(msgs []jetstream.Msg, id string) bool {
	for _, m := range msgs {
		md, err := m.Metadata()
		if err == nil && strings.HasPrefix(md.Stream, "CHAT_") && md.NumDelivered == 1 &&
			bytes.Contains(m.Data(), []byte(`"id":"`+id+`"`)) {
			return true
		}
	}
	return false
}

// TestHeldPassProgress (issue 27): a slow holder. Writer A fetches m01, stores its inbox copy and
// is parked (plane3.Hook) before it acks, for longer than the consumer's ack wait; writer B on the
// same durable fetches meanwhile, as a second pass of the same loop would. With A's progress acks
// m01 is never redelivered; with A stalled as a whole (its Keeper parked too: a stopped process),
// it is redelivered to B, whose copy collapses with A's on its Nats-Msg-Id, so the member gets
// one copy; A's late ack changes nothing.
func TestHeldPassProgress(t *testing.T) {
	setup := func(t *testing.T, stallKeeper bool) (e *plane3test.Env, djs jetstream.JetStream, post func() uint64, parked chan struct{}, progress *atomic.Int64, release func(), stopA func()) {
		e = plane3test.New(t)
		pjs := e.Provisioner(t)
		e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
		dc := e.Delivery(t)
		djs = plane3test.JS(t, dc)
		e.Join(t, djs, "general", "a1", uid1, 0, 1)
		ajs := plane3test.JS(t, e.Agent(t, "a0", uid0))

		parked, progress = make(chan struct{}), &atomic.Int64{}
		gate := make(chan struct{})
		var parkOnce, releaseOnce sync.Once
		release = func() { releaseOnce.Do(func() { close(gate) }) }
		plane3.Hook = func(at plane3.Point, msgs []jetstream.Msg) {
			if !firstDelivery(msgs, "m01") {
				return
			}
			switch at {
			case plane3.AtSettling: // A: its copy stored, its ack not yet sent
				parkOnce.Do(func() { close(parked) })
				<-gate
			case plane3.AtProgress:
				progress.Add(1)
				if stallKeeper {
					<-gate
				}
			}
		}
		t.Cleanup(func() { plane3.Hook = nil }) // after the loops stopped (cleanups run last first)

		a, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{Names: e.N, AckWait: shortAckWait})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx, nil) }()
		var once sync.Once
		stopA = func() {
			once.Do(func() {
				release()
				cancel()
				if err := <-done; err != nil {
					t.Errorf("writer A: %v", err)
				}
			})
		}
		t.Cleanup(stopA)
		post = func() uint64 { return e.Post(t, ajs, "a0", "m01", "held past the ack wait") }
		return e, djs, post, parked, progress, release, stopA
	}
	// startB runs writer B and a reader on a second delivery connection.
	startB := func(t *testing.T, e *plane3test.Env) {
		startLoopsWith(t, e.Delivery(t), fanout.Config{Names: e.N, AckWait: shortAckWait}, reader.Config{Names: e.N, AckWait: shortAckWait})
	}
	info := func(t *testing.T, e *plane3test.Env, djs jetstream.JetStream) *jetstream.ConsumerInfo {
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

	t.Run("ok/progress-acks-keep-a-held-pass-from-redelivering", func(t *testing.T) {
		e, djs, post, parked, progress, release, _ := setup(t, false)
		seq := post()
		<-parked
		startB(t, e)
		// Progress acks go out at most every third of the ack wait: four of them span more than
		// the ack wait, with B fetching all along.
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := progress.Load(); n < 4 {
				return fmt.Errorf("%d progress rounds for the held pass", n)
			}
			return nil
		})
		if ci := info(t, e, djs); ci.NumRedelivered != 0 || ci.Delivered.Consumer != 1 || ci.NumAckPending != 1 {
			t.Fatalf("held past the ack wait: redelivered %d, delivered %d times, %d unacked; want 0, 1, 1",
				ci.NumRedelivered, ci.Delivered.Consumer, ci.NumAckPending)
		}
		release()
		testkit.Eventually(t, 10*time.Second, func() error {
			if ci := info(t, e, djs); ci.AckFloor.Stream < seq {
				return fmt.Errorf("ack floor %d, want %d", ci.AckFloor.Stream, seq)
			}
			return nil
		})
		if ci := info(t, e, djs); ci.Delivered.Consumer != 1 {
			t.Fatalf("m01 was delivered %d times, want once", ci.Delivered.Consumer)
		}
		if n := inboxCount(t, e, djs); n != 1 {
			t.Fatalf("INBOX holds %d entries, want 1", n)
		}
	})

	t.Run("fail/a-holder-stalled-past-the-ack-wait-is-redelivered-and-its-copy-collapses", func(t *testing.T) {
		e, djs, post, parked, _, _, stopA := setup(t, true)
		seq := post()
		<-parked
		// A is parked before its settle waits for the copy's PubAck: the copy was sent, and is
		// stored soon after.
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := inboxCount(t, e, djs); n != 1 {
				return fmt.Errorf("INBOX holds %d entries with A parked before its ack, want A's copy", n)
			}
			return nil
		})
		startB(t, e)
		testkit.Eventually(t, 10*time.Second, func() error {
			if ci := info(t, e, djs); ci.Delivered.Consumer < 2 || ci.AckFloor.Stream < seq {
				return fmt.Errorf("delivered %d times, ack floor %d; want a redelivery to B, acked", ci.Delivered.Consumer, ci.AckFloor.Stream)
			}
			return nil
		})
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := dlvCount(t, e, djs, "a1", uid1); n != 1 {
				return fmt.Errorf("DLV holds %d copies for a1", n)
			}
			return nil
		})
		stopA() // A wakes, waits for its stored copy's ack and acks a message B acked already
		if n := inboxCount(t, e, djs); n != 1 {
			t.Fatalf("INBOX holds %d entries after the redelivery, want 1 (the copies collapse)", n)
		}
		if ci := info(t, e, djs); ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
			t.Fatalf("after both holders: %d unacked, %d awaiting redelivery", ci.NumAckPending, ci.NumRedelivered)
		}
		if n := dlvCount(t, e, djs, "a1", uid1); n != 1 {
			t.Fatalf("DLV holds %d copies for a1, want 1", n)
		}
	})
}

// TestUpgradeAckWait (issue 27): a space whose fanout and reader durables were created with
// upstream's 60 s ack wait has them updated to plane3.AckWait when the loops start.
func TestUpgradeAckWait(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs := plane3test.JS(t, dc)
	old := []struct {
		stream string
		cfg    jetstream.ConsumerConfig
	}{{e.N.ChatStream(), fanout.ConsumerConfig(e.N)}, {e.N.InboxStream(), reader.ConsumerConfig(e.N)}}
	for _, o := range old {
		o.cfg.AckWait = 60 * time.Second
		if _, err := djs.CreateConsumer(plane3test.Ctx(t), o.stream, o.cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fanout.New(plane3test.Ctx(t), dc, fanout.Config{Names: e.N}); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.New(plane3test.Ctx(t), dc, reader.Config{Names: e.N}); err != nil {
		t.Fatal(err)
	}
	for _, o := range old {
		c, err := djs.Consumer(plane3test.Ctx(t), o.stream, o.cfg.Durable)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.CachedInfo().Config.AckWait; got != plane3.AckWait {
			t.Errorf("%s on %s: ack wait %v after the loops started, want %v", o.cfg.Durable, o.stream, got, plane3.AckWait)
		}
	}
}
