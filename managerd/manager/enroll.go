package manager

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	"github.com/cotalgo/cotal/pkg/daemon"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/space"
)

// A remote managerd's spawn (seed 001 "Fresh managed agents"): the manager makes the agent's
// standing actor token itself and sends the authority only its SHA-256 with the requested actor,
// label, role, capabilities and lists, under its current registration proof and serve epoch.
// The authority writes the managed grant at a lifecycle uid it chooses, provisions that uid's
// durables and answers the coordinate, the sentinel, the effective lists and its public exchange
// URL. The manager binds every returned coordinate (the owner it is configured for, the actor it
// asked; the uid within its grammar), requires each effective list within the one it asked,
// re-keys the agent onto the returned uid, and launches it with the exchange form of its launch
// material (pkg/material): the exchange URL, the token and the sentinel, no credential. The
// manager provisions nothing and mints nothing, and the agent renews its own bearer.

// newActorToken returns a fresh standing actor token (32 random bytes, base64url, as authd's
// own) and its SHA-256 in lower-case hex, the only form that leaves the manager.
func newActorToken() (token, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = base64.RawURLEncoding.EncodeToString(b[:])
	clear(b[:])
	sum := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(sum[:]), nil
}

// managedRequest is the manager envelope of a managed-agent kind under the current registration.
func (m *Manager) managedRequest(kind string) (managerauthority.ManagedRequest, error) {
	rs := m.remote
	rs.mu.Lock()
	activated, epoch, proof := rs.activated, rs.epoch, rs.proof
	rs.mu.Unlock()
	if !activated {
		return managerauthority.ManagedRequest{}, errors.New("this start is not activated yet: no registration to ask under")
	}
	op := strings.TrimPrefix(kind, "manager-managed-agent-")
	return managerauthority.ManagedRequest{V: 1, Kind: kind, Space: m.cfg.Space, Actor: m.cfg.Actor,
		InstanceID: rs.id.InstanceID, ManagerLifecycleUID: rs.id.LifecycleUID,
		RequestID: op + "-" + strings.ToLower(rand.Text()), RegistrationProof: proof, ServeEpoch: epoch,
		Identities: rs.id.Identities()}, nil
}

// authorityRefusal maps a failed managed-agent hook call to Spawn's or Stop's refusal.
func authorityRefusal(err error, step string) error {
	var rj *Rejection
	var rf *managerauthority.Refusal
	switch {
	case errors.As(err, &rj): // logged and raised by hookFailed
		return api.Refuse(codes.Internal, managerv1.Reason_REASON_PROVISION_FAILED, "%s: %s", step, rj.Error())
	case errors.As(err, &rf) && rf.Status == http.StatusConflict:
		return api.Refuse(codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE, "%s: %v", step, rf)
	case errors.As(err, &rf) && rf.Status >= 500:
		return api.Refuse(codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE, "%s: %v", step, rf)
	case errors.As(err, &rf):
		return api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_PROVISION_FAILED, "%s: %v", step, rf)
	}
	return api.Refuse(codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE, "%s: %v", step, err)
}

// enrollRemote enrolls a at the authority and returns its exchange-form launch material; a is
// re-keyed onto the uid the authority chose and its lists are the effective ones.
func (m *Manager) enrollRemote(ctx context.Context, hook ManagedAgentEnroller, a *agent) ([]byte, error) {
	env, err := m.managedRequest(managerauthority.KindEnrollment)
	if err != nil {
		return nil, api.Refuse(codes.Unavailable, managerv1.Reason_REASON_UNAVAILABLE, "enroll: %v", err)
	}
	token, hash, err := newActorToken()
	if err != nil {
		return nil, fmt.Errorf("manager: actor token: %w", err)
	}
	req := &managerauthority.EnrollmentRequest{ManagedRequest: env, Target: managerauthority.EnrollmentTarget{
		Actor: a.actor, TokenHash: hash, Role: a.role, Label: a.name, Capabilities: slices.Clone(a.caps),
		Subscribe: slices.Clone(a.subscribe), AllowSubscribe: slices.Clone(a.allowSub), AllowPublish: slices.Clone(a.allowPub),
	}}
	var e *managerauthority.Enrollment
	err = daemon.Guard("the remote authority's EnrollManagedAgent", func() error {
		var herr error
		e, herr = hook.EnrollManagedAgent(ctx, req)
		return herr
	})
	if err = m.hookFailed(err); err != nil {
		m.log.Warn("the remote authority did not enroll the agent", "agent", a.name, "err", err)
		return nil, authorityRefusal(err, "enroll")
	}
	if e == nil {
		return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_PROVISION_FAILED, "enroll: the remote authority answered nothing")
	}
	sentinel, err := m.bindEnrollment(req, e)
	if err != nil {
		m.log.Error("the remote authority's enrollment does not bind; the agent is not launched", "agent", a.name, "uid", e.LifecycleUID, "err", err)
		// An answer for the owner and actor asked, at a well-formed uid, names a grant this
		// manager can retire: it is undone like a failed launch's. Any other answer names
		// nothing this manager asked for, and is left to the host.
		if _, kerr := space.ACLKey(e.Owner, e.Actor, e.LifecycleUID); kerr == nil && e.Owner == m.cfg.AgentOwner && e.Actor == a.actor {
			a.uid = e.LifecycleUID
			m.undoEnrollment(ctx, a)
		} else {
			m.tr.Warn(CodeAuthority, fmt.Sprintf("the enrollment of %s does not bind and names no grant this manager asked for; the host must retire what it granted", a.name), err)
		}
		return nil, api.Refuse(codes.Internal, managerv1.Reason_REASON_PROVISION_FAILED, "enroll: the remote authority's answer does not bind: %v", err)
	}
	a.uid = e.LifecycleUID
	a.subscribe, a.allowSub, a.allowPub = slices.Clone(e.Subscribe), slices.Clone(e.AllowSubscribe), slices.Clone(e.AllowPublish)
	a.exchange = e.AgentBearerExchangeURL
	b, err := material.Encode(material.Material{
		Version: material.Version, Space: m.cfg.Space, Servers: m.cfg.Brokers,
		Owner: e.Owner, Actor: a.actor, LifecycleUID: a.uid, InstanceID: m.cfg.InstanceID,
		Role: a.role, Subscribe: a.subscribe, AllowSubscribe: a.allowSub, AllowPublish: a.allowPub,
		ExchangeURL: e.AgentBearerExchangeURL, Token: token, Sentinel: sentinel,
	})
	if err != nil {
		return nil, fmt.Errorf("manager: launch material: %w", err)
	}
	m.log.Info("the remote authority enrolled the agent", "agent", a.name, "owner", e.Owner, "uid", a.uid, "exchange", e.AgentBearerExchangeURL)
	return b, nil
}

// bindEnrollment checks that e answers req: the owner this manager is configured for (its agent
// owner), the actor asked, a uid and lists within their grammars (DecodeEnrollmentAnswer's
// checks, again for a host hook), each effective list within the one asked, and a bearer
// sentinel. It returns the sentinel's JWT.
func (m *Manager) bindEnrollment(req *managerauthority.EnrollmentRequest, e *managerauthority.Enrollment) (string, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	if _, err := managerauthority.DecodeEnrollmentAnswer(b); err != nil {
		return "", err
	}
	switch {
	case e.Owner != m.cfg.Owner || e.Owner != m.cfg.AgentOwner:
		return "", fmt.Errorf("the authority enrolled the agent under owner %s, but this manager's agents are %s's", e.Owner, m.cfg.AgentOwner)
	case e.Actor != req.Target.Actor:
		return "", fmt.Errorf("the authority enrolled actor %s, not %s", e.Actor, req.Target.Actor)
	}
	for _, l := range []struct {
		name      string
		got, want []string
	}{{"subscribe", e.Subscribe, req.Target.Subscribe}, {"allowSubscribe", e.AllowSubscribe, req.Target.AllowSubscribe}, {"allowPublish", e.AllowPublish, req.Target.AllowPublish}} {
		for _, c := range l.got {
			if !slices.Contains(l.want, c) {
				return "", fmt.Errorf("the authority's %s holds %q, which was not asked", l.name, c)
			}
		}
	}
	return managerauthority.SentinelJWT(e.SentinelCreds)
}

// undoEnrollment undoes the enrollment of an agent whose spawn failed after it: the whole
// managed retirement, as a Stop runs it (prepare, requester, rail). The authority activated the
// lifecycle at enrollment, so the rail retires it although no exchange ran. Until it is retired
// the name stays held: the retirement is recorded as pending first and, when this try fails,
// retried in the background (and at the next start) like a Stop's.
func (m *Manager) undoEnrollment(ctx context.Context, a *agent) {
	opID, err := lifecycle.ManagedRetirementOpID(a.uid)
	if err != nil {
		m.log.Error("spawn failed after the enrollment, and the enrollment could not be undone", "agent", a.name, "uid", a.uid, "err", err)
		return
	}
	p := pendingRetirement{V: 1, Name: a.name, Target: managerauthority.Target{Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUID: a.uid}, OpID: opID}
	if err := m.writePending(p); err != nil {
		m.log.Error("spawn failed after the enrollment; its pending retirement could not be recorded", "agent", a.name, "uid", a.uid, "err", err)
		m.tr.Warn(CodeAuthority, fmt.Sprintf("spawn of %s failed after its enrollment (lifecycle %s); its retirement could not be recorded and is tried once", a.name, a.uid), err)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*retireRailTimeout)
	err = m.retireOnce(dctx, p)
	cancel()
	if err != nil {
		m.retire.hold(p.Name)
		m.log.Warn("spawn failed after the enrollment; its retirement is pending and retried, its name held", "agent", a.name, "uid", a.uid, "opId", opID, "err", err)
		m.tr.Warn(CodeAuthority, fmt.Sprintf("spawn of %s failed after its enrollment (lifecycle %s); its retirement is pending and retried, its name held", a.name, a.uid), err)
		m.retryRetirement(p, nil)
		return
	}
	m.removePending(p.Name)
	m.log.Info("spawn failed after the enrollment; the enrollment was undone", "agent", a.name, "uid", a.uid)
}
