package reader_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const uid2 = "uidbbbbbbbbbbbbbbbbbbbbbbb"

// TestHeldPassNakAndTerm (issue 27): progress acks for a held pass leave its deferred entries
// alone. One pass of reader A holds a1's entry x (published, then parked before its ack) and a2's
// entry y (no ACL row: nak'd for NakDelay, longer than ProgressEvery). While A's Keeper sends
// progress acks for the pass, y comes back after its nak delay (to reader B on the same durable)
// and, at MaxDeliveries 2, is terminated; x is never redelivered and its one copy lands once A
// goes on.
func TestHeldPassNakAndTerm(t *testing.T) {
	const (
		ackWait  = 3 * time.Second // ProgressEvery 1 s, looked at every 500 ms
		nakDelay = 1500 * time.Millisecond
	)
	e := plane3test.New(t)
	dc := e.Delivery(t)
	f := &fixture{e: e, djs: plane3test.JS(t, dc), pjs: e.Provisioner(t), log: &records{}}
	f.e.AddLifecycle(t, f.pjs, "a1", uid1, []string{"general"})
	sub2, err := e.N.Dinbox(plane3test.Owner, "a2", uid2)
	if err != nil {
		t.Fatal(err)
	}
	f.entry(t, f.dinbox(t), plane3.Entry{Msg: msg("x"), Channel: "general", Seq: 1, Reason: plane3.ReasonMention})
	f.entry(t, sub2, plane3.Entry{Msg: msg("y"), Channel: "general", Seq: 2, Reason: plane3.ReasonMention})

	has := func(msgs []jetstream.Msg, id string, delivered uint64) bool {
		for _, m := range msgs {
			if md, err := m.Metadata(); err == nil && md.NumDelivered == delivered && bytes.Contains(m.Data(), []byte(`"id":"`+id+`"`)) {
				return true
			}
		}
		return false
	}
	parked, gate := make(chan struct{}), make(chan struct{})
	var parkOnce, releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate) }) }
	var rounds atomic.Int64    // progress rounds over A's pass
	var roundsAtY atomic.Int64 // rounds sent before y's second delivery
	roundsAtY.Store(-1)
	plane3.Hook = func(at plane3.Point, msgs []jetstream.Msg) {
		switch {
		case at == plane3.AtSettling && has(msgs, "x", 1):
			parkOnce.Do(func() { close(parked) })
			<-gate
		case at == plane3.AtProgress && has(msgs, "x", 1):
			rounds.Add(1)
		case at == plane3.AtFetched && has(msgs, "y", 2):
			roundsAtY.CompareAndSwap(-1, rounds.Load())
		}
	}
	t.Cleanup(func() { plane3.Hook = nil })

	run := func(name string, log *records) {
		r, err := reader.New(plane3test.Ctx(t), e.Delivery(t), reader.Config{Names: e.N, AckWait: ackWait, NakDelay: nakDelay, MaxDeliveries: 2, Logger: slog.New(log)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx, nil) }()
		t.Cleanup(func() {
			release()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("reader %s: %v", name, err)
			}
		})
	}
	logA, logB := &records{}, &records{}
	run("A", logA)
	<-parked
	if ci := f.readerState(t); ci.Delivered.Consumer != 2 {
		t.Fatalf("A's pass: %d deliveries, want x and y in one pass", ci.Delivered.Consumer)
	}
	run("B", logB)
	testkit.Eventually(t, 15*time.Second, func() error {
		if !logB.has("ERROR gave up on an entry") {
			return fmt.Errorf("y not terminated yet (progress rounds %d)", rounds.Load())
		}
		return nil
	})
	// y came back on its nak delay (1.5 s), between the first progress round (1 s) and the third
	// (3 s or later); a progress ack that reached it would have put it at 4 s or later.
	t.Logf("y came back after %d progress rounds over the held pass", roundsAtY.Load())
	if n := roundsAtY.Load(); n < 0 || n >= 3 {
		t.Fatalf("y's second delivery came after %d progress rounds, want fewer than 3", n)
	}
	if ci := f.readerState(t); ci.Delivered.Consumer != 3 || ci.NumAckPending != 1 || ci.NumRedelivered != 0 {
		t.Fatalf("with A parked: %d deliveries, %d unacked, %d awaiting redelivery; want 3 (x once, y twice), 1 (x), 0",
			ci.Delivered.Consumer, ci.NumAckPending, ci.NumRedelivered)
	}
	release()
	f.settled(t)
	if n := f.dlvCount(t); n != 1 {
		t.Fatalf("DLV holds %d copies of x, want 1", n)
	}
	if ci := f.readerState(t); ci.Delivered.Consumer != 3 {
		t.Fatalf("%d deliveries after A went on, want 3: x was redelivered", ci.Delivered.Consumer)
	}
}
