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
// So the writer starts a pass only while the reader durable holds at most 999 - Batch entries not
// yet acked (over all lifecycles, so an upper bound for each): a pass adds at most Batch entries
// to any one lifecycle's subject (one per chat message), so no subject passes 999. It knows the
// count from a look at the broker plus the entries it published since, and looks only once that
// estimate passes 999 - Batch (743 at the default Batch); when the look shows more than
// InboxBound it waits until the reader is down to InboxBound, so a writer the reader keeps up
// with looks about once per 250 to 750 entries.
//
// A look counts only what the broker updates in the same step as the store or the delivery, so it
// never counts short: the entries the reader has not been delivered yet (INBOX's last sequence
// minus the durable's delivered stream sequence: an upper bound, as gaps count too), those
// delivered and not acked (NumAckPending, the durable's pending map), and the publishes still
// waiting for their PubAck (PublishAsyncPending, read first, so an entry stored meanwhile is
// counted twice rather than not at all). NumPending is not used: the broker updates it after the
// PubAck, on another goroutine (nats-server stream.go processJetStreamMsg, signalConsumersLoop),
// so with passes in flight it can trail the stored entries.
//
// The wait is bounded by the reader: it acks, drops or terminates every entry within
// plane3.MaxDeliveries deliveries (a missing ACL row: 10 × 2 s), and its own gate never waits on
// a member (reader/gate.go drops into a gap marker instead). While the writer waits, chat
// messages wait in CHAT for the fanout durable.
const (
	// InboxBound is what the writer waits for the reader to be down to, once it found it over
	// 999 - Batch entries not yet acked.
	InboxBound = 500
	// inboxPoll is the pause between two looks at the reader durable while the writer waits.
	inboxPoll = 2 * time.Millisecond
)

// inboxRoom is the writer's view of the reader durable.
type inboxRoom struct {
	reader jetstream.Consumer // nil until found
	base   uint64             // entries not acked at the last look
	sent   uint64             // entries in flight at the last look and published since
}

// maxBatch is the largest Batch for which InboxBound + Batch stays under INBOX's cap.
const maxBatch = provision.MaxMsgsPerSubject - 1 - InboxBound

// inboxFull reports whether the writer must wait for the reader: the estimate passes
// 999 - Batch and the reader's info shows more than InboxBound entries not yet acked (while waiting,
// every look reads the info). A reader durable not found (none created yet) or an info that fails
// does not hold the writer back.
func (w *Writer) inboxFull(ctx context.Context) bool {
	r := &w.inbox
	if r.base+r.sent <= uint64(provision.MaxMsgsPerSubject-1-w.cfg.Batch) && r.base <= InboxBound {
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
	inflight := uint64(w.js.PublishAsyncPending())
	si, err := w.inboxStream(ctx)
	var ci *jetstream.ConsumerInfo
	if err == nil {
		ci, err = r.reader.Info(ctx)
	}
	if err != nil {
		w.log.Debug("reader durable info failed", "err", err)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.reader = nil
		}
		r.base, r.sent = 0, 0
		return false
	}
	var undelivered uint64
	if last := si.State.LastSeq; last > ci.Delivered.Stream {
		undelivered = last - ci.Delivered.Stream
	}
	r.base, r.sent = undelivered+uint64(ci.NumAckPending), inflight
	return r.base+r.sent > InboxBound
}

// inboxStream reads INBOX's state (its last sequence).
func (w *Writer) inboxStream(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := w.js.Stream(ctx, w.cfg.Names.InboxStream())
	if err != nil {
		return nil, err
	}
	return st.CachedInfo(), nil
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
