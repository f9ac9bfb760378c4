package api

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// Bounds on what a request may carry; the Backend judges the rest (admission).
const (
	// MaxInputBytes bounds InputRequest.text and one Attach data frame.
	MaxInputBytes = 64 << 10
	// MaxTerminalSize bounds rows and columns in Spawn and Attach resize frames.
	MaxTerminalSize = 1000
	// maxNameBytes bounds a name before the Backend checks its syntax; longer is never valid.
	maxNameBytes = 256
	// maxRecvMsgBytes is the largest request message: a 64 KiB input plus its framing, or a Spawn.
	maxRecvMsgBytes = 128 << 10
	// DefaultMaxAttach is Options.MaxAttach when unset.
	DefaultMaxAttach = 64
	// DefaultExitDrain is Options.ExitDrain when unset.
	DefaultExitDrain = time.Second
	// DefaultWriteTimeout is Options.WriteTimeout when unset: long enough for any agent that
	// reads its terminal at all to take 64 KiB, short enough that a caller without a deadline
	// learns that the agent does not.
	DefaultWriteTimeout = 10 * time.Second
)

// Options configure NewServer.
type Options struct {
	// AllowUIDs are the peer uids admitted (SO_PEERCRED); every other peer is refused with
	// PERMISSION_DENIED, reason PEER_NOT_ALLOWED, before the Backend is called. Empty admits
	// nobody.
	AllowUIDs []uint32
	// Logger gets refused peers and internal errors (with their cause). Optional.
	Logger *slog.Logger
	// MaxAttach bounds the Attach sessions open at once, across all agents and peers; more are
	// refused with RESOURCE_EXHAUSTED, reason ATTACH_LIMIT. Zero means DefaultMaxAttach.
	MaxAttach int
	// ExitDrain bounds how long Attach keeps forwarding output after the agent exited, waiting
	// for the terminal's output to end, before it sends the exited frame. Zero means
	// DefaultExitDrain.
	ExitDrain time.Duration
	// WriteTimeout bounds one write to an agent's terminal (an Input, one Attach data frame) when
	// the call has no earlier deadline of its own; an agent that stopped reading its input fails
	// the write with DEADLINE_EXCEEDED then. Zero means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// InMemoryPeerUID declares the peer uid of connections that are no OS socket (bufconn,
	// net.Pipe), which have no SO_PEERCRED; without it they are refused. It is never used for a
	// Unix socket (always SO_PEERCRED) and never makes a TCP connection acceptable. For tests.
	InMemoryPeerUID *uint32
}

// NewServer returns a gRPC server serving ManagerService for b: peer identity from SO_PEERCRED
// at accept, the uid gate before every call, bounded messages, and errors mapped as Refusal
// says. The caller serves it (Serve on a Listen listener) and stops it.
func NewServer(b Backend, opts Options) *grpc.Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxAttach := opts.MaxAttach
	if maxAttach <= 0 {
		maxAttach = DefaultMaxAttach
	}
	drain := opts.ExitDrain
	if drain <= 0 {
		drain = DefaultExitDrain
	}
	writeTimeout := opts.WriteTimeout
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	var declared *uint32
	if opts.InMemoryPeerUID != nil {
		v := *opts.InMemoryPeerUID
		declared = &v
	}
	g := &gate{allow: slices.Clone(opts.AllowUIDs), log: log}
	gs := grpc.NewServer(
		grpc.Creds(&peerCreds{declared: declared}),
		grpc.ChainUnaryInterceptor(recovering{log}.unary, g.unary),
		grpc.ChainStreamInterceptor(recovering{log}.stream, g.stream),
		grpc.MaxRecvMsgSize(maxRecvMsgBytes),
		// Attach streams may be quiet for hours; keepalive pings are allowed but not required.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	managerv1.RegisterManagerServiceServer(gs, &service{
		b: b, log: log, attach: make(chan struct{}, maxAttach), drain: drain, writeTimeout: writeTimeout,
	})
	return gs
}

// service implements ManagerService on a Backend.
type service struct {
	managerv1.UnimplementedManagerServiceServer
	b      Backend
	log    *slog.Logger
	attach chan struct{} // one token per open Attach session
	drain  time.Duration
	// writeTimeout bounds a terminal write whose call has no earlier deadline.
	writeTimeout time.Duration
}

var _ managerv1.ManagerServiceServer = (*service)(nil)

// checkName refuses an empty or oversized name; its syntax is the Backend's to judge.
func checkName(name string) error {
	if name == "" {
		return invalid("name is required")
	}
	if len(name) > maxNameBytes {
		return invalid("name is longer than %d bytes", maxNameBytes)
	}
	return nil
}

func checkSize(what string, v uint32) error {
	if v > MaxTerminalSize {
		return invalid("%s %d is out of range 1..%d", what, v, MaxTerminalSize)
	}
	return nil
}

func (s *service) Spawn(ctx context.Context, req *managerv1.SpawnRequest) (*managerv1.SpawnResponse, error) {
	err := checkName(req.GetName())
	if err == nil {
		err = checkSize("rows", req.GetRows())
	}
	if err == nil {
		err = checkSize("cols", req.GetCols())
	}
	if err == nil && req.GetConnector() == "" {
		err = invalid("connector is required")
	}
	if err != nil {
		return nil, publicError(ctx, s.log, "Spawn", err)
	}
	a, err := s.b.Spawn(ctx, req)
	if err != nil {
		return nil, publicError(ctx, s.log, "Spawn", err)
	}
	return &managerv1.SpawnResponse{Agent: a}, nil
}

func (s *service) Stop(ctx context.Context, req *managerv1.StopRequest) (*managerv1.StopResponse, error) {
	if err := checkName(req.GetName()); err != nil {
		return nil, publicError(ctx, s.log, "Stop", err)
	}
	resp, err := s.b.Stop(ctx, req.GetName())
	if err != nil {
		return nil, publicError(ctx, s.log, "Stop", err)
	}
	if resp == nil {
		resp = &managerv1.StopResponse{}
	}
	return resp, nil
}

func (s *service) List(ctx context.Context, _ *managerv1.ListRequest) (*managerv1.ListResponse, error) {
	agents, err := s.b.List(ctx)
	if err != nil {
		return nil, publicError(ctx, s.log, "List", err)
	}
	agents = slices.Clone(agents)
	slices.SortStableFunc(agents, func(a, b *managerv1.Agent) int { return strings.Compare(a.GetName(), b.GetName()) })
	return &managerv1.ListResponse{Agents: agents}, nil
}

func (s *service) Inspect(ctx context.Context, req *managerv1.InspectRequest) (*managerv1.InspectResponse, error) {
	if err := checkName(req.GetName()); err != nil {
		return nil, publicError(ctx, s.log, "Inspect", err)
	}
	resp, err := s.b.Inspect(ctx, req.GetName())
	if err != nil {
		return nil, publicError(ctx, s.log, "Inspect", err)
	}
	if resp == nil {
		resp = &managerv1.InspectResponse{}
	}
	return resp, nil
}

// Input writes the text by the call's deadline (at most WriteTimeout): an agent that does not
// take it in time fails the call with DEADLINE_EXCEEDED, and a later call, to this agent or
// another, is not held behind it. Bytes the agent took before the deadline stay written.
func (s *service) Input(ctx context.Context, req *managerv1.InputRequest) (*managerv1.InputResponse, error) {
	n, err := s.input(ctx, req)
	if err != nil {
		return nil, publicError(ctx, s.log, "Input", err)
	}
	return &managerv1.InputResponse{Written: uint32(n)}, nil
}

// input writes the request's text, then "\r" when enter is set; n counts both.
func (s *service) input(ctx context.Context, req *managerv1.InputRequest) (int, error) {
	if err := checkName(req.GetName()); err != nil {
		return 0, err
	}
	if len(req.GetText()) > MaxInputBytes {
		return 0, invalid("text is %d bytes, more than %d", len(req.GetText()), MaxInputBytes)
	}
	if len(req.GetText()) == 0 && !req.GetEnter() {
		return 0, invalid("nothing to write: text is empty and enter is not set")
	}
	term, err := s.b.Terminal(req.GetName())
	if err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	total := 0
	for _, p := range [][]byte{req.GetText(), enterBytes(req.GetEnter())} {
		if len(p) == 0 {
			continue
		}
		n, err := term.Write(wctx, p)
		total += n
		if err != nil {
			return total, writeError(ctx, term, err, total)
		}
	}
	return total, nil
}

func enterBytes(enter bool) []byte {
	if enter {
		return []byte{'\r'}
	}
	return nil
}

// writeError is a failed terminal write: AGENT_EXITED once the agent has exited; the caller's
// own cancellation or deadline as it is (publicError reports it); DEADLINE_EXCEEDED when the
// write timeout passed first, the agent not having taken its input (written bytes did reach it);
// else err as it is (INTERNAL).
func writeError(ctx context.Context, term Terminal, err error, written int) error {
	select {
	case <-term.Exited():
		return Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_AGENT_EXITED, "the agent has exited")
	default:
	}
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return &notReading{written: written}
	}
	return err
}

func (s *service) Status(ctx context.Context, _ *managerv1.StatusRequest) (*managerv1.StatusResponse, error) {
	resp, err := s.b.Status(ctx)
	if err != nil {
		return nil, publicError(ctx, s.log, "Status", err)
	}
	if resp == nil {
		resp = &managerv1.StatusResponse{}
	}
	return resp, nil
}

func (s *service) Shutdown(ctx context.Context, req *managerv1.ShutdownRequest) (*managerv1.ShutdownResponse, error) {
	resp, err := s.b.Shutdown(ctx, req.GetWithAgents())
	if err != nil {
		return nil, publicError(ctx, s.log, "Shutdown", err)
	}
	if resp == nil {
		resp = &managerv1.ShutdownResponse{}
	}
	return resp, nil
}
