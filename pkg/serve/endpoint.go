package serve

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

const (
	// RenewFrom and RenewTo bound the point of a bearer's life at which the endpoint renews it
	// and moves to a new connection: a random point in [RenewFrom, RenewTo).
	RenewFrom = 0.5
	RenewTo   = 0.8
	// queueGroup is the one queue group every connection of an endpoint binds in, so that while
	// an old and a new connection overlap each request reaches exactly one of them.
	queueGroup = "serve"
	// minRetry and maxRetry bound the wait between failed renewals.
	minRetry = 50 * time.Millisecond
	maxRetry = 5 * time.Second
	// connectTimeout bounds one connect when the context has no earlier deadline.
	connectTimeout = 10 * time.Second
)

// ErrExpired ends an endpoint that could not get and bind a fresh bearer before its current
// one expired.
var ErrExpired = errors.New("serve: no fresh bearer was bound before the current one expired")

// EndpointOptions are ServeEndpoint's options. URLs, Bearer, SentinelCreds, Grant, Handler and
// Ready are required.
type EndpointOptions struct {
	// URLs are the broker's client URLs.
	URLs []string
	// Bearer pulls a fresh access bearer (the renewal source's Bearer).
	Bearer func(ctx context.Context) (string, error)
	// SentinelCreds returns the space's sentinel user JWT, which the callout expects as the user
	// JWT beside the bearer (the renewal source's SentinelCreds). It must be a bearer user JWT.
	SentinelCreds func(ctx context.Context) (string, error)
	// Grant is the verified serving grant; every bearer is checked by it before it is presented.
	Grant *Grant
	// Handler answers one request with msg.Respond. It only sees requests whose reply subject
	// is in the instance's reply family. While an old and a new connection overlap it may run
	// on both at once.
	Handler nats.MsgHandler
	// Ready tells the authority the instance is bound (the Provider's ready request with the
	// access bearer as proof). It is called once, after the first bind.
	Ready func(ctx context.Context, accessToken string) error
	// Now is the clock the renewal is scheduled on; time.Now when nil.
	Now func() time.Time
	// NatsOptions are added to every connection's options (TLS, name, ...).
	NatsOptions []nats.Option
}

// Endpoint is one serving endpoint instance. It runs until Close, or until it cannot bind a
// fresh bearer before the current one expires (Done, Err).
type Endpoint struct {
	opts        EndpointOptions
	grant       *Grant
	now         func() time.Time
	serve       string
	replyPrefix string

	mu    sync.Mutex
	conn  *nats.Conn
	token string // the latest bearer the grant accepted; presented on (re)connect
	iat   time.Time
	exp   time.Time
	live  map[*nats.Conn]chan struct{}
	err   error

	dropped   atomic.Uint64
	rotations atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// ServeEndpoint pulls a bearer, checks it with the grant, connects, binds the responder on
// cotal.<t>.sep.<epTok>.<iid>.> (in one queue group), flushes, and calls Ready; then it keeps
// renewing in the background (see the package doc). ctx bounds this setup; the endpoint runs
// until Close. It refuses missing options and a bearer the grant refuses.
func ServeEndpoint(ctx context.Context, o EndpointOptions) (*Endpoint, error) {
	switch {
	case len(o.URLs) == 0:
		return nil, errors.New("serve: no broker URL")
	case o.Bearer == nil:
		return nil, errors.New("serve: no bearer source")
	case o.SentinelCreds == nil:
		return nil, errors.New("serve: no sentinel")
	case o.Grant == nil || o.Grant.v == nil:
		return nil, errors.New("serve: no serving grant")
	case o.Handler == nil:
		return nil, errors.New("serve: no handler")
	case o.Ready == nil:
		return nil, errors.New("serve: no ready call")
	}
	names, err := space.NewNames(o.Grant.space)
	if err != nil {
		return nil, err
	}
	serve, err := names.ServiceServe(o.Grant.epTok, o.Grant.instance)
	if err != nil {
		return nil, err
	}
	reply, err := names.ServiceReply(o.Grant.epTok, o.Grant.instance)
	if err != nil {
		return nil, err
	}
	e := &Endpoint{
		opts:        o,
		grant:       o.Grant,
		now:         o.Now,
		serve:       serve,
		replyPrefix: strings.TrimSuffix(reply, ">"),
		live:        make(map[*nats.Conn]chan struct{}),
		done:        make(chan struct{}),
	}
	if e.now == nil {
		e.now = time.Now
	}

	tok, err := o.Bearer(ctx)
	if err != nil {
		return nil, fmt.Errorf("serve: bearer: %w", err)
	}
	c, err := o.Grant.check(tok)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.token, e.iat, e.exp = tok, time.Unix(c.Iat, 0), time.Unix(c.Exp, 0)
	e.mu.Unlock()
	nc, err := e.bind(ctx)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.conn = nc
	e.mu.Unlock()
	if err := o.Ready(ctx, tok); err != nil {
		_ = e.closeAll(ctx)
		return nil, fmt.Errorf("serve: ready: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go e.run(runCtx)
	return e, nil
}

// Dropped counts the requests dropped for a reply subject outside the instance's reply family.
func (e *Endpoint) Dropped() uint64 { return e.dropped.Load() }

// Rotations counts the moves to a new connection under a fresh bearer.
func (e *Endpoint) Rotations() uint64 { return e.rotations.Load() }

// Exp is the current bearer's expiry.
func (e *Endpoint) Exp() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.exp
}

// Done is closed when the endpoint has stopped serving.
func (e *Endpoint) Done() <-chan struct{} { return e.done }

// Err is why the endpoint stopped: nil after Close, ErrExpired (wrapping the last failure)
// when no fresh bearer could be bound in time.
func (e *Endpoint) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Close stops renewing, drains every connection (answering the requests already received) and
// waits for them to close or ctx to end. It is idempotent.
func (e *Endpoint) Close(ctx context.Context) error {
	e.cancel()
	select {
	case <-e.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.closeAll(ctx)
}

func (e *Endpoint) run(ctx context.Context) {
	defer close(e.done)
	for {
		e.mu.Lock()
		iat, exp := e.iat, e.exp
		e.mu.Unlock()
		frac := RenewFrom + rand.Float64()*(RenewTo-RenewFrom)
		at := iat.Add(time.Duration(frac * float64(exp.Sub(iat))))
		if !e.sleep(ctx, at.Sub(e.now())) {
			return
		}
		if err := e.rotate(ctx, exp); err != nil {
			if ctx.Err() != nil {
				return
			}
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
			cctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
			_ = e.closeAll(cctx)
			cancel()
			return
		}
	}
}

// rotate pulls bearers until one the grant accepts, newer than the current one, is bound on a
// new connection, then drains the old connection. It gives up when the current bearer expires.
func (e *Endpoint) rotate(ctx context.Context, exp time.Time) error {
	var last error
	for {
		if !e.now().Before(exp) {
			if last == nil {
				return ErrExpired
			}
			return fmt.Errorf("%w: %w", ErrExpired, last)
		}
		pctx, cancel := context.WithDeadline(ctx, exp)
		nc, err := e.renewOnce(pctx, exp)
		cancel()
		if err == nil {
			e.mu.Lock()
			old := e.conn
			e.conn = nc
			e.mu.Unlock()
			e.rotations.Add(1)
			if old != nil {
				_ = old.Drain()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = err
		wait := exp.Sub(e.now()) / 8
		wait = min(max(wait, minRetry), maxRetry)
		if !e.sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

func (e *Endpoint) renewOnce(ctx context.Context, exp time.Time) (*nats.Conn, error) {
	tok, err := e.opts.Bearer(ctx)
	if err != nil {
		return nil, fmt.Errorf("serve: bearer: %w", err)
	}
	c, err := e.grant.check(tok)
	if err != nil {
		return nil, err
	}
	if !time.Unix(c.Exp, 0).After(exp) {
		return nil, errors.New("serve: the pulled bearer does not outlive the current one")
	}
	e.mu.Lock()
	e.token = tok
	e.mu.Unlock()
	nc, err := e.bind(ctx)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.iat, e.exp = time.Unix(c.Iat, 0), time.Unix(c.Exp, 0)
	e.mu.Unlock()
	return nc, nil
}

// bind connects with the latest checked bearer, subscribes the responder and flushes, so the broker has the
// subscription (or has refused it) before the caller moves on.
func (e *Endpoint) bind(ctx context.Context) (*nats.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	nc, err := e.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("serve: connect: %w", err)
	}
	closed := make(chan struct{})
	var once sync.Once
	nc.SetClosedHandler(func(*nats.Conn) {
		once.Do(func() { close(closed) })
		e.forget(nc)
	})
	e.mu.Lock()
	e.live[nc] = closed
	e.mu.Unlock()
	if nc.IsClosed() {
		once.Do(func() { close(closed) })
		e.forget(nc)
	}
	fail := func(err error) (*nats.Conn, error) {
		nc.Close()
		e.forget(nc)
		return nil, err
	}
	if _, err := nc.QueueSubscribe(e.serve, queueGroup, e.handle); err != nil {
		return fail(fmt.Errorf("serve: bind: %w", err))
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return fail(fmt.Errorf("serve: bind flush: %w", err))
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return fail(fmt.Errorf("serve: bind: the broker refused the subscription: %w", nats.ErrPermissionViolation))
	}
	return nc, nil
}

func (e *Endpoint) forget(nc *nats.Conn) {
	e.mu.Lock()
	delete(e.live, nc)
	e.mu.Unlock()
}

// handle drops a request whose reply subject is not in the instance's reply family (the
// profile lets it publish only there) and passes every other one to the handler.
func (e *Endpoint) handle(m *nats.Msg) {
	if !e.replyOK(m.Reply) {
		e.dropped.Add(1)
		return
	}
	e.opts.Handler(m)
}

func (e *Endpoint) replyOK(r string) bool {
	rest, ok := strings.CutPrefix(r, e.replyPrefix)
	if !ok || rest == "" {
		return false
	}
	for _, t := range strings.Split(rest, ".") {
		if t == "" || strings.ContainsAny(t, "*> \t\r\n") {
			return false
		}
	}
	return true
}

// present is the token every (re)connect presents: the latest bearer, checked by the grant
// again now (an empty token, which the callout denies, when it no longer passes).
func (e *Endpoint) present() string {
	e.mu.Lock()
	tok := e.token
	e.mu.Unlock()
	if e.grant.Check(tok) != nil {
		return ""
	}
	return tok
}

// connect is the broker connect through the callout: the sentinel as user JWT (a bearer JWT,
// so the throwaway key's nonce signature is not checked), the bearer as auth token.
func (e *Endpoint) connect(ctx context.Context) (*nats.Conn, error) {
	sentinel, err := e.opts.SentinelCreds(ctx)
	if err != nil {
		return nil, fmt.Errorf("serve: sentinel: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(sentinel)
	if err != nil || !uc.BearerToken {
		return nil, errors.New("serve: the sentinel is not a bearer user JWT")
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	timeout := connectTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), time.Millisecond)
	}
	opts := append([]nats.Option{
		nats.Timeout(timeout),
		nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
		nats.TokenHandler(e.present),
	}, e.opts.NatsOptions...)
	return nats.Connect(strings.Join(e.opts.URLs, ","), opts...)
}

func (e *Endpoint) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// closeAll drains every live connection and waits for each to close or ctx to end.
func (e *Endpoint) closeAll(ctx context.Context) error {
	e.mu.Lock()
	conns := make(map[*nats.Conn]chan struct{}, len(e.live))
	for nc, ch := range e.live {
		conns[nc] = ch
	}
	e.mu.Unlock()
	for nc := range conns {
		if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			nc.Close()
		}
	}
	for nc, ch := range conns {
		select {
		case <-ch:
			e.forget(nc)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
