package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// The Stream RPC: Mint, OpenCalloutRequest and SignCalloutResponse calls over one long-lived
// bidirectional stream, for callers that make many (authd's callout responder, managerd).
//
// Choices made here:
//
//   - Each request is handled by the very method its unary RPC calls (s.Mint,
//     s.OpenCalloutRequest, s.SignCalloutResponse), in its own goroutine, with a context derived
//     from the stream's. The caller identity, the rate-limit key and the certificate
//     re-verification read the mTLS peer from that context (mtls.IdentityFromContext,
//     certKey, mtls.CallerVerifier), which is the stream's connection: the same caller as a
//     unary call on that connection. Policy, rate limit, request_id idempotency and the audit
//     line are therefore per request and unchanged; the audit line's rpc is the one begin is
//     given ("Mint", ...), never "Stream". Nothing in the service reads grpc.Method.
//   - Flow control: at most StreamInFlight requests are read ahead of their sent answers. The
//     reader takes a slot after each Recv and does not call Recv again until it has one; the
//     sender gives the slot back once the answer is written. A caller that sends faster than
//     signerd answers, or does not read its answers, is held back by HTTP/2 flow control.
//   - One goroutine sends (grpc's SendMsg must not be called concurrently); answers leave in the
//     order they are ready, each with its request's id.
//   - An id already in flight, and a request without a call (or with one this signerd does not
//     know), are refused for that id with INVALID_ARGUMENT; the stream goes on. They are not
//     audited: no RPC was asked for.
//   - A panic in one request answers INTERNAL for its id and the stream goes on (the recovery
//     interceptor covers only the handler's own goroutine).
//   - A caller holds at most MaxStreamsPerCaller streams (by identity, or by certificate
//     fingerprint without one); one more is refused RESOURCE_EXHAUSTED (reason RATE_LIMITED) before any
//     request is read. Connections per source and streams per connection are bounded by the listener's
//     limits as for every call; the rate limit charges each request.
//   - StopStreams (signerd stopping or draining) sends each stream a StreamDrain and the stream
//     is ended once the caller half-closes it, every request read having been answered, or
//     after StreamDrainGrace; new streams are refused UNAVAILABLE. A caller's requests are never
//     dropped unanswered by a stop the caller was told about.

// Stream limits.
const (
	// StreamInFlight bounds the requests of one stream read and not yet answered.
	StreamInFlight = 64
	// MaxStreamsPerCaller bounds the Streams one caller holds open at once.
	MaxStreamsPerCaller = 16
	// StreamDrainGrace is how long a stream told to drain waits for its caller to half-close.
	StreamDrainGrace = 5 * time.Second
	// StreamHeader is the response header signerd sends once it has accepted a Stream; a caller
	// that opens one knows from it that the stream is served before sending a request.
	StreamHeader = "cotal-signer-stream"
)

// streamTable counts each caller's open streams and signals them to drain.
type streamTable struct {
	mu       sync.Mutex
	byCaller map[string]int // guarded by mu
	stopped  bool           // guarded by mu
	stop     chan struct{}  // closed by StopStreams
}

func newStreamTable() *streamTable {
	return &streamTable{byCaller: map[string]int{}, stop: make(chan struct{})}
}

// open counts a stream of key, or says why it may not open.
func (t *streamTable) open(key string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.stopped:
		return status.Error(codes.Unavailable, "signerd is stopping; use a new stream or the unary RPCs")
	case t.byCaller[key] >= MaxStreamsPerCaller:
		return refuse(codes.ResourceExhausted, policy.ReasonRateLimited, fmt.Sprintf("at most %d streams per caller", MaxStreamsPerCaller)).status()
	}
	t.byCaller[key]++
	return nil
}

func (t *streamTable) close(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byCaller[key]--; t.byCaller[key] <= 0 {
		delete(t.byCaller, key)
	}
}

// StopStreams tells every open stream to drain and refuses new ones. signerd calls it before it
// stops serving (and when it drains), so a graceful stop does not wait for streams its callers
// would hold open for ever. It is safe to call more than once.
func (s *Service) StopStreams() {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	if !s.streams.stopped {
		s.streams.stopped = true
		close(s.streams.stop)
	}
}

// Stream serves one caller's stream of calls; see the choices above.
func (s *Service) Stream(st grpc.BidiStreamingServer[signerv1.StreamRequest, signerv1.StreamResponse]) error {
	if s.noStream {
		return status.Error(codes.Unimplemented, "method Stream not implemented")
	}
	ctx := st.Context()
	key, err := mtls.IdentityFromContext(ctx)
	if err != nil {
		key = certKey(ctx)
	}
	if err := s.streams.open(key); err != nil {
		return err
	}
	defer s.streams.close(key)
	if err := st.SendHeader(metadata.Pairs(StreamHeader, "1")); err != nil {
		return err
	}
	ss := &serverStream{s: s, st: st, slots: make(chan struct{}, StreamInFlight),
		out: make(chan *signerv1.StreamResponse, StreamInFlight+1), inFlight: map[uint64]bool{},
		stopRead: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ss.ctx = ctx

	sendFailed := make(chan struct{})
	sent := make(chan struct{})
	go ss.send(sendFailed, sent)
	readDone := make(chan error, 1)
	go func() { readDone <- ss.read() }()

	// ended waits for the stream's end: the reader done, the sender failed or the context ended;
	// stopping reports signerd stopping (stop), and a fired timeout ends the drain's grace.
	ended := func(stop <-chan struct{}, timeout <-chan time.Time) (end error, stopping bool) {
		select {
		case err := <-readDone:
			return err, false
		case <-sendFailed:
			return status.Error(codes.Unavailable, "stream send failed"), false
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err(), false
		case <-stop:
			return nil, true
		case <-timeout:
			return status.Error(codes.Unavailable, "signerd is stopping; the stream was not half-closed in time"), false
		}
	}
	end, stopping := ended(s.streams.stop, nil)
	if stopping {
		ss.queue(&signerv1.StreamResponse{Result: &signerv1.StreamResponse_Drain{Drain: &signerv1.StreamDrain{}}})
		t := time.NewTimer(StreamDrainGrace)
		end, _ = ended(nil, t.C)
		t.Stop()
	}
	// No request is dispatched from here on; every one dispatched is answered (or the send
	// failed), then the sender ends. The reader, if still in Recv, ends with the stream.
	ss.mu.Lock()
	ss.stopping = true
	ss.mu.Unlock()
	close(ss.stopRead)
	ss.wg.Wait()
	close(ss.out)
	<-sent
	return end
}

// serverStream is the state of one Stream.
type serverStream struct {
	s   *Service
	st  grpc.BidiStreamingServer[signerv1.StreamRequest, signerv1.StreamResponse]
	ctx context.Context
	// slots holds one token per request read and not yet answered.
	slots chan struct{}
	// out feeds the sender; every request holds a slot until its answer is sent, so it never
	// holds more than StreamInFlight answers, plus the drain notice.
	out      chan *signerv1.StreamResponse
	stopRead chan struct{} // closed once the handler ends
	wg       sync.WaitGroup

	mu       sync.Mutex
	stopping bool            // guarded by mu; no dispatch once set
	inFlight map[uint64]bool // guarded by mu
}

// read receives requests and dispatches them until the caller half-closes (nil), the stream
// breaks, or the handler ends.
func (ss *serverStream) read() error {
	for {
		req, err := ss.st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case ss.slots <- struct{}{}:
		case <-ss.stopRead:
			return nil
		}
		if !ss.dispatch(req) {
			<-ss.slots
			return nil
		}
	}
}

// dispatch starts req's handling, or answers its refusal; false once the stream is stopping.
func (ss *serverStream) dispatch(req *signerv1.StreamRequest) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.stopping {
		return false
	}
	id := req.GetId()
	ss.wg.Add(1)
	if ss.inFlight[id] {
		ss.s.log.Warn("stream request id already in flight", "id", id)
		ss.out <- refusalAnswer(id, invalid(fmt.Sprintf("request id %d is already in flight on this stream", id)).status())
		ss.wg.Done()
		return true
	}
	ss.inFlight[id] = true
	go func() {
		defer ss.wg.Done()
		resp := ss.s.streamCall(ss.ctx, req)
		ss.mu.Lock()
		delete(ss.inFlight, id)
		ss.mu.Unlock()
		ss.out <- resp
	}()
	return true
}

// queue hands the sender a message that holds no slot (the drain notice).
func (ss *serverStream) queue(r *signerv1.StreamResponse) { ss.out <- r }

// send writes every answer, then gives its slot back. After a failed send it keeps draining,
// so no request goroutine blocks, and closes failed once.
func (ss *serverStream) send(failed, done chan struct{}) {
	defer close(done)
	var err error
	for r := range ss.out {
		if err == nil {
			if err = ss.st.Send(r); err != nil {
				close(failed)
			}
		}
		if r.GetDrain() == nil {
			<-ss.slots
		}
	}
}

// streamCall answers one request by the unary RPC's own method.
func (s *Service) streamCall(ctx context.Context, req *signerv1.StreamRequest) (out *signerv1.StreamResponse) {
	id := req.GetId()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in stream request", "id", id, "panic", fmt.Sprint(p))
			out = refusalAnswer(id, status.Error(codes.Internal, "internal error"))
		}
	}()
	out = &signerv1.StreamResponse{Id: id}
	var err error
	switch c := req.GetCall().(type) {
	case *signerv1.StreamRequest_Mint:
		var r *signerv1.MintResponse
		if r, err = s.Mint(ctx, c.Mint); err == nil {
			out.Result = &signerv1.StreamResponse_Mint{Mint: r}
		}
	case *signerv1.StreamRequest_OpenCallout:
		var r *signerv1.OpenCalloutRequestResponse
		if r, err = s.OpenCalloutRequest(ctx, c.OpenCallout); err == nil {
			out.Result = &signerv1.StreamResponse_OpenCallout{OpenCallout: r}
		}
	case *signerv1.StreamRequest_SignCallout:
		var r *signerv1.SignCalloutResponseResponse
		if r, err = s.SignCalloutResponse(ctx, c.SignCallout); err == nil {
			out.Result = &signerv1.StreamResponse_SignCallout{SignCallout: r}
		}
	default:
		err = invalid("stream request carries no call this signerd knows").status()
	}
	if err != nil {
		return refusalAnswer(id, err)
	}
	return out
}

// refusalAnswer carries err, a gRPC status error as the unary RPC returns it, for id.
func refusalAnswer(id uint64, err error) *signerv1.StreamResponse {
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		b, _ = proto.Marshal(status.New(codes.Internal, "internal error").Proto())
	}
	return &signerv1.StreamResponse{Id: id, Result: &signerv1.StreamResponse_Status{Status: b}}
}
