package api

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/pkg/daemon"
)

// recovering turns a panic in a handler into INTERNAL, so that one call that panics (a bug, or a
// host's code the Backend did not guard) ends that call, not the process: grpc-go does not
// recover handler panics. The panic's text (daemon.RejectionText) goes to the log only, as any
// internal error's cause does (errors.go).
type recovering struct{ log *slog.Logger }

func (r recovering) recovered(method string, v any, err *error) {
	r.log.Error("managerd api: a call panicked; ManagerService goes on", "method", method, "rejection", daemon.RejectionText(v))
	*err = status.Error(codes.Internal, internalMessage)
}

func (r recovering) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp = nil
			r.recovered(info.FullMethod, v, &err)
		}
	}()
	return handler(ctx, req)
}

func (r recovering) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			r.recovered(info.FullMethod, v, &err)
		}
	}()
	return handler(srv, ss)
}
