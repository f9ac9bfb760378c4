package plane3

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// progressMsg counts the progress acks sent for it; settled makes it refuse them, as the client
// refuses a verb after an ack, nak or term (jetstream.ErrMsgAlreadyAckd).
type progressMsg struct {
	jetstream.Msg
	sent    int
	settled bool
}

func (m *progressMsg) InProgress() error {
	if m.settled {
		return jetstream.ErrMsgAlreadyAckd
	}
	m.sent++
	return nil
}

// TestKeeperTick drives the Keeper's tick by hand: a pass is sent progress acks once it has gone
// ProgressEvery without one, not before, and not again until it has again; nothing with the fence
// down; nothing once released; a settled message is refused by the client, the others still sent.
func TestKeeperTick(t *testing.T) {
	const ackWait = 3 * time.Second // ProgressEvery 1 s
	newKeeper := func(mayAct func() bool) *Keeper {
		return &Keeper{every: ProgressEvery(ackWait), mayAct: mayAct, stop: make(chan struct{}), passes: map[*kept]struct{}{}}
	}
	msgs := func(ms ...*progressMsg) []jetstream.Msg {
		out := make([]jetstream.Msg, len(ms))
		for i, m := range ms {
			out[i] = m
		}
		return out
	}
	t.Run("ok/due-after-progress-every-and-again-after-the-next", func(t *testing.T) {
		k := newKeeper(Always)
		a, b := &progressMsg{}, &progressMsg{}
		p := k.add(msgs(a, b))
		t0 := p.last
		k.tick(t0.Add(999 * time.Millisecond))
		if a.sent != 0 || b.sent != 0 {
			t.Fatalf("sent %d, %d before ProgressEvery", a.sent, b.sent)
		}
		k.tick(t0.Add(time.Second))
		if a.sent != 1 || b.sent != 1 {
			t.Fatalf("sent %d, %d at ProgressEvery, want 1 each", a.sent, b.sent)
		}
		k.tick(t0.Add(1500 * time.Millisecond))
		k.tick(t0.Add(2 * time.Second))
		if a.sent != 2 || b.sent != 2 {
			t.Fatalf("sent %d, %d one ProgressEvery after the first, want 2 each", a.sent, b.sent)
		}
	})
	t.Run("ok/a-settled-message-is-skipped", func(t *testing.T) {
		k := newKeeper(Always)
		a, b := &progressMsg{settled: true}, &progressMsg{}
		p := k.add(msgs(a, b))
		k.tick(p.last.Add(time.Second))
		if a.sent != 0 || b.sent != 1 {
			t.Fatalf("sent %d to the settled one and %d to the other, want 0 and 1", a.sent, b.sent)
		}
	})
	t.Run("fail/fence-down-sends-nothing", func(t *testing.T) {
		k := newKeeper(func() bool { return false })
		a := &progressMsg{}
		p := k.add(msgs(a))
		k.tick(p.last.Add(5 * time.Second))
		if a.sent != 0 {
			t.Fatalf("sent %d with the fence down", a.sent)
		}
	})
	t.Run("fail/released-sends-nothing", func(t *testing.T) {
		k := newKeeper(Always)
		a := &progressMsg{}
		p := k.add(msgs(a))
		k.release(p)
		k.tick(p.last.Add(5 * time.Second))
		if a.sent != 0 || len(k.passes) != 0 {
			t.Fatalf("sent %d after release, %d passes kept", a.sent, len(k.passes))
		}
	})
	t.Run("ok/nil-keeper-keeps-nothing", func(t *testing.T) {
		var k *Keeper
		if p := k.add(msgs(&progressMsg{})); p != nil {
			t.Fatalf("a nil Keeper kept %v", p)
		}
		k.release(nil)
		k.Stop()
		if got := ProgressEvery(AckWait); got != 5*time.Second {
			t.Fatalf("ProgressEvery(AckWait) = %v, want 5s", got)
		}
	})
}
