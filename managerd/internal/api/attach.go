package api

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// maxDataFrame bounds one output data frame; a larger chunk from the terminal is split, so a
// client's default 4 MiB receive limit is never reached.
const maxDataFrame = 64 << 10

// Attach serves one terminal session.
//
// The session cap is taken first (RESOURCE_EXHAUSTED, reason ATTACH_LIMIT, when full). The first
// frame must be open (else INVALID_ARGUMENT); the server then sends one snapshot frame (possibly
// empty) and every later output byte in order in data frames. Client data frames are written to
// the terminal, resize frames (rows and cols 1..1000) resize it; another open, an empty frame or
// a bad size ends the stream with INVALID_ARGUMENT. A client that half-closes keeps receiving
// output.
//
// The stream ends:
//   - with an exited frame and OK once the agent has exited and its output has ended (or
//     ExitDrain has passed since the exit);
//   - with DATA_LOSS and no ErrorInfo when this subscriber fell too far behind and the terminal
//     dropped it: the output is no longer byte-exact, so the stream stops rather than skip bytes.
//     It is not a refusal of the request (no reason fits, and none is invented); the client may
//     attach again and gets a fresh snapshot;
//   - with DEADLINE_EXCEEDED and no ErrorInfo when the agent did not take a data frame within
//     WriteTimeout (it is not reading its terminal): keystrokes are never dropped silently, and a
//     stuck write never outlives the session;
//   - with the client's cancellation when it leaves; the subscription is released either way.
func (s *service) Attach(stream managerv1.ManagerService_AttachServer) error {
	ctx := stream.Context()
	select {
	case s.attach <- struct{}{}:
		defer func() { <-s.attach }()
	default:
		return Refuse(codes.ResourceExhausted, managerv1.Reason_REASON_ATTACH_LIMIT,
			"%d attach sessions are open", cap(s.attach)).status().Err()
	}
	fail := func(err error) error { return publicError(ctx, s.log, "Attach", err) }
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return fail(invalid("the stream ended before an open frame"))
	}
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return fail(invalid("the first frame must be open"))
	}
	if err := checkName(open.GetName()); err != nil {
		return fail(err)
	}
	term, err := s.b.Terminal(open.GetName())
	if err != nil {
		return fail(err)
	}
	snapshot, out, lagged, detach, err := term.Attach()
	if err != nil {
		return fail(err)
	}
	defer detach()
	if snapshot == nil {
		snapshot = []byte{}
	}
	if err := stream.Send(&managerv1.AttachResponse{Frame: &managerv1.AttachResponse_Snapshot{Snapshot: snapshot}}); err != nil {
		return err
	}
	in := make(chan error, 1)
	go func() { in <- s.readClient(stream, term) }()

	exited := term.Exited()
	var drained <-chan time.Time
	exitSeen := false
	sendExited := func() error {
		return stream.Send(&managerv1.AttachResponse{Frame: &managerv1.AttachResponse_Exited{Exited: &managerv1.Exited{ExitCode: term.ExitCode()}}})
	}
	for {
		select {
		case p, ok := <-out:
			if !ok {
				if lagged() {
					return status.Error(codes.DataLoss, "attach: this session fell behind the agent's output and was dropped; attach again for a fresh snapshot")
				}
				out = nil
				if exitSeen {
					return sendExited()
				}
				continue
			}
			for len(p) > 0 {
				n := min(len(p), maxDataFrame)
				if err := stream.Send(&managerv1.AttachResponse{Frame: &managerv1.AttachResponse_Data{Data: p[:n]}}); err != nil {
					return err
				}
				p = p[n:]
			}
		case <-exited:
			exited, exitSeen = nil, true
			if out == nil {
				return sendExited()
			}
			t := time.NewTimer(s.drain)
			defer t.Stop()
			drained = t.C
		case <-drained:
			return sendExited()
		case err := <-in:
			if err != nil {
				return err
			}
			in = nil // half-closed: output continues
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// readClient applies the client's frames to the terminal until the client half-closes (nil) or
// a frame is refused or the stream fails (that error, as the caller may see it).
func (s *service) readClient(stream managerv1.ManagerService_AttachServer, term Terminal) error {
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch f := req.GetFrame().(type) {
		case *managerv1.AttachRequest_Open:
			return publicError(ctx, s.log, "Attach", invalid("open may only be the first frame"))
		case *managerv1.AttachRequest_Data:
			if len(f.Data) > MaxInputBytes {
				return publicError(ctx, s.log, "Attach", invalid("data frame is %d bytes, more than %d", len(f.Data), MaxInputBytes))
			}
			wctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
			n, err := term.Write(wctx, f.Data)
			cancel()
			if err != nil {
				err = writeError(ctx, term, err, n)
				var r *Refusal
				if errors.As(err, &r) {
					continue // the agent exited: the stream ends with the exited frame
				}
				return publicError(ctx, s.log, "Attach", err)
			}
		case *managerv1.AttachRequest_Resize:
			rows, cols := f.Resize.GetRows(), f.Resize.GetCols()
			if rows < 1 || rows > MaxTerminalSize || cols < 1 || cols > MaxTerminalSize {
				return publicError(ctx, s.log, "Attach", invalid("resize %dx%d: rows and cols must be 1..%d", rows, cols, MaxTerminalSize))
			}
			if err := term.Resize(uint16(rows), uint16(cols)); err != nil {
				return publicError(ctx, s.log, "Attach", err)
			}
		default:
			return publicError(ctx, s.log, "Attach", invalid("empty frame"))
		}
	}
}
