package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are signerd's Prometheus instruments. They carry no caller identity, space or subject
// labels: cardinality stays bounded and the metrics endpoint reveals nothing about who asked.
type Metrics struct {
	requests    *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	auditBatch  prometheus.Histogram
}

// NewMetrics registers signerd's instruments with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "signerd", Name: "requests_total",
			Help: "SignerService requests by RPC, decision (granted, denied, error) and reason code.",
		}, []string{"rpc", "decision", "reason"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "signerd", Name: "rate_limited_total",
			Help: "Requests refused past a rate limit before being read, by RPC and reason " +
				"(rate-limited: the caller's own rate; global-rate-limited: the global cap). They are " +
				"audited in aggregate, one line per caller and reason per interval, and also counted in requests_total.",
		}, []string{"rpc", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "signerd", Name: "request_duration_seconds",
			Help:    "SignerService request latency, including the audit fsync.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"rpc"}),
		auditBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "signerd", Name: "audit_batch_lines",
			Help:    "Audit lines made durable per fsync (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.rateLimited, m.latency, m.auditBatch} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveAuditBatch records one audit batch size; pass it as audit.Config.OnBatch.
func (m *Metrics) ObserveAuditBatch(n int) {
	if m != nil {
		m.auditBatch.Observe(float64(n))
	}
}

func (m *Metrics) observe(rpc, decision, reason string, seconds float64) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(rpc, decision, reason).Inc()
	m.latency.WithLabelValues(rpc).Observe(seconds)
}

func (m *Metrics) observeRateLimited(rpc, reason string) {
	if m == nil {
		return
	}
	m.rateLimited.WithLabelValues(rpc, reason).Inc()
}
