package service_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

const (
	uidAlice = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uidBob   = "uidbbbbbbbbbbbbbbbbbbbbbbb"
	uidCarol = "uidcccccccccccccccccccccccc"
)

// logBuffer collects the service's log lines.
type logBuffer struct{ testkit.SyncBuffer }

func (l *logBuffer) has(s string) bool { return strings.Contains(l.String(), s) }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// start runs deliveryd in process until the test ends.
func start(t *testing.T, cfg *config.Config, logs *logBuffer) *service.Service {
	t.Helper()
	svc, err := service.Start(plane3test.Ctx(t), service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv})
	if err != nil {
		t.Fatalf("Start: %v\n%s", err, logs)
	}
	closeAtEnd(t, svc)
	return svc
}

// noEnv is an empty environment: no COTAL_DELIVERY_* override from the machine running the tests.
func noEnv(string) string { return "" }

// closeAtEnd closes svc when the test ends (its outcome is the test's own business).
func closeAtEnd(t *testing.T, svc *service.Service) {
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
}

// eventually polls f until it returns nil, failing the test at the deadline.
func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopped waits for svc to stop by itself and returns why.
func stopped(t *testing.T, svc *service.Service, within time.Duration, logs *logBuffer) error {
	t.Helper()
	select {
	case <-svc.Done():
		return svc.Err()
	case <-time.After(within):
		t.Fatalf("service still running after %v; its log:\n%s", within, logs.String())
	}
	return nil
}

func ctx(t *testing.T) context.Context { return plane3test.Ctx(t) }
