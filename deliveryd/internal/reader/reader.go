// Package reader is deliveryd's trusted reader (reference/delivery.md §1.4), the authorization
// gate of durable delivery: it consumes every inbox entry through the durable "reader" on
// INBOX_<t>, re-reads the lifecycle's ACL row and (for a durable-channel entry) its membership row
// after the entry reached it, and only then publishes the frame {version:1, channel, msg} to the lifecycle's
// dlv subject with the header Cotal-Delivery-Frame: 1 and the dedup Nats-Msg-Id
// <id>:<owner>.<actor>:<uid>:<generation>.
//
// Entries are taken in passes of up to Batch; the ACL and member rows a pass needs are read once,
// after all its entries were delivered (see pass). Per entry: an unparseable subject or body is
// acked (dropped); a durable-channel entry without a membership row or outside its member's
// interval is acked without a copy, judged before the ACL row (so a departed lifecycle's closed
// row drops its entries at once); a missing ACL row is an unknown lifecycle, not a revocation, so
// the entry is nak'd with a 2 s delay and terminated (and logged as an error) once delivered 10
// times; a channel outside the row's allowSubscribe is a revocation and the entry is acked without
// a copy; a failed publish is nak'd under the same ceiling. The entry is acked only after the DLV copy is
// stored. It never creates a stream or bucket; a missing one stops New naming it. A copy to a
// lifecycle whose dlv_ durable already holds as many unacked frames as DLV keeps is not published
// but counted into a gap marker (gate.go).
package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults.
const (
	// DefaultBatch is how many entries one pass takes; their rows are read once.
	DefaultBatch = 256
	// retryPause is the wait after a failed fetch (a broker that is reconnecting).
	retryPause = time.Second
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
	// Batch is the most entries one pass handles; zero means DefaultBatch.
	Batch int
	// AckWait is the consumer's ack_wait, the Keeper's base; zero means plane3.AckWait. Tests
	// shorten it to show a held pass past it; deliveryd uses the default.
	AckWait time.Duration
	// MayAct is the lease fence, checked before every fetch, publish and ack; an entry found
	// while it is false is handed back (plane3.HandBack: nak'd, not acked or terminated), so it
	// redelivers once the fence lifts or to whoever holds the lease, and Run fetches nothing while
	// it is false (plane3.AwaitFence). Nil means always.
	MayAct func() bool
	// Logger receives drops, deferrals and give-ups (never a message body); nil discards.
	Logger *slog.Logger
	// Registerer receives the gate's metrics (gate.go); nil registers them nowhere.
	Registerer prometheus.Registerer
}

// Reader is the trusted reader on one delivery connection.
type Reader struct {
	cfg      Config
	log      *slog.Logger
	js       jetstream.JetStream
	consumer jetstream.Consumer
	members  jetstream.KeyValue
	acl      jetstream.KeyValue
	gate     *gate
	// aclRows and memberRows are the ACL and membership buckets' rows as of a pass's Sync
	// (read); only Run's goroutine touches them.
	aclRows, memberRows *plane3.Mirror
	// inboxes caches what each inbox subject names (inboxOf); only Run's goroutine touches it.
	inboxes map[string]*inbox
}

// ConsumerConfig is the reader durable (upstream inboxReaderConfig, but with plane3.AckWait, 15 s,
// instead of upstream's 60 s ack wait: see plane3/progress.go). It carries a filter so that
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
	if cfg.NakDelay < 0 || cfg.Batch < 0 || cfg.AckWait < 0 {
		return nil, fmt.Errorf("reader: negative NakDelay %v, Batch %d or AckWait %v", cfg.NakDelay, cfg.Batch, cfg.AckWait)
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = plane3.AckWait
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
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
	met, err := NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("reader: metrics: %w", err)
	}
	r := &Reader{cfg: cfg, log: plane3.Logger(cfg.Logger).With("loop", "reader"), js: js}
	r.gate = newGate(js, n, cfg.MayAct, r.log, met)
	r.cfg.MayAct = r.gate.mayAct // the gate sees the fence down (gate.go)
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
	cc := ConsumerConfig(n)
	cc.AckWait = cfg.AckWait
	if r.consumer, err = js.CreateOrUpdateConsumer(ctx, n.InboxStream(), cc); err != nil {
		return nil, fmt.Errorf("reader: create %s on %s: %w", n.ReaderConsumer(), n.InboxStream(), err)
	}
	return r, nil
}

// Run reads entries until ctx is done (nil) or the consumer fails. Passes overlap
// (plane3.Overlap), as the fan-out writer's do, and drain stops its intake as it stops the
// writer's.
func (r *Reader) Run(ctx context.Context, drain <-chan struct{}) error {
	gctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.gate.run(gctx) })
	defer wg.Wait()
	defer stop()
	defer plane3.CloseMirrors(&r.aclRows, &r.memberRows)
	o := plane3.Overlap{Keep: plane3.StartKeeper(r.cfg.AckWait, r.cfg.MayAct)}
	defer o.Close(ctx)
	for ctx.Err() == nil && !plane3.Closed(drain) {
		if !r.cfg.MayAct() {
			if err := o.Settle(ctx); err != nil { // fenced: the held pass is handed back
				return err
			}
			if !plane3.AwaitFence(ctx, func() bool { return r.cfg.MayAct() || plane3.Closed(drain) }) {
				return nil
			}
			continue // the fence lifted, or a drain began: look again
		}
		batch, err := o.Next(ctx, r.consumer, r.cfg.Batch)
		var serr *plane3.SettleError
		if errors.As(err, &serr) {
			return serr.Err
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if plane3.Fatal(err) {
				return fmt.Errorf("reader: fetch: %w", err)
			}
			r.log.Warn("fetch failed; retrying", "err", err)
			if !plane3.Pause(ctx, retryPause) {
				return nil
			}
			continue
		}
		if len(batch) == 0 {
			continue
		}
		next, err := r.pass(ctx, batch)
		if err := o.Trim(ctx); err != nil {
			return err
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		o.Hold(next)
	}
	return nil
}

// item is one entry of a pass.
type item struct {
	m          jetstream.Msg
	lc         plane3.Lifecycle
	entry      plane3.Entry
	id         string
	aclKey     string
	memberKey  string
	dlv        string
	deliveries uint64
	body       *body
}

// inbox is what the reader derives from a lifecycle's inbox subject: the lifecycle, its ACL row
// key and its dlv subject.
type inbox struct {
	lc     plane3.Lifecycle
	aclKey string
	dlv    string
}

// maxInboxes bounds the reader's cache of inbox subjects; past it the cache starts afresh.
const maxInboxes = 1 << 14

// inboxOf is subject's lifecycle, ACL key and dlv subject (nil: not a lifecycle's inbox subject
// of this space), parsed once and kept (they depend on nothing but the subject).
func (r *Reader) inboxOf(subject string) *inbox {
	if in, ok := r.inboxes[subject]; ok {
		return in
	}
	lc, ok := plane3.ParseDinbox(r.cfg.Names, subject)
	if !ok {
		return nil
	}
	aclKey, err := space.ACLKey(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return nil
	}
	dlv, err := r.cfg.Names.Dlv(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return nil
	}
	if len(r.inboxes) >= maxInboxes || r.inboxes == nil {
		r.inboxes = map[string]*inbox{}
	}
	in := &inbox{lc: lc, aclKey: aclKey, dlv: dlv}
	r.inboxes[subject] = in
	return in
}

// entries are a pass's inbox entries by their bytes, each decoded once (DecodeEntryHead, then its
// message through bodies): a chat message's entries to N members are the same bytes but for the
// generation, so a pass decodes each distinct one once.
type entries struct {
	byBytes map[string]*decoded
	bodies  bodies
}

// decoded is one distinct entry of a pass: its head, its message, or why it does not decode.
type decoded struct {
	entry plane3.Entry
	body  *body
	err   error
}

// of is data decoded, on its first sight in the pass.
func (es *entries) of(data []byte) *decoded {
	if d, ok := es.byBytes[string(data)]; ok {
		return d
	}
	if es.byBytes == nil {
		es.byBytes, es.bodies = map[string]*decoded{}, bodies{}
	}
	d := &decoded{}
	d.entry, d.err = plane3.DecodeEntryHead(data)
	if d.err == nil {
		d.body = es.bodies.of(d.entry)
		d.err = d.body.err
	}
	es.byBytes[string(data)] = d
	return d
}

// body is one distinct message of a pass on one channel, decoded (plane3.DecodeMessage) and
// framed (dlvclient.EncodeFrame) once for all the entries that carry it: a chat message's entries
// to N members carry the same bytes, and each decode or frame is a parse of the whole message.
type body struct {
	id       string
	err      error // the message does not decode: every entry carrying it is dropped
	frame    []byte
	frameErr error
	framed   bool
}

// bodies are a pass's messages by channel, then bytes (looked up without a copy of the bytes).
type bodies map[string]map[string]*body

// of is entry's message, decoded on its first sight in the pass.
func (bs bodies) of(entry plane3.Entry) *body {
	byMsg := bs[entry.Channel]
	if b, ok := byMsg[string(entry.Msg)]; ok {
		return b
	}
	if byMsg == nil {
		byMsg = map[string]*body{}
		bs[entry.Channel] = byMsg
	}
	b := &body{}
	if m, err := plane3.DecodeMessage(entry.Msg); err != nil {
		b.err = err
	} else {
		b.id = m.ID
	}
	byMsg[string(entry.Msg)] = b
	return b
}

// framed is the DLV frame of its message, made on the first copy that needs it; the frames of a
// message's copies share its bytes (a publish never writes to them).
func (it item) framed() ([]byte, error) {
	b := it.body
	if !b.framed {
		b.frame, b.frameErr = dlvclient.EncodeFrame(it.entry.Channel, it.entry.Msg)
		b.framed = true
	}
	return b.frame, b.frameErr
}

// row is one key read for a pass: whether it exists, a read error, and its value decoded once
// for every entry of the pass that needs it (ok false: it does not decode).
type row struct {
	value  []byte
	found  bool
	err    error
	ok     bool
	acl    plane3.ACL
	member plane3.Member
}

// pass handles a batch. The ACL and member rows it needs are read once, after every entry of the
// batch was delivered and before any is published, so each check sees every change committed
// before its entry reached the reader, as a read per entry would; a revocation that lands while
// the pass publishes takes effect for the next pass. Entries to drop or defer are settled at
// once; copies are published asynchronously in order, and the returned settle acks each of their
// entries once its copy is stored.
func (r *Reader) pass(ctx context.Context, batch []jetstream.Msg) (func(context.Context) error, error) {
	var items []item
	acls, members := map[string]*row{}, map[string]*row{}
	distinct := entries{}
	for _, m := range batch {
		in := r.inboxOf(m.Subject())
		if in == nil {
			r.log.Warn("dropped an entry on a subject that is not a lifecycle's inbox", "subject", m.Subject())
			if err := r.settle(m, m.Ack); err != nil {
				return nil, err
			}
			continue
		}
		d := distinct.of(m.Data())
		if d.err != nil {
			r.log.Warn("dropped an entry that does not decode", "subject", m.Subject(), "err", d.err)
			if err := r.settle(m, m.Ack); err != nil {
				return nil, err
			}
			continue
		}
		it := item{m: m, lc: in.lc, entry: d.entry, id: d.body.id, body: d.body, deliveries: 1, aclKey: in.aclKey, dlv: in.dlv}
		if md, err := m.Metadata(); err == nil {
			it.deliveries = md.NumDelivered
		}
		acls[it.aclKey] = &row{}
		if d.entry.Reason == plane3.ReasonDurable {
			it.memberKey, _ = space.MemberKey(d.entry.Channel, in.lc.Owner, in.lc.Actor, in.lc.UID)
			members[it.memberKey] = &row{}
		}
		items = append(items, it)
	}
	// The two buckets are read side by side: each read is made after every entry was delivered,
	// which is all a check needs; neither depends on the other.
	var wg sync.WaitGroup
	wg.Go(func() { r.read(ctx, r.members, &r.memberRows, members) })
	r.read(ctx, r.acl, &r.aclRows, acls)
	wg.Wait()
	for _, rw := range acls {
		if rw.found {
			rw.acl, rw.ok = plane3.DecodeACL(rw.value)
		}
	}
	for key, rw := range members {
		if rw.found {
			m, _, err := plane3.DecodeMember(key, rw.value)
			rw.member, rw.ok = m, err == nil
		}
	}

	type sent struct {
		it  item
		ack jetstream.PubAckFuture
	}
	var inflight []sent
	for i, it := range items {
		out, err := r.copyOf(it, acls[it.aclKey], members[it.memberKey])
		if err != nil {
			if err := r.retry(it.m, it.deliveries, it.lc, err); err != nil {
				return nil, err
			}
			continue
		}
		if out == nil {
			if err := r.settle(it.m, it.m.Ack); err != nil {
				return nil, err
			}
			continue
		}
		if !r.cfg.MayAct() {
			for _, rest := range items[i:] { // fenced: publish no more; what was published settles below
				plane3.HandBack(rest.m)
			}
			break
		}
		if !r.gate.admit(ctx, it.lc, it.m) { // the durable is full: dropped, counted in a gap marker
			if err := r.settle(it.m, it.m.Ack); err != nil {
				return nil, err
			}
			continue
		}
		f, err := r.js.PublishMsgAsync(out)
		if err != nil {
			r.gate.lost(it.lc, it.m)
			if err := r.retry(it.m, it.deliveries, it.lc, fmt.Errorf("publish to %s: %w", out.Subject, err)); err != nil {
				return nil, err
			}
			continue
		}
		inflight = append(inflight, sent{it, f})
	}
	return func(ctx context.Context) error {
		for j, s := range inflight {
			if !r.cfg.MayAct() {
				for _, rest := range inflight[j:] { // fenced: not acked; their copies collapse on redelivery
					plane3.HandBack(rest.it.m)
				}
				return nil
			}
			select {
			case pa := <-s.ack.Ok():
				r.gate.stored(s.it.lc, s.it.m, pa.Sequence)
				if err := r.settle(s.it.m, s.it.m.Ack); err != nil {
					return err
				}
			case err := <-s.ack.Err():
				r.gate.lost(s.it.lc, s.it.m)
				if err := r.retry(s.it.m, s.it.deliveries, s.it.lc, fmt.Errorf("publish to %s: %w", s.ack.Msg().Subject, err)); err != nil {
					return err
				}
			case <-ctx.Done():
				return nil
			}
		}
		return nil
	}, nil
}

// read fills rows from kv's mirror (plane3.Mirror), opened on the first pass that needs it and
// synced once per pass: each row as a get made after the pass's entries were delivered reads it
// (at 100 members a pass needs about 100 ACL rows and 100 membership rows; a request each, or a
// scan of the bucket each pass, cost the reader and the broker more than the copies). A failed
// open or Sync is every row's read error (their entries are deferred), and the mirror is opened
// afresh on the next pass.
func (r *Reader) read(ctx context.Context, kv jetstream.KeyValue, mirror **plane3.Mirror, rows map[string]*row) {
	if len(rows) == 0 {
		return
	}
	err := plane3.SyncMirror(ctx, r.js, kv, mirror)
	for key, rw := range rows {
		if err != nil {
			rw.err = err
			continue
		}
		if e, ok := (*mirror).Get(key); ok {
			rw.value, rw.found = e.Value, true
		}
	}
}

// copyOf decides one entry: the DLV message to publish, nil to drop it (acked without a copy),
// or an error to retry it.
//
// A durable-channel entry's membership row is judged before the ACL row: a drop it decides does
// not depend on the ACL row, and a departed lifecycle (deprovisioned: its ACL row purged, its
// membership row closed by the fan-out writer, plane3.Member.Depart) has its entries still in
// the inbox dropped at their first delivery instead of deferred ten times as an unknown lifecycle.
func (r *Reader) copyOf(it item, aclRow, memberRow *row) (*nats.Msg, error) {
	if it.entry.Reason == plane3.ReasonDurable {
		if memberRow.err != nil {
			return nil, fmt.Errorf("read member row: %w", memberRow.err)
		}
		if !memberRow.found {
			r.log.Info("dropped a durable entry: no membership row", "member", it.memberKey)
			return nil, nil
		}
		if !memberRow.ok || !memberRow.member.Eligible(it.entry.Seq) {
			r.log.Info("dropped a durable entry outside its member's interval", "member", it.memberKey, "seq", it.entry.Seq)
			return nil, nil
		}
	}
	if aclRow.err != nil {
		return nil, fmt.Errorf("read ACL row: %w", aclRow.err)
	}
	if !aclRow.found || !aclRow.ok {
		return nil, errors.New("no ACL row for the lifecycle")
	}
	if !aclRow.acl.Allows(it.entry.Channel) {
		r.log.Info("dropped an entry: the lifecycle's ACL no longer allows the channel", "lifecycle", it.aclKey, "channel", it.entry.Channel)
		return nil, nil
	}
	frame, err := it.framed()
	if err != nil {
		r.log.Warn("dropped an entry whose message cannot be framed", "lifecycle", it.aclKey, "err", err)
		return nil, nil
	}
	out := nats.NewMsg(it.dlv)
	out.Data = frame
	out.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
	if msgID := plane3.MsgID(it.id, it.lc, it.entry.Generation); msgID != "" {
		out.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return out, nil
}

// retry naks the entry for redelivery after NakDelay, or terminates it once it has been
// delivered MaxDeliveries times (so one lifecycle cannot hold the shared reader for ever).
func (r *Reader) retry(m jetstream.Msg, deliveries uint64, lc plane3.Lifecycle, cause error) error {
	if !r.cfg.MayAct() {
		plane3.HandBack(m) // fenced: neither deferred nor given up on
		return nil
	}
	if deliveries >= r.cfg.MaxDeliveries {
		r.log.Error("gave up on an entry", "lifecycle", lc.Principal()+"."+lc.UID, "deliveries", deliveries, "err", cause)
		return r.settle(m, m.Term)
	}
	r.log.Debug("deferred an entry", "lifecycle", lc.Principal()+"."+lc.UID, "deliveries", deliveries, "err", cause)
	return r.settle(m, func() error { return m.NakWithDelay(r.cfg.NakDelay) })
}

// settle sends m's ack verb while the lease fence is up; with it down m is handed back instead.
func (r *Reader) settle(m jetstream.Msg, verb func() error) error {
	if !r.cfg.MayAct() {
		plane3.HandBack(m)
		return nil
	}
	if err := verb(); err != nil {
		return fmt.Errorf("reader: ack: %w", err)
	}
	return nil
}
