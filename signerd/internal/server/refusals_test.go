package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// recordingAuditor keeps what it is asked to append.
type recordingAuditor struct{ recs []audit.Record }

func (a *recordingAuditor) Append(_ context.Context, r audit.Record) error {
	a.recs = append(a.recs, r)
	return nil
}

func (a *recordingAuditor) AppendWritten(ctx context.Context, r audit.Record) error {
	return a.Append(ctx, r)
}

// TestRateLimitedRefusalsCountedNotAudited: finish counts a refusal past a rate in the metrics
// and the tally and appends nothing; the flush writes one line per caller and reason.
func TestRateLimitedRefusalsCountedNotAudited(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	aud := &recordingAuditor{}
	s := &Service{audit: aud, metrics: m, log: slog.New(slog.DiscardHandler), now: time.Now, refusals: newRefusalTally()}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	refuseAs := func(key string, reason policy.Reason, rpc policy.RPC, at time.Time) {
		c := &call{start: at, rpc: rpc, caller: "-", limited: reason, limitKey: key}
		err := s.finish(context.Background(), c, refuse(codes.ResourceExhausted, policy.ReasonRateLimited, "rate limit exceeded"))
		if err == nil {
			t.Fatal("finish let a rate-limited call through")
		}
	}
	for i := range 100 {
		refuseAs("spiffe://td/a", policy.ReasonRateLimited, policy.RPCMint, t0.Add(time.Duration(i)*time.Millisecond))
	}
	refuseAs("spiffe://td/a", policy.ReasonRateLimited, policy.RPCGetSpace, t0.Add(-time.Second))
	refuseAs("sha256:00", policy.ReasonGlobalRateLimited, policy.RPCMac, t0)
	if len(aud.recs) != 0 {
		t.Fatalf("finish audited %d rate-limited refusals one by one", len(aud.recs))
	}
	if got := rateLimitedCount(t, reg, "Mint", "rate-limited"); got != 100 {
		t.Errorf("rate_limited_total{Mint,rate-limited} = %v, want 100", got)
	}
	if got := rateLimitedCount(t, reg, "Mac", "global-rate-limited"); got != 1 {
		t.Errorf("rate_limited_total{Mac,global-rate-limited} = %v, want 1", got)
	}

	s.flushRefusals(context.Background())
	want := []audit.Record{
		{Time: t0.Add(-time.Second), Caller: "spiffe://td/a", RPC: "Mint,GetSpace", Decision: audit.Denied, Reason: "rate-limited", Count: 101},
		{Time: t0, Caller: "sha256:00", RPC: "Mac", Decision: audit.Denied, Reason: "global-rate-limited", Count: 1},
	}
	if len(aud.recs) != len(want) {
		t.Fatalf("flush wrote %+v, want %+v", aud.recs, want)
	}
	for i := range want {
		if aud.recs[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, aud.recs[i], want[i])
		}
	}
	s.flushRefusals(context.Background())
	if len(aud.recs) != len(want) {
		t.Fatalf("a second flush with nothing counted wrote %+v", aud.recs[len(want):])
	}
}

// TestRefusalTallyBounded: past MaxTalliedCallers callers in one interval, the rest share one
// line, so many certificates cannot buy many lines.
func TestRefusalTallyBounded(t *testing.T) {
	rt := newRefusalTally()
	for i := range MaxTalliedCallers + 500 {
		rt.add(CertKeyPrefix+string(rune('a'+i%26))+string(rune(i)), policy.ReasonRateLimited, policy.RPCMint, time.Unix(int64(i), 0))
	}
	recs := rt.take()
	if len(recs) != MaxTalliedCallers+1 {
		t.Fatalf("%d lines, want %d", len(recs), MaxTalliedCallers+1)
	}
	var overflow uint64
	for _, r := range recs {
		if r.Caller == OverflowCaller {
			overflow = r.Count
		}
	}
	if overflow != 500 {
		t.Fatalf("overflow line counts %d, want 500", overflow)
	}
}

// rateLimitedCount reads signerd_rate_limited_total{rpc, reason} from reg.
func rateLimitedCount(t *testing.T, reg *prometheus.Registry, rpc, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "signerd_rate_limited_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["rpc"] == rpc && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
