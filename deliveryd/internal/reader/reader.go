// Package reader is deliveryd's trusted reader (reference/delivery.md §1.4), the authorization
// gate of durable delivery: it consumes every inbox entry through the durable "reader" on
// INBOX_<t>, re-reads the lifecycle's ACL row and (for a durable-channel entry) its membership row
// at that moment, and only then publishes the frame {version:1, channel, msg} to the lifecycle's
// dlv subject with the header Cotal-Delivery-Frame: 1 and the dedup Nats-Msg-Id
// <id>:<owner>.<actor>:<uid>:<generation>.
//
// Per entry: an unparseable subject or body is acked (dropped); a missing ACL row is an unknown
// lifecycle, not a revocation, so the entry is nak'd with a 2 s delay and terminated (and logged as
// an error) once delivered 10 times; a channel outside the row's allowSubscribe is a revocation and
// the entry is acked without a copy, as is a durable-channel entry outside its member's interval; a
// failed publish is nak'd under the same ceiling. The entry is acked only after the DLV copy is
// stored. It never creates a stream or bucket; a missing one stops New naming it.
package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Config is what New needs. Names is required.
type Config struct {
	Names space.Names
	// NakDelay is the redelivery delay after a missing ACL row or a failed publish; zero means
	// plane3.NakDelay (2 s).
	NakDelay time.Duration
	// MaxDeliveries is the ceiling after which an entry is terminated; zero means
	// plane3.MaxDeliveries (10).
	MaxDeliveries uint64
	// MayAct is the lease fence, checked before every publish and ack; an entry found while it is
	// false is left unacked. Nil means always.
	MayAct func() bool
	// Logger receives drops, deferrals and give-ups (never a message body); nil discards.
	Logger *slog.Logger
}

// Reader is the trusted reader on one delivery connection.
type Reader struct {
	cfg      Config
	log      *slog.Logger
	js       jetstream.JetStream
	consumer jetstream.Consumer
	members  jetstream.KeyValue
	acl      jetstream.KeyValue
}

// ConsumerConfig is the reader durable (upstream inboxReaderConfig). It carries a filter so that
// nats.go creates it through $JS.API.CONSUMER.CREATE.INBOX_<t>.reader.<filter>, the form the
// delivery profile is granted (the unfiltered named create is not).
func ConsumerConfig(n space.Names) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: n.ReaderConsumer(), FilterSubject: n.DinboxAll(),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: plane3.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: plane3.ReaderMaxAckPending,
	}
}

// New opens INBOX, DLV and the members and ACL buckets on nc (a delivery credential's connection)
// and creates or updates the reader durable. A missing stream or bucket is an error matching
// plane3.ErrMissing that names it.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Reader, error) {
	n := cfg.Names
	if n.Token() == "" {
		return nil, space.ErrZeroNames
	}
	if cfg.NakDelay < 0 {
		return nil, fmt.Errorf("reader: negative NakDelay %v", cfg.NakDelay)
	}
	if cfg.NakDelay == 0 {
		cfg.NakDelay = plane3.NakDelay
	}
	if cfg.MaxDeliveries == 0 {
		cfg.MaxDeliveries = plane3.MaxDeliveries
	}
	if cfg.MayAct == nil {
		cfg.MayAct = plane3.Always
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("reader: %w", err)
	}
	r := &Reader{cfg: cfg, log: plane3.Logger(cfg.Logger).With("loop", "reader"), js: js}
	for _, s := range []string{n.InboxStream(), n.DLVStream()} {
		if _, err := plane3.OpenStream(ctx, js, s); err != nil {
			return nil, fmt.Errorf("reader: %w", err)
		}
	}
	if r.members, err = plane3.OpenBucket(ctx, js, n, space.Members); err != nil {
		return nil, fmt.Errorf("reader: %w", err)
	}
	if r.acl, err = plane3.OpenBucket(ctx, js, n, space.ACL); err != nil {
		return nil, fmt.Errorf("reader: %w", err)
	}
	if r.consumer, err = js.CreateOrUpdateConsumer(ctx, n.InboxStream(), ConsumerConfig(n)); err != nil {
		return nil, fmt.Errorf("reader: create %s on %s: %w", n.ReaderConsumer(), n.InboxStream(), err)
	}
	return r, nil
}

// Run reads entries until ctx is done (nil) or the consumer fails.
func (r *Reader) Run(ctx context.Context) error {
	it, err := r.consumer.Messages()
	if err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("reader: %w", err)
		}
		if err := r.handle(ctx, m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// handle settles one entry. It returns an error only when an ack cannot be sent.
func (r *Reader) handle(ctx context.Context, m jetstream.Msg) error {
	n := r.cfg.Names
	lc, ok := plane3.ParseDinbox(n, m.Subject())
	if !ok {
		r.log.Warn("dropped an entry on a subject that is not a lifecycle's inbox", "subject", m.Subject())
		return r.settle(m.Ack)
	}
	entry, id, err := plane3.DecodeEntry(m.Data())
	if err != nil {
		r.log.Warn("dropped an entry that does not decode", "subject", m.Subject(), "err", err)
		return r.settle(m.Ack)
	}
	var deliveries uint64 = 1
	if md, err := m.Metadata(); err == nil {
		deliveries = md.NumDelivered
	}
	key, _ := space.ACLKey(lc.Owner, lc.Actor, lc.UID)
	e, err := r.acl.Get(ctx, key)
	var acl plane3.ACL
	var known bool
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return r.retry(m, deliveries, lc, fmt.Errorf("read ACL row: %w", err))
	default:
		acl, known = plane3.DecodeACL(e.Value())
	}
	if !known {
		return r.retry(m, deliveries, lc, errors.New("no ACL row for the lifecycle"))
	}
	if !acl.Allows(entry.Channel) {
		r.log.Info("dropped an entry: the lifecycle's ACL no longer allows the channel", "lifecycle", key, "channel", entry.Channel)
		return r.settle(m.Ack)
	}
	if entry.Reason == plane3.ReasonDurable {
		mkey, _ := space.MemberKey(entry.Channel, lc.Owner, lc.Actor, lc.UID)
		me, err := r.members.Get(ctx, mkey)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return r.retry(m, deliveries, lc, fmt.Errorf("read member row: %w", err))
		}
		if err != nil {
			r.log.Info("dropped a durable entry: no membership row", "member", mkey)
			return r.settle(m.Ack)
		}
		row, _, derr := plane3.DecodeMember(mkey, me.Value())
		if derr != nil || !row.Eligible(entry.Seq) {
			r.log.Info("dropped a durable entry outside its member's interval", "member", mkey, "seq", entry.Seq)
			return r.settle(m.Ack)
		}
	}
	body, err := dlvclient.EncodeFrame(entry.Channel, entry.Msg)
	if err != nil {
		r.log.Warn("dropped an entry whose message cannot be framed", "lifecycle", key, "err", err)
		return r.settle(m.Ack)
	}
	subj, _ := n.Dlv(lc.Owner, lc.Actor, lc.UID)
	out := nats.NewMsg(subj)
	out.Data = body
	out.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
	if msgID := plane3.MsgID(id, lc, entry.Generation); msgID != "" {
		out.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	if !r.cfg.MayAct() {
		return nil
	}
	if _, err := r.js.PublishMsg(ctx, out); err != nil {
		return r.retry(m, deliveries, lc, fmt.Errorf("publish to %s: %w", subj, err))
	}
	return r.settle(m.Ack)
}

// retry naks the entry for redelivery after NakDelay, or terminates it once it has been
// delivered MaxDeliveries times (so one lifecycle cannot hold the shared reader for ever).
func (r *Reader) retry(m jetstream.Msg, deliveries uint64, lc plane3.Lifecycle, cause error) error {
	if deliveries >= r.cfg.MaxDeliveries {
		r.log.Error("gave up on an entry", "lifecycle", lc.Principal()+"."+lc.UID, "deliveries", deliveries, "err", cause)
		return r.settle(m.Term)
	}
	r.log.Debug("deferred an entry", "lifecycle", lc.Principal()+"."+lc.UID, "deliveries", deliveries, "err", cause)
	return r.settle(func() error { return m.NakWithDelay(r.cfg.NakDelay) })
}

// settle sends an ack verb unless the lease fence is down.
func (r *Reader) settle(verb func() error) error {
	if !r.cfg.MayAct() {
		return nil
	}
	if err := verb(); err != nil {
		return fmt.Errorf("reader: ack: %w", err)
	}
	return nil
}
