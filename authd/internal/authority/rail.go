package authority

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// credential (profile retirement-requester). Body, closed:
// {"v":1,"opId","serveEndpoint","serveInstanceId","serveEpoch"}. In order:
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

// maxRailBody bounds a rail request body.
const maxRailBody = 4096

// maxRailInFlight bounds the rail requests served at once; past it a request is answered
// unavailable at once.
const maxRailInFlight = 64

// RetireArgs is the rail body, decoded.
type RetireArgs struct {
	OpID            string
	ServeEndpoint   string
	ServeInstanceID string
	ServeEpoch      uint64
}

// DecodeRetireArgs reads a rail body, untrusted bytes: one JSON object of exactly v (1), opId,
// serveEndpoint, serveInstanceId (strings) and serveEpoch (an integer 0..2^53-1), each present
// once, at most maxRailBody bytes, nothing after it; opId and serveInstanceId in the uid grammar,
// serveEndpoint an endpoint name.
func DecodeRetireArgs(b []byte) (RetireArgs, error) {
	if len(b) > maxRailBody {
		return RetireArgs{}, fmt.Errorf("a body of %d bytes (at most %d)", len(b), maxRailBody)
	}
	var w struct {
		V               *int    `json:"v"`
		OpID            *string `json:"opId"`
		ServeEndpoint   *string `json:"serveEndpoint"`
		ServeInstanceID *string `json:"serveInstanceId"`
		ServeEpoch      *uint64 `json:"serveEpoch"`
	}
	if !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
		return RetireArgs{}, errors.New("the body must be one JSON object")
	}
	if err := checkNoDuplicateKeys(b); err != nil {
		return RetireArgs{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return RetireArgs{}, errors.New("the body is not a closed object of v, opId, serveEndpoint, serveInstanceId, serveEpoch")
	}
	if _, err := dec.Token(); err != io.EOF {
		return RetireArgs{}, errors.New("the body has data after its JSON object")
	}
	switch {
	case w.V == nil || *w.V != 1:
		return RetireArgs{}, errors.New("v must be 1")
	case w.OpID == nil || w.ServeEndpoint == nil || w.ServeInstanceID == nil || w.ServeEpoch == nil:
		return RetireArgs{}, errors.New("opId, serveEndpoint, serveInstanceId and serveEpoch are required")
	case *w.ServeEpoch > lifecycle.MaxSafeInteger:
		return RetireArgs{}, errors.New("serveEpoch is above 2^53-1")
	}
	if err := space.ValidateUID(*w.OpID); err != nil {
		return RetireArgs{}, fmt.Errorf("opId: %w", err)
	}
	if _, err := lifecycle.EndpointToken(*w.ServeEndpoint); err != nil {
		return RetireArgs{}, fmt.Errorf("serveEndpoint: %w", err)
	}
	if err := space.ValidateUID(*w.ServeInstanceID); err != nil {
		return RetireArgs{}, fmt.Errorf("serveInstanceId: %w", err)
	}
	return RetireArgs{OpID: *w.OpID, ServeEndpoint: *w.ServeEndpoint, ServeInstanceID: *w.ServeInstanceID, ServeEpoch: *w.ServeEpoch}, nil
}

// checkNoDuplicateKeys refuses an object with a key twice at its top level (encoding/json keeps
// the last, so a body could say two things).
func checkNoDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New("the body must be one JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errors.New("the body is not JSON")
		}
		k, _ := t.(string)
		if seen[k] {
			return fmt.Errorf("field %q appears twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return errors.New("the body is not JSON")
		}
	}
	return nil
}

// RailResult is a rail success's result.
type RailResult struct {
	Retired           bool     `json:"retired"`
	LifecycleUID      string   `json:"lifecycleUid"`
	OpID              string   `json:"opId"`
	EvictedPrincipals []string `json:"evictedPrincipals"`
}

// RailReply is the rail's answer envelope.
type RailReply struct {
	V      int         `json:"v"`
	OK     bool        `json:"ok"`
	Result *RailResult `json:"result,omitempty"`
	Code   Code        `json:"code,omitempty"`
	Error  string      `json:"error,omitempty"`
}

// ServeRetireRail subscribes the rail on nc (the plane connection) in queue space.AuthRailQueue
// and flushes, so a request sent after it returns is served. Each request is served on its own
// goroutine (at most maxRailInFlight at once) and waits for its flight on the plane's context.
func (a *Authority) ServeRetireRail(ctx context.Context, nc *nats.Conn) (*nats.Subscription, error) {
	sem := make(chan struct{}, maxRailInFlight)
	sub, err := nc.QueueSubscribe(a.names.RetireLifecycleServe(), space.AuthRailQueue, func(m *nats.Msg) {
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
	if err != nil {
		return nil, fmt.Errorf("authority: subscribe the retire rail: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("authority: flush the retire rail: %w", err)
	}
	if err := nc.LastError(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("authority: the retire rail subscription was refused: %w", err)
	}
	return sub, nil
}

// replyRail publishes r on the request subject's reply subject, the only one it answers on.
func (a *Authority) replyRail(nc *nats.Conn, subject string, r RailReply) {
	b, err := json.Marshal(r)
	if err == nil {
		err = nc.Publish(space.RailReply(subject), b)
	}
	if err != nil {
		a.log.Warn("retire rail: reply not sent", "err", err)
	}
}

func failReply(err error) RailReply {
	return RailReply{V: 1, Code: CodeOf(err), Error: publicMessage(err)}
}

// HandleRetireRail decides one rail request (steps 1-5 above) and returns its answer.
func (a *Authority) HandleRetireRail(ctx context.Context, subject string, body []byte) RailReply {
	res, err := a.handleRetireRail(ctx, subject, body)
	if err != nil {
		a.log.Info("retire rail refused", "code", CodeOf(err), "err", err)
		return failReply(err)
	}
	return RailReply{V: 1, OK: true, Result: &res}
}

func (a *Authority) handleRetireRail(ctx context.Context, subject string, body []byte) (RailResult, error) {
	r, err := a.names.ParseRetireLifecycle(subject)
	if err != nil {
		return RailResult{}, refuse(CodeBadRequest, "not a retire-lifecycle subject")
	}
	args, err := DecodeRetireArgs(body)
	if err != nil {
		return RailResult{}, refuse(CodeBadRequest, "%v", err)
	}
	opID, err := lifecycle.ManagedRetirementOpID(r.TargetUID)
	if err != nil {
		return RailResult{}, refuse(CodeBadRequest, "%v", err)
	}
	if args.OpID != opID {
		return RailResult{}, refuse(CodePermissionDenied, "opId %s is not the managed retirement of %s", args.OpID, r.TargetUID)
	}
	g, _, found, err := a.store.EndpointGate(ctx, args.ServeEndpoint, args.ServeInstanceID)
	switch {
	case err != nil:
		return RailResult{}, unavailable("the endpoint gate could not be read", err)
	case !found:
		return RailResult{}, refuse(CodeFailedPrecondition, "endpoint %s instance %s is not registered", args.ServeEndpoint, args.ServeInstanceID)
	case g.State != lifecycle.GateOpen:
		return RailResult{}, &Error{Code: CodeFailedPrecondition, Msg: fmt.Sprintf("endpoint %s instance %s is %s", args.ServeEndpoint, args.ServeInstanceID, g.State), GateState: g.State}
	case g.Principal != r.CallerOwner+"."+r.CallerActor:
		return RailResult{}, refuse(CodePermissionDenied, "endpoint %s instance %s is not served by %s.%s", args.ServeEndpoint, args.ServeInstanceID, r.CallerOwner, r.CallerActor)
	case g.ProcessEpoch != args.ServeEpoch:
		return RailResult{}, refuse(CodeExpired, "serve epoch %d is not the current %d", args.ServeEpoch, g.ProcessEpoch)
	}
	h, _, found, err := a.store.Head(ctx, r.TargetOwner, r.TargetActor)
	switch {
	case err != nil:
		return RailResult{}, unavailable("the lifecycle head could not be read", err)
	case !found:
		return RailResult{}, refuse(CodeFailedPrecondition, "%s.%s has no lifecycle", r.TargetOwner, r.TargetActor)
	case h.LifecycleUID != r.TargetUID:
		return RailResult{}, refuse(CodeExpired, "%s.%s is at another lifecycle", r.TargetOwner, r.TargetActor)
	case h.State == lifecycle.HeadRetired:
		return RailResult{Retired: true, LifecycleUID: r.TargetUID, OpID: opID, EvictedPrincipals: []string{}}, nil
	}
	a.log.Info("retire rail: retirement requested", "target", r.TargetOwner+"."+r.TargetActor, "uid", r.TargetUID,
		"caller", r.CallerOwner+"."+r.CallerActor, "caller_uid", r.CallerUID, "endpoint", args.ServeEndpoint, "instance", args.ServeInstanceID)
	res, err := a.Retire(ctx, r.TargetOwner, r.TargetActor, r.TargetUID)
	if err != nil {
		return RailResult{}, err
	}
	return RailResult{Retired: true, LifecycleUID: r.TargetUID, OpID: opID, EvictedPrincipals: res.EvictedPrincipals}, nil
}
