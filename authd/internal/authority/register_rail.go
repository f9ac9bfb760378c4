package authority

// The register-manager rail (issue 23 item 8): cotal.<t>.ep.one.auth.register-manager.<o>.<a>.<nonce>
// (space.Names.RegisterManager), served in queue space.AuthRailQueue. The caller's principal
// <o>.<a> comes only from the subject, where the broker pinned it to the caller's credential (a
// supervisor may publish only its own); the body is lifecycle's closed {"v":1,"instanceId"}. The
// order:
//
//  1. the subject parses (space.Names.ParseRegisterManager), else bad-request;
//  2. the body decodes (lifecycle.DecodeRegisterManagerRequest), else bad-request, no read;
//  3. lease.<instanceId> (manager bucket) is read: absent, or held by another principal than
//     <o>.<a>, is permission-denied with nothing written; an unreadable or corrupt lease row is
//     unavailable;
//  4. RegisterEndpoint(lifecycle.ManagerEndpoint, instanceId, "<o>.<a>"): the lease holder is the
//     gate's principal.
//
// The answer (lifecycle.EncodeRegisterManagerReply) goes only to space.RailReply(subject), never
// to a reply subject the message carries. It carries no registration proof: the proof payload
// binds a manager lifecycle uid and the nkeys of five manager actors, which a Go managerd does not
// have (see pkg/lifecycle's rail comment); CurrentProof serves the callers that do.

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// registerRailTimeout bounds one register-manager request's reads and writes.
const registerRailTimeout = 30 * time.Second

// ServeRegisterManager subscribes the register-manager rail on nc in queue space.AuthRailQueue
// and confirms the subscription with the broker (subscribeRail). Each request runs under ctx (bounded by 30 s);
// requests are served one at a time. The caller drains or unsubscribes the subscription.
func (a *Authority) ServeRegisterManager(ctx context.Context, nc *nats.Conn) (*nats.Subscription, error) {
	return subscribeRail(ctx, nc, a.names.RegisterManagerServe(), "register-manager", func(m *nats.Msg) {
		rctx, cancel := context.WithTimeout(ctx, registerRailTimeout)
		defer cancel()
		a.answerRegisterManager(rctx, nc, m)
	})
}

// answerRegisterManager handles one request and publishes its answer on RailReply(subject).
func (a *Authority) answerRegisterManager(ctx context.Context, nc *nats.Conn, m *nats.Msg) {
	var reply lifecycle.RegisterManagerReply
	res, err := a.RegisterManager(ctx, m.Subject, m.Data)
	if err != nil {
		reply = lifecycle.RegisterManagerReply{Code: string(CodeOf(err)), Error: err.Error()}
	} else {
		reply = lifecycle.RegisterManagerReply{OK: true, Result: res}
	}
	b, err := lifecycle.EncodeRegisterManagerReply(reply)
	if err != nil {
		a.log.Error("register-manager: the answer does not encode", "err", err)
		return
	}
	if err := nc.Publish(space.RailReply(m.Subject), b); err != nil {
		a.log.Warn("register-manager: the answer was not sent", "err", err)
	}
}

// RegisterManager is the rail's decision for one request on subject with body (the steps of the
// file comment), without the transport: what ServeRegisterManager answers.
func (a *Authority) RegisterManager(ctx context.Context, subject string, body []byte) (lifecycle.RegisterManagerResult, error) {
	owner, actor, _, err := a.names.ParseRegisterManager(subject)
	if err != nil {
		return lifecycle.RegisterManagerResult{}, refuse(CodeBadRequest, "not a register-manager subject of this space")
	}
	req, err := lifecycle.DecodeRegisterManagerRequest(body)
	if err != nil {
		return lifecycle.RegisterManagerResult{}, refuse(CodeBadRequest, "%v", err)
	}
	principal := owner + "." + actor
	lease, _, found, err := a.store.Lease(ctx, req.InstanceID)
	switch {
	case err != nil:
		return lifecycle.RegisterManagerResult{}, &Error{Code: CodeUnavailable, Msg: "the instance lease could not be read", Err: err}
	case !found:
		return lifecycle.RegisterManagerResult{}, refuse(CodePermissionDenied, "no manager holds the lease of instance %s", req.InstanceID)
	case lease.Holder != principal:
		return lifecycle.RegisterManagerResult{}, refuse(CodePermissionDenied, "the lease of instance %s is not held by %s", req.InstanceID, principal)
	}
	reg, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, req.InstanceID, principal)
	if err != nil {
		return lifecycle.RegisterManagerResult{}, err
	}
	return lifecycle.RegisterManagerResult{InstanceID: req.InstanceID, ProcessEpoch: reg.ProcessEpoch,
		RegistrationRevision: reg.RegistrationRevision, Generation: reg.Generation}, nil
}
