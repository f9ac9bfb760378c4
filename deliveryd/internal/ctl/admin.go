package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/cotalgo/cotal/deliveryd/internal/evict"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
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
	// OpLifecycleMemberships is the read-only footprint inventory (issue 25): the channels of
	// every membership row one lifecycle holds in the members bucket.
	OpLifecycleMemberships = "lifecycleMemberships"
)

// AuthdPrincipal is authd's plane principal (pkg/profiles' auth-plane credential,
// local.authd). Its credential may publish its own request subject on this lane, and the lane
// answers it lifecycleMemberships alone: every other op is refused for it.
const AuthdPrincipal = profiles.AuthPlaneOwner + "." + profiles.AuthPlaneActor

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
// (for its own principal) and authd's plane credential (as local.authd) publish here; the
// envelope checks have run. The lane carries every op on one subject, so authd's credential
// could send any of them: it is answered lifecycleMemberships alone.
func (r *Responders) admin(ctx context.Context, c Caller, req Request) Reply {
	if c.Principal() == AuthdPrincipal && req.Op != OpLifecycleMemberships {
		r.log.Warn("refused: an admin op outside authd's one", "op", req.Op, "principal", c.Principal())
		return refuse("%s may ask only %s on the delivery-admin lane", AuthdPrincipal, OpLifecycleMemberships)
	}
	switch req.Op {
	case OpLifecycleMemberships:
		return r.lifecycleMemberships(ctx, c, req.Args)
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

// LifecycleMemberships is lifecycleMemberships' data: the lifecycle asked about and the channel
// of every membership row it holds in cotal_members_<t> (one key per channel,
// <channel>/<owner>.<actor>.<uid>), sorted: open rows, tombstones and rows that do not decode
// alike, since each is part of its footprint. Complete is false when the listing may miss a row
// (the members bucket could not be read, the daemon's index of it could not catch up with the
// bucket, or the list was cut to fit a reply); Channels then holds what was seen, every one a
// row that existed, and a caller must not take the list for the whole footprint.
type LifecycleMemberships struct {
	Owner        string   `json:"owner"`
	Actor        string   `json:"actor"`
	LifecycleUID string   `json:"lifecycleUid"`
	Channels     []string `json:"channels"`
	Complete     bool     `json:"complete"`
}

// lifecycleMembershipsFields are the only args lifecycleMemberships takes.
var lifecycleMembershipsFields = []string{"owner", "actor", "lifecycleUid"}

// DecodeLifecycleMembershipsArgs reads lifecycleMemberships' args, closed: exactly owner, actor
// and lifecycleUid, each a JSON string; owner a real principal owner ("local" or a derived u_
// owner, as ParseCaller requires of a caller), actor and lifecycleUid in their pkg/space
// grammars. An unknown, missing or mistyped field or a value outside its grammar is an error
// matching ErrBadRequest whose text is safe to send back (a value is quoted at most 64 bytes).
func DecodeLifecycleMembershipsArgs(args map[string]json.RawMessage) (plane3.Lifecycle, error) {
	bad := func(format string, a ...any) (plane3.Lifecycle, error) {
		return plane3.Lifecycle{}, fmt.Errorf("%w: %s: %s", ErrBadRequest, OpLifecycleMemberships, fmt.Sprintf(format, a...))
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(lifecycleMembershipsFields, k) {
			return bad("unknown field %.64q (args take owner, actor and lifecycleUid only)", k)
		}
	}
	var v [3]string
	for i, k := range lifecycleMembershipsFields {
		raw, ok := args[k]
		if !ok {
			return bad("%s is required", k)
		}
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '"' || json.Unmarshal(raw, &v[i]) != nil {
			return bad("%s must be a string", k)
		}
	}
	owner, actor, uid := v[0], v[1], v[2]
	if err := space.ValidateOwner(owner); err != nil || (owner != "local" && space.ValidateDerivedOwner(owner) != nil) {
		return bad("owner %.64q is not a principal owner (local or a derived u_ owner)", owner)
	}
	if err := space.ValidateActor(actor); err != nil {
		return bad("actor %.64q: %v", actor, err)
	}
	if err := space.ValidateUID(uid); err != nil {
		return bad("lifecycleUid %.64q: %v", uid, err)
	}
	return plane3.Lifecycle{Owner: owner, Actor: actor, UID: uid}, nil
}

// lifecycleMemberships answers the inventory of one lifecycle's membership rows, read from the
// members index once it holds the bucket's last revision (so as fresh as a listing of the
// bucket's keys, without a watch per request). It reads and writes nothing else. When the
// listing may miss a row it answers ok with complete:false and what it saw, and logs why.
func (r *Responders) lifecycleMemberships(ctx context.Context, c Caller, args map[string]json.RawMessage) Reply {
	lc, err := DecodeLifecycleMembershipsArgs(args)
	if err != nil {
		return refuse("%v", err)
	}
	res := LifecycleMemberships{Owner: lc.Owner, Actor: lc.Actor, LifecycleUID: lc.UID, Channels: []string{}}
	var last uint64
	if r.listFault != nil {
		err = r.listFault()
	}
	if err == nil {
		last, err = r.membersLastSeq(ctx)
	}
	if err != nil {
		r.log.Warn("lifecycleMemberships: the members bucket cannot be listed", "principal", c.Principal(), "err", err)
		return okReply(res)
	}
	chs, err := r.idx.channels(ctx, lc, last)
	res.Channels = append(res.Channels, chs...)
	if err != nil {
		r.log.Warn("lifecycleMemberships: the listing may miss rows", "principal", c.Principal(), "err", err)
		return okReply(res)
	}
	// The reply must fit the connection's max_payload: a list cut to fit is incomplete.
	room, used := r.maxPayload*9/10-1024, 0
	for i, ch := range res.Channels {
		if used += len(ch) + 3; r.maxPayload > 0 && used > room {
			r.log.Warn("lifecycleMemberships: list cut to fit a reply", "principal", c.Principal(), "rows", len(res.Channels), "sent", i)
			res.Channels = res.Channels[:i]
			return okReply(res)
		}
	}
	res.Complete = true
	return okReply(res)
}
