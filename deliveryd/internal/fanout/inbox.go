package fanout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/provision"
)

// The writer's back-pressure on INBOX. INBOX_<t> keeps provision.MaxMsgsPerSubject entries per
// lifecycle subject and discards the oldest: an entry the trusted reader has not yet taken would
// be lost without a trace if the writer ran more than that ahead of the reader on one lifecycle.
// So the writer starts a pass only while the reader durable holds at most InboxBound entries not
// yet acked (NumPending + NumAckPending, over all lifecycles, so an upper bound for each): a
// pass adds at most Batch entries to any one lifecycle's subject (one per chat message), and
// InboxBound + Batch stays under the cap. It knows the count from the durable's info plus the
// entries it published since, and reads the info again only once that estimate passes the bound,
// so a writer that the reader keeps up with reads it about once per InboxBound entries.
//
// The wait is bounded by the reader: it acks, drops or terminates every entry within
// plane3.MaxDeliveries deliveries (a missing ACL row: 10 × 2 s), and its own gate never waits on
// a member (reader/gate.go drops into a gap marker instead). While the writer waits, chat
// messages wait in CHAT for the fanout durable.
const (
	// InboxBound is the most reader entries not yet acked at which the writer starts a pass.
	InboxBound = 500
	// inboxPoll is the pause between two looks at the reader durable while the writer waits.
	inboxPoll = 2 * time.Millisecond
)

// inboxRoom is the writer's view of the reader durable.
type inboxRoom struct {
	reader jetstream.Consumer // nil until found
	base   uint64             // unacked at the last info
	sent   uint64             // entries published since
}

// maxBatch is the largest Batch for which InboxBound + Batch stays under INBOX's cap.
const maxBatch = provision.MaxMsgsPerSubject - 1 - InboxBound

// inboxFull reports whether the reader holds more than InboxBound entries not yet acked, reading
// its info only when the estimate passes the bound. A reader durable not found (none created yet)
// or an info that fails does not hold the writer back.
func (w *Writer) inboxFull(ctx context.Context) bool {
	r := &w.inbox
	if r.base+r.sent <= InboxBound {
		return false
	}
	if r.reader == nil {
		c, err := w.js.Consumer(ctx, w.cfg.Names.InboxStream(), w.cfg.Names.ReaderConsumer())
		if err != nil {
			if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				w.log.Debug("reader durable info failed", "err", err)
			}
			r.base, r.sent = 0, 0
			return false
		}
		r.reader = c
	}
	ci, err := r.reader.Info(ctx)
	if err != nil {
		w.log.Debug("reader durable info failed", "err", err)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.reader = nil
		}
		r.base, r.sent = 0, 0
		return false
	}
	r.base, r.sent = ci.NumPending+uint64(ci.NumAckPending), 0
	return r.base > InboxBound
}

// awaitInbox waits until the reader holds at most InboxBound entries, the fence falls, drain
// closes or ctx ends; it reports whether to go on.
func (w *Writer) awaitInbox(ctx context.Context, drain <-chan struct{}) bool {
	began := time.Now()
	logged := false
	for w.inboxFull(ctx) {
		if !w.cfg.MayAct() || plane3.Closed(drain) {
			return true // the loop looks again
		}
		if !logged && time.Since(began) > 10*time.Second {
			w.log.Warn("waiting for the trusted reader: it holds too many entries not yet acked", "bound", InboxBound, "unacked", w.inbox.base)
			logged = true
		}
		if !plane3.Pause(ctx, inboxPoll) {
			return false
		}
	}
	return ctx.Err() == nil
}

var errBatch = fmt.Errorf("fanout: Batch over %d (INBOX keeps %d per lifecycle, the writer waits at %d)", maxBatch, provision.MaxMsgsPerSubject, InboxBound)
