package managerclient

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// statusOnly answers Status with a fixed space; every other RPC is Unimplemented.
type statusOnly struct {
	managerv1.UnimplementedManagerServiceServer
}

func (statusOnly) Status(context.Context, *managerv1.StatusRequest) (*managerv1.StatusResponse, error) {
	return &managerv1.StatusResponse{Space: "demo", Capacity: 4}, nil
}

func TestDial(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "manager.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	managerv1.RegisterManagerServiceServer(srv, statusOnly{})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	t.Run("ok/a call over the socket", func(t *testing.T) {
		c, closer, err := Dial(context.Background(), sock)
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		r, err := c.Status(context.Background(), &managerv1.StatusRequest{})
		if err != nil || r.Space != "demo" || r.Capacity != 4 {
			t.Fatalf("Status = %v, %v", r, err)
		}
		if _, err := c.List(context.Background(), &managerv1.ListRequest{}); status.Code(err) != codes.Unimplemented {
			t.Fatalf("List: %v, want Unimplemented from the server", err)
		}
	})
	t.Run("fail/not a socket", func(t *testing.T) {
		file := filepath.Join(dir, "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Dial(context.Background(), file); err == nil || !strings.Contains(err.Error(), "is not a socket") {
			t.Fatalf("Dial(file) = %v, want 'is not a socket'", err)
		}
	})
	t.Run("fail/missing", func(t *testing.T) {
		if _, _, err := Dial(context.Background(), filepath.Join(dir, "none.sock")); err == nil || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Dial(missing) = %v, want a not-exist error", err)
		}
	})
	t.Run("fail/cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, _, err := Dial(ctx, sock); !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial(cancelled) = %v", err)
		}
	})
}
