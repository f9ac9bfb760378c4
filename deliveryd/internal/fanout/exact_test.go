package fanout_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// gapSplit splits a member's events at its one gap marker: the frames before, the count, the
// frames after. It fails the test on no marker or two.
func gapSplit(t *testing.T, got []string) (before []string, missing int, after []string) {
	t.Helper()
	at := -1
	for i, s := range got {
		if strings.HasPrefix(s, "gap ") {
			if at >= 0 {
				t.Fatalf("two markers: %v and %v", got[at], s)
			}
			at = i
		}
	}
	if at < 0 {
		t.Fatalf("no gap marker in %d events", len(got))
	}
	fmt.Sscanf(got[at], "gap %d", &missing)
	return got[:at], missing, got[at+1:]
}

// TestGateExact is the case issue 27's Known gaps named: a member that acked its whole window
// (its subject full of acked frames), then stopped, and a burst at once. The gate counts exactly:
// the member gets the first 999 copies of the burst (the cap minus the free slot; the old bound,
// NumPending + NumAckPending + 64, stopped short of it), then one marker with the rest; the counts
// add up to the burst and to the metric. Then a second reader (the first closed, as after a
// failover) finds the member holding 999 unacked frames it did not publish: it counts them (the
// subject's last sequence above the floor, the durable delivered nothing), so a second burst is
// all dropped into a second marker, and nothing is lost.
func TestGateExact(t *testing.T) {
	e := plane3test.New(t)
	dc := e.Delivery(t)
	djs, pjs := plane3test.JS(t, dc), e.Provisioner(t)
	e.AddLifecycle(t, pjs, "a1", uid1, []string{"general"})
	e.Join(t, djs, "general", "a1", uid1, 0, 1)
	reg, logs := prometheus.NewRegistry(), &logLines{}
	stop := startLoopsWith(t, dc, fanout.Config{Names: e.N}, reader.Config{Names: e.N, Registerer: reg, Logger: slog.New(logs)})
	ajs := plane3test.JS(t, e.Agent(t, "a0", uid0))

	// The window: 1000 posts the live member acks, so its subject holds 1000 acked frames.
	m := runMember(t, e, "a1", uid1)
	postBurst(t, e, ajs, djs, "w", 1000)
	drained(t, e, djs)
	durableSettled(t, e, djs, "a1", uid1)
	if got := m.got(); strings.Join(got, ",") != strings.Join(ids("w", 0, 1000), ",") {
		t.Fatalf("ok/window: %d events", len(got))
	}
	m.stop()

	const burst = 1500
	postBurst(t, e, ajs, djs, "p", burst)
	drained(t, e, djs)
	dropped := metric(t, reg, "cotal_delivery_copies_dropped_total")
	if dropped != burst-999 {
		t.Fatalf("ok/exact: dropped %v of %d, want %d (999 kept)", dropped, burst, burst-999)
	}

	// The member back: 999 frames in order, the marker with the rest.
	m2 := runMember(t, e, "a1", uid1)
	testkit.Eventually(t, 30*time.Second, func() error {
		if metric(t, reg, "cotal_delivery_gap_markers_total") != 1 {
			return fmt.Errorf("no marker yet")
		}
		return nil
	})
	durableSettled(t, e, djs, "a1", uid1)
	before, missing, after := gapSplit(t, m2.got())
	if strings.Join(before, ",") != strings.Join(ids("p", 0, 999), ",") || len(after) != 0 {
		t.Fatalf("ok/order: %d before the gap, %d after", len(before), len(after))
	}
	if len(before)+missing != burst || float64(missing) != dropped {
		t.Fatalf("ok/counts: delivered %d + gap %d != %d, or metric %v", len(before), missing, burst, dropped)
	}
	m2.stop()

	// Failover: the member stopped again with 500 unacked frames stored by the first reader,
	// then a second reader and 700 more posts: 499 fit (500 + 499 = 999), 201 are dropped.
	postBurst(t, e, ajs, djs, "f", 500)
	drained(t, e, djs)
	stop()
	reg2 := prometheus.NewRegistry()
	startLoopsWith(t, dc, fanout.Config{Names: e.N}, reader.Config{Names: e.N, Registerer: reg2, Logger: slog.New(logs)})
	postBurst(t, e, ajs, djs, "g", 700)
	drained(t, e, djs)
	if d := metric(t, reg2, "cotal_delivery_copies_dropped_total"); d != 201 {
		t.Fatalf("ok/failover: the second reader dropped %v, want 201", d)
	}
	m3 := runMember(t, e, "a1", uid1)
	testkit.Eventually(t, 30*time.Second, func() error {
		if metric(t, reg2, "cotal_delivery_gap_markers_total") != 1 {
			return fmt.Errorf("no marker yet")
		}
		return nil
	})
	durableSettled(t, e, djs, "a1", uid1)
	before, missing, after = gapSplit(t, m3.got())
	want := append(ids("f", 0, 500), ids("g", 0, 499)...)
	if strings.Join(before, ",") != strings.Join(want, ",") || len(after) != 0 || missing != 201 {
		t.Fatalf("ok/failover counts: %d before the gap (want 999 in order), gap %d (want 201), %d after", len(before), missing, len(after))
	}
	t.Logf("exact: 999 + gap %d of %d; failover: %d + gap %d of 1200", burst-999, burst, len(before), missing)
}
