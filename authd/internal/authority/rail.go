package authority

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// The retire-lifecycle rail (reference lifecycle-hosted.md §2.4; issue 23 item 7): a remote
// manager's retirement requester asks authd to retire one managed lifecycle it serves.
//
// Subject cotal.<t>.ep.one.auth.retire-lifecycle.handle.<tO>.<tA>.<tUid>.<cO>.<cA>.<cUid>.<nonce>:
// the target and the caller come only from the subject, which the broker pins to the requester's
// credential (profile retirement-requester). The body and the answer are pkg/lifecycle's
// retire-lifecycle wire (DecodeRetireLifecycleRequest, EncodeRetireLifecycleReply). In order:
//
//  1. the subject must parse exactly (bad-request);
//  2. the body must decode (bad-request);
//  3. opId must be ManagedRetirementOpID(tUid), else permission-denied, before any read;
//  4. the endpoint gate epgate.<serveEndpoint>.<serveInstanceId>, leader-read: a read error is
//     unavailable; absent, retired or frozen is failed-precondition (upstream names absent and
//     retired; a frozen gate is a registration in progress, which admits no one either); a
//     principal other than <cO>.<cA> is permission-denied; a processEpoch other than serveEpoch
//     is expired;
//  5. the head of <tO>.<tA>: absent is failed-precondition; retired at tUid is success with no
//     evicted principal; at another uid expired; then the barrier (Retire), whose own reads
//     refuse a gate frozen by a foreign op (conflict) and whose flight refuses the same opId for
//     other coordinates (conflict);
//  6. the answer {"v":1,"ok":true,"result":{"retired":true,"lifecycleUid","opId",
//     "evictedPrincipals"}} or {"v":1,"ok":false,"code","error"}, published only on
//     <request subject>.reply (space.RailReply), never on a reply subject the request names.
//
// The binding is alias-level, as upstream's: a zombie of the same principal holding the current
// epoch passes. The caller's own uid (cUid) is carried for the audit line, not checked.

// maxRailInFlight bounds the rail requests served at once; past it a request is answered
// unavailable at once.
const maxRailInFlight = 64

// ServeRetireRail subscribes the rail on nc (the plane connection) in queue space.AuthRailQueue
// and flushes, so a request sent after it returns is served. Each request is served on its own
// goroutine (at most maxRailInFlight at once) and waits for its flight on the plane's context.
func (a *Authority) ServeRetireRail(ctx context.Context, nc *nats.Conn) (*nats.Subscription, error) {
	sem := make(chan struct{}, maxRailInFlight)
	return subscribeRail(ctx, nc, a.names.RetireLifecycleServe(), "retire", func(m *nats.Msg) {
		select {
		case sem <- struct{}{}:
		default:
			a.replyRail(nc, m.Subject, failReply(refuse(CodeUnavailable, "too many retirement requests in flight")))
			return
		}
		go func() {
			defer func() { <-sem }()
			a.replyRail(nc, m.Subject, a.HandleRetireRail(a.ctx, m.Subject, m.Data))
		}()
	})
}

// subscribeRail subscribes one auth rail's serve pattern in queue space.AuthRailQueue and
// confirms it with the broker (a flush bounded by ctx and 10 s, then the connection's last
// error: a refused subscription shows there), unsubscribing again if either fails.
func subscribeRail(ctx context.Context, nc *nats.Conn, pattern, what string, handle nats.MsgHandler) (*nats.Subscription, error) {
	sub, err := nc.QueueSubscribe(pattern, space.AuthRailQueue, handle)
	if err != nil {
		return nil, fmt.Errorf("authority: subscribe the %s rail: %w", what, err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("authority: flush the %s rail: %w", what, err)
	}
	if err := nc.LastError(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("authority: the %s rail subscription was refused: %w", what, err)
	}
	return sub, nil
}

// replyRail publishes r on the request subject's reply subject, the only one it answers on.
func (a *Authority) replyRail(nc *nats.Conn, subject string, r lifecycle.RetireLifecycleReply) {
	b, err := lifecycle.EncodeRetireLifecycleReply(r)
	if err == nil {
		err = nc.Publish(space.RailReply(subject), b)
	}
	if err != nil {
		a.log.Warn("retire rail: reply not sent", "err", err)
	}
}

func failReply(err error) lifecycle.RetireLifecycleReply {
	return lifecycle.RetireLifecycleReply{Code: string(CodeOf(err)), Error: publicMessage(err)}
}

// HandleRetireRail decides one rail request (steps 1-5 above) and returns its answer.
func (a *Authority) HandleRetireRail(ctx context.Context, subject string, body []byte) lifecycle.RetireLifecycleReply {
	res, err := a.handleRetireRail(ctx, subject, body)
	if err != nil {
		a.log.Info("retire rail refused", "code", CodeOf(err), "err", err)
		return failReply(err)
	}
	return lifecycle.RetireLifecycleReply{OK: true, Result: res}
}

func (a *Authority) handleRetireRail(ctx context.Context, subject string, body []byte) (lifecycle.RetireLifecycleResult, error) {
	type result = lifecycle.RetireLifecycleResult
	r, err := a.names.ParseRetireLifecycle(subject)
	if err != nil {
		return result{}, refuse(CodeBadRequest, "not a retire-lifecycle subject")
	}
	args, err := lifecycle.DecodeRetireLifecycleRequest(body)
	if err != nil {
		return result{}, refuse(CodeBadRequest, "%v", err)
	}
	opID, err := lifecycle.ManagedRetirementOpID(r.TargetUID)
	if err != nil {
		return result{}, refuse(CodeBadRequest, "%v", err)
	}
	if args.OpID != opID {
		return result{}, refuse(CodePermissionDenied, "opId %s is not the managed retirement of %s", args.OpID, r.TargetUID)
	}
	g, _, found, err := a.store.EndpointGate(ctx, args.ServeEndpoint, args.ServeInstanceID)
	switch {
	case err != nil:
		return result{}, unavailable("the endpoint gate could not be read", err)
	case !found:
		return result{}, refuse(CodeFailedPrecondition, "endpoint %s instance %s is not registered", args.ServeEndpoint, args.ServeInstanceID)
	case g.State != lifecycle.GateOpen:
		return result{}, &Error{Code: CodeFailedPrecondition, Msg: fmt.Sprintf("endpoint %s instance %s is %s", args.ServeEndpoint, args.ServeInstanceID, g.State), GateState: g.State}
	case g.Principal != r.CallerOwner+"."+r.CallerActor:
		return result{}, refuse(CodePermissionDenied, "endpoint %s instance %s is not served by %s.%s", args.ServeEndpoint, args.ServeInstanceID, r.CallerOwner, r.CallerActor)
	case g.ProcessEpoch != args.ServeEpoch:
		return result{}, refuse(CodeExpired, "serve epoch %d is not the current %d", args.ServeEpoch, g.ProcessEpoch)
	}
	h, _, found, err := a.store.Head(ctx, r.TargetOwner, r.TargetActor)
	switch {
	case err != nil:
		return result{}, unavailable("the lifecycle head could not be read", err)
	case !found:
		return result{}, refuse(CodeFailedPrecondition, "%s.%s has no lifecycle", r.TargetOwner, r.TargetActor)
	case h.LifecycleUID != r.TargetUID:
		return result{}, refuse(CodeExpired, "%s.%s is at another lifecycle", r.TargetOwner, r.TargetActor)
	case h.State == lifecycle.HeadRetired:
		return result{LifecycleUID: r.TargetUID, OpID: opID, EvictedPrincipals: []string{}}, nil
	}
	a.log.Info("retire rail: retirement requested", "target", r.TargetOwner+"."+r.TargetActor, "uid", r.TargetUID,
		"caller", r.CallerOwner+"."+r.CallerActor, "caller_uid", r.CallerUID, "endpoint", args.ServeEndpoint, "instance", args.ServeInstanceID)
	res, err := a.Retire(ctx, r.TargetOwner, r.TargetActor, r.TargetUID)
	if err != nil {
		return result{}, err
	}
	return result{LifecycleUID: r.TargetUID, OpID: opID, EvictedPrincipals: res.EvictedPrincipals}, nil
}
