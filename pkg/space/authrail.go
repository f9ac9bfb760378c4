package space

import (
	"fmt"
	"strings"
)

// Auth rails: the two request subjects authd serves on the data account beside its callout. Each
// carries its caller's coordinates in the subject, where the broker pins them to the caller's
// credential; the body never names a caller. A request's answer comes only on <request>.reply
// (RailReply), the ctl rails' convention, so a caller's reply grant is its own request subject
// plus one token.
const (
	// AuthRailQueue is the queue group every authd serving the rails subscribes in.
	AuthRailQueue = "cotal-auth-rail"
	// RailReplyToken is the token RailReply appends.
	RailReplyToken = "reply"

	retireRailPrefix   = "ep.one.auth.retire-lifecycle.handle"
	registerRailPrefix = "ep.one.auth.register-manager"
)

// RetireRail is the coordinates of one retire-lifecycle request: the target lifecycle
// (Owner, Actor, UID), the caller (the requester's principal and its own lifecycle uid) and the
// request nonce.
type RetireRail struct {
	TargetOwner, TargetActor, TargetUID string
	CallerOwner, CallerActor, CallerUID string
	Nonce                               string
}

func (r RetireRail) check(withNonce bool) error {
	for _, c := range []struct {
		f func(string) error
		v string
	}{
		{ValidateOwner, r.TargetOwner}, {ValidateActor, r.TargetActor}, {ValidateUID, r.TargetUID},
		{ValidateOwner, r.CallerOwner}, {ValidateActor, r.CallerActor}, {ValidateUID, r.CallerUID},
	} {
		if err := c.f(c.v); err != nil {
			return err
		}
	}
	if withNonce {
		return ValidateInboxNonce(r.Nonce)
	}
	return nil
}

func (r RetireRail) stem() string {
	return strings.Join([]string{r.TargetOwner, r.TargetActor, r.TargetUID, r.CallerOwner, r.CallerActor, r.CallerUID}, ".")
}

// RetireLifecycle is one retire-lifecycle request subject:
// cotal.<t>.ep.one.auth.retire-lifecycle.handle.<tO>.<tA>.<tUid>.<cO>.<cA>.<cUid>.<nonce>.
func (n Names) RetireLifecycle(r RetireRail) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := r.check(true); err != nil {
		return "", err
	}
	return n.sub(retireRailPrefix + "." + r.stem() + "." + r.Nonce), nil
}

// RetireLifecycleCaller is a retirement requester's publish grant: its one target and caller
// with any nonce, cotal.<t>.ep.one.auth.retire-lifecycle.handle.<tO>.<tA>.<tUid>.<cO>.<cA>.<cUid>.*
// (wildcard: the nonce). r.Nonce is ignored.
func (n Names) RetireLifecycleCaller(r RetireRail) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := r.check(false); err != nil {
		return "", err
	}
	return n.sub(retireRailPrefix + "." + r.stem() + ".*"), nil
}

// RetireLifecycleServe is authd's serve pattern: cotal.<t>.ep.one.auth.retire-lifecycle.handle.*.*.*.*.*.*.*
// (wildcards: target, caller and nonce). A reply subject is one token longer and never matches.
func (n Names) RetireLifecycleServe() string {
	return n.sub(retireRailPrefix + ".*.*.*.*.*.*.*")
}

// ParseRetireLifecycle reads a request subject back into its coordinates, refusing any subject
// RetireLifecycle would not build.
func (n Names) ParseRetireLifecycle(subject string) (RetireRail, error) {
	toks, err := n.railTokens(subject, retireRailPrefix, 7)
	if err != nil {
		return RetireRail{}, err
	}
	r := RetireRail{toks[0], toks[1], toks[2], toks[3], toks[4], toks[5], toks[6]}
	if err := r.check(true); err != nil {
		return RetireRail{}, err
	}
	return r, nil
}

// RegisterManager is one register-manager request subject of the manager principal
// <owner>.<actor>: cotal.<t>.ep.one.auth.register-manager.<owner>.<actor>.<nonce>.
func (n Names) RegisterManager(owner, actor, nonce string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateInboxNonce(nonce); err != nil {
		return "", err
	}
	return n.sub(registerRailPrefix + "." + p + "." + nonce), nil
}

// RegisterManagerCaller is a manager principal's publish grant on the rail:
// cotal.<t>.ep.one.auth.register-manager.<owner>.<actor>.* (wildcard: the nonce).
func (n Names) RegisterManagerCaller(owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub(registerRailPrefix + "." + p + ".*"), nil
}

// RegisterManagerServe is authd's serve pattern: cotal.<t>.ep.one.auth.register-manager.*.*.*.
func (n Names) RegisterManagerServe() string { return n.sub(registerRailPrefix + ".*.*.*") }

// ParseRegisterManager reads a request subject back into the caller principal and nonce.
func (n Names) ParseRegisterManager(subject string) (owner, actor, nonce string, err error) {
	toks, err := n.railTokens(subject, registerRailPrefix, 3)
	if err != nil {
		return "", "", "", err
	}
	if _, err := n.RegisterManager(toks[0], toks[1], toks[2]); err != nil {
		return "", "", "", err
	}
	return toks[0], toks[1], toks[2], nil
}

// RailReply is the one subject a rail request's answer is published on: <request>.reply.
func RailReply(request string) string { return request + "." + RailReplyToken }

// RailReplyGrant is the subscribe grant for the answers to a caller's requests: the caller's
// publish grant (ending in the nonce wildcard) plus .reply.
func RailReplyGrant(callerGrant string) string { return callerGrant + "." + RailReplyToken }

// RetireLifecycleReplyAny and RegisterManagerReplyAny are authd's reply-publish patterns.
func (n Names) RetireLifecycleReplyAny() string { return RailReplyGrant(n.RetireLifecycleServe()) }

// RegisterManagerReplyAny: cotal.<t>.ep.one.auth.register-manager.*.*.*.reply.
func (n Names) RegisterManagerReplyAny() string { return RailReplyGrant(n.RegisterManagerServe()) }

func (n Names) railTokens(subject, prefix string, want int) ([]string, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	head := n.sub(prefix) + "."
	if !strings.HasPrefix(subject, head) {
		return nil, fmt.Errorf("space: %q is not a %s subject of %s", subject, prefix, n.Prefix())
	}
	toks := strings.Split(subject[len(head):], ".")
	if len(toks) != want {
		return nil, fmt.Errorf("space: %q has %d tokens after %s, want %d", subject, len(toks), prefix, want)
	}
	return toks, nil
}
