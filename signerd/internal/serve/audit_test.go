package serve_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
)

// TestBrokenAuditStopsServing (finding 5): when the audit disk fills, the signer refuses the call,
// turns health NOT_SERVING on every service name and Run returns an error naming the cause, so
// the process exits non-zero and its supervisor sees it. A restart on the same files serves again.
func TestBrokenAuditStopsServing(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	var full atomic.Bool
	write := func(file *os.File, b []byte) (int, error) {
		if full.Load() {
			return 0, syscall.ENOSPC
		}
		return file.Write(b)
	}
	s, err := serve.Start(f.config(t, "127.0.0.1:0", f.keyDir, ""), nil, serve.Options{AuditIO: audit.IO{Write: write}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	r := &running{Signer: s, exited: make(chan struct{})}
	go func() {
		r.err = s.Run(context.Background())
		close(r.exited)
	}()
	t.Cleanup(func() {
		s.Stop()
		_ = r.wait()
	})
	conn := dial(t, s.Addr().String(), f.client)
	getSpace(t, conn)

	// Watch every name health serves; each first reports SERVING.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	names := []string{"", signerv1.SignerService_ServiceDesc.ServiceName}
	var watches []healthpb.Health_WatchClient
	for _, name := range names {
		w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("watch %q: %v", name, err)
		}
		if resp, err := w.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q before the disk filled: %v %v, want SERVING", name, resp.GetStatus(), err)
		}
		watches = append(watches, w)
	}

	full.Store(true)
	_, err = signerv1.NewSignerServiceClient(conn).GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("GetSpace with the audit disk full: %v, want Unavailable", err)
	}
	for i, w := range watches {
		for {
			resp, err := w.Recv()
			if err != nil {
				t.Fatalf("health %q never reported NOT_SERVING: %v", names[i], err)
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
				break
			}
		}
	}
	cancel() // let the graceful stop finish without waiting for the watches

	err = r.wait()
	if err == nil {
		t.Fatal("Run returned nil after the audit log broke")
	}
	if !errors.Is(err, audit.ErrBroken) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), f.auditPath) {
		t.Fatalf("Run = %v, want the audit failure naming %s and ENOSPC", err, f.auditPath)
	}

	// Space freed: a restart on the same files verifies the chain and serves.
	s2 := run(t, f.config(t, "127.0.0.1:0", f.keyDir, ""))
	getSpace(t, dial(t, s2.Addr().String(), f.client))
}
