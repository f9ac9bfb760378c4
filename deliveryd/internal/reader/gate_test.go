package reader

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestGapMarkerRetried: a marker publish retried for the same overflow (its answer lost, say)
// is stored once: its Nats-Msg-Id names the lifecycle and the first dropped entry. A later
// overflow (another first entry) gets its own marker.
func TestGapMarkerRetried(t *testing.T) {
	e := plane3test.New(t)
	const uid = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	e.AddLifecycle(t, e.Provisioner(t), "a1", uid, []string{"general"})
	js := plane3test.JS(t, e.Delivery(t))
	met, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(js, e.N, plane3.Always, slog.New(slog.DiscardHandler), met)
	lc := plane3.Lifecycle{Owner: plane3test.Owner, Actor: "a1", UID: uid}
	for i, first := range []uint64{42, 42, 43} {
		l := &lane{checked: true, durable: true, dropped: 5, first: first}
		if !g.mark(plane3test.Ctx(t), lc, l) || l.dropped != 0 {
			t.Fatalf("mark %d: not published (%+v)", i, l)
		}
	}
	subj, _ := e.N.Dlv(plane3test.Owner, "a1", uid)
	s, err := js.Stream(plane3test.Ctx(t), e.N.DLVStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(plane3test.Ctx(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subj]; n != 2 {
		t.Fatalf("DLV holds %d markers, want 2 (42 once, 43 once)", n)
	}
	name, _ := e.N.DlvConsumer(plane3test.Owner, "a1", uid) // read as the agent: delivery reads no DLV body
	c, err := plane3test.JS(t, e.Agent(t, "a1", uid)).Consumer(plane3test.Ctx(t), e.N.DLVStream(), name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := dlvclient.DecodeGap(m.Headers().Get(dlvclient.GapHeader), m.Data()); err != nil || n != 5 || m.Headers().Get(dlvclient.FrameHeader) != "1" {
		t.Fatalf("marker: count %d, frame header %q, err %v", n, m.Headers().Get(dlvclient.FrameHeader), err)
	}
}
