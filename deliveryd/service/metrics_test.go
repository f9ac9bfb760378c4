package service_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestMetricsListen: with metrics_listen set deliveryd serves /metrics with the reader's gate
// instruments (zero on a quiet space) and nothing else on that listener; Close stops it.
func TestMetricsListen(t *testing.T) {
	e := plane3test.New(t)
	var logs logBuffer
	cfg := servicetest.Config(t, e, "deliveryd-metrics")
	cfg.MetricsListen = "127.0.0.1:0"
	svc := start(t, cfg, &logs)
	addr := svc.MetricsAddr()
	if addr == nil {
		t.Fatal("no metrics listener")
	}
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string, error) {
		resp, err := client.Get(fmt.Sprintf("http://%s%s", addr, path))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	code, body, err := get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("ok/GET /metrics = %d, %v", code, err)
	}
	for _, want := range []string{"cotal_delivery_copies_dropped_total 0", "cotal_delivery_members_overflowing 0",
		"cotal_delivery_gap_markers_total 0", "cotal_delivery_copies_unmarked_total 0", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Fatalf("ok/metrics lack %q", want)
		}
	}
	if code, _, err := get("/"); err != nil || code != http.StatusNotFound {
		t.Fatalf("fail/GET / = %d, %v; want 404", code, err)
	}
	if err := svc.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get("/metrics"); err == nil {
		t.Fatal("fail/the listener outlived Close")
	}
}
