package authority

// The stock managed-agent enrollment writer (issue 25 item 4; seed 001 "Fresh managed agents" and
// "Managed-agent authority transport"; reference lifecycle-hosted.md §2.6): a remote manager,
// authorized by AuthorizeRemoteManagedAgentEnrollment, asks this authd to grant one fresh managed
// agent under its supervising actor. It runs serialized per alias (owner.actor of the agent):
//
//  1. the alias's current managed row, if any: the same tokenHash under the same supervising
//     actor, still covered by that actor's current grant and at a lifecycle no retirement has
//     begun on, answers the same uid again (its durables re-made, idempotently); any other
//     managed row (another tokenHash, another parent, no longer covered) is conflict until that
//     lifecycle's retirement is prepared; an interactive row of the alias is conflict;
//  2. a fresh enrollment refuses an alias whose head is active or retiring at another uid
//     (conflict: that incarnation must retire first), then picks a uid and reserves it
//     create-only (uid.<uid> in the records bucket, mintedBy this authd's ManagerInstance);
//  3. activates the lifecycle at that uid (Activate: the head active, the gate open) before any
//     ledger row or durable, as the seed's launch writer does: an agent that never exchanges its
//     actor token still has a head at its uid, so its manager's retire rail runs the terminal
//     barrier there instead of refusing a lifecycle that never began (the first exchange's own
//     activation answers already-active); a replay activates again, which finishes an
//     activation a crash interrupted and is otherwise two reads;
//  4. writes the managed row by ledger.Put(Managed): parent the supervising actor, tokenHash the
//     SHA-256 the manager sent, the lists clamped to the supervising row's, and Put's envelope
//     walk (the spawner chain) refuses anything the clamp cannot narrow (a role the supervising
//     row does not delegate: permission-denied);
//  5. pre-creates the lifecycle's durables and ACL row on this authd's own one-shot provisioner
//     credential (Config.Provisioner); a failure after the activation undoes the enrollment before
//     the refusal is answered: the row revoked, the lifecycle deprovisioned and retired at its uid
//     (the managed retirement's barrier), so the alias is free for the next enrollment.
//
// A crash between the activation and the row leaves the alias active at a uid no row names; the
// next fresh enrollment of the alias is conflict, naming that uid, until the host retires it
// through the retire door (its grant is absent, so the door runs the barrier).
//
// The answer carries the space's sentinel as creds text with a throwaway seed and the public
// face's base URL, where the agent exchanges its actor token; without a public face (no
// public_url) enrollment is failed-precondition, decided before anything is written.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// Provisioner pre-creates and removes one managed lifecycle's durables and ACL row on this
// authd's own one-shot credentials (pkg/provision's RunProvisionAgent and RunDeprovisionAgent).
type Provisioner interface {
	// ProvisionAgent makes a's dm_ and dlv_ durables, ACL row and role queue; spawnerOwner and
	// spawnerActor name the principal the provisioner credential is minted for. A failure leaves
	// nothing this call created.
	ProvisionAgent(ctx context.Context, spawnerOwner, spawnerActor string, a provision.Agent) error
	// DeprovisionAgent removes the lifecycle's durables and ACL row (absent items are no error).
	DeprovisionAgent(ctx context.Context, owner, actor, uid string) error
}

// undoTimeout bounds an enrollment's undo (revoke and deprovision), which runs even when the
// caller's context has ended.
const undoTimeout = 15 * time.Second

// maxUIDPicks bounds the fresh uids one enrollment tries when a reservation create loses (a
// 128-bit collision: never in practice).
const maxUIDPicks = 3

// EnrollManagedAgent is the enrollment writer (see the top of this file). It runs the
// enrollment decision first, so every refusal of AuthorizeRemoteManagedAgentEnrollment comes
// first; its own refusals are failed-precondition (no public face; a provisioning conflict on the
// broker), conflict (the alias is held), permission-denied (a role the supervising row does not
// delegate) and unavailable (the ledger, the store, signerd or the broker).
func (a *Authority) EnrollManagedAgent(ctx context.Context, owner string, r *managerauthority.EnrollmentRequest) (managerauthority.Enrollment, error) {
	if _, err := a.AuthorizeRemoteManagedAgentEnrollment(ctx, owner, r); err != nil {
		return managerauthority.Enrollment{}, err
	}
	if a.cfg.PublicURL == "" {
		return managerauthority.Enrollment{}, refuse(CodeFailedPrecondition,
			"this authd has no public face (public_url): a managed agent could not exchange its actor token")
	}
	if a.cfg.Provisioner == nil {
		return managerauthority.Enrollment{}, refuse(CodeUnavailable, "this authd has no provisioner")
	}
	t := r.Target
	if t.Actor == r.Actor {
		return managerauthority.Enrollment{}, refuse(CodeConflict, "actor %q is the supervising actor itself", t.Actor)
	}
	sentinel, err := a.sentinelCreds(ctx)
	if err != nil {
		return managerauthority.Enrollment{}, err
	}

	unlock, err := a.aliases.lock(ctx, owner+"."+t.Actor)
	if err != nil {
		return managerauthority.Enrollment{}, &Error{Code: CodeUnavailable, Msg: "the alias is busy", Err: err}
	}
	defer unlock()

	parent, err := a.cfg.Ledger.AuthorizeGrant(owner, r.Actor)
	if err != nil {
		return managerauthority.Enrollment{}, &Error{Code: CodePermissionDenied, Msg: fmt.Sprintf("the interactive grant for actor %q is refused", r.Actor), Err: err}
	}
	lists := clampLists(parent, t)
	ans := managerauthority.Enrollment{Owner: owner, Actor: t.Actor, SentinelCreds: sentinel, AgentBearerExchangeURL: a.cfg.PublicURL}

	row, kind, err := a.cfg.Ledger.Get(owner, t.Actor)
	switch {
	case errors.Is(err, ledger.ErrNoRow):
	case err != nil:
		return managerauthority.Enrollment{}, &Error{Code: CodeUnavailable, Msg: "the alias's ledger row could not be read", Err: err}
	case kind != ledger.Managed:
		return managerauthority.Enrollment{}, refuse(CodeConflict, "%s.%s is an interactive grant", owner, t.Actor)
	case subtle.ConstantTimeCompare([]byte(row.TokenHash), []byte(t.TokenHash)) != 1:
		return managerauthority.Enrollment{}, refuse(CodeConflict,
			"%s.%s is enrolled with another actor token: prepare its retirement first", owner, t.Actor)
	default:
		if why, err := a.replayable(ctx, parent, row); err != nil {
			return managerauthority.Enrollment{}, err
		} else if why != "" {
			return managerauthority.Enrollment{}, refuse(CodeConflict, "%s.%s is enrolled and %s: prepare its retirement first", owner, t.Actor, why)
		}
		// A replay: the same uid, activated and its durables made again (a crash may have left
		// either unfinished).
		if _, err := a.Activate(ctx, owner, t.Actor, row.LifecycleUID); err != nil {
			return managerauthority.Enrollment{}, err
		}
		if err := a.cfg.Provisioner.ProvisionAgent(ctx, owner, r.Actor, provision.Agent{Owner: owner, Actor: t.Actor,
			LifecycleUID: row.LifecycleUID, Role: row.Role, AllowSubscribe: row.AllowSubscribe}); err != nil {
			return managerauthority.Enrollment{}, provisionRefusal(err)
		}
		ans.LifecycleUID = row.LifecycleUID
		ans.Subscribe = coveredBy(lists.subscribe, row.AllowSubscribe)
		ans.AllowSubscribe, ans.AllowPublish = row.AllowSubscribe, row.AllowPublish
		a.log.Info("enroll: replay", "owner", owner, "actor", t.Actor, "uid", row.LifecycleUID, "parent", row.Parent)
		return ans, nil
	}

	if err := a.freshAlias(ctx, owner, t.Actor); err != nil {
		return managerauthority.Enrollment{}, err
	}
	row = ledger.Row{Ver: ledger.Version, Owner: owner, Actor: t.Actor, Scope: lists.scope, AllowSubscribe: lists.allowSubscribe,
		AllowPublish: lists.allowPublish, Role: t.Role, Parent: parent.Principal(), Label: t.Label, TokenHash: t.TokenHash,
		GrantedAt: a.now().UnixMilli()}
	// What Put would refuse is refused before anything is written (the uid is a placeholder in
	// the grammar: the real one is drawn next).
	if err := a.cfg.Ledger.Check(ledger.Managed, withUID(row, placeholderUID)); err != nil {
		return managerauthority.Enrollment{}, ledgerRefusal(err)
	}
	uid, err := a.reserveFresh(ctx, owner, t.Actor)
	if err != nil {
		return managerauthority.Enrollment{}, err
	}
	row.LifecycleUID = uid
	if _, err := a.Activate(ctx, owner, t.Actor, uid); err != nil {
		return managerauthority.Enrollment{}, errors.Join(err, a.undoEnrollment(ctx, owner, t.Actor, uid))
	}
	if err := a.held(); err != nil {
		return managerauthority.Enrollment{}, errors.Join(err, a.undoEnrollment(ctx, owner, t.Actor, uid))
	}
	if err := a.cfg.Ledger.Put(ledger.Managed, row); err != nil {
		return managerauthority.Enrollment{}, errors.Join(ledgerRefusal(err), a.undoEnrollment(ctx, owner, t.Actor, uid))
	}
	if err := a.cfg.Provisioner.ProvisionAgent(ctx, owner, r.Actor, provision.Agent{Owner: owner, Actor: t.Actor, LifecycleUID: uid,
		Role: t.Role, AllowSubscribe: lists.allowSubscribe}); err != nil {
		return managerauthority.Enrollment{}, errors.Join(provisionRefusal(err), a.undoEnrollment(ctx, owner, t.Actor, uid))
	}
	ans.LifecycleUID, ans.Subscribe, ans.AllowSubscribe, ans.AllowPublish = uid, lists.subscribe, lists.allowSubscribe, lists.allowPublish
	a.log.Info("enroll: granted", "owner", owner, "actor", t.Actor, "uid", uid, "parent", row.Parent, "role", t.Role,
		"allowSubscribe", lists.allowSubscribe, "allowPublish", lists.allowPublish)
	return ans, nil
}

// placeholderUID stands for the uid not yet drawn when an enrollment's row is checked.
const placeholderUID = "aaaaaaaaaaaaaaaaaaaaaaaaaa"

func withUID(r ledger.Row, uid string) ledger.Row {
	r.LifecycleUID = uid
	return r
}

// undoEnrollment revokes a fresh enrollment's row (if it is at uid), deprovisions its lifecycle
// and retires it at uid when its head stands there (an interrupted activation is finished first,
// so the barrier finds the gate open), bounded by undoTimeout even when ctx has ended. Its error
// is for the log (the refusal is the cause's).
func (a *Authority) undoEnrollment(ctx context.Context, owner, actor, uid string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	var errs []error
	if row, kind, err := a.cfg.Ledger.Get(owner, actor); err == nil && kind == ledger.Managed && row.LifecycleUID == uid {
		if err := a.cfg.Ledger.Revoke(ledger.Managed, owner, actor); err != nil && !errors.Is(err, ledger.ErrNoRow) {
			errs = append(errs, fmt.Errorf("revoke: %w", err))
		}
	} else if err != nil && !errors.Is(err, ledger.ErrNoRow) {
		errs = append(errs, fmt.Errorf("read the row: %w", err))
	}
	if err := a.cfg.Provisioner.DeprovisionAgent(ctx, owner, actor, uid); err != nil {
		errs = append(errs, fmt.Errorf("deprovision: %w", err))
	}
	switch h, _, found, err := a.store.Head(ctx, owner, actor); {
	case err != nil:
		errs = append(errs, fmt.Errorf("read the head: %w", err))
	case found && h.LifecycleUID == uid && h.State != lifecycle.HeadRetired:
		if h.State == lifecycle.HeadActive {
			if _, err := a.Activate(ctx, owner, actor, uid); err != nil {
				errs = append(errs, fmt.Errorf("finish the activation: %w", err))
			}
		}
		if _, err := a.Retire(ctx, owner, actor, uid); err != nil {
			errs = append(errs, fmt.Errorf("retire: %w", err))
		}
	}
	err := errors.Join(errs...)
	a.log.Warn("enroll: undone", "owner", owner, "actor", actor, "uid", uid, "undo_err", err)
	return err
}

// replayable says why the alias's managed row cannot be answered again ("" when it can): it
// must name parent as its parent, sit within parent's current grant, and its lifecycle must not
// be retiring or retired.
func (a *Authority) replayable(ctx context.Context, parent, row ledger.Row) (string, error) {
	if row.Parent != parent.Principal() {
		return "supervised by another actor", nil
	}
	if !within(parent, row) {
		return "no longer covered by its supervising grant", nil
	}
	g, _, found, err := a.store.Gate(ctx, row.LifecycleUID)
	if err != nil {
		return "", storeRefusal("read the lifecycle gate", err)
	}
	if found && (g.State == lifecycle.GateRetired || g.State == lifecycle.GateFrozen && g.Op != nil && g.Op.Kind == lifecycle.OpRetirement) {
		return "its lifecycle's retirement has begun", nil
	}
	return "", nil
}

// freshAlias refuses a fresh enrollment of an alias whose head is active or retiring at a
// lifecycle (the new uid's activation could never succeed while it stands).
func (a *Authority) freshAlias(ctx context.Context, owner, actor string) error {
	h, _, found, err := a.store.Head(ctx, owner, actor)
	if err != nil {
		return storeRefusal("read the lifecycle head", err)
	}
	if found && h.State != lifecycle.HeadRetired {
		return refuse(CodeConflict, "%s.%s is %s at lifecycle %s: retire it first", owner, actor, h.State, h.LifecycleUID)
	}
	return nil
}

// reserveFresh picks a fresh uid and reserves it for owner.actor, create-only.
func (a *Authority) reserveFresh(ctx context.Context, owner, actor string) (string, error) {
	b, err := lifecycle.EncodeReservation(lifecycle.Reservation{Owner: owner, Actor: actor, MintedBy: a.ManagerInstance()})
	if err != nil {
		return "", refuse(CodeBadRequest, "%v", err)
	}
	for range maxUIDPicks {
		uid, err := newLifecycleUID()
		if err != nil {
			return "", &Error{Code: CodeUnavailable, Msg: "no lifecycle uid could be drawn", Err: err}
		}
		key, err := lifecycle.UIDKey(uid)
		if err != nil {
			return "", &Error{Code: CodeUnavailable, Msg: "the lifecycle uid", Err: err}
		}
		wrote := false
		_, err = a.create(ctx, space.Records, key, b, &wrote)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return "", err
			}
			return "", storeRefusal("reserve the lifecycle uid", err)
		}
		return uid, nil
	}
	return "", refuse(CodeUnavailable, "no fresh lifecycle uid could be reserved")
}

// newLifecycleUID draws a fresh lifecycle uid: 16 random bytes as 26 lower-case base32
// characters, within the uid grammar (as authd's admin grant draws one).
func newLifecycleUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b)), nil
}

// sentinelCreds is the space's sentinel (signerd's GetSpace sentinel_jwt, a bearer user JWT) as
// creds text with a fresh throwaway seed: the broker checks no nonce signature for a bearer JWT,
// so the seed carries no authority.
func (a *Authority) sentinelCreds(ctx context.Context) (string, error) {
	if a.cfg.Signer == nil {
		return "", refuse(CodeUnavailable, "no signer is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, mintTimeout)
	defer cancel()
	resp, err := a.cfg.Signer.GetSpace(ctx, &signerv1.GetSpaceRequest{Space: a.cfg.Space})
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "signerd did not serve the space's sentinel", Err: err}
	}
	s := resp.GetSentinelJwt()
	if uc, err := jwt.DecodeUserClaims(s); err != nil || !uc.BearerToken {
		return "", &Error{Code: CodeUnavailable, Msg: "signerd's sentinel is not a bearer user JWT", Err: err}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "no throwaway seed", Err: err}
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "no throwaway seed", Err: err}
	}
	// Laid out as jwt.FormatUserConfig lays out a creds file (which refuses a seed that is not
	// the subject's: the sentinel's subject has no seed anywhere).
	dj, err := jwt.DecorateJWT(s)
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "the sentinel creds", Err: err}
	}
	ds, err := jwt.DecorateSeed(seed)
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "the sentinel creds", Err: err}
	}
	return string(dj) + string(ds), nil
}

// enrollLists are an enrollment's effective row: its capability words and lists.
type enrollLists struct {
	scope, subscribe, allowSubscribe, allowPublish []string
}

// clampLists resolves the requested lists' defaults as managerd does (subscribe ["general"];
// allowSubscribe and allowPublish the subscribe list) and clamps them to parent's grant: a
// capability word parent holds, an allowSubscribe or allowPublish pattern whose broker reach one
// of parent's same-list patterns covers, a subscribe channel the clamped allowSubscribe covers.
// What falls outside is dropped, never widened.
func clampLists(parent ledger.Row, t managerauthority.EnrollmentTarget) enrollLists {
	sub := t.Subscribe
	if len(sub) == 0 {
		sub = []string{"general"}
	}
	allowSub, allowPub := t.AllowSubscribe, t.AllowPublish
	if len(allowSub) == 0 {
		allowSub = sub
	}
	if len(allowPub) == 0 {
		allowPub = sub
	}
	var l enrollLists
	for _, c := range t.Capabilities {
		if slices.Contains(parent.Scope, c) && !slices.Contains(l.scope, c) {
			l.scope = append(l.scope, c)
		}
	}
	l.allowSubscribe = withinAll(parent.AllowSubscribe, allowSub)
	l.allowPublish = withinAll(parent.AllowPublish, allowPub)
	l.subscribe = coveredBy(sub, l.allowSubscribe)
	return l
}

// withinAll is the entries of list (once each) that reach nothing beyond parent's patterns.
func withinAll(parent, list []string) []string {
	out := []string{}
	for _, ch := range list {
		if withinChannels(parent, ch) && !slices.Contains(out, ch) {
			out = append(out, ch)
		}
	}
	return out
}

// coveredBy is the channels of sub (once each) one of allow's patterns covers.
func coveredBy(sub, allow []string) []string {
	out := []string{}
	for _, c := range sub {
		if slices.ContainsFunc(allow, func(p string) bool { return space.PatternCovers(p, c) }) && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// withinChannels is the ledger's spawner-chain channel rule: ch's broker reach is covered by one
// of parent's patterns' reach.
func withinChannels(parent []string, ch string) bool {
	reach := space.ChannelReach(ch)
	return slices.ContainsFunc(parent, func(p string) bool { return space.PatternCovers(space.ChannelReach(p), reach) })
}

// within reports whether row sits within parent's grant as the ledger's envelope walk judges one
// link: parent admin covers all; else row's scope, channels and role are parent's.
func within(parent, row ledger.Row) bool {
	if slices.Contains(parent.Scope, "admin") {
		return true
	}
	for _, s := range row.Scope {
		if !slices.Contains(parent.Scope, s) {
			return false
		}
	}
	for _, ch := range row.AllowSubscribe {
		if !withinChannels(parent.AllowSubscribe, ch) {
			return false
		}
	}
	for _, ch := range row.AllowPublish {
		if !withinChannels(parent.AllowPublish, ch) {
			return false
		}
	}
	return row.Role == "" || slices.Contains(parent.Scope, ledger.RolePrefix+row.Role)
}

// ledgerRefusal maps a ledger.Put refusal.
func ledgerRefusal(err error) error {
	switch {
	case errors.Is(err, ledger.ErrSpawnerChain):
		return &Error{Code: CodePermissionDenied, Msg: "the agent's grant is not within its supervising grant (a role it does not delegate?)", Err: err}
	case errors.Is(err, ledger.ErrOtherSpace):
		return &Error{Code: CodeConflict, Msg: "the alias is held by an interactive grant", Err: err}
	case errors.Is(err, ledger.ErrInvalidRow):
		return &Error{Code: CodeBadRequest, Msg: "the agent's row is refused by the ledger", Err: err}
	}
	return &Error{Code: CodeUnavailable, Msg: "the agent's row could not be written", Err: err}
}

// provisionRefusal maps a provisioning failure: an item in another shape (a role queue another
// configuration made) is failed-precondition, anything else unavailable.
func provisionRefusal(err error) error {
	if errors.Is(err, provision.ErrConflict) {
		return &Error{Code: CodeFailedPrecondition, Msg: "the agent's durables exist in another shape on the broker", Err: err}
	}
	return &Error{Code: CodeUnavailable, Msg: "the agent's durables could not be provisioned", Err: err}
}
