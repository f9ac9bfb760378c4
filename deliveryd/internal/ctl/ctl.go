// Package ctl is deliveryd's two control responders (reference/delivery.md §1.5 and §4).
//
// ctl.delivery serves agents on cotal.<t>.ctl.delivery.*.* in queue group "delivery":
//   - durableJoin {channel}: the channel must be concrete and inside the caller's single live ACL
//     row (resolved from <owner>.<actor>.*; none or several are refused). A new join commits
//     generation+1 at joinCursor = CHAT's last sequence, state durable-active, activated:false
//     (it routes at once); a retry of an unfinished activation keeps its window. The catch-up then
//     copies (joinCursor, fence] of the channel into the member's inbox, fence = max(CHAT frontier,
//     fanout's delivered sequence), in the fan-out writer's entry format and Nats-Msg-Id. If
//     retention evicted part of the window the row is tombstoned at the fence and the reply is
//     {durable:false, reason}; else a revision CAS flips activated:true, and a concurrent leave or
//     rejoin that superseded it gives durable:false. Data: {durable, generation, lifecycleUid,
//     reason?} (lifecycleUid is ours: the agent passes it back to durableLeave).
//     A lifecycle whose ACL row grants no reads is fenced (a retirement's teardown fenced it
//     before reading the lifecycleMemberships inventory): its join removes its own row on the
//     channel, if any, by revision CAS and is refused; so does a join that finds the fence when
//     it reads the ACL row again after its commit (a teardown fenced and listed in between),
//     so no row the inventory missed outlives the teardown.
//   - durableLeave {channel, generation, lifecycleUid}: no ACL check; no row is
//     {alreadyLeft:true}; else a tombstone at leaveCursor = CHAT's last sequence, refused as a
//     stale write when the row's generation is not the one given.
//   - listMemberships {lifecycleUid}: the caller lifecycle's open rows, {channel, generation,
//     activated}, read from an in-memory index of the members bucket that one watch keeps for as
//     long as the responders run (index), never from a watch per request.
//   - readHistory answers "not supported".
//
// ctl.delivery-admin serves the manager on cotal.<t>.ctl.delivery-admin.*.* in queue group
// "delivery-admin"; only the supervisor profile, for its own principal, and authd's auth-plane
// credential, as local.authd, may publish there (the broker enforces it, pkg/profiles broker
// tests prove it), and local.authd is answered lifecycleMemberships alone (AuthdPrincipal).
// lifecycleMemberships {owner, actor, lifecycleUid} (closed: any other field is refused) answers
// {owner, actor, lifecycleUid, channels, complete}: the channel of every key the lifecycle holds
// in the members bucket, read from the index once it has caught up with the bucket; complete is
// false, with what was seen, when the bucket cannot be read or the index cannot catch up.
// reloadCreds calls the daemon's Renewer and answers
// {delivery:{ok, brokerAccepted:{identity, iat, exp}}, membership:{ok:true, skipped:true}}, and
// is refused ("this daemon has not finished starting", nothing adopted) until Config.Started;
// reloadStoreIdentity answers {kind:"signer", endpoint}, or {kind:"injected", identity} for a
// hosted store; evictPrincipal, principalLiveness and planeConnLiveness answer a loud "no
// executor wired" refusal.
//
// Both share upstream's envelope: a request {op, args, from}, a reply {ok, data?, error?}. A
// request is answered only on <request-subject>.reply.<nonce>; one with any other reply target is
// dropped unanswered (boundReply: the daemon may publish on every caller's reply lane, so
// answering elsewhere would make it a confused deputy). It is refused, changing nothing, when its
// body is over the request bound (DefaultMaxRequestBytes, never above the broker's max_payload),
// is not a JSON envelope, names an unknown op, or claims a from.id other than the subject's
// <owner>.<actor> ("sender mismatch"), or when the subject's owner is not a real principal owner.
// A broker or bucket failure is logged and answered with a short reason only.
//
// One caller (one request subject, so one principal the broker authenticated) has at most
// Config.MaxInFlightPerCaller requests in flight; one more is answered at once, without being
// run, {ok:false, code:"TOO_MANY_IN_FLIGHT", error}, so a caller that floods slow requests
// (a durableJoin's catch-up) cannot hold the responder's shared slots that other callers need.
//
// Membership rows (plane3.Member, in cotal_members_<t> under <channel>/<owner>.<actor>.<uid>, the
// rows the fan-out writer and trusted reader route by) are written only with a revision CAS and a
// generation guard. Every KV write, inbox publish and reply is fenced by Config.MayAct: a handler
// that finds it false stops and answers nothing, so the caller retries against whoever holds the
// lease.
//
// Use: New(Config) once; Start(ctx, nc) binds both responders on a delivery-credential connection
// (opening, never creating, CHAT, INBOX and the members and ACL buckets) and returns once the
// broker holds the subscriptions; Stop unbinds them, cancels and waits for requests in flight;
// Drain unbinds them and lets the requests in flight finish first. A quiescing daemon calls Stop,
// a resumed one Start again (on the same or a new connection), a draining one Drain.
package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults.
const (
	// DefaultRequestTimeout bounds one request's work; agents wait 30 s for durableJoin.
	DefaultRequestTimeout = 25 * time.Second
	// DefaultRenewTimeout bounds reloadCreds' renewal (upstream's 12 s fetch deadline).
	DefaultRenewTimeout = 12 * time.Second
	// bindTimeout bounds Start's flush of its subscriptions.
	bindTimeout = 5 * time.Second
	// maxInFlight bounds the requests handled at once per responder.
	maxInFlight = 32
	// DefaultMaxInFlightPerCaller bounds one caller's requests in flight: an agent joins its
	// channels one at a time, so a few cover retries; eight callers can never fill maxInFlight.
	DefaultMaxInFlightPerCaller = 4
	// lifecycleStripes is the number of locks serialising catch-up copies per lifecycle.
	lifecycleStripes = 64
)

// Proven is what a renewal proved: the credential's identity (the daemon's user public key) and
// its issued-at and expiry as signed.
type Proven struct {
	Identity string
	IssuedAt time.Time
	Expires  time.Time
}

// Renewer renews the daemon's credential now: mint through signerd, prove it on a throwaway
// connection, adopt it (pkg/signerclient's prove-then-adopt). The daemon supplies it.
type Renewer interface {
	RenewNow(ctx context.Context) (Proven, error)
}

// Config is what New needs. Names and WriterIdentity are required.
type Config struct {
	Names space.Names
	// WriterIdentity is stamped on every membership row this daemon writes (upstream card.id:
	// the daemon's user public key).
	WriterIdentity string
	// MayAct is the lease fence, checked before every write, publish and reply. Nil means always.
	MayAct func() bool
	// Renewer answers reloadCreds; nil refuses it ("no renewer wired").
	Renewer Renewer
	// Executor runs evictPrincipal, principalLiveness and planeConnLiveness; nil refuses them
	// ("no executor wired").
	Executor Executor
	// StoreIdentity is the signer endpoint the daemon renews from, answered by
	// reloadStoreIdentity; empty refuses it.
	StoreIdentity string
	// InjectedStore, when set, is the store identity a hosting platform declared (seed 000's
	// storeIdentity): reloadStoreIdentity answers it instead of the signer endpoint.
	InjectedStore string
	// Started reports whether the daemon has finished starting (its lease watch bound); until
	// it does, reloadCreds is refused and adopts nothing. Nil means started.
	Started func() bool
	// MaxRequestBytes bounds a request body; zero means DefaultMaxRequestBytes. It is never
	// above the connection's max_payload.
	MaxRequestBytes int
	// RequestTimeout bounds one request; zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// MaxInFlightPerCaller bounds one caller's requests in flight; zero means
	// DefaultMaxInFlightPerCaller.
	MaxInFlightPerCaller int
	// Logger receives refusals and failures (never a body, never a credential); nil discards.
	Logger *slog.Logger
	// Now stamps updatedAt; nil means time.Now.
	Now func() time.Time
}

// Responders is deliveryd's ctl.delivery and ctl.delivery-admin responders.
type Responders struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	running bool
	// draining: Drain has unbound the responders; a request already dispatched is dropped.
	draining bool
	subs     []*nats.Subscription
	cancel   func()
	wg       sync.WaitGroup
	// inflight counts each request subject's (each caller's) requests being handled; mu guards it.
	inflight map[string]int
	// idxDone is closed when the members index's watch has ended (Stop waits for it).
	idxDone chan struct{}

	// Bound by Start; read by handlers started after it.
	js      jetstream.JetStream
	chat    jetstream.Stream
	members *store
	idx     *index
	acl     jetstream.KeyValue
	max     int
	// maxPayload is the connection's max_payload, the bound of a reply.
	maxPayload int

	stripes [lifecycleStripes]sync.Mutex
	// beforeCommit and afterCommit, when set (tests), run just before and just after
	// durableJoin commits a new pending row.
	beforeCommit, afterCommit func()
	// idxWatch is the members index's watch (tests stop it to end the index).
	idxWatch jetstream.KeyWatcher
	// listFault, when set (tests), is asked before lifecycleMemberships reads the members
	// bucket; an error stands for a bucket that cannot be read.
	listFault func() error
}

// New validates cfg.
func New(cfg Config) (*Responders, error) {
	if cfg.Names.Token() == "" {
		return nil, space.ErrZeroNames
	}
	if cfg.WriterIdentity == "" {
		return nil, errors.New("ctl: WriterIdentity is required")
	}
	if cfg.MaxRequestBytes < 0 || cfg.RequestTimeout < 0 || cfg.MaxInFlightPerCaller < 0 {
		return nil, fmt.Errorf("ctl: negative MaxRequestBytes %d, RequestTimeout %v or MaxInFlightPerCaller %d",
			cfg.MaxRequestBytes, cfg.RequestTimeout, cfg.MaxInFlightPerCaller)
	}
	if cfg.MaxInFlightPerCaller == 0 {
		cfg.MaxInFlightPerCaller = DefaultMaxInFlightPerCaller
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.MayAct == nil {
		cfg.MayAct = plane3.Always
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Responders{cfg: cfg, log: plane3.Logger(cfg.Logger).With("loop", "ctl"), inflight: map[string]int{}}, nil
}

// Start opens CHAT, INBOX and the members and ACL buckets on nc (a delivery credential's
// connection; a missing one is an error matching plane3.ErrMissing that names it) and binds both
// responders. It returns once the broker has the subscriptions. Start on a running Responders is
// an error; after Stop it binds again. ctx bounds the opening and every request handled until
// Stop.
func (r *Responders) Start(ctx context.Context, nc *nats.Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return errors.New("ctl: already started")
	}
	n := r.cfg.Names
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	chat, err := plane3.OpenStream(ctx, js, n.ChatStream())
	if err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	if _, err := plane3.OpenStream(ctx, js, n.InboxStream()); err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	members, err := plane3.OpenBucket(ctx, js, n, space.Members)
	if err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	acl, err := plane3.OpenBucket(ctx, js, n, space.ACL)
	if err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	r.js, r.chat, r.acl = js, chat, acl
	r.members = &store{kv: members, mayAct: r.mayAct, now: func() int64 { return r.cfg.Now().UnixMilli() }}
	r.max, r.maxPayload = r.cfg.MaxRequestBytes, int(nc.MaxPayload())
	if mp := r.maxPayload; mp > 0 && mp < r.max {
		r.max = mp
	}
	hctx, cancelH := context.WithCancel(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(ctx, cancelH)
	// The index's watch lives until Stop (hctx); a listMemberships waits for it to catch up.
	w, err := members.WatchAll(hctx)
	if err != nil {
		unhook()
		cancelH()
		return fmt.Errorf("ctl: watch the members bucket: %w", err)
	}
	r.idx, r.idxDone, r.idxWatch = newIndex(), make(chan struct{}), w
	go func(x *index, done chan struct{}) { defer close(done); x.run(w) }(r.idx, r.idxDone)
	cancel := func() { unhook(); cancelH(); _ = w.Stop() }
	// Running before the first subscription: a request arriving while Start still holds mu
	// waits for it, then is served.
	r.running, r.draining = true, false
	fail := func(subs []*nats.Subscription, err error) error {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		cancel()
		<-r.idxDone
		r.running = false
		return err
	}
	var subs []*nats.Subscription
	for _, s := range []struct {
		service, subject string
		handle           func(context.Context, Caller, Request) Reply
	}{
		{space.CtlServiceDelivery, n.CtlDeliveryServe(), r.delivery},
		{space.CtlServiceDeliveryAdmin, n.CtlDeliveryAdminServe(), r.admin},
	} {
		sem := make(chan struct{}, maxInFlight)
		sub, err := nc.QueueSubscribe(s.subject, s.service, func(m *nats.Msg) {
			r.mu.Lock()
			if !r.running || r.draining {
				r.mu.Unlock()
				return
			}
			if r.inflight[m.Subject] >= r.cfg.MaxInFlightPerCaller {
				r.mu.Unlock()
				r.busy(s.service, m)
				return
			}
			r.inflight[m.Subject]++
			r.wg.Add(1) // under mu, so never after Stop's Wait began
			r.mu.Unlock()
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; r.done(m.Subject); r.wg.Done() }()
				r.serve(hctx, s.service, m, s.handle)
			}()
		})
		if err != nil {
			return fail(subs, fmt.Errorf("ctl: subscribe %s: %w", s.subject, err))
		}
		subs = append(subs, sub)
	}
	// ctx lives as long as the responders (deliveryd passes its serving context, which has no
	// deadline, and FlushWithContext requires one), so the bind is bounded on its own.
	fctx, fcancel := context.WithTimeout(ctx, bindTimeout)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		return fail(subs, fmt.Errorf("ctl: bind: %w", err))
	}
	r.subs, r.cancel = subs, cancel
	return nil
}

// Drain unbinds both responders, so no new request is taken, and lets the requests in flight
// finish and reply until ctx ends; then it stops as Stop does (cancelling what is left). It is
// what a draining daemon calls instead of Stop.
func (r *Responders) Drain(ctx context.Context) {
	r.mu.Lock()
	if !r.running || r.draining {
		r.mu.Unlock()
		r.Stop()
		return
	}
	r.draining = true
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.subs = nil
	r.mu.Unlock()
	finished := make(chan struct{})
	go func() { r.wg.Wait(); close(finished) }() // no Add after draining is set
	select {
	case <-finished:
	case <-ctx.Done():
	}
	r.Stop()
}

// Stop unbinds both responders, cancels the requests in flight and waits for them; none replies
// after Stop begins. It is idempotent.
func (r *Responders) Stop() {
	r.mu.Lock()
	if !r.running {
		r.mu.Unlock()
		return
	}
	r.running = false
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.subs = nil
	r.cancel()
	done := r.idxDone
	r.mu.Unlock()
	r.wg.Wait()
	<-done
}

// done ends one request of the caller whose request subject is subject.
func (r *Responders) done(subject string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[subject]--; r.inflight[subject] <= 0 {
		delete(r.inflight, subject)
	}
}

// busy answers a request over its caller's in-flight limit, without running it. The checks
// that come before any reply still apply: a foreign reply target is dropped, a fenced daemon
// stays silent.
func (r *Responders) busy(service string, m *nats.Msg) {
	if !BoundReply(m.Subject, m.Reply) || !r.mayAct() {
		return
	}
	// Debug, not Warn: a flooding caller would otherwise flood the log at the same rate.
	r.log.Debug("refused: too many requests in flight", "service", service, "subject", m.Subject)
	b, err := json.Marshal(Reply{Code: CodeTooManyInFlight, Error: fmt.Sprintf(
		"%s: this caller has %d requests in flight, the most one caller may; retry once one is answered",
		CodeTooManyInFlight, r.cfg.MaxInFlightPerCaller)})
	if err != nil {
		return
	}
	if err := m.Respond(b); err != nil {
		r.log.Warn("reply failed", "service", service, "subject", m.Subject, "err", err)
	}
}

// mayAct is the fence: the lease's, and this Responders still running.
func (r *Responders) mayAct() bool {
	r.mu.Lock()
	running := r.running
	r.mu.Unlock()
	return running && r.cfg.MayAct()
}

// serve is one request: the boundReply drop, the envelope and sender checks, the op, the reply.
func (r *Responders) serve(ctx context.Context, service string, m *nats.Msg, handle func(context.Context, Caller, Request) Reply) {
	if !BoundReply(m.Subject, m.Reply) {
		r.log.Warn("dropped: reply target is not under the sender's own reply subtree", "service", service, "subject", m.Subject)
		return
	}
	var reply Reply
	caller, ok := ParseCaller(r.cfg.Names, service, m.Subject)
	req, err := DecodeRequest(m.Data, r.max)
	switch {
	case !ok:
		reply = refuse("sender mismatch - request rejected")
	case err != nil:
		reply = refuse("%v", err)
	case req.From != caller.Principal():
		r.log.Warn("refused: from.id does not match the subject's sender", "service", service, "subject", m.Subject)
		reply = refuse("sender mismatch - request rejected")
	default:
		ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
		reply = handle(ctx, caller, req)
		cancel()
	}
	if !r.mayAct() {
		return
	}
	b, err := json.Marshal(reply)
	if err != nil {
		b, _ = json.Marshal(refuse("reply does not encode"))
	}
	if err := m.Respond(b); err != nil {
		r.log.Warn("reply failed", "service", service, "subject", m.Subject, "err", err)
	}
}

// stripe is the lock serialising one lifecycle's catch-up copies (their consumer name
// cu_<lifecycle>_<gen> does not name the channel).
func (r *Responders) stripe(lc plane3.Lifecycle) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(lc.Principal() + "." + lc.UID))
	return &r.stripes[h.Sum32()%lifecycleStripes]
}
