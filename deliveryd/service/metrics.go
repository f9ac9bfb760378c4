package service

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is deliveryd's metrics listener: a plain-HTTP server of /metrics only, on
// metrics_listen, serving its own registry (the reader's gate, the Go runtime and the process).
type metrics struct {
	lis net.Listener
	srv *http.Server
}

// registerer is where the reader registers its gate's metrics: opts.Registerer for a host, or a
// registry served on metrics_listen (both when both are set: the host's gets them, the listener
// serves them too), or nil.
func (s *Service) registerer(opts RuntimeOptions) (prometheus.Registerer, error) {
	if s.cfg.MetricsListen == "" {
		return opts.Registerer, nil
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", s.cfg.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.metrics = &metrics{lis: lis, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := s.metrics.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("metrics listener stopped", "err", err)
		}
	}()
	if opts.Registerer == nil {
		return reg, nil
	}
	return teeRegisterer{reg, opts.Registerer}, nil
}

// MetricsAddr is the metrics listener's address, or nil.
func (s *Service) MetricsAddr() net.Addr {
	if s.metrics == nil {
		return nil
	}
	return s.metrics.lis.Addr()
}

func (s *Service) closeMetrics() {
	if s.metrics != nil {
		_ = s.metrics.srv.Close()
	}
}

// teeRegisterer registers with both.
type teeRegisterer [2]prometheus.Registerer

func (t teeRegisterer) Register(c prometheus.Collector) error {
	if err := t[0].Register(c); err != nil {
		return err
	}
	return t[1].Register(c)
}

func (t teeRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t teeRegisterer) Unregister(c prometheus.Collector) bool {
	a, b := t[0].Unregister(c), t[1].Unregister(c)
	return a && b
}
