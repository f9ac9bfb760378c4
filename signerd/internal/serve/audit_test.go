package serve_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestBrokenAuditStopsServing (finding 5): when the audit disk fills mid-write, the signer refuses
// the call, turns health NOT_SERVING on every service name and Run returns an error naming the
// cause, so the process exits non-zero and its supervisor sees it. The restart on the same files
// cuts the torn line the write left, saves it aside and serves again.
func TestBrokenAuditStopsServing(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	var full atomic.Bool
	write := func(file *os.File, b []byte) (int, error) {
		if full.Load() {
			n, _ := file.Write(b[:len(b)/2]) // the disk fills halfway through the line
			return n, syscall.ENOSPC
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

	// Space freed: a restart on the same files cuts the torn line and serves.
	s2 := run(t, f.config(t, "127.0.0.1:0", f.keyDir, ""))
	getSpace(t, dial(t, s2.Addr().String(), f.client))
	if torn, err := filepath.Glob(f.auditPath + ".torn.*"); err != nil || len(torn) != 1 {
		t.Fatalf("torn line saved to %v (%v), want one file", torn, err)
	}
	if _, err := audit.VerifyFiles([]string{f.auditPath}, audit.FilesOptions{}); err != nil {
		t.Fatalf("audit file after restart: %v", err)
	}
}

// TestSIGHUPRotatesAudit (issue 7 deliverable 5): SIGHUP, which reloads the policy, also starts a
// new audit file; the rotated file and the new one verify as one chain.
func TestSIGHUPRotatesAudit(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	s := run(t, f.config(t, "127.0.0.1:0", f.keyDir, "policy_reload_interval: 1h\n"))
	conn := dial(t, s.Addr().String(), f.client)
	getSpace(t, conn)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	rotated := audit.RotatedName(f.auditPath, 1)
	testkit.Eventually(t, 5*time.Second, func() error {
		_, err := os.Stat(rotated)
		return err
	})
	getSpace(t, conn)
	sum, err := audit.VerifyFiles([]string{rotated, f.auditPath}, audit.FilesOptions{})
	if err != nil {
		t.Fatalf("VerifyFiles: %v", err)
	}
	// GetSpace, the continuation line, GetSpace.
	if sum.Lines != 3 || sum.Chains[0].Seq != 3 {
		t.Fatalf("summary %+v, want 3 lines on one chain across the two files", sum)
	}
}

// TestAuditMaxBytesConfig: audit.max_bytes defaults to 64 MiB and refuses less than 64 KiB.
func TestAuditMaxBytesConfig(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := fixture{cert: "/c.pem", key: "/k.pem", clientCA: "/ca.pem", publicDir: "/pub", policy: "/p.yaml", auditPath: "/a/log"}
	for _, tc := range []struct {
		name string
		edit string // replaces "replica: serve-test}"
		want int64  // 0: refused
	}{
		{"ok/default-64MiB", "replica: serve-test}", 64 << 20},
		{"ok/set", "replica: serve-test, max_bytes: 1048576}", 1 << 20},
		{"fail/below-64KiB", "replica: serve-test, max_bytes: 65535}", 0},
		{"fail/negative", "replica: serve-test, max_bytes: -1}", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := strings.Replace(f.yaml("127.0.0.1:0", "/keys", ""), "replica: serve-test}", tc.edit, 1)
			cfg, err := serve.ParseConfig([]byte(y))
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), "audit.max_bytes") {
					t.Fatalf("ParseConfig = %v, want an error naming audit.max_bytes", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Audit.MaxBytes != tc.want {
				t.Fatalf("audit.max_bytes = %d, want %d", cfg.Audit.MaxBytes, tc.want)
			}
		})
	}
}

// TestAuditKeepsSpaceNames (finding 9): over mTLS, a request for space "heyJude" is audited with
// that space and the caller's identity, not REDACTED.
func TestAuditKeepsSpaceNames(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	s := run(t, f.config(t, "127.0.0.1:0", f.keyDir, ""))
	conn := dial(t, s.Addr().String(), f.client)
	_, err := signerv1.NewSignerServiceClient(conn).GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "heyJude"})
	if status.Code(err) == codes.OK {
		t.Fatal("GetSpace for a space alpha's managerd may not read was granted")
	}
	data, err := os.ReadFile(f.auditPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	last := lines[len(lines)-1]
	for _, want := range []string{`"caller":"` + signerdtest.ID("managerd", "alpha") + `"`, `"space":"heyJude"`, `"decision":"denied"`} {
		if !strings.Contains(last, want) {
			t.Fatalf("audit line %s lacks %s", last, want)
		}
	}
}

// TestAuditRotatesBySize: audit.max_bytes reaches the log; granted calls past it start a new file
// that continues the chain.
func TestAuditRotatesBySize(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	cfg := f.config(t, "127.0.0.1:0", f.keyDir, "")
	cfg.Audit.MaxBytes = audit.MinMaxBytes
	s := run(t, cfg)
	conn := dial(t, s.Addr().String(), f.client)
	var rotated []string
	for calls := 0; len(rotated) == 0; calls++ {
		if calls == 1000 {
			t.Fatalf("no rotation after %d calls at %d bytes a file", calls, audit.MinMaxBytes)
		}
		getSpace(t, conn)
		var err error
		if rotated, err = audit.Rotated(f.auditPath); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := audit.VerifyFiles(append(rotated, f.auditPath), audit.FilesOptions{}); err != nil {
		t.Fatalf("VerifyFiles: %v", err)
	}
	if fi, err := os.Stat(rotated[0]); err != nil || fi.Size() > audit.MinMaxBytes || fi.Mode().Perm() != 0o600 {
		t.Fatalf("rotated file %v (%v): want at most %d bytes, mode 0600", fi, err, audit.MinMaxBytes)
	}
}
