package reader

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// The gate on each lifecycle's DLV subject. DLV_<t> keeps at most provision.MaxMsgsPerSubject
// messages per subject and discards the oldest: harmless for a frame the lifecycle's dlv_ durable
// has acked, a silent loss for one it has not (a stopped agent, a burst). So before a copy is
// published the reader holds an upper bound of the frames stored on the subject above the
// durable's ack floor, and publishes the copy only while the bound stays at most the cap minus one
// (the last slot is kept free): the oldest frame a publish can then discard is at or below the
// floor, acked. A copy past it is dropped (its entry acked), counted, and the lifecycle is in
// overflow: logged once, and the gap marker (dlvclient.GapHeader, the count of dropped copies) is
// published as soon as the durable has room again, looked at on the lifecycle's next copy and by a
// timer, before any later frame. A lifecycle whose durable does not exist (not provisioned yet, or
// never: the benchmark's members) is not gated; it is looked up again after absentRecheck.
//
// The bound uses only what the broker updates in the same step as the store or the ack, never the
// consumer's NumPending (nats-server counts it on a goroutine of its own, signalConsumersLoop,
// after the publish's answer has gone out, so it trails stored frames):
//
//   - The reader is the only publisher on dlv.<o>.<a>.<uid> (lease-fenced), so the gate keeps the
//     stream sequence of each frame it published there (the PubAck's, reported by the pass:
//     stored), trimmed as the floor passes them, and counts each copy admitted but not yet
//     answered (inflight).
//   - The durable's AckFloor.Stream in its info is the consumer store's, moved as the ack is
//     processed (nats-server consumer.go processAckMsgLocked → updateAcks → the store's
//     UpdateAcks), and dlvclient acks in order, so the frames above it are the unacked ones (an
//     ack out of order only makes the bound larger).
//   - Frames the gate did not publish (another holder's, before a restart, before the fence fell)
//     are all at or below top, the subject's last stored sequence when the gate first looked (a
//     last-by-subject get). Once the floor reaches top there are none unacked; while the durable
//     has been delivered up to top they are at most its NumAckPending (the length of its pending
//     map, also moved in the delivery's and the ack's own step); otherwise at most the subject's
//     stored count (stream info by subject, the store's own count) and at most NumAckPending plus
//     the sequences between the delivered one and top.
//
// The info is read on first sight of a lifecycle, again once the frames published since the last
// one reach half the room it showed (so an agent that keeps up costs one info and one get per
// about half the cap of copies), and before a copy is dropped; always after every publish in
// flight has been answered (PublishAsyncComplete). The gate starts a lifecycle afresh (a new top)
// after a publish whose answer was an error (it may be stored, at an unknown sequence), when the
// subject's last frame is not one it knows, when the durable was created again, and for every
// lifecycle after the lease fence was seen down (another holder may have published meanwhile).
const (
	// gateTick is how often the timer looks at lifecycles in overflow for room for their marker.
	gateTick = 2 * time.Second
	// overflowRecheck is the least time between two infos of a lifecycle in overflow on its copies.
	overflowRecheck = 250 * time.Millisecond
	// absentRecheck is how long a lifecycle found without a durable stays ungated before the
	// next look.
	absentRecheck = 10 * time.Second
	// idleForget is how long a lifecycle not in overflow is remembered without a copy.
	idleForget = 10 * time.Minute
)

// Metrics are the gate's Prometheus instruments; they carry no lifecycle label (the logs name
// the lifecycle).
type Metrics struct {
	dropped     prometheus.Counter
	overflowing prometheus.Gauge
	markers     prometheus.Counter
	unmarked    prometheus.Counter
}

// NewMetrics makes the gate's instruments and registers them with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "cotal_delivery_copies_dropped_total",
			Help: "Copies the trusted reader did not publish because the lifecycle's dlv_ durable was full; each is counted in a gap marker."}),
		overflowing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cotal_delivery_members_overflowing",
			Help: "Lifecycles whose copies are being dropped and whose gap marker is not yet stored."}),
		markers: prometheus.NewCounter(prometheus.CounterOpts{Name: "cotal_delivery_gap_markers_total",
			Help: "Gap markers stored in DLV."}),
		unmarked: prometheus.NewCounter(prometheus.CounterOpts{Name: "cotal_delivery_copies_unmarked_total",
			Help: "Dropped copies whose gap marker could not be stored: the lifecycle's durable was deleted while it overflowed."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.dropped, m.overflowing, m.markers, m.unmarked} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// lane is one lifecycle's gate state.
type lane struct {
	checked  bool           // an info was read
	durable  bool           // the durable existed at the last info (gated)
	booted   bool           // top is known for the durable created at created
	created  time.Time      // the durable's creation time at boot
	top      uint64         // the subject's last stored sequence at boot; 0 once nothing foreign is unacked
	last     uint64         // the highest sequence known stored on the subject (top or the gate's own)
	own      []uint64       // sequences of frames this gate published since boot, above the last floor, ascending
	flight   map[uint64]int // admitted copies not yet answered, by INBOX sequence
	inflight int            // their count
	reboot   bool           // start afresh at the next info (a publish answered with an error)
	base     uint64         // the bound of unacked frames at the last info
	room     uint64         // limit - base at the last info
	since    uint64         // frames (and markers) admitted since
	infoAt   time.Time      // when the last info was read
	seen     time.Time      // the last copy
	dropped  uint64         // copies dropped since the overflow began; > 0 is overflow
	first    uint64         // INBOX sequence of the first dropped copy: the marker's dedup id
}

// gate is the reader's gate on every lifecycle's DLV subject.
type gate struct {
	js    jetstream.JetStream
	n     space.Names
	cap   uint64
	fence func() bool
	fell  atomic.Bool // the fence was seen down since the last admit
	log   *slog.Logger
	met   *Metrics
	mu    sync.Mutex
	lanes map[plane3.Lifecycle]*lane
	dlv   jetstream.Stream // DLV_<t>, opened on first use
}

func newGate(js jetstream.JetStream, n space.Names, mayAct func() bool, log *slog.Logger, met *Metrics) *gate {
	return &gate{js: js, n: n, cap: provision.MaxMsgsPerSubject, fence: mayAct, log: log, met: met, lanes: map[plane3.Lifecycle]*lane{}}
}

// mayAct is the lease fence as the reader checks it: every look at it goes through the gate, so
// a fence seen down makes the gate start every lifecycle afresh before its next copy.
func (g *gate) mayAct() bool {
	ok := g.fence()
	if !ok {
		g.fell.Store(true)
	}
	return ok
}

// limit is the most unacked frames a copy or a marker may leave in the durable: the last slot
// stays free.
func (g *gate) limit() uint64 { return g.cap - 1 }

// entrySeq is the INBOX sequence of m, the key of its copy in flight.
func entrySeq(m jetstream.Msg) uint64 {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// admit decides whether the copy m of lifecycle lc may be published: true counts it as published
// and in flight until the pass reports its answer (stored or lost). False means it was dropped:
// the caller acks its entry without a copy.
func (g *gate) admit(ctx context.Context, lc plane3.Lifecycle, m jetstream.Msg) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fell.Swap(false) {
		// The fence was down: another holder may have published, and the pass handed back its
		// copies in flight without their answers. Every copy admitted so far has been published
		// (admit comes just before each publish), so the next info, waiting for their answers,
		// finds each stored one at or below the new top.
		for _, l := range g.lanes {
			l.restart()
			l.flight, l.inflight = nil, 0
		}
	}
	now := time.Now()
	l := g.lanes[lc]
	if l == nil {
		l = &lane{}
		g.lanes[lc] = l
	}
	l.seen = now
	switch {
	case !l.checked && now.Sub(l.infoAt) >= overflowRecheck, // first sight, or the last read failed
		l.checked && !l.durable && now.Sub(l.infoAt) >= absentRecheck,
		l.dropped > 0 && now.Sub(l.infoAt) >= overflowRecheck,
		l.durable && l.dropped == 0 && (!l.booted || l.reboot || l.since >= max(l.room/2, 1)):
		g.refresh(ctx, lc, l)
	}
	if !l.durable {
		return true
	}
	if l.dropped > 0 && !g.mark(ctx, lc, l) {
		l.dropped++
		g.met.dropped.Inc()
		return false
	}
	if l.base+l.since+1 > g.limit() {
		if l.since > 0 {
			g.refresh(ctx, lc, l)
		}
		if l.durable && l.base+l.since+1 > g.limit() {
			l.dropped, l.first = 1, entrySeq(m)
			g.met.dropped.Inc()
			g.met.overflowing.Inc()
			g.log.Warn("dropping copies: the lifecycle's durable holds as many unacked frames as DLV keeps; a gap marker will follow",
				"lifecycle", lc.Principal()+"."+lc.UID, "cap", g.cap, "unacked", l.base+l.since)
			return false
		}
	}
	l.since++
	if l.flight == nil {
		l.flight = map[uint64]int{}
	}
	l.flight[entrySeq(m)]++
	l.inflight++
	return true
}

// stored records the answer to the copy of entry m admitted for lc: DLV stored it at seq.
func (g *gate) stored(lc plane3.Lifecycle, m jetstream.Msg, seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.lanes[lc]
	if l == nil || !l.answered(entrySeq(m)) {
		return // admitted before the lane started afresh: at or below its top
	}
	l.add(seq)
}

// lost records that the copy of entry m admitted for lc was not stored, or may have been at a
// sequence the gate does not know (a publish that failed or timed out): lc starts afresh.
func (g *gate) lost(lc plane3.Lifecycle, m jetstream.Msg) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l := g.lanes[lc]; l != nil && l.answered(entrySeq(m)) {
		l.reboot = true
	}
}

// answered takes one copy of entry seq out of flight; false when none is there.
func (l *lane) answered(seq uint64) bool {
	if l.flight[seq] == 0 {
		return false
	}
	if l.flight[seq]--; l.flight[seq] == 0 {
		delete(l.flight, seq)
	}
	l.inflight--
	return true
}

// add records a frame of the gate's own stored at seq (a duplicate answer names the first's).
func (l *lane) add(seq uint64) {
	if l.booted && seq <= l.top {
		return
	}
	l.last = max(l.last, seq)
	i := sort.Search(len(l.own), func(i int) bool { return l.own[i] >= seq })
	if i < len(l.own) && l.own[i] == seq {
		return
	}
	l.own = slices.Insert(l.own, i, seq)
}

// restart forgets what the lane knows of the subject: the next info reads a new top. Copies in
// flight stay counted until their answers come (one stored at or below the new top is then
// counted under it: twice, never less).
func (l *lane) restart() {
	l.booted, l.reboot = false, false
	l.top, l.last, l.own = 0, 0, nil
}

// refresh reads lc's durable info into l, after waiting for every publish in flight, so the
// info counts each frame already published. A failed read (a broker error, or a signerd older than
// this gate whose delivery credential may not read DLV consumer info or messages) leaves the
// lifecycle ungated until absentRecheck, unless it is in overflow (its marker waits for a read
// that works): the gate never holds the reader on a broker error, and never publishes past a
// pending marker.
func (g *gate) refresh(ctx context.Context, lc plane3.Lifecycle, l *lane) {
	select {
	case <-g.js.PublishAsyncComplete():
	case <-ctx.Done():
		return
	}
	name, err := g.n.DlvConsumer(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return
	}
	l.infoAt = time.Now()
	c, err := g.js.Consumer(ctx, g.n.DLVStream(), name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if l.dropped > 0 {
			g.forget(lc, l, "the lifecycle's durable is gone; its gap marker cannot be delivered")
		}
		l.checked, l.durable = true, false
		l.restart()
		return
	}
	if err == nil {
		err = g.count(ctx, lc, l, c.CachedInfo())
	}
	if err != nil {
		g.log.Warn("gate: the durable's info failed; its copies are not gated until the next look",
			"lifecycle", lc.Principal()+"."+lc.UID, "err", err)
		if l.dropped == 0 {
			l.checked, l.durable = true, false // looked at again after absentRecheck
			l.restart()
		}
		return
	}
	l.checked, l.durable = true, true
	l.since, l.room = 0, 0
	if l.base < g.limit() {
		l.room = g.limit() - l.base
	}
}

// count sets l.base from the durable's info ci: the frames stored on lc's subject above its ack
// floor, bounded as the package doc says, plus the copies still in flight.
func (g *gate) count(ctx context.Context, lc plane3.Lifecycle, l *lane, ci *jetstream.ConsumerInfo) error {
	floor, delivered, pending := ci.AckFloor.Stream, ci.Delivered.Stream, uint64(ci.NumAckPending)
	if l.booted && !ci.Created.Equal(l.created) {
		l.restart() // the durable was made again: its floor starts over
	}
	// With nothing in flight the subject's last frame is one the gate knows (top, or its own
	// last); another is a frame it did not publish, and the lane starts afresh.
	if !l.booted || l.reboot || l.inflight == 0 {
		last, err := g.lastSeq(ctx, lc)
		if err != nil {
			return err
		}
		if l.booted && !l.reboot && last != l.last {
			g.log.Warn("gate: the lifecycle's subject holds a frame this reader did not publish; counting afresh",
				"lifecycle", lc.Principal()+"."+lc.UID, "last", last, "known", l.last)
			l.restart()
		}
		if !l.booted || l.reboot {
			l.restart()
			l.booted, l.created, l.top, l.last = true, ci.Created, last, last
		}
	}
	i := sort.Search(len(l.own), func(i int) bool { return l.own[i] > floor })
	l.own = l.own[i:]
	var foreign uint64
	switch {
	case l.top <= floor:
		l.top = 0 // all acked; the floor does not go back for this durable
	case delivered >= l.top:
		foreign = pending
	default:
		stored, err := g.subjectCount(ctx, lc)
		if err != nil {
			return err
		}
		foreign = min(stored, pending+l.top-delivered)
	}
	l.base = foreign + uint64(len(l.own)) + uint64(l.inflight)
	return nil
}

// lastSeq is the stream sequence of the last message stored on lc's DLV subject, 0 for none.
func (g *gate) lastSeq(ctx context.Context, lc plane3.Lifecycle) (uint64, error) {
	subj, err := g.n.Dlv(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return 0, err
	}
	if err := g.openDLV(ctx); err != nil {
		return 0, err
	}
	m, err := g.dlv.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// subjectCount is how many messages DLV holds on lc's subject (stream info by subject).
func (g *gate) subjectCount(ctx context.Context, lc plane3.Lifecycle) (uint64, error) {
	subj, err := g.n.Dlv(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return 0, err
	}
	if err := g.openDLV(ctx); err != nil {
		return 0, err
	}
	info, err := g.dlv.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subj], nil
}

func (g *gate) openDLV(ctx context.Context) error {
	if g.dlv != nil {
		return nil
	}
	s, err := g.js.Stream(ctx, g.n.DLVStream())
	if err != nil {
		return err
	}
	g.dlv = s
	return nil
}

// mark publishes l's gap marker once the durable has room again (room for a frame: the
// lifecycle acked at least one since its overflow began), and reports whether l left overflow.
// The marker's dedup id names the first dropped entry, so a publish retried within the dedup
// window is stored once.
func (g *gate) mark(ctx context.Context, lc plane3.Lifecycle, l *lane) bool {
	if l.base+l.since+1 > g.limit() || !g.mayAct() {
		return false
	}
	subj, err := g.n.Dlv(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return false
	}
	body, count, err := dlvclient.EncodeGap(l.dropped)
	if err != nil {
		return false
	}
	out := nats.NewMsg(subj)
	out.Data = body
	out.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
	out.Header.Set(dlvclient.GapHeader, count)
	out.Header.Set(jetstream.MsgIDHeader, "gap:"+lc.Principal()+":"+lc.UID+":"+strconv.FormatUint(l.first, 10))
	ack, err := g.js.PublishMsg(ctx, out)
	if err != nil {
		g.log.Warn("gap marker not stored; retrying", "lifecycle", lc.Principal()+"."+lc.UID, "missing", l.dropped, "err", err)
		l.reboot = true // it may be stored all the same, at a sequence the gate does not know
		return false
	}
	g.log.Warn("published a gap marker: copies were dropped before it",
		"lifecycle", lc.Principal()+"."+lc.UID, "missing", l.dropped)
	g.met.markers.Inc()
	g.met.overflowing.Dec()
	l.dropped, l.first = 0, 0
	l.add(ack.Sequence)
	l.since++
	return true
}

// forget ends l's overflow without a marker (its durable is gone).
func (g *gate) forget(lc plane3.Lifecycle, l *lane, why string) {
	g.log.Warn(why, "lifecycle", lc.Principal()+"."+lc.UID, "missing", l.dropped)
	g.met.unmarked.Add(float64(l.dropped))
	g.met.overflowing.Dec()
	l.dropped, l.first = 0, 0
}

// run is the timer: every gateTick it looks at each lifecycle in overflow and publishes its
// marker once its durable has room, and forgets lifecycles idle for idleForget, until ctx is done.
func (g *gate) run(ctx context.Context) {
	t := time.NewTicker(gateTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.tick(ctx)
	}
}

func (g *gate) tick(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for lc, l := range g.lanes {
		if l.dropped == 0 {
			if now.Sub(l.seen) >= idleForget {
				delete(g.lanes, lc)
			}
			continue
		}
		if !g.mayAct() || ctx.Err() != nil {
			return
		}
		g.refresh(ctx, lc, l)
		if l.dropped > 0 && l.durable {
			g.mark(ctx, lc, l)
		}
	}
}
