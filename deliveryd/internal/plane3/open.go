package plane3

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// ErrMissing matches a stream or bucket deliveryd needs and the space does not have: deliveryd
// never creates one (pkg/provision does), it fails naming it.
var ErrMissing = errors.New("plane3: missing; provision the space first")

// OpenStream binds a stream that must exist.
func OpenStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: stream %s", ErrMissing, name)
	}
	if err != nil {
		return nil, fmt.Errorf("plane3: stream %s: %w", name, err)
	}
	return s, nil
}

// OpenBucket binds a bucket that must exist.
func OpenBucket(ctx context.Context, js jetstream.JetStream, n space.Names, k space.BucketKind) (jetstream.KeyValue, error) {
	name, err := n.Bucket(k)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: bucket %s", ErrMissing, name)
	}
	if err != nil {
		return nil, fmt.Errorf("plane3: bucket %s: %w", name, err)
	}
	return kv, nil
}

// Logger returns l, or a logger that discards.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// Always is the fence of a loop that runs without a lease (tests, embedding without one).
func Always() bool { return true }

// Fatal reports whether a fetch error ends a loop: its consumer or stream is gone (someone deleted
// it; deliveryd never recreates behind an operator's back) or the connection is closed for good.
// Anything else (a timeout, a reconnecting broker, a missed heartbeat) is retried.
func Fatal(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrConnectionClosed)
}

// Pause waits d or until ctx is done; it reports whether ctx is still live.
func Pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Closed reports whether ch is closed; a nil ch never is. The loops' drain signal.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// FencedNakDelay is the redelivery delay of a message a loop fetched and may not act on because
// its lease fence is down (HandBack).
const FencedNakDelay = 500 * time.Millisecond

// FencePoll is how often a loop whose fence is down looks at it again before fetching
// (AwaitFence).
const FencePoll = 50 * time.Millisecond

// HandBack naks each message for redelivery after FencedNakDelay: what a loop does with a message
// it fetched and may not act on because its fence is down, instead of leaving it to wait out
// AckWait. A nak is no effect of holding the lease (it stores and acks nothing; the message only
// becomes deliverable again, to this instance once its fence lifts or to whoever holds the lease),
// so it is sent with the fence down. One that fails (the connection is down, and keeps no
// reconnect buffer) leaves the message to AckWait.
func HandBack(msgs ...jetstream.Msg) {
	for _, m := range msgs {
		_ = m.NakWithDelay(FencedNakDelay)
	}
}

// AwaitFence returns once mayAct holds (true) or ctx is done (false), looking every FencePoll. A
// loop calls it before each fetch, so while its fence is down (after a reconnect, until the lease
// is renewed on the new connection) it takes no message it would have to hand back, and a
// message it handed back is not delivered to it again, and counted, until it may act on it.
func AwaitFence(ctx context.Context, mayAct func() bool) bool {
	for !mayAct() {
		if !Pause(ctx, FencePoll) {
			return false
		}
	}
	return ctx.Err() == nil
}

// FetchWait bounds one wait for the first message of a pass, so a loop notices its ctx.
const FetchWait = 200 * time.Millisecond

// SettleGrace bounds the settling of a loop's last pass after its ctx is done: the copies it
// published are usually stored by then, and acking them spares their redelivery.
const SettleGrace = time.Second

// FetchReady takes what c already holds, up to batch, without waiting: the next pass of a loop
// whose previous pass is still being stored. Nothing ready is an empty pass, not an error.
func FetchReady(c jetstream.Consumer, batch int) ([]jetstream.Msg, error) {
	more, err := c.FetchNoWait(batch)
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range more.Messages() {
		out = append(out, m)
	}
	if err := more.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		return out, err
	}
	return out, nil
}

// FetchPass waits up to FetchWait for one message of c, then takes what else is already there,
// up to batch in all: one pass of the fan-out writer or the trusted reader. A timeout with
// nothing delivered is an empty pass, not an error.
func FetchPass(ctx context.Context, c jetstream.Consumer, batch int) ([]jetstream.Msg, error) {
	first, err := c.Fetch(1, jetstream.FetchMaxWait(FetchWait))
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range first.Messages() {
		out = append(out, m)
	}
	if err := first.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return nil, err
	}
	if len(out) == 0 || batch == 1 {
		return out, ctx.Err()
	}
	more, _ := FetchReady(c, batch-1) // the first message makes a pass; a failure here does not undo it
	return append(out, more...), nil
}

// SettleError is a held pass's settling failure that Overlap.Next returns instead of a pass.
type SettleError struct{ Err error }

func (e *SettleError) Error() string { return "settle: " + e.Err.Error() }
func (e *SettleError) Unwrap() error { return e.Err }

// OverlapDepth is how many passes a loop keeps published and unsettled while it routes the next
// (Overlap): on a cluster each stored copy waits a replication round trip, so more passes in
// flight keep the broker busy. Three passes of 256 stay within the reader durable's
// MaxAckPending (1000).
const OverlapDepth = 2

// Overlap is how the fan-out writer and the trusted reader overlap their passes: up to
// OverlapDepth passes whose copies are published are held, unsettled, while the broker stores
// them; the next pass, if its messages are already there, is handled, and only then is the oldest
// held one settled (its messages acked), held passes always settling in the order they were
// routed. With nothing waiting, every held pass is settled before the loop waits for more.
//
// With Keep set, every pass Next returns is kept alive (progress acks, see Keeper) until it is
// settled, or, when the loop never held it (a failed pass, whose messages it nak'd), until the
// next Next; Close releases everything and stops Keep.
type Overlap struct {
	held []heldPass
	Keep *Keeper

	cur     *kept           // the Keeper's pass last fetched and not yet held
	curMsgs []jetstream.Msg // its messages, for the test hook
}

// heldPass is one pass published and not yet settled.
type heldPass struct {
	settle func(context.Context) error
	pass   *kept
	msgs   []jetstream.Msg
}

// Next is the next pass of c, of up to batch messages. While passes are held it takes only what
// is already there (FetchReady); if that is nothing, or the fetch fails, it settles the held
// passes first and returns an empty pass (the loop comes back and waits) or the fetch error. A
// settling failure is returned as a *SettleError, the fetch not made or not returned. With
// nothing held it waits as FetchPass does.
func (o *Overlap) Next(ctx context.Context, c jetstream.Consumer, batch int) ([]jetstream.Msg, error) {
	o.Keep.release(o.cur) // fetched before and never held: the loop is done with it
	o.cur, o.curMsgs = nil, nil
	if len(o.held) == 0 {
		msgs, err := FetchPass(ctx, c, batch)
		return o.fetched(msgs), err
	}
	msgs, err := FetchReady(c, batch)
	if err == nil && len(msgs) > 0 {
		return o.fetched(msgs), nil
	}
	if serr := o.Settle(ctx); serr != nil {
		return nil, &SettleError{serr}
	}
	return nil, err
}

// fetched keeps a pass Next returns.
func (o *Overlap) fetched(msgs []jetstream.Msg) []jetstream.Msg {
	if len(msgs) > 0 {
		o.cur, o.curMsgs = o.Keep.add(msgs), msgs
		hook(AtFetched, msgs)
	}
	return msgs
}

// Settle settles every held pass, oldest first, and holds none. It stops at the first failure.
func (o *Overlap) Settle(ctx context.Context) error {
	return o.settleTo(ctx, 0)
}

// Trim settles the oldest held passes until fewer than OverlapDepth are held: what a loop calls
// after routing a pass, before it holds it.
func (o *Overlap) Trim(ctx context.Context) error {
	return o.settleTo(ctx, OverlapDepth-1)
}

func (o *Overlap) settleTo(ctx context.Context, keep int) error {
	for len(o.held) > keep {
		h := o.held[0]
		o.held = o.held[1:]
		hook(AtSettling, h.msgs)
		err := h.settle(ctx)
		o.Keep.release(h.pass)
		if err != nil {
			return err
		}
	}
	return nil
}

// Hold keeps settle as the newest held pass, the one Next returned last; the loop must have
// trimmed first.
func (o *Overlap) Hold(settle func(context.Context) error) {
	o.held = append(o.held, heldPass{settle: settle, pass: o.cur, msgs: o.curMsgs})
	o.cur, o.curMsgs = nil, nil
}

// Close settles the held passes when the loop stops: within SettleGrace, even though ctx is done.
// It then releases every pass and stops Keep.
func (o *Overlap) Close(ctx context.Context) {
	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleGrace)
	defer cancel()
	_ = o.Settle(grace)
	for _, h := range o.held { // left by a failed settle: their messages redeliver
		o.Keep.release(h.pass)
	}
	o.held = nil
	o.Keep.release(o.cur)
	o.cur, o.curMsgs = nil, nil
	o.Keep.Stop()
}
