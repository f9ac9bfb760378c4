package authority

// Interactive manager selection (issue 23 item 9; reference lifecycle-hosted.md §3.4; seed 001
// "Interactive manager primary"): which manager instance a manager-caller bearer is bound to.
//
// A manager instance is live when all of these hold, read leader-served in this order:
//   - its endpoint gate epgate.manager.<iid> is open;
//   - its spec svc.manager.<iid> names the gate's principal, carries the gate's processEpoch,
//     and its KV revision is the gate's registrationRevision;
//   - its lease lease.<iid> (manager bucket) is held by the gate's principal and carries the
//     gate's processEpoch and registrationRevision (a lease row without them, written by a
//     managerd that does not register, is not live).
//
// A candidate is an instance whose gate principal's owner is the requesting owner; an instance of
// another owner is never a candidate, and the refusal does not say whether it exists.
//
// Remote-first (the default, upstream selectManagerInstance):
//   - an explicit managerInstanceId must be a live candidate, else refused;
//   - otherwise the remote candidates (every epgate.manager.* key, listed by STREAM.INFO with a
//     subjects filter, bounded by MaxManagerGates, but the local instance): exactly one live is
//     chosen; more than one live is refused (the caller must name one); some but none live is
//     refused;
//   - no remote candidate: the local instance (Inputs.LocalManager) if it is a live candidate,
//     refused if it is not; no local manager at all is refused with CodeNotFound. (Go decides
//     "no binding" as a refusal: a manager-caller bearer must carry act.managerInstanceId, so an
//     unbound one could never be verified.)
//
// Local-primary (SelectLocalPrimary), for an unpinned human exchange only: the local instance if it
// is a live candidate, else refused (absent, unreadable, another space, not live), without listing
// or reading any remote gate. An explicit managerInstanceId and every agent-arm exchange keep the
// remote-first rules.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Selection policies (authd RuntimeOptions.InteractiveManagerSelection).
const (
	// SelectRemoteFirst is the default: upstream's remote-first selection.
	SelectRemoteFirst = ""
	// SelectLocalPrimary binds an unpinned human exchange to the local managerd.
	SelectLocalPrimary = "local-primary"
)

// MaxManagerGates bounds the manager gates a remote listing may return; a space with more is
// refused (unavailable) rather than read partially.
const MaxManagerGates = 1024

// CheckSelectionPolicy refuses a policy other than SelectRemoteFirst and SelectLocalPrimary, and
// SelectLocalPrimary without a local manager reader.
func CheckSelectionPolicy(policy string, local LocalManager) error {
	switch policy {
	case SelectRemoteFirst:
		return nil
	case SelectLocalPrimary:
		if local == nil {
			return errors.New("authority: interactive manager selection \"local-primary\" needs a local manager reader")
		}
		return nil
	}
	return fmt.Errorf("authority: interactive manager selection %.40q is not \"\" (remote-first) or %q", policy, SelectLocalPrimary)
}

// SelectorConfig is what a Selector needs. Store is required.
type SelectorConfig struct {
	// Store reads the gates, specs and leases.
	Store *Store
	// Policy is SelectRemoteFirst or SelectLocalPrimary (CheckSelectionPolicy).
	Policy string
	// Local reads the local managerd's identity afresh on every selection that needs it; nil
	// means there is no local manager (a hosted context).
	Local LocalManager
}

// Selector picks the manager instance a manager-caller bearer is bound to. It keeps no state
// between calls and is safe for concurrent use.
type Selector struct {
	store  *Store
	policy string
	local  LocalManager
}

// NewSelector checks cfg and returns the selector.
func NewSelector(cfg SelectorConfig) (*Selector, error) {
	if cfg.Store == nil {
		return nil, errors.New("authority: a selector needs a store")
	}
	if err := CheckSelectionPolicy(cfg.Policy, cfg.Local); err != nil {
		return nil, err
	}
	return &Selector{store: cfg.Store, policy: cfg.Policy, local: cfg.Local}, nil
}

// Selection is one manager-caller exchange's request.
type Selection struct {
	// Owner is the bearer's owner (derived from the IdP token, or the managed row's).
	Owner string
	// Human is true for the human (IdP) arm, false for the agent arm.
	Human bool
	// InstanceID is the explicit managerInstanceId, "" for none.
	InstanceID string
}

// Select returns the manager instance the exchange binds, or a refusal (*Error): CodeBadRequest
// for a malformed request, CodeNotFound when there is no manager to bind, CodeFailedPrecondition
// for an instance that is not a live candidate or an ambiguous choice, CodeUnavailable when a
// store or the local identity could not be read.
func (s *Selector) Select(ctx context.Context, sel Selection) (string, error) {
	if err := space.ValidateOwner(sel.Owner); err != nil {
		return "", refuse(CodeBadRequest, "owner: %v", err)
	}
	if sel.InstanceID != "" {
		if err := space.ValidateUID(sel.InstanceID); err != nil {
			return "", refuse(CodeBadRequest, "managerInstanceId: %v", err)
		}
		if err := s.candidate(ctx, sel.Owner, sel.InstanceID); err != nil {
			return "", err
		}
		return sel.InstanceID, nil
	}
	if sel.Human && s.policy == SelectLocalPrimary {
		iid, ok, err := s.localID()
		if err != nil {
			return "", err
		}
		if !ok {
			return "", refuse(CodeNotFound, "no local manager is registered on this host (local-primary)")
		}
		if err := s.candidate(ctx, sel.Owner, iid); err != nil {
			return "", err
		}
		return iid, nil
	}
	return s.remoteFirst(ctx, sel.Owner)
}

func (s *Selector) remoteFirst(ctx context.Context, owner string) (string, error) {
	localID, hasLocal, localErr := s.localID()
	iids, err := s.store.managerGates(ctx)
	if err != nil {
		return "", err
	}
	var remote, live []string
	for _, iid := range iids {
		if hasLocal && iid == localID {
			continue
		}
		g, _, ok, err := s.store.EndpointGate(ctx, lifecycle.ManagerEndpoint, iid)
		if err != nil {
			return "", readRefusal(err)
		}
		if !ok || principalOwner(g.Principal) != owner {
			continue
		}
		remote = append(remote, iid)
		switch err := s.live(ctx, iid, g); {
		case err == nil:
			live = append(live, iid)
		case CodeOf(err) != CodeFailedPrecondition:
			return "", err
		}
	}
	switch {
	case len(live) == 1:
		return live[0], nil
	case len(live) > 1:
		return "", refuse(CodeFailedPrecondition, "%d live manager instances: name one with managerInstanceId", len(live))
	case len(remote) > 0:
		return "", refuse(CodeFailedPrecondition, "none of the %d registered manager instances is live", len(remote))
	}
	if localErr != nil {
		return "", localErr
	}
	if !hasLocal {
		return "", refuse(CodeNotFound, "no manager instance is registered for this owner")
	}
	if err := s.candidate(ctx, owner, localID); err != nil {
		return "", err
	}
	return localID, nil
}

// localID reads the local manager's instance id: ok false when there is no reader or no file,
// an unavailable refusal when it cannot be read or names another space.
func (s *Selector) localID() (string, bool, error) {
	if s.local == nil {
		return "", false, nil
	}
	id, err := s.local()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", false, nil
	case err != nil:
		return "", false, &Error{Code: CodeUnavailable, Msg: "the local manager's identity is unreadable", Err: err}
	case id.Space != s.store.Names().Name():
		return "", false, refuse(CodeUnavailable, "the local manager serves space %q, not %q", id.Space, s.store.Names().Name())
	}
	if err := space.ValidateUID(id.InstanceID); err != nil {
		return "", false, &Error{Code: CodeUnavailable, Msg: "the local manager's identity is unreadable", Err: err}
	}
	return id.InstanceID, true, nil
}

// notCandidate is the one refusal for an instance that is absent, another owner's or not live,
// so that a caller learns nothing about instances that are not its own.
func notCandidate(iid string) *Error {
	return refuse(CodeFailedPrecondition, "manager instance %s is not a live manager of this owner", iid)
}

// candidate checks that iid is a live instance whose gate principal belongs to owner.
func (s *Selector) candidate(ctx context.Context, owner, iid string) error {
	g, _, ok, err := s.store.EndpointGate(ctx, lifecycle.ManagerEndpoint, iid)
	if err != nil {
		return readRefusal(err)
	}
	if !ok || principalOwner(g.Principal) != owner {
		return notCandidate(iid)
	}
	return s.live(ctx, iid, g)
}

// live checks the rest of liveness for an instance whose gate g was just read: open, spec and
// lease agreeing with it. A failed check is CodeFailedPrecondition (notCandidate).
func (s *Selector) live(ctx context.Context, iid string, g lifecycle.EndpointGate) error {
	if g.State != lifecycle.GateOpen {
		return notCandidate(iid)
	}
	spec, rev, ok, err := s.store.Spec(ctx, lifecycle.ManagerEndpoint, iid)
	if err != nil {
		return readRefusal(err)
	}
	if !ok || spec.Principal != g.Principal || spec.ProcessEpoch != g.ProcessEpoch || rev != g.RegistrationRevision {
		return notCandidate(iid)
	}
	l, _, ok, err := s.store.Lease(ctx, iid)
	if err != nil {
		return readRefusal(err)
	}
	if !ok || l.Holder != g.Principal || !l.Registered() ||
		l.ProcessEpoch != g.ProcessEpoch || l.RegistrationRevision != g.RegistrationRevision {
		return notCandidate(iid)
	}
	return nil
}

func principalOwner(p string) string {
	o, _, _ := strings.Cut(p, ".")
	return o
}

// readRefusal reports a store failure (unreachable or a corrupt row) as unavailable.
func readRefusal(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeUnavailable, Msg: "the lifecycle store could not be read", Err: err}
}

// maxInfoBytes bounds one STREAM.INFO answer: the stream's config and state plus at most
// MaxManagerGates subjects of a bounded length.
const maxInfoBytes = 64<<10 + MaxManagerGates*256

// managerGates lists the instance ids of every epgate.manager.* key in the auth bucket with
// $JS.API.STREAM.INFO and a subjects filter, page by page. More than MaxManagerGates keys, or a
// key this package could not have written, is refused (unavailable): the list is never partial.
func (s *Store) managerGates(ctx context.Context) ([]string, error) {
	tok, err := lifecycle.EndpointToken(lifecycle.ManagerEndpoint)
	if err != nil {
		return nil, err
	}
	all, err := s.names.KVAll(space.Auth)
	if err != nil {
		return nil, fmt.Errorf("authority: %w", err)
	}
	prefix := strings.TrimSuffix(all, ">") // $KV.<bucket>.
	filter := prefix + "epgate." + tok + ".*"
	var out []string
	seen := map[string]bool{}
	total := 0
	for page := 0; ; page++ {
		resp, err := s.streamInfo(ctx, space.Auth, filter, len(out), maxInfoBytes)
		if err != nil {
			return nil, readRefusal(fmt.Errorf("list manager gates: %w", err))
		}
		if resp.Total > MaxManagerGates {
			return nil, refuse(CodeUnavailable, "more than %d manager gates", MaxManagerGates)
		}
		if page == 0 {
			total = resp.Total
		}
		// A page that adds nothing, or answers another offset or total, ends the listing; the
		// count check below refuses a listing that ended short.
		if len(resp.State.Subjects) == 0 || resp.Offset != len(out) || resp.Total != total {
			break
		}
		for subj := range resp.State.Subjects {
			key, ok := strings.CutPrefix(subj, prefix)
			ep, iid, err := lifecycle.ParseEndpointGateKey(key)
			if !ok || err != nil || ep != lifecycle.ManagerEndpoint {
				return nil, readRefusal(fmt.Errorf("%w: the listing holds %.80q", ErrCorrupt, subj))
			}
			if seen[iid] {
				return nil, readRefusal(fmt.Errorf("%w: list manager gates: %s listed twice", ErrUnavailable, iid))
			}
			seen[iid] = true
			out = append(out, iid)
		}
		if len(out) >= total {
			break
		}
	}
	if len(out) != total {
		// The gates changed between pages, or the server paged differently: never a partial list.
		return nil, readRefusal(fmt.Errorf("%w: list manager gates: %d of %d listed", ErrUnavailable, len(out), total))
	}
	slices.Sort(out)
	return out, nil
}
