package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// internalMessage is all a caller learns of an error that is not a Refusal: the cause may carry
// a path, a subject or worse, so it goes to the log only.
const internalMessage = "internal error"

// ReasonName is the ErrorInfo reason for r: its enum name without "REASON_".
func ReasonName(r managerv1.Reason) string {
	return strings.TrimPrefix(r.String(), "REASON_")
}

// status converts a refusal into a gRPC status with an ErrorInfo detail. A refusal with no
// reason, or with the OK code, is a programming error and is sent as INTERNAL.
func (r *Refusal) status() *status.Status {
	if r.Reason == managerv1.Reason_REASON_UNSPECIFIED || r.Code == codes.OK {
		return status.New(codes.Internal, internalMessage)
	}
	if _, ok := managerv1.Reason_name[int32(r.Reason)]; !ok {
		return status.New(codes.Internal, internalMessage)
	}
	st := status.New(r.Code, r.Message)
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonName(r.Reason), Domain: ErrorDomain})
	if err != nil {
		return st
	}
	return d
}

// publicError converts what a Backend (or this package) returned into what the caller may see:
// a *Refusal keeps its code, reason and message; the caller's own cancellation or deadline is
// reported as such; anything else is INTERNAL with a fixed message, and is logged.
func publicError(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	var nr *notReading
	if errors.As(err, &nr) {
		return status.Error(codes.DeadlineExceeded, nr.Error())
	}
	var r *Refusal
	if errors.As(err, &r) {
		st := r.status()
		if st.Code() == codes.Internal {
			log.Error("managerd api: refusal without a reason", "method", method, "err", err)
		}
		return st.Err()
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return status.FromContextError(ctx.Err()).Err()
	}
	log.Error("managerd api: internal error", "method", method, "err", err)
	return status.Error(codes.Internal, internalMessage)
}

// notReading is a terminal write that the write timeout ended before the call's own deadline:
// the agent is not taking its input. It is DEADLINE_EXCEEDED with no ErrorInfo, as a call's own
// deadline is (it is no refusal of the request: the same input may succeed once the agent reads).
type notReading struct{ written int }

func (e *notReading) Error() string {
	return fmt.Sprintf("the agent is not reading its terminal: it took %d bytes of this input before the write timeout", e.written)
}

// invalid is an INVALID_ARGUMENT refusal with reason INVALID_ARGUMENT.
func invalid(format string, args ...any) *Refusal {
	return Refuse(codes.InvalidArgument, managerv1.Reason_REASON_INVALID_ARGUMENT, format, args...)
}
