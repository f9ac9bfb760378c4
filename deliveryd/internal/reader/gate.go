package reader

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
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
// published the reader holds an upper bound of the durable's unacked frames (NumPending +
// NumAckPending of its info, plus the frames published since that info) and publishes the copy only
// while the bound stays at most the cap minus one (the last slot is kept free). A copy
// past it is dropped (its entry acked), counted, and the lifecycle is in overflow: logged once, and
// the gap marker (dlvclient.GapHeader, the count of dropped copies) is published as soon as the
// durable has room again, looked at on the lifecycle's next copy and by a timer, before any later
// frame. A lifecycle whose durable does not exist (not provisioned yet, or never: the benchmark's
// members) is not gated; it is looked up again after absentRecheck.
//
// The info is read on first sight of a lifecycle, again once the frames published since the last
// one reach half the room it showed (so an agent that keeps up costs one info per about half the
// cap of copies), and before a copy is dropped; always after every publish in flight has been
// stored (PublishAsyncComplete), so the info counts every frame published before it.
const (
	// gateTick is how often the timer looks at lifecycles in overflow for room for their marker.
	gateTick = 2 * time.Second
	// overflowRecheck is the least time between two infos of a lifecycle in overflow on its copies.
	overflowRecheck = 250 * time.Millisecond
	// absentRecheck is how long a lifecycle found without a durable stays ungated before the
	// next look.
	absentRecheck = 10 * time.Second
	// lagMargin is added to a durable's info count for stored frames the broker has not counted
	// yet (see refresh).
	lagMargin = 64
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
	checked bool      // an info was read
	durable bool      // the durable existed at the last info (gated)
	base    uint64    // its unacked frames at the last info
	room    uint64    // limit - base at the last info
	since   uint64    // frames (and markers) published since
	infoAt  time.Time // when the last info was read
	seen    time.Time // the last copy
	dropped uint64    // copies dropped since the overflow began; > 0 is overflow
	first   uint64    // INBOX sequence of the first dropped copy: the marker's dedup id
}

// gate is the reader's gate on every lifecycle's DLV subject.
type gate struct {
	js     jetstream.JetStream
	n      space.Names
	cap    uint64
	mayAct func() bool
	log    *slog.Logger
	met    *Metrics
	mu     sync.Mutex
	lanes  map[plane3.Lifecycle]*lane
	dlv    jetstream.Stream // DLV_<t>, opened on first use
}

func newGate(js jetstream.JetStream, n space.Names, mayAct func() bool, log *slog.Logger, met *Metrics) *gate {
	return &gate{js: js, n: n, cap: provision.MaxMsgsPerSubject, mayAct: mayAct, log: log, met: met, lanes: map[plane3.Lifecycle]*lane{}}
}

// limit is the most unacked frames a copy or a marker may leave in the durable: the last slot
// stays free, a margin the exact count does not need.
func (g *gate) limit() uint64 { return g.cap - 1 }

// admit decides whether the copy m of lifecycle lc may be published: true counts it as published.
// False means it was dropped: the caller acks its entry without a copy.
func (g *gate) admit(ctx context.Context, lc plane3.Lifecycle, m jetstream.Msg) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
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
		l.durable && l.dropped == 0 && l.since >= max(l.room/2, 1):
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
			l.dropped, l.first = 1, 0
			if md, err := m.Metadata(); err == nil {
				l.first = md.Sequence.Stream
			}
			g.met.dropped.Inc()
			g.met.overflowing.Inc()
			g.log.Warn("dropping copies: the lifecycle's durable holds as many unacked frames as DLV keeps; a gap marker will follow",
				"lifecycle", lc.Principal()+"."+lc.UID, "cap", g.cap, "unacked", l.base+l.since)
			return false
		}
	}
	l.since++
	return true
}

// refresh reads lc's durable info into l, after waiting for every publish in flight, so the
// info counts each frame already published. A failed read (a broker error, or a signerd older than
// this gate whose delivery credential may not read DLV consumer info) leaves the lifecycle
// ungated until absentRecheck, unless it is in overflow (its marker waits for a read that works):
// the gate never holds the reader on a broker error, and never publishes past a pending marker.
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
		return
	}
	if err != nil {
		g.log.Warn("gate: the durable's info failed; its copies are not gated until the next look",
			"lifecycle", lc.Principal()+"."+lc.UID, "err", err)
		if l.dropped == 0 {
			l.checked, l.durable = true, false // looked at again after absentRecheck
		}
		return
	}
	ci := c.CachedInfo()
	l.checked, l.durable = true, true
	// The broker counts a consumer's pending messages as its stream signals them, on a goroutine
	// of its own (nats-server signalConsumersLoop), so NumPending can trail frames already stored:
	// lagMargin stands for them. The subject's stored count, exact (the store's own), bounds the
	// unacked frames too and is the tighter bound for a lifecycle that stopped acking before its
	// subject filled.
	unacked := ci.NumPending + uint64(ci.NumAckPending) + lagMargin
	if stored, ok := g.stored(ctx, lc); ok {
		unacked = min(unacked, stored)
	}
	l.base, l.since = unacked, 0
	l.room = 0
	if l.base < g.limit() {
		l.room = g.limit() - l.base
	}
}

// stored is how many messages DLV holds on lc's subject (stream info by subject).
func (g *gate) stored(ctx context.Context, lc plane3.Lifecycle) (uint64, bool) {
	subj, err := g.n.Dlv(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return 0, false
	}
	if g.dlv == nil {
		if g.dlv, err = g.js.Stream(ctx, g.n.DLVStream()); err != nil {
			return 0, false
		}
	}
	info, err := g.dlv.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0, false
	}
	return info.State.Subjects[subj], true
}

// mark publishes l's gap marker once the durable has room again (room for a frame: the
// lifecycle acked at least one since its overflow began), and reports whether l left overflow. The marker's dedup id names the first dropped entry, so a publish retried within
// the dedup window is stored once.
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
	if _, err := g.js.PublishMsg(ctx, out); err != nil {
		g.log.Warn("gap marker not stored; retrying", "lifecycle", lc.Principal()+"."+lc.UID, "missing", l.dropped, "err", err)
		return false
	}
	g.log.Warn("published a gap marker: copies were dropped before it",
		"lifecycle", lc.Principal()+"."+lc.UID, "missing", l.dropped)
	g.met.markers.Inc()
	g.met.overflowing.Dec()
	l.dropped, l.first = 0, 0
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
