package signerclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// Calls over signerd's Stream RPC. A busy caller (authd's callout responder, managerd's spawns
// and renewals) sends Mint, OpenCalloutRequest and SignCalloutResponse as requests on one
// long-lived stream per replica instead of one HTTP/2 stream per call; signerd answers each
// exactly as the unary RPC would (same policy, rate limit, request_id idempotency and audit
// line). Choices made here:
//
//   - Lanes: one stream per configured address, opened lazily by the first call that needs it
//     and picked round robin by calls, so that, with several replicas, the balancer spreads the
//     streams (each opened on the replica it picks) as it spreads unary calls.
//   - A stream is used only once signerd has accepted it (its response header StreamHeader). A
//     signerd without Stream (UNIMPLEMENTED) sends the lane's calls to the unary RPCs for
//     StreamRetryAfter, then it tries again; any other refusal to open (signerd stopping, the
//     caller at its stream cap, signerd down) sends that call to the unary RPCs and the next
//     call tries to open again.
//   - Never a silent resend: a call whose request was sent and whose stream then broke fails
//     UNAVAILABLE (the unary RPCs' retry policy does not apply to it), and the next call opens
//     a new stream. Only a request that never left (its stream was already gone or draining)
//     is sent again, on a new stream or by the unary RPC.
//   - signerd's StreamDrain (it is stopping or draining) and a stream's age (StreamMaxAge, kept
//     under signerd's max_connection_age_grace default so a connection's age limit never cuts
//     a stream with calls in it) retire a stream: it takes no new call, is half-closed, and its
//     calls in flight are still answered.
//   - A call whose context ends stops waiting (DEADLINE_EXCEEDED or CANCELED, as the unary call
//     returns); its answer, if it comes, is dropped. Config.CallTimeout bounds a call without a
//     deadline, and Config.Interceptors run around each call as around a unary call, with the
//     unary RPC's method name.

// Stream tuning.
const (
	// StreamRetryAfter is how long a lane uses the unary RPCs after signerd answered that it
	// serves no Stream.
	StreamRetryAfter = time.Minute
	// StreamMaxAge is how long a stream takes new calls before it is retired.
	StreamMaxAge = 20 * time.Second
	// StreamHeader is the response header signerd sends once it has accepted a stream.
	StreamHeader = "cotal-signer-stream"
)

// errNotSent marks a stream request that never left: it may be sent again.
var errNotSent = errors.New("signerclient: stream gone before the request was sent")

// Calls sends Mint, OpenCalloutRequest and SignCalloutResponse over signerd's Stream when
// signerd serves it, and by the unary RPCs otherwise. Get it from Client.Calls; it is safe for
// concurrent use and lives as long as its Client. Its OpenCalloutRequest and
// SignCalloutResponse have the generated client's signature (authd's callout Signer) and return
// gRPC status errors; its Mint is Client.Mint's.
type Calls struct {
	c       *Client
	lanes   []*lane
	next    atomic.Uint64
	timeout time.Duration
	chain   grpc.UnaryClientInterceptor // cfg.Interceptors chained; nil for none
	now     func() time.Time
	ctx     context.Context // ends with the Client
	stop    context.CancelFunc

	// opened counts streams signerd accepted; fellBack counts calls sent by the unary RPCs
	// because no stream was usable (tests and benchmarks read them).
	opened, fellBack atomic.Uint64
}

func newCalls(c *Client, lanes int, timeout time.Duration, interceptors []grpc.UnaryClientInterceptor) *Calls {
	ctx, stop := context.WithCancel(context.Background())
	k := &Calls{c: c, timeout: timeout, now: time.Now, ctx: ctx, stop: stop}
	for range max(lanes, 1) {
		k.lanes = append(k.lanes, &lane{k: k})
	}
	if len(interceptors) > 0 {
		k.chain = chainInterceptors(interceptors)
	}
	return k
}

// Calls returns the client's stream multiplexer (see Calls).
func (c *Client) Calls() *Calls { return c.calls }

// Opened counts the streams signerd has accepted so far.
func (k *Calls) Opened() uint64 { return k.opened.Load() }

// FellBack counts the calls sent by the unary RPCs because no stream was usable.
func (k *Calls) FellBack() uint64 { return k.fellBack.Load() }

// Mint is Client.Mint over the stream: the same checks of the request and of the credential.
func (k *Calls) Mint(ctx context.Context, req *signerv1.MintRequest) (*signerv1.Credential, error) {
	if req == nil {
		return nil, localInvalid("nil MintRequest")
	}
	resp := new(signerv1.MintResponse)
	err := k.call(ctx, signerv1.SignerService_Mint_FullMethodName,
		&signerv1.StreamRequest{Call: &signerv1.StreamRequest_Mint{Mint: req}}, req, resp,
		func(ctx context.Context) (proto.Message, error) { return k.c.api.Mint(ctx, req) })
	return mintAnswer(req, resp, err)
}

// OpenCalloutRequest is the generated client's OpenCalloutRequest over the stream. opts apply
// to the unary fallback only.
func (k *Calls) OpenCalloutRequest(ctx context.Context, req *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	resp := new(signerv1.OpenCalloutRequestResponse)
	err := k.call(ctx, signerv1.SignerService_OpenCalloutRequest_FullMethodName,
		&signerv1.StreamRequest{Call: &signerv1.StreamRequest_OpenCallout{OpenCallout: req}}, req, resp,
		func(ctx context.Context) (proto.Message, error) { return k.c.api.OpenCalloutRequest(ctx, req, opts...) })
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// SignCalloutResponse is the generated client's SignCalloutResponse over the stream. opts apply
// to the unary fallback only.
func (k *Calls) SignCalloutResponse(ctx context.Context, req *signerv1.SignCalloutResponseRequest, opts ...grpc.CallOption) (*signerv1.SignCalloutResponseResponse, error) {
	resp := new(signerv1.SignCalloutResponseResponse)
	err := k.call(ctx, signerv1.SignerService_SignCalloutResponse_FullMethodName,
		&signerv1.StreamRequest{Call: &signerv1.StreamRequest_SignCallout{SignCallout: req}}, req, resp,
		func(ctx context.Context) (proto.Message, error) {
			return k.c.api.SignCalloutResponse(ctx, req, opts...)
		})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// call sends sreq on a lane's stream and merges its answer into reply, or calls unary when no
// stream is usable. Its errors are gRPC status errors.
func (k *Calls) call(ctx context.Context, method string, sreq *signerv1.StreamRequest, req, reply proto.Message, unary func(context.Context) (proto.Message, error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, k.timeout)
		defer cancel()
	}
	l := k.lanes[(k.next.Add(1)-1)%uint64(len(k.lanes))]
	// Two tries on a stream: a request that never left its first stream (gone or draining)
	// goes on a new one; then the unary RPC.
	for range 2 {
		cs := l.stream(ctx)
		if cs == nil {
			break
		}
		invoke := func(ctx context.Context, _ string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			r, err := cs.do(ctx, sreq)
			if err != nil {
				return err
			}
			return mergeResult(r, reply.(proto.Message))
		}
		var err error
		if k.chain != nil {
			err = k.chain(ctx, method, req, reply, k.c.conn, invoke)
		} else {
			err = invoke(ctx, method, req, reply, k.c.conn)
		}
		if !errors.Is(err, errNotSent) {
			return err
		}
	}
	k.fellBack.Add(1)
	r, err := unary(ctx)
	if err != nil {
		return err
	}
	proto.Merge(reply, r)
	return nil
}

// mergeResult turns a stream answer into reply or the refusal it carries.
func mergeResult(r *signerv1.StreamResponse, reply proto.Message) error {
	var got proto.Message
	switch res := r.GetResult().(type) {
	case *signerv1.StreamResponse_Status:
		var p spb.Status
		if err := proto.Unmarshal(res.Status, &p); err != nil || p.GetCode() == int32(codes.OK) {
			return status.Error(codes.Internal, "signerd sent an unreadable stream refusal")
		}
		return status.FromProto(&p).Err()
	case *signerv1.StreamResponse_Mint:
		got = res.Mint
	case *signerv1.StreamResponse_OpenCallout:
		got = res.OpenCallout
	case *signerv1.StreamResponse_SignCallout:
		got = res.SignCallout
	}
	if got == nil || got.ProtoReflect().Descriptor() != reply.ProtoReflect().Descriptor() {
		return status.Error(codes.Internal, "signerd answered a stream request with another call's result")
	}
	proto.Merge(reply, got)
	return nil
}

// close ends every stream; calls in flight fail UNAVAILABLE.
func (k *Calls) close() { k.stop() }

// lane holds one stream at a time.
type lane struct {
	k *Calls

	mu         sync.Mutex
	cur        *clientStream // guarded by mu; nil when none is open
	unaryUntil time.Time     // guarded by mu
}

// stream returns the lane's open stream, opening one if needed, or nil to use the unary RPCs.
func (l *lane) stream(ctx context.Context) *clientStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.k.now()
	if cs := l.cur; cs != nil {
		if cs.usable() && now.Sub(cs.opened) < StreamMaxAge {
			return cs
		}
		l.cur = nil
		go cs.retire()
	}
	if now.Before(l.unaryUntil) || l.k.ctx.Err() != nil {
		return nil
	}
	cs, err := l.open(ctx)
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			l.unaryUntil = now.Add(StreamRetryAfter)
		}
		return nil
	}
	l.k.opened.Add(1)
	l.cur = cs
	return cs
}

// detach forgets cs if it is the lane's stream.
func (l *lane) detach(cs *clientStream) {
	l.mu.Lock()
	if l.cur == cs {
		l.cur = nil
	}
	l.mu.Unlock()
}

// open opens a stream and waits, within ctx, for signerd to accept it.
func (l *lane) open(ctx context.Context) (*clientStream, error) {
	sctx, cancel := context.WithCancel(l.k.ctx)
	st, err := l.k.c.api.Stream(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	stop := context.AfterFunc(ctx, cancel)
	md, err := st.Header()
	if !stop() {
		cancel()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err == nil && len(md.Get(StreamHeader)) == 0 {
		// Not accepted: the stream ended with a status and no header (an old signerd's
		// UNIMPLEMENTED, or a refusal); Recv returns it.
		_, err = st.Recv()
		if err == nil || errors.Is(err, io.EOF) {
			err = status.Error(codes.Unavailable, "signerd did not accept the stream")
		}
	}
	if err != nil {
		cancel()
		return nil, err
	}
	cs := &clientStream{lane: l, st: st, cancel: cancel, opened: l.k.now(), sendTok: make(chan struct{}, 1),
		pending: map[uint64]chan result{}, done: make(chan struct{})}
	go cs.recv()
	return cs, nil
}

// result is one answer or the stream's failure.
type result struct {
	resp *signerv1.StreamResponse
	err  error
}

// clientStream is one open stream and the calls waiting on it.
type clientStream struct {
	lane    *lane
	st      grpc.BidiStreamingClient[signerv1.StreamRequest, signerv1.StreamResponse]
	cancel  context.CancelFunc
	opened  time.Time
	sendTok chan struct{} // held while sending or half-closing
	done    chan struct{} // closed when recv ends

	mu       sync.Mutex
	nextID   uint64                 // guarded by mu
	pending  map[uint64]chan result // guarded by mu; nil once the stream has ended
	retiring bool                   // guarded by mu; no new request once set
}

// usable reports whether the stream takes new calls.
func (cs *clientStream) usable() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.pending != nil && !cs.retiring
}

// do sends req with a fresh id and waits for its answer. errNotSent means req never left.
func (cs *clientStream) do(ctx context.Context, req *signerv1.StreamRequest) (*signerv1.StreamResponse, error) {
	ch := make(chan result, 1)
	cs.mu.Lock()
	if cs.pending == nil || cs.retiring {
		cs.mu.Unlock()
		return nil, errNotSent
	}
	cs.nextID++
	id := cs.nextID
	cs.pending[id] = ch
	cs.mu.Unlock()
	// The request is a copy with its id: the caller's may be in flight on another stream.
	out := &signerv1.StreamRequest{Id: id, Call: req.GetCall()}

	select {
	case cs.sendTok <- struct{}{}:
	case <-ctx.Done():
		cs.forget(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-cs.done:
		cs.forget(id)
		return nil, errNotSent
	}
	cs.mu.Lock()
	gone := cs.pending == nil || cs.retiring
	cs.mu.Unlock()
	if gone {
		<-cs.sendTok
		cs.forget(id)
		return nil, errNotSent
	}
	err := cs.st.Send(out)
	<-cs.sendTok
	if err != nil && !errors.Is(err, io.EOF) {
		// Not a broken stream (whose status recv reports): the message could not be sent. The
		// stream's state is unknown, so it is ended, and this call fails with the error.
		cs.forget(id)
		cs.cancel()
		return nil, status.Convert(err).Err()
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		cs.forget(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (cs *clientStream) forget(id uint64) {
	cs.mu.Lock()
	if cs.pending != nil {
		delete(cs.pending, id)
	}
	cs.mu.Unlock()
}

// recv delivers answers until the stream ends, then fails every call still waiting UNAVAILABLE.
func (cs *clientStream) recv() {
	defer close(cs.done)
	var end error
	for {
		r, err := cs.st.Recv()
		if err != nil {
			end = err
			break
		}
		if r.GetDrain() != nil {
			go cs.retire()
			continue
		}
		cs.mu.Lock()
		ch := cs.pending[r.GetId()]
		delete(cs.pending, r.GetId())
		cs.mu.Unlock()
		if ch != nil {
			ch <- result{resp: r}
		}
	}
	cs.lane.detach(cs)
	cs.mu.Lock()
	pending := cs.pending
	cs.pending = nil
	cs.mu.Unlock()
	if len(pending) > 0 {
		why := "stream ended"
		if !errors.Is(end, io.EOF) {
			why = status.Convert(end).Message()
		}
		fail := status.Error(codes.Unavailable, fmt.Sprintf("signer stream broken with the call in flight (not resent): %s", why))
		for _, ch := range pending {
			ch <- result{err: fail}
		}
	}
	cs.cancel()
}

// retire takes no new call and half-closes the stream; signerd answers what was sent and ends
// it, which ends recv.
func (cs *clientStream) retire() {
	cs.lane.detach(cs)
	cs.mu.Lock()
	already := cs.retiring
	cs.retiring = true
	cs.mu.Unlock()
	if already {
		return
	}
	select {
	case cs.sendTok <- struct{}{}:
		_ = cs.st.CloseSend()
		<-cs.sendTok
	case <-cs.done:
	}
}

// chainInterceptors runs ics in order around an invoker, as grpc.WithChainUnaryInterceptor does.
func chainInterceptors(ics []grpc.UnaryClientInterceptor) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		next := invoker
		for i := len(ics) - 1; i >= 0; i-- {
			ic, inner := ics[i], next
			next = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
				return ic(ctx, method, req, reply, cc, inner, opts...)
			}
		}
		return next(ctx, method, req, reply, cc, opts...)
	}
}
