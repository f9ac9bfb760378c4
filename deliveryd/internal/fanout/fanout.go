// Package fanout is deliveryd's fan-out writer (reference/delivery.md §1.3): it consumes every
// chat message through the durable "fanout" on CHAT_<t> (deliver new, explicit ack) and routes
// each to the inboxes of the lifecycles that should get a durable copy: on a durable channel, every
// member row whose interval holds the message's sequence, except the sender's; on a live channel,
// each mentioned peer whose ACL allows the channel. It routes, it does not authorize: the trusted
// reader re-checks every entry. Messages are taken in passes of up to Batch sharing one read of
// the membership rows (see view); their copies are published asynchronously and each chat message
// is acked last, after its own copies are stored, so a crash redelivers it and the copies collapse
// on their Nats-Msg-Id.
//
// A membership row whose lifecycle has no ACL row is a departed member: deprovisioning (managerd's
// Stop, pkg/provision.DeprovisionAgent) purges the ACL row, and the reader could never deliver to
// it, only retry each entry and give up. The writer routes nothing to such a row and closes it
// (plane3.Member.Depart, a revision CAS), since the deprovisioner may not write membership rows:
// the ACL purge is the deprovision, and deliveryd, the rows' only writer, carries it into them.
//
// It refuses (acks and drops) a message that is not chat, not JSON, whose from.id is not the
// principal of its subject, or whose owner is not a real principal owner. It never creates a
// stream or bucket; a missing one stops Run naming it.
package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults.
const (
	// DefaultBatch is how many chat messages one pass takes; they share one read of the rows.
	DefaultBatch = 256
	// retryPause is the wait after a failed fetch (a broker that is reconnecting).
	retryPause = time.Second
	// passWindow is the most inbox copies one pass keeps unacknowledged by the broker: before
	// publishing past it the pass waits for its oldest copy's ack. A pass of DefaultBatch
	// messages to up to 16 members never waits; at 100 members (25600 copies) it does. The
	// writer's async publish window (asyncWindow) holds the plane3.OverlapDepth+1 passes in
	// flight at once, so a publish never stalls in nats.go, which past 200 ms would fail it and
	// with it the whole pass.
	passWindow = 4096
	// asyncWindow is the writer's nats.go async publish window (its default is 4000).
	asyncWindow = (plane3.OverlapDepth + 1) * passWindow
)

// Config is what New needs. Names is required.
type Config struct {
	Names space.Names
	// Batch is the most chat messages one pass handles; zero means DefaultBatch.
	Batch int
	// NakDelay is the redelivery delay after a failed pass; zero means plane3.NakDelay.
	NakDelay time.Duration
	// AckWait is the consumer's ack_wait, the Keeper's base; zero means plane3.AckWait. Tests
	// shorten it to show a held pass past it; deliveryd uses the default.
	AckWait time.Duration
	// MayAct is the lease fence: checked before every fetch, publish and ack. A pass that finds it
	// false stops and hands its messages back (plane3.HandBack: nak'd, not acked), so they
	// redeliver once it lifts or to whoever holds the lease; Run fetches nothing while it is
	// false (plane3.AwaitFence). Nil means always.
	MayAct func() bool
	// Logger receives drops and failures (never a message body); nil discards.
	Logger *slog.Logger
	// WriterIdentity is stamped on the membership rows of departed lifecycles the writer closes;
	// empty means "fanout".
	WriterIdentity string
}

// errQuiesced stops a pass whose fence went down while it routed.
var errQuiesced = errors.New("fanout: quiesced")

// Writer is the fan-out writer on one delivery connection.
type Writer struct {
	cfg      Config
	log      *slog.Logger
	js       jetstream.JetStream
	consumer jetstream.Consumer
	members  jetstream.KeyValue
	channels jetstream.KeyValue
	acl      jetstream.KeyValue
	presence jetstream.KeyValue
	inbox    inboxRoom // the reader durable's backlog (inbox.go)
	// memberRows, aclRows and channelRows are the membership, ACL and channels buckets' rows as
	// of a pass's Sync (plane3.Mirror, opened on a pass's first need); only Run's goroutine
	// touches them.
	memberRows, aclRows, channelRows *plane3.Mirror
}

// ConsumerConfig is the fanout durable (upstream fanoutDurableConfig, but with plane3.AckWait, 15 s,
// instead of upstream's 60 s ack wait: see plane3/progress.go).
func ConsumerConfig(n space.Names) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: n.FanoutConsumer(), FilterSubject: n.ChatAll(),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: plane3.AckWait,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
}

// New opens CHAT, INBOX and the members, channels, ACL and presence buckets on nc (a delivery
// credential's connection) and creates or updates the fanout durable. A missing stream or bucket
// is an error matching plane3.ErrMissing that names it; a refused create is the broker's refusal,
// never taken for "already exists".
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Writer, error) {
	n := cfg.Names
	if n.Token() == "" {
		return nil, space.ErrZeroNames
	}
	if cfg.Batch < 0 || cfg.NakDelay < 0 || cfg.AckWait < 0 {
		return nil, fmt.Errorf("fanout: negative Batch %d, NakDelay %v or AckWait %v", cfg.Batch, cfg.NakDelay, cfg.AckWait)
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = plane3.AckWait
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Batch > maxBatch {
		return nil, errBatch
	}
	if cfg.NakDelay == 0 {
		cfg.NakDelay = plane3.NakDelay
	}
	if cfg.MayAct == nil {
		cfg.MayAct = plane3.Always
	}
	if cfg.WriterIdentity == "" {
		cfg.WriterIdentity = "fanout"
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(asyncWindow))
	if err != nil {
		return nil, fmt.Errorf("fanout: %w", err)
	}
	w := &Writer{cfg: cfg, log: plane3.Logger(cfg.Logger).With("loop", "fanout"), js: js}
	for _, s := range []string{n.ChatStream(), n.InboxStream()} {
		if _, err := plane3.OpenStream(ctx, js, s); err != nil {
			return nil, fmt.Errorf("fanout: %w", err)
		}
	}
	for _, b := range []struct {
		kind space.BucketKind
		dst  *jetstream.KeyValue
	}{{space.Members, &w.members}, {space.Channels, &w.channels}, {space.ACL, &w.acl}, {space.Presence, &w.presence}} {
		if *b.dst, err = plane3.OpenBucket(ctx, js, n, b.kind); err != nil {
			return nil, fmt.Errorf("fanout: %w", err)
		}
	}
	cc := ConsumerConfig(n)
	cc.AckWait = cfg.AckWait
	if w.consumer, err = js.CreateOrUpdateConsumer(ctx, n.ChatStream(), cc); err != nil {
		return nil, fmt.Errorf("fanout: create %s on %s: %w", n.FanoutConsumer(), n.ChatStream(), err)
	}
	return w, nil
}

// Run fans out until ctx is done (nil) or the consumer fails. Passes overlap (plane3.Overlap): a
// pass's messages are acked after the next plane3.OverlapDepth passes, if they are waiting, are
// routed.
// Once drain is closed it takes no new pass, settles the one it holds (its messages acked) and
// returns nil: a draining daemon's intake stop. A nil drain never closes.
func (w *Writer) Run(ctx context.Context, drain <-chan struct{}) error {
	defer plane3.CloseMirrors(&w.memberRows, &w.aclRows, &w.channelRows)
	o := plane3.Overlap{Keep: plane3.StartKeeper(w.cfg.AckWait, w.cfg.MayAct)}
	defer o.Close(ctx)
	for ctx.Err() == nil && !plane3.Closed(drain) {
		if !w.cfg.MayAct() {
			_ = o.Settle(ctx) // fenced: the held pass is handed back
			if !plane3.AwaitFence(ctx, func() bool { return w.cfg.MayAct() || plane3.Closed(drain) }) {
				return nil
			}
			continue // the fence lifted, or a drain began: look again
		}
		if w.inboxFull(ctx) { // the reader lags: settle, wait, look again (inbox.go)
			_ = o.Settle(ctx)
			if !w.awaitInbox(ctx, drain) {
				return nil
			}
			continue
		}
		batch, err := o.Next(ctx, w.consumer, w.cfg.Batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if plane3.Fatal(err) {
				return fmt.Errorf("fanout: fetch: %w", err)
			}
			w.log.Warn("fetch failed; retrying", "err", err)
			if !plane3.Pause(ctx, retryPause) {
				return nil
			}
			continue
		}
		if len(batch) == 0 {
			continue
		}
		next, err := w.pass(ctx, batch)
		_ = o.Trim(ctx) // a writer's pass settles its own failures: it never returns one
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.failed(batch, err)
			continue
		}
		o.Hold(next)
	}
	return nil
}

// failed naks every message of a pass that failed, for redelivery after NakDelay (with the fence
// down they are handed back); the copies that did land collapse with the redelivered ones on
// their Nats-Msg-Id.
func (w *Writer) failed(batch []jetstream.Msg, err error) {
	w.log.Warn("fan-out pass failed; its messages redeliver", "messages", len(batch), "err", err)
	for _, m := range batch {
		if w.cfg.MayAct() {
			_ = m.NakWithDelay(w.cfg.NakDelay)
		} else {
			plane3.HandBack(m)
		}
	}
}

// view is what one pass reads once, after its messages were delivered (each bucket's mirror
// synced once per pass): so it holds every membership committed before any of them reached the
// fanout consumer, which is what upstream's per-message fresh scan guarantees and what
// durableJoin's fence relies on.
type view struct {
	members map[string][]memberRow // by channel, departed lifecycles left out
	classes map[string]string
	roster  map[string][]string // lower-case name -> principals
	acls    map[string][]aclRow // by principal, the rows that decode; nil until read
	// channelsSynced: the channels mirror was synced in this pass. aclSynced: the ACL mirror was
	// synced in this pass, after the membership rows were read if they were (readMembers resets it).
	channelsSynced, aclSynced bool
	// checked lists the channels whose members' ACL rows were looked up in this pass.
	checked map[string]bool
	// departed are the open rows of lifecycles without an ACL row, to close after the pass.
	departed []memberRow
}

type memberRow struct {
	key string
	rev uint64
	lc  plane3.Lifecycle
	m   plane3.Member
}

type aclRow struct {
	lc  plane3.Lifecycle
	acl plane3.ACL
}

// pass routes a batch: it publishes every message's inbox copies asynchronously, in order, and
// returns the pass's settle, which acks each message once its own copies are stored and naks one
// whose copy failed (it handles its failures itself and returns nil). A pass that fails returns
// no settle; Run naks its messages. With the fence down, the messages not yet routed are handed
// back at once, and the settle hands back those not yet acked: their copies already stored
// collapse with the redelivered ones on their Nats-Msg-Id.
func (w *Writer) pass(ctx context.Context, batch []jetstream.Msg) (func(context.Context) error, error) {
	v := &view{classes: map[string]string{}}
	type routed struct {
		m   jetstream.Msg
		end int // its copies are win.acks[:end] past those of the messages before it
	}
	var done []routed
	win := &window{}
	for _, m := range batch {
		if !w.cfg.MayAct() {
			break // fenced: route no more
		}
		err := w.route(ctx, v, win, m)
		if errors.Is(err, errQuiesced) {
			break
		}
		if err != nil {
			return nil, err
		}
		done = append(done, routed{m, len(win.acks)})
	}
	if rest := batch[len(done):]; len(rest) > 0 {
		plane3.HandBack(rest...) // fenced: not routed, or partly
	}
	w.depart(ctx, v)
	handBack := func(rs []routed) {
		for _, r := range rs {
			plane3.HandBack(r.m)
		}
	}
	return func(ctx context.Context) error {
		for i, r := range done {
			if !w.cfg.MayAct() {
				handBack(done[i:]) // fenced: not acked; they redeliver
				return nil
			}
			if err := win.waitTo(ctx, r.end); err != nil {
				if ctx.Err() != nil {
					return nil // unacked: the messages redeliver after AckWait
				}
				w.log.Warn("an inbox copy failed; the message redelivers", "err", err)
				if w.cfg.MayAct() {
					_ = r.m.NakWithDelay(w.cfg.NakDelay)
				} else {
					plane3.HandBack(r.m)
				}
				continue
			}
			if !w.cfg.MayAct() {
				handBack(done[i:])
				return nil
			}
			if err := r.m.Ack(); err != nil {
				rest := make([]jetstream.Msg, 0, len(done)-i)
				for _, r := range done[i:] {
					rest = append(rest, r.m)
				}
				w.failed(rest, fmt.Errorf("ack: %w", err))
				return nil
			}
		}
		return nil
	}, nil
}

// window is the pass's copies in publish order and how many of them were waited for (a
// future's ack is received once: each is waited for once, here).
type window struct {
	acks   []jetstream.PubAckFuture
	waited int
}

// room waits, while passWindow of the pass's copies are not waited for, for the oldest of them:
// the broker's back-pressure on a large pass. A failed copy fails the pass.
func (win *window) room(ctx context.Context) error {
	for len(win.acks)-win.waited >= passWindow {
		if err := win.waitTo(ctx, win.waited+1); err != nil {
			return err
		}
	}
	return nil
}

// waitTo waits for the acks of the copies before end. On a failed copy it skips to end (the
// rest of those copies belong to the message the failure fails) and returns the failure.
func (win *window) waitTo(ctx context.Context, end int) error {
	for ; win.waited < end; win.waited++ {
		f := win.acks[win.waited]
		select {
		case <-f.Ok():
		case err := <-f.Err():
			win.waited = end
			return fmt.Errorf("publish %s: %w", f.Msg().Subject, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// route publishes one message's inbox copies, their acks appended to win (none for a message it
// drops). Each copy waits for room in the pass's window (window.room) before
// the fence is checked and it is published.
func (w *Writer) route(ctx context.Context, v *view, win *window, m jetstream.Msg) error {
	n := w.cfg.Names
	owner, actor, channel, ok := plane3.ParseChat(n, m.Subject())
	if !ok {
		w.log.Debug("dropped: not a principal's chat subject", "subject", m.Subject())
		return nil
	}
	msg, err := plane3.DecodeMessage(m.Data())
	if err != nil || msg.From != owner+"."+actor {
		w.log.Warn("dropped: not JSON or from.id is not the subject's principal", "subject", m.Subject())
		return nil
	}
	md, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	seq := md.Sequence.Stream
	body, err := msg.Normalised(channel)
	if err != nil {
		return err
	}
	class, ok := v.classes[channel]
	if !ok {
		if err := w.syncOnce(ctx, w.channels, &w.channelRows, &v.channelsSynced); err != nil {
			return err
		}
		class = plane3.ClassOf(w.channelRows, channel)
		v.classes[channel] = class
	}
	type target struct {
		lc     plane3.Lifecycle
		reason string
		gen    uint64
	}
	var targets []target
	sender := owner + "." + actor
	if class == plane3.ClassDurable {
		if v.members == nil {
			if err := w.readMembers(ctx, v); err != nil {
				return err
			}
		}
		if !v.checked[channel] {
			if err := w.checkMembers(ctx, v, channel); err != nil {
				return err
			}
		}
		for _, r := range v.members[channel] {
			if r.lc.Principal() == sender || !r.m.Eligible(seq) {
				continue
			}
			targets = append(targets, target{r.lc, plane3.ReasonDurable, r.m.Generation})
		}
	} else {
		for _, name := range msg.Mentions {
			lc, ok, err := w.mentioned(ctx, v, name, sender, channel)
			if err != nil {
				return err
			}
			if ok {
				targets = append(targets, target{lc, plane3.ReasonMention, 0})
			}
		}
	}
	if len(targets) == 0 {
		return nil
	}
	enc := plane3.NewEntryEncoder(body, channel, seq)
	for _, t := range targets {
		if err := win.room(ctx); err != nil {
			return err
		}
		if !w.cfg.MayAct() {
			return errQuiesced
		}
		entry := enc.Encode(t.reason, t.gen)
		subj, err := n.Dinbox(t.lc.Owner, t.lc.Actor, t.lc.UID)
		if err != nil {
			return err
		}
		out := nats.NewMsg(subj)
		out.Data = entry
		if id := plane3.MsgID(msg.ID, t.lc, t.gen); id != "" {
			out.Header.Set(jetstream.MsgIDHeader, id)
		}
		f, err := w.js.PublishMsgAsync(out)
		if err != nil {
			return fmt.Errorf("publish %s: %w", subj, err)
		}
		win.acks = append(win.acks, f)
		w.inbox.sent++
	}
	return nil
}

// readMembers reads every membership row (tombstones included: a row stays eligible for its
// pre-leave interval) from the synced mirror and groups them by channel, each channel's rows in key
// order. A row that does not decode is skipped and logged, as upstream's listMembers skips it.
// The ACL mirror must be synced again before the departure check (checkMembers): its rows must be
// read after the membership rows.
func (w *Writer) readMembers(ctx context.Context, v *view) error {
	if err := plane3.SyncMirror(ctx, w.js, w.members, &w.memberRows); err != nil {
		return err
	}
	v.members = map[string][]memberRow{}
	v.aclSynced, v.checked = false, map[string]bool{}
	w.memberRows.Each(func(key string, r plane3.Row) {
		m, lc, err := plane3.DecodeMember(key, r.Value)
		if err != nil {
			w.log.Warn("skipped a membership row that does not decode", "key", key)
			return
		}
		v.members[m.Channel] = append(v.members[m.Channel], memberRow{key, r.Revision, lc, m})
	})
	for _, rows := range v.members {
		slices.SortFunc(rows, func(a, b memberRow) int { return strings.Compare(a.key, b.key) })
	}
	return nil
}

// syncOnce syncs the mirror m of kv unless *synced says this pass already did, and sets it. The
// ACL mirror's flag is reset by readMembers, so it is synced again after the membership rows.
func (w *Writer) syncOnce(ctx context.Context, kv jetstream.KeyValue, m **plane3.Mirror, synced *bool) error {
	if *synced {
		return nil
	}
	if err := plane3.SyncMirror(ctx, w.js, kv, m); err != nil {
		return err
	}
	*synced = true
	return nil
}

// checkMembers keeps, of channel's membership rows, those whose lifecycle has an ACL row. A row
// without one is a departed member (deprovisioned: its ACL row purged): it is removed from
// v.members, so no entry is routed to it, and unless it is already closed it goes on v.departed.
// The ACL rows are read after the membership rows, never before (syncOnce): a lifecycle's ACL row
// is written before it can join (durableJoin requires it), so a row read here whose ACL row the
// later read misses has really lost it.
func (w *Writer) checkMembers(ctx context.Context, v *view, channel string) error {
	if err := w.syncOnce(ctx, w.acl, &w.aclRows, &v.aclSynced); err != nil {
		return err
	}
	rows := v.members[channel]
	kept := rows[:0]
	for _, r := range rows {
		if _, ok := w.aclRows.Get(aclKey(r.lc)); ok {
			kept = append(kept, r)
			continue
		}
		if _, open := r.m.Depart("", 0); open {
			v.departed = append(v.departed, r)
		}
	}
	v.members[channel] = kept
	v.checked[channel] = true
	return nil
}

func aclKey(lc plane3.Lifecycle) string { return lc.Principal() + "." + lc.UID }

// readACLs reads every ACL row that decodes, by principal (for mentions).
func (w *Writer) readACLs(ctx context.Context, v *view) error {
	if err := w.syncOnce(ctx, w.acl, &w.aclRows, &v.aclSynced); err != nil {
		return err
	}
	acls := map[string][]aclRow{}
	w.aclRows.Each(func(key string, r plane3.Row) {
		lc, ok := plane3.ParseACLKey(key)
		if !ok {
			return
		}
		if acl, valid := plane3.DecodeACL(r.Value); valid {
			acls[lc.Principal()] = append(acls[lc.Principal()], aclRow{lc, acl})
		}
	})
	v.acls = acls
	return nil
}

// depart closes the membership rows of the departed lifecycles the pass found (Member.Depart), each
// by a CAS on the revision it was read at: a row a join or leave rewrote meanwhile is left to the
// next pass, which reads it again. Each row is written once; a closed one is not found again.
// Fenced: a quiesced writer writes nothing.
func (w *Writer) depart(ctx context.Context, v *view) {
	for _, r := range v.departed {
		if !w.cfg.MayAct() || ctx.Err() != nil {
			return
		}
		next, _ := r.m.Depart(w.cfg.WriterIdentity, time.Now().UnixMilli())
		body, err := json.Marshal(next)
		if err == nil {
			_, err = w.members.Update(ctx, r.key, body, r.rev)
		}
		switch {
		case err == nil:
			w.log.Info("closed the membership row of a departed lifecycle (no ACL row)", "member", r.key)
		case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			w.log.Debug("a departed lifecycle's membership row changed while it was closed; the next pass reads it again", "member", r.key)
		default:
			w.log.Warn("could not close a departed lifecycle's membership row; it stays unrouted", "member", r.key, "err", err)
		}
	}
	v.departed = nil
}

// mentioned resolves a live-channel mention as upstream does: the name must match exactly one
// roster card (case-insensitive), not the sender; that principal must have exactly one ACL row,
// and the row must allow the channel.
func (w *Writer) mentioned(ctx context.Context, v *view, name, sender, channel string) (plane3.Lifecycle, bool, error) {
	if v.roster == nil {
		v.roster = map[string][]string{}
		err := plane3.Scan(ctx, w.presence, func(e jetstream.KeyValueEntry) {
			var p struct {
				Card struct {
					ID   string `json:"id"`
					Name string `json:"name"`
				} `json:"card"`
			}
			if json.Unmarshal(e.Value(), &p) != nil || p.Card.ID != e.Key() || p.Card.Name == "" {
				return
			}
			k := strings.ToLower(p.Card.Name)
			v.roster[k] = append(v.roster[k], p.Card.ID)
		})
		if err != nil {
			return plane3.Lifecycle{}, false, err
		}
	}
	peers := v.roster[strings.ToLower(name)]
	if len(peers) != 1 || peers[0] == sender {
		return plane3.Lifecycle{}, false, nil
	}
	if v.acls == nil {
		if err := w.readACLs(ctx, v); err != nil {
			return plane3.Lifecycle{}, false, err
		}
	}
	rows := v.acls[peers[0]]
	if len(rows) != 1 {
		if len(rows) > 1 {
			w.log.Error("mention skipped: the peer has more than one live ACL row", "principal", peers[0], "rows", len(rows))
		}
		return plane3.Lifecycle{}, false, nil
	}
	if !rows[0].acl.Allows(channel) {
		return plane3.Lifecycle{}, false, nil
	}
	return rows[0].lc, true, nil
}
