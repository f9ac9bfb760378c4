package plane3

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Why AckWait is short (issue 27): after a kill -9 of deliveryd, the messages its loops had
// fetched and not settled come back only once their ack wait runs out, counted from their
// delivery or their last progress ack. The successor holds the lease 15 to 30 s after the kill
// (a row written every 15 s expires 30 s after it was stored), so with upstream's 60 s the ack
// wait, not the lease, set the delay of a copy in flight at the kill (60-66 s measured). At 15 s,
// half the lease TTL, those messages are deliverable again before the earliest successor can act,
// and the delay is the lease's. A live holder's long pass does not redeliver: the Keeper sends a
// progress ack for each message it still holds. Nothing else changes: NakDelay (2 s) and
// FencedNakDelay (500 ms) were already well under the ack wait, MaxDeliveries counts deliveries,
// and neither consumer has a MaxDeliver or a BackOff.

// ProgressEvery is how long a message a loop holds goes without an ack before the Keeper sends it
// a progress ack (+WPI): a third of the ack wait. The Keeper looks every half of that, so a held
// message is refreshed at most half an ack wait after its delivery or its last progress ack.
func ProgressEvery(ackWait time.Duration) time.Duration { return ackWait / 3 }

// Keeper keeps the messages of the passes a loop holds from redelivering while it lives: every
// message of a pass, from its fetch until the loop is done with the pass (Overlap settles or drops
// it), gets a progress ack once it has gone ProgressEvery without one. A message already settled
// (acked, nak'd, terminated, handed back) is skipped: the client refuses a second ack verb on it
// (jetstream.ErrMsgAlreadyAckd) without sending anything. With the fence down nothing is sent:
// a progress ack keeps a message from whoever holds the lease. A nil Keeper keeps nothing.
//
// A progress ack sent in the instant a loop naks the same message (the client checks its
// "settled" flag before it sends, not atomically with the send) restarts the message's ack wait
// and so replaces the nak's delay with the ack wait: a deferral redelivered after AckWait instead
// of NakDelay, never lost or doubled. Only passes held past ProgressEvery can meet it.
type Keeper struct {
	every  time.Duration
	mayAct func() bool
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu     sync.Mutex
	passes map[*kept]struct{}
}

// kept is one pass a Keeper keeps alive.
type kept struct {
	msgs []jetstream.Msg
	last time.Time // the fetch, or the last progress ack sent
}

// StartKeeper starts the Keeper of a loop whose consumer has ackWait; mayAct is its lease fence
// (nil: always). Stop ends it.
func StartKeeper(ackWait time.Duration, mayAct func() bool) *Keeper {
	if mayAct == nil {
		mayAct = Always
	}
	k := &Keeper{every: ProgressEvery(ackWait), mayAct: mayAct, stop: make(chan struct{}), done: make(chan struct{}), passes: map[*kept]struct{}{}}
	go k.run()
	return k
}

func (k *Keeper) run() {
	defer close(k.done)
	t := time.NewTicker(k.every / 2)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case now := <-t.C:
			k.tick(now)
		}
	}
}

// tick sends a progress ack for every message of each pass kept ProgressEvery or more since its
// fetch or its last progress ack.
func (k *Keeper) tick(now time.Time) {
	var due []*kept
	k.mu.Lock()
	for p := range k.passes {
		if now.Sub(p.last) >= k.every {
			p.last = now
			due = append(due, p)
		}
	}
	k.mu.Unlock()
	for _, p := range due {
		if !k.mayAct() {
			return
		}
		hook(AtProgress, p.msgs)
		for _, m := range p.msgs {
			_ = m.InProgress() // settled already, or the connection down: nothing to keep
		}
	}
}

// add keeps msgs from now on; nil for a nil Keeper.
func (k *Keeper) add(msgs []jetstream.Msg) *kept {
	if k == nil || len(msgs) == 0 {
		return nil
	}
	p := &kept{msgs: msgs, last: time.Now()}
	k.mu.Lock()
	k.passes[p] = struct{}{}
	k.mu.Unlock()
	return p
}

// release stops keeping p (nil: nothing).
func (k *Keeper) release(p *kept) {
	if k == nil || p == nil {
		return
	}
	k.mu.Lock()
	delete(k.passes, p)
	k.mu.Unlock()
}

// Stop ends the Keeper and waits for a round in progress; the passes it kept are left to their
// ack wait.
func (k *Keeper) Stop() {
	if k == nil {
		return
	}
	k.once.Do(func() { close(k.stop) })
	if k.done != nil {
		<-k.done
	}
}

// Point is where a test hook is called.
type Point int

const (
	// AtFetched: Overlap.Next took a pass (before the loop handles it).
	AtFetched Point = iota
	// AtSettling: Overlap is about to settle a held pass (its copies published, not yet acked).
	AtSettling
	// AtProgress: the Keeper is about to send progress acks for a pass.
	AtProgress
)

// Hook is for tests only and nil in production: when set, the loops call it with the messages of
// a pass at each Point, from the loop's goroutine (AtFetched, AtSettling) or the Keeper's
// (AtProgress); blocking in it blocks that goroutine, which is how a test parks a pass. Set it
// before the loops start and clear it after they stop. A binary built with the cotal_testhook
// tag sets it from COTAL_TEST_PARK (testhook.go).
var Hook func(at Point, msgs []jetstream.Msg)

func hook(at Point, msgs []jetstream.Msg) {
	if h := Hook; h != nil {
		h(at, msgs)
	}
}
