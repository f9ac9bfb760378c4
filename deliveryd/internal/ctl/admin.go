package ctl

import (
	"context"
	"encoding/json"

	"github.com/cotalgo/cotal/deliveryd/internal/evict"
)

// Executor runs the $SYS verbs (deliveryd/internal/evict's *Executor).
type Executor interface {
	Evict(ctx context.Context, principal string) (evict.EvictResult, error)
	PrincipalLiveness(ctx context.Context, principal string) (evict.LivenessResult, error)
	PlaneConnLiveness(ctx context.Context, q evict.PlaneQuery) (evict.PlaneResult, error)
}

// ctl.delivery-admin ops.
const (
	OpReloadCreds         = "reloadCreds"
	OpReloadStoreIdentity = "reloadStoreIdentity"
	OpEvictPrincipal      = "evictPrincipal"
	OpPrincipalLiveness   = "principalLiveness"
	OpPlaneConnLiveness   = "planeConnLiveness"
)

// BrokerAccepted is the credential a renewal proved on the broker; times are Unix seconds.
type BrokerAccepted struct {
	Identity string `json:"identity"`
	IssuedAt int64  `json:"iat"`
	Expires  int64  `json:"exp"`
}

// ComponentResult is one credential component of reloadCreds.
type ComponentResult struct {
	OK             bool            `json:"ok"`
	Skipped        bool            `json:"skipped,omitempty"`
	BrokerAccepted *BrokerAccepted `json:"brokerAccepted,omitempty"`
	Error          string          `json:"error,omitempty"`
}

// ReloadResult is reloadCreds' data. The membership component is always skipped: the membership
// feed's membership-rw credential renews itself on its own signerd rail (deliveryd/internal/
// membership), so the manager has nothing to hand it.
type ReloadResult struct {
	Delivery   ComponentResult `json:"delivery"`
	Membership ComponentResult `json:"membership"`
}

// StoreIdentity is reloadStoreIdentity's data: where the daemon's credential comes from (upstream
// names a secret store; ours is the signer): {kind:"signer", endpoint}, or, in a hosted context
// that declared its store, {kind:"injected", identity}.
type StoreIdentity struct {
	Kind     string `json:"kind"`
	Endpoint string `json:"endpoint,omitempty"`
	Identity string `json:"identity,omitempty"`
}

// ErrNotStarted is reloadCreds' refusal before the daemon has finished starting.
const ErrNotStarted = "this daemon has not finished starting"

// admin dispatches one ctl.delivery-admin request. The broker lets only a supervisor credential
// publish here, for its own principal; the envelope checks have run.
func (r *Responders) admin(ctx context.Context, _ Caller, req Request) Reply {
	switch req.Op {
	case OpReloadCreds:
		return r.reloadCreds(ctx)
	case OpReloadStoreIdentity:
		if r.cfg.InjectedStore != "" {
			return okReply(StoreIdentity{Kind: "injected", Identity: r.cfg.InjectedStore})
		}
		if r.cfg.StoreIdentity == "" {
			return refuse("reloadStoreIdentity: no signer endpoint wired")
		}
		return okReply(StoreIdentity{Kind: "signer", Endpoint: r.cfg.StoreIdentity})
	case OpEvictPrincipal, OpPrincipalLiveness, OpPlaneConnLiveness:
		return r.sys(ctx, req)
	default:
		return refuse("unsupported delivery-admin op %q", req.Op)
	}
}

// reloadCreds renews the delivery credential now (upstream proves the delivery and membership
// components; here membership is skipped, see ReloadResult). Any failure is a top-level ok:false carrying the
// component results. Before the daemon has finished starting it is refused and adopts nothing
// (upstream: the lease can be ready before the watch binds; the next renewal pass adopts).
func (r *Responders) reloadCreds(ctx context.Context) Reply {
	if r.cfg.Started != nil && !r.cfg.Started() {
		return refuse("reloadCreds: %s", ErrNotStarted)
	}
	if r.cfg.Renewer == nil {
		return refuse("reloadCreds: no renewer wired")
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultRenewTimeout)
	defer cancel()
	res := ReloadResult{Membership: ComponentResult{OK: true, Skipped: true}}
	p, err := r.cfg.Renewer.RenewNow(ctx)
	if err != nil {
		r.log.Warn("reloadCreds: renewal failed", "err", err)
		res.Delivery = ComponentResult{Error: err.Error()}
		return Reply{Data: res, Error: "reloadCreds: delivery: " + err.Error()}
	}
	res.Delivery = ComponentResult{OK: true, BrokerAccepted: &BrokerAccepted{
		Identity: p.Identity, IssuedAt: p.IssuedAt.Unix(), Expires: p.Expires.Unix()}}
	return okReply(res)
}

// sys runs one $SYS verb on the executor; with none wired each refuses loudly, as upstream.
func (r *Responders) sys(ctx context.Context, req Request) Reply {
	if r.cfg.Executor == nil {
		return refuse("%s: %v", req.Op, evict.ErrNotWired)
	}
	// A fenced daemon kicks nothing and reads nothing for anyone.
	if !r.mayAct() {
		return refuse("%s: %v", req.Op, ErrQuiesced)
	}
	var (
		data any
		err  error
	)
	switch req.Op {
	case OpPlaneConnLiveness:
		raw, ok := req.Args["query"]
		if !ok {
			return refuse("planeConnLiveness: args.query is required")
		}
		q, perr := evict.ParsePlaneQuery(raw)
		if perr != nil {
			return refuse("planeConnLiveness: %v", perr)
		}
		data, err = r.cfg.Executor.PlaneConnLiveness(ctx, q)
	default:
		var principal string
		if raw, ok := req.Args["principal"]; !ok || json.Unmarshal(raw, &principal) != nil {
			return refuse("%s: args.principal (owner.actor) is required", req.Op)
		}
		if perr := evict.ParsePrincipal(principal); perr != nil {
			return refuse("%s: %v", req.Op, perr)
		}
		if req.Op == OpEvictPrincipal {
			var res evict.EvictResult
			res, err = r.cfg.Executor.Evict(ctx, principal)
			if err == nil && !res.VerifiedGone {
				// A kick has no ack: only a complete re-scan proves the principal gone.
				return Reply{Data: res, Error: "evictPrincipal: not verified gone (a connection remains or the scan was incomplete)"}
			}
			data = res
		} else {
			data, err = r.cfg.Executor.PrincipalLiveness(ctx, principal)
		}
	}
	if err != nil {
		r.log.Warn("delivery-admin: $SYS verb failed", "op", req.Op, "err", err)
		return refuse("%s: %v", req.Op, err)
	}
	return okReply(data)
}
