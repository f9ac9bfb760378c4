package authority

// The stock prepare-retirement writer (issue 25 item 4; seed 001 "Managed-agent authority
// transport" and "Durable cleanup results"; reference lifecycle-hosted.md §2.6): what
// /manager-service-authority answers a manager-managed-agent-prepare-retirement with, once
// AuthorizeRemoteManagedAgentPrepareRetirement admitted it. Under the target alias's lock (the
// stock writers are serialized per alias: a prepare and an enrollment never interleave on one),
// when the managed grant of target.owner.target.actor still stands at target.lifecycleUid:
//
//  1. fence the lifecycle's ACL row to no reads (Footprint.Fence, a deprovisioner credential
//     pinned to the lifecycle with no member channels), so deliveryd stops routing to it and a
//     durable join its inventory does not see removes its own row;
//  2. read deliveryd's inventory of the lifecycle's membership rows (Footprint.Inventory:
//     lifecycleMemberships on the delivery-admin lane as local.authd), which adds family rows
//     and rows on channels a wildcard grants;
//  3. remove the footprint (Footprint.Deprovision): the two exact durables, the ACL row and the
//     membership rows on the grant's concrete allowSubscribe channels ∪ the inventory's, in
//     batches of at most provision.MaxMemberChannels;
//  4. revoke the managed grant, so the manager's terminal rail finds it gone.
//
// When the inventory cannot be read (no responder, an incomplete list, a timeout, a refusal),
// step 3 still removes what the grant names (and the rows an incomplete list did see), the
// grant is kept and the answer is unavailable: the manager keeps the alias held and retries under
// the same opId. Any slot the removal leaves refused is unavailable too, with the grant kept. The
// lifecycle head is never touched. A grant already absent, or at another uid, is a no-op:
// prepared, nothing revoked, zero counts (a repeat). A grant at this uid in the interactive row
// space is failed-precondition: only managed lifecycles are prepared here.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// Footprint is what the prepare writer asks of the broker and deliveryd for one lifecycle
// owner.actor.uid. authd's service wires the stock one (pkg/provision's one-shot deprovisioner
// credentials through signerd, and pkg/dlvclient on the plane connection).
type Footprint interface {
	// Fence narrows the lifecycle's ACL row to no reads (provision.RunFenceLifecycleACL).
	Fence(ctx context.Context, owner, actor, uid string) (provision.Fence, error)
	// Inventory is deliveryd's lifecycleMemberships (dlvclient.LifecycleMemberships): an
	// incomplete list is returned with dlvclient.ErrIncomplete.
	Inventory(ctx context.Context, owner, actor, uid string) (dlvclient.Inventory, error)
	// Deprovision removes the lifecycle's footprint with membership rows on memberChannels (at
	// most provision.MaxMemberChannels; provision.RunDeprovisionAgent).
	Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error)
}

// ErrReleaseIncomplete is wrapped by every unavailable refusal of PrepareManagedAgentRetirement
// that kept the grant because the release did not finish (the fence, the inventory or a
// footprint slot): its message says what was released and may be shown to the caller.
var ErrReleaseIncomplete = errors.New("the managed agent's release is incomplete; its grant is kept")

// inventoryTimeout bounds the inventory read: deliveryd answers from its index, and a prepare
// that cannot read it in time fails for a retry rather than hold the alias lock.
const inventoryTimeout = 5 * time.Second

// aliasLocks serializes the stock writers per alias (owner.actor).
type aliasLocks struct {
	mu sync.Mutex
	m  map[string]*aliasLock
}

type aliasLock struct {
	mu   sync.Mutex
	refs int
}

// lock takes alias's lock, waiting for ctx at most; unlock releases it.
func (l *aliasLocks) lock(ctx context.Context, alias string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*aliasLock{}
	}
	al := l.m[alias]
	if al == nil {
		al = &aliasLock{}
		l.m[alias] = al
	}
	al.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if al.refs--; al.refs == 0 {
			delete(l.m, alias)
		}
		l.mu.Unlock()
	}
	got := make(chan struct{})
	go func() {
		al.mu.Lock()
		close(got)
	}()
	select {
	case <-got:
		return func() { al.mu.Unlock(); release() }, nil
	case <-ctx.Done():
		go func() { <-got; al.mu.Unlock(); release() }()
		return nil, ctx.Err()
	}
}

// PrepareManagedAgentRetirement is the stock prepare-retirement writer (see the file comment)
// for the authenticated owner. It returns the answer, or an *Error: the decision's refusals,
// failed-precondition for a target alias held by an interactive grant at that uid or a ledger
// row that cannot be read, and unavailable (the grant kept) when this authd does not hold the
// plane claim, no footprint writer is wired, or any step of the release failed.
func (a *Authority) PrepareManagedAgentRetirement(ctx context.Context, owner string, r *managerauthority.PrepareRetirementRequest) (*managerauthority.PrepareRetirementAnswer, error) {
	if _, err := a.AuthorizeRemoteManagedAgentPrepareRetirement(ctx, owner, r); err != nil {
		return nil, err
	}
	if err := a.held(); err != nil {
		return nil, err
	}
	if a.cfg.Footprint == nil {
		return nil, refuse(CodeUnavailable, "this authd has no footprint writer")
	}
	t := r.Target
	unlock, err := a.aliases.lock(ctx, t.Owner+"."+t.Actor)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Msg: "the target alias is busy", Err: err}
	}
	defer unlock()

	ans := &managerauthority.PrepareRetirementAnswer{V: 1, Kind: managerauthority.KindPrepareRetirement, Space: a.cfg.Space,
		Owner: owner, Actor: r.Actor, InstanceID: r.InstanceID, RequestID: r.RequestID, ServeEpoch: r.ServeEpoch,
		Target: t, OpID: r.OpID, Prepared: true, Cleanup: zeroCleanup()}
	row, held, err := a.managedGrant(t)
	if err != nil {
		return nil, err
	}
	if !held {
		a.log.Info("prepare-retirement: no managed grant at the uid; nothing to release", "owner", t.Owner, "actor", t.Actor, "uid", t.LifecycleUID, "opId", r.OpID)
		return ans, nil
	}

	fence, err := a.cfg.Footprint.Fence(ctx, t.Owner, t.Actor, t.LifecycleUID)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Msg: "the lifecycle's ACL row could not be fenced; the grant is kept for a retry", Err: errors.Join(ErrReleaseIncomplete, err)}
	}
	ictx, cancel := context.WithTimeout(ctx, inventoryTimeout)
	inv, ierr := a.cfg.Footprint.Inventory(ictx, t.Owner, t.Actor, t.LifecycleUID)
	cancel()
	channels := grantChannels(row)
	if ierr == nil || errors.Is(ierr, dlvclient.ErrIncomplete) {
		channels = union(channels, inv.Channels)
	}
	res, derr := a.deprovision(ctx, t, channels)
	ans.Cleanup = cleanupOf(res, channels)
	a.log.Info("prepare-retirement: footprint released", "owner", t.Owner, "actor", t.Actor, "uid", t.LifecycleUID, "opId", r.OpID,
		"fence", fence.State, "inventoryComplete", ierr == nil, "memberChannels", len(channels), "result", res.String(), "err", derr)
	switch {
	case derr != nil:
		return nil, &Error{Code: CodeUnavailable, Msg: fmt.Sprintf("the footprint was not fully removed (%s); the grant is kept for a retry", res), Err: errors.Join(ErrReleaseIncomplete, derr)}
	case ierr != nil:
		return nil, &Error{Code: CodeUnavailable, Msg: fmt.Sprintf("deliveryd's membership inventory could not be read: removed what the grant names (%s); the grant is kept for a retry", res), Err: errors.Join(ErrReleaseIncomplete, ierr)}
	}

	// Revoke the grant still at this uid (the alias lock keeps the stock writers out; a row
	// moved by anything else since the first read is left to its writer).
	if _, still, err := a.managedGrant(t); err != nil {
		return nil, err
	} else if still {
		if err := a.cfg.Ledger.Revoke(ledger.Managed, t.Owner, t.Actor); err != nil && !errors.Is(err, ledger.ErrNoRow) {
			return nil, &Error{Code: CodeUnavailable, Msg: "the footprint is released but the managed grant could not be revoked; retry", Err: err}
		}
		ans.Revoked = true
	}
	a.log.Info("prepare-retirement: prepared", "owner", t.Owner, "actor", t.Actor, "uid", t.LifecycleUID, "opId", r.OpID, "revoked", ans.Revoked)
	return ans, nil
}

// managedGrant reads the target alias's row: held when it is a managed row at the target's uid.
// A row of the interactive space at that uid, and a row that cannot be read, are
// failed-precondition.
func (a *Authority) managedGrant(t managerauthority.Target) (ledger.Row, bool, error) {
	row, kind, err := a.cfg.Ledger.Get(t.Owner, t.Actor)
	switch {
	case errors.Is(err, ledger.ErrNoRow):
		return ledger.Row{}, false, nil
	case err != nil:
		return ledger.Row{}, false, &Error{Code: CodeFailedPrecondition, Msg: fmt.Sprintf("the ledger row of %s.%s cannot be read", t.Owner, t.Actor), Err: err}
	case row.LifecycleUID != t.LifecycleUID:
		return ledger.Row{}, false, nil
	case kind != ledger.Managed:
		return ledger.Row{}, false, refuse(CodeFailedPrecondition, "%s.%s at lifecycle %s is an interactive grant, not a managed agent", t.Owner, t.Actor, t.LifecycleUID)
	}
	return row, true, nil
}

// deprovision removes t's footprint with membership rows on channels, in batches of at most
// provision.MaxMemberChannels: the first batch examines the consumers and the ACL row, each
// further batch adds its member slots to the Result (its consumers and ACL row, then absent,
// are not counted twice).
func (a *Authority) deprovision(ctx context.Context, t managerauthority.Target, channels []string) (provision.Result, error) {
	first := channels[:min(len(channels), provision.MaxMemberChannels)]
	res, err := a.cfg.Footprint.Deprovision(ctx, t.Owner, t.Actor, t.LifecycleUID, first)
	errs := []error{err}
	for rest := channels[len(first):]; len(rest) > 0 && ctx.Err() == nil; {
		batch := rest[:min(len(rest), provision.MaxMemberChannels)]
		rest = rest[len(batch):]
		more, err := a.cfg.Footprint.Deprovision(ctx, t.Owner, t.Actor, t.LifecycleUID, batch)
		errs = append(errs, err)
		addMembers(&res, more)
	}
	return res, errors.Join(errs...)
}

// addMembers adds more's member slots to res and its totals.
func addMembers(res *provision.Result, more provision.Result) {
	m := more.Members
	res.Members.Examined += m.Examined
	res.Members.Absent += m.Absent
	res.Members.Deleted += m.Deleted
	res.Members.Disappeared += m.Disappeared
	res.Members.Refused += m.Refused
	res.Examined += m.Examined
	res.Absent += m.Absent
	res.Disappeared += m.Disappeared
	res.Refused += m.Refused
	if res.Deleted != nil {
		d := *res.Deleted + m.Deleted
		res.Deleted = &d
	}
	for _, k := range more.Removed {
		if !slices.Contains(res.Removed, k) {
			res.Removed = append(res.Removed, k)
		}
	}
}

// grantChannels are the concrete channels of row's allowSubscribe (a pattern names no row key).
func grantChannels(row ledger.Row) []string {
	var out []string
	for _, ch := range row.AllowSubscribe {
		if space.ValidateChannel(ch) == nil && !slices.Contains(out, ch) {
			out = append(out, ch)
		}
	}
	return out
}

// union is a followed by b's entries a lacks.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func zeroCleanup() managerauthority.Cleanup {
	zero, czero := 0, 0
	return managerauthority.Cleanup{Deleted: &zero, Consumers: managerauthority.ConsumerCounts{Deleted: &czero}, Channels: []string{}}
}

// cleanupOf is res in the wire's names.
func cleanupOf(res provision.Result, channels []string) managerauthority.Cleanup {
	c := res.Consumers
	kv := func(k provision.KVCounts) managerauthority.KVCounts {
		return managerauthority.KVCounts{Examined: k.Examined, Absent: k.Absent, Deleted: k.Deleted, Disappeared: k.Disappeared, Refused: k.Refused}
	}
	if channels == nil {
		channels = []string{}
	}
	return managerauthority.Cleanup{Examined: res.Examined, Absent: res.Absent, Acknowledged: res.Acknowledged, Deleted: res.Deleted,
		Disappeared: res.Disappeared, Refused: res.Refused,
		Consumers: managerauthority.ConsumerCounts{Examined: c.Examined, Absent: c.Absent, Acknowledged: c.Acknowledged, Deleted: c.Deleted,
			Disappeared: c.Disappeared, Refused: c.Refused},
		ACL: kv(res.ACL), Members: kv(res.Members), Channels: channels}
}
