package api

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// panickyBackend panics in Status and Terminal; the rest is the fake's.
type panickyBackend struct{ *fakeBackend }

func (panickyBackend) Status(context.Context) (*managerv1.StatusResponse, error) {
	panic("status exploded")
}

func (panickyBackend) Terminal(string) (Terminal, error) {
	var p *struct{ n int }
	_ = p.n // a nil dereference
	return nil, nil
}

// TestHandlerPanic: a Backend call that panics ends that call as INTERNAL with the fixed message
// (the panic's text goes to the log), and ManagerService goes on serving the next call, unary
// and streaming alike.
func TestHandlerPanic(t *testing.T) {
	var logs testkit.SyncBuffer
	b := panickyBackend{newFakeBackend()}
	c := startBufconn(t, b, Options{AllowUIDs: []uint32{myUID()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := ctxT(t)

	t.Run("fail/unary panic is INTERNAL", func(t *testing.T) {
		_, err := c.Status(ctx, &managerv1.StatusRequest{})
		if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != internalMessage {
			t.Fatalf("Status: %v", err)
		}
		if !strings.Contains(logs.String(), `rejection="status exploded"`) || !strings.Contains(logs.String(), "/cotal.manager.v1.ManagerService/Status") {
			t.Fatalf("log: %s", logs.String())
		}
	})
	t.Run("fail/stream panic is INTERNAL", func(t *testing.T) {
		s, err := c.Attach(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "a"}}}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != internalMessage {
			t.Fatalf("Attach: %v", err)
		}
		if !strings.Contains(logs.String(), "nil pointer dereference") {
			t.Fatalf("log: %s", logs.String())
		}
	})
	t.Run("ok/still serving", func(t *testing.T) {
		before := b.calls.Load()
		list, err := c.List(ctx, &managerv1.ListRequest{})
		if err != nil || len(list.GetAgents()) != 0 || b.calls.Load() != before+1 {
			t.Fatalf("List after the panics: %v %v (calls %d -> %d)", list, err, before, b.calls.Load())
		}
	})
}
