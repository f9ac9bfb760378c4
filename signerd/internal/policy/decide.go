package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// Request is what a caller asks signerd to do, as the server sees it after authenticating the
// caller and decoding the RPC. Decide reads nothing else.
type Request struct {
	// Caller is the caller identity: the URI SAN of the verified client certificate.
	Caller string
	// RPC is the method called.
	RPC RPC
	// Space is the space name the request acts on. Every SignerService RPC names one; an empty
	// Space is refused.
	Space string
	// Profile is the profile to mint or remint (Mint, Remint, SignCalloutResponse only). For
	// SignCalloutResponse an empty Profile means the response carries authd's refusal and mints
	// nothing, so only RPC and space are checked; the server must pass the granted profile
	// whenever the response mints a credential.
	Profile profiles.Name
	// TTL is the requested lifetime; 0 asks for the profile default. Negative is refused.
	TTL time.Duration
	// Params are the profile parameters to check (Mint, SignCalloutResponse, and Remint, where
	// they are the ones the presented credential was minted with).
	Params profiles.Params
	// Minter is, for Remint, the caller identity recorded as minter of the presented credential.
	Minter string
}

// Reason is a stable code for a decision. The denial codes are a public contract: they travel
// to callers in gRPC status details (the server maps each to the REASON_* enum value of the same
// name) and to the TypeScript SDK. Never rename or reuse one; add new ones instead.
type Reason string

// Decision reasons.
const (
	// ReasonAllowed: the request is within the caller's policy.
	ReasonAllowed Reason = "allowed"
	// ReasonCallerUnknown: the caller identity is not a well-formed SPIFFE ID, or no entry
	// matches it.
	ReasonCallerUnknown Reason = "caller-unknown"
	// ReasonRPCNotAllowed: the caller's entry does not list the RPC (or the RPC is unknown).
	ReasonRPCNotAllowed Reason = "rpc-not-allowed"
	// ReasonSpaceNotAllowed: the request names no space, a space the entry excludes, or one it
	// does not list (for "{space}": a space whose token differs from the id's bound segment).
	ReasonSpaceNotAllowed Reason = "space-not-allowed"
	// ReasonProfileNotAllowed: the entry has no rule for the profile.
	ReasonProfileNotAllowed Reason = "profile-not-allowed"
	// ReasonOwnerNotAllowed: the owner parameter is not listed and the rule does not allow any
	// owner.
	ReasonOwnerNotAllowed Reason = "owner-not-allowed"
	// ReasonChannelNotAllowed: a channel in subscribe, allow_subscribe or allow_publish is
	// malformed, could reach an excluded channel, or is covered by none of the rule's patterns.
	ReasonChannelNotAllowed Reason = "channel-not-allowed"
	// ReasonRoleNotAllowed: the role parameter is not listed in the rule.
	ReasonRoleNotAllowed Reason = "role-not-allowed"
	// ReasonCapabilityNotAllowed: a capability parameter is not listed in the rule.
	ReasonCapabilityNotAllowed Reason = "capability-not-allowed"
	// ReasonRemintNotAllowed: the rule for the profile says remint: none.
	ReasonRemintNotAllowed Reason = "remint-not-allowed"
	// ReasonRemintForeignMinter: the rule says remint: own and the credential was minted by
	// another identity (or its minter is unknown).
	ReasonRemintForeignMinter Reason = "remint-foreign-minter"
	// ReasonRateLimited: the caller's token bucket is empty. Decide never returns it; the
	// server does, from a Limiter, after Decide.
	ReasonRateLimited Reason = "rate-limited"
	// ReasonTTLInvalid: the requested TTL is negative (Decide), or, by the server's lifetime
	// rule, under one second or asked for a profile without expiry. A TTL above the cap is not
	// a denial; it is capped.
	ReasonTTLInvalid Reason = "ttl-invalid"
)

// Reasons returns every reason code, for the server's mapping table and its tests.
func Reasons() []Reason {
	return []Reason{
		ReasonAllowed, ReasonCallerUnknown, ReasonRPCNotAllowed, ReasonSpaceNotAllowed,
		ReasonProfileNotAllowed, ReasonOwnerNotAllowed, ReasonChannelNotAllowed,
		ReasonRoleNotAllowed, ReasonCapabilityNotAllowed, ReasonRemintNotAllowed,
		ReasonRemintForeignMinter, ReasonRateLimited, ReasonTTLInvalid,
	}
}

// Decision is the outcome of Decide.
type Decision struct {
	// Allow is true only with ReasonAllowed.
	Allow bool
	// Reason is the stable code.
	Reason Reason
	// Detail is a short human explanation that is safe to return to the caller: it may echo
	// the caller's own request values but never reveals what the policy would allow.
	Detail string
	// Caller is the id (or id pattern) of the matched entry; "" when none matched.
	Caller string
	// TTLCap is the policy's lifetime cap for the profile; 0 when the RPC takes no profile or
	// the decision was made before a profile rule was found. signerd grants
	// min(requested or default, profile maximum, TTLCap).
	TTLCap time.Duration
	// PolicyDigest is the Digest of the policy that decided, so what is granted can be tied to
	// the policy it was granted under (signerd's idempotency cache serves a replay only under
	// the same policy).
	PolicyDigest string
}

// Explanation is a decision with the entry that produced it, for `signerd policy explain`.
type Explanation struct {
	Decision Decision
	// Rule is a copy of the matched entry; nil when no entry matched.
	Rule *Rule
	// BoundSpace is the segment the entry's "{space}" bound in the caller id; "" if none.
	BoundSpace string
}

// Explain decides req exactly as Decide does and also returns the matched entry.
func (p *Policy) Explain(req Request) Explanation {
	r, bound, ok := p.match(req.Caller)
	d := decide(req, r, bound, ok)
	d.PolicyDigest = p.Digest()
	e := Explanation{Decision: d, BoundSpace: bound}
	if ok {
		c := r.clone()
		e.Rule = &c
	}
	return e
}

// Decide says whether the caller may make req. It is pure: no I/O, no clock, no rate limit.
//
// The caller's entry is the one with exactly its id, else the first pattern in file order that
// matches it. Then, in order: the RPC must be listed; the space must be named, not excluded,
// and listed; for RPCs that take no profile (and for a SignCalloutResponse that carries a
// refusal) that is all. Otherwise the profile must have a rule, and a negative TTL is refused.
// For Remint the rule's remint mode is checked first (own: the recorded minter must be this
// caller identity), then the parameters the credential was minted with, exactly as for a Mint:
// Remint rebuilds the credential from them under the policy in force, so a narrowed rule
// reaches renewed credentials. For Mint, Remint and SignCalloutResponse the parameters are
// checked: the owner (unless empty) must be listed or any_owner set; every channel or channel
// pattern in Subscribe, AllowSubscribe and AllowPublish is judged by what it reaches on the broker
// (space.ChannelReach: a last-token '*' reaches the whole subtree), which must touch no excluded
// pattern and be covered by one allowed pattern; the role (unless empty) and every capability must be listed. Actor and
// LifecycleUID are not constrained by policy. Anything not listed is denied.
//
// A TTL above the cap is not a denial: Decision.TTLCap carries the cap and signerd grants the
// minimum of the request, the profile maximum and the cap.
func (p *Policy) Decide(req Request) Decision {
	r, bound, ok := p.match(req.Caller)
	d := decide(req, r, bound, ok)
	d.PolicyDigest = p.Digest()
	return d
}

// Admit says only whether the caller may call req.RPC in req.Space: the caller must have an
// entry, the entry must list the RPC, and the space must be named, not excluded, and listed.
// Profile, TTL and parameters are not looked at. An allowed Admit says nothing about Decide;
// a denied one is the denial Decide would give. The server asks it before it reads anything
// that could reveal whether a space or a credential exists (Remint).
func (p *Policy) Admit(req Request) Decision {
	r, bound, ok := p.match(req.Caller)
	if d, denied := admit(req, r, bound, ok); denied {
		return d
	}
	return Decision{Allow: true, Reason: ReasonAllowed, Caller: r.ID}
}

func deny(r *rule, reason Reason, format string, args ...any) Decision {
	d := Decision{Reason: reason, Detail: fmt.Sprintf(format, args...)}
	if r != nil {
		d.Caller = r.ID
	}
	return d
}

// maxEcho bounds how much of a caller-supplied value a Detail repeats.
const maxEcho = 64

// echo quotes a caller-supplied value for a Detail, truncated so a hostile value cannot bloat
// logs or responses.
func echo(s string) string {
	if len(s) > maxEcho {
		s = s[:maxEcho] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// admit is the caller, RPC and space part of decide.
func admit(req Request, r *rule, bound string, ok bool) (Decision, bool) {
	if !ok {
		return deny(nil, ReasonCallerUnknown, "caller identity is not in the signer policy"), true
	}
	if !req.RPC.Valid() || !r.rpcs[req.RPC] {
		return deny(r, ReasonRPCNotAllowed, "rpc %s not allowed for this caller", echo(string(req.RPC))), true
	}
	if req.Space == "" {
		return deny(r, ReasonSpaceNotAllowed, "request names no space"), true
	}
	if r.spaceExcluded(req.Space) || !r.spaceAllowed(req.Space, bound) {
		return deny(r, ReasonSpaceNotAllowed, "space %s not allowed for this caller", echo(req.Space)), true
	}
	return Decision{}, false
}

func decide(req Request, r *rule, bound string, ok bool) Decision {
	if d, denied := admit(req, r, bound, ok); denied {
		return d
	}
	if !req.RPC.TakesProfile() || req.RPC == RPCSignCalloutResponse && req.Profile == "" {
		return Decision{Allow: true, Reason: ReasonAllowed, Caller: r.ID}
	}

	pr, ok := r.profiles[req.Profile]
	if !ok {
		return deny(r, ReasonProfileNotAllowed, "profile %s not allowed for this caller", echo(string(req.Profile)))
	}
	withCap := func(d Decision) Decision { d.TTLCap = pr.TTLMax; return d }
	if req.TTL < 0 {
		return withCap(deny(r, ReasonTTLInvalid, "requested ttl %s is negative", req.TTL))
	}

	if req.RPC == RPCRemint {
		switch pr.Remint {
		case RemintAny:
		case RemintOwn:
			if req.Minter == "" || req.Minter != req.Caller {
				return withCap(deny(r, ReasonRemintForeignMinter, "credential was not minted by this caller"))
			}
		default:
			return withCap(deny(r, ReasonRemintNotAllowed, "remint of profile %s not allowed for this caller", echo(string(req.Profile))))
		}
	}

	if d, denied := pr.checkParams(r, &req.Params); denied {
		return withCap(d)
	}
	return withCap(Decision{Allow: true, Reason: ReasonAllowed, Caller: r.ID})
}

// spaceExcluded compares by name and by token: two names with the same token are the same
// account on the wire, so an exclusion must catch both spellings.
func (r *rule) spaceExcluded(name string) bool {
	tok := space.Token(name)
	for _, x := range r.ExcludeSpaces {
		if x == name || space.Token(x) == tok {
			return true
		}
	}
	return false
}

// spaceAllowed compares listed names exactly (a different spelling of the same token is not
// what the operator wrote) and "{space}" by token (an id segment holds a token, not a name).
func (r *rule) spaceAllowed(name, bound string) bool {
	for _, s := range r.Spaces {
		switch s {
		case SpaceAny:
			return true
		case SpaceBound:
			if bound != "" && space.Token(name) == bound {
				return true
			}
		default:
			if s == name {
				return true
			}
		}
	}
	return false
}

// checkParams applies the rule to Mint, Remint and SignCalloutResponse parameters: exclusions first,
// then the allow lists.
func (pr *profileRule) checkParams(r *rule, params *profiles.Params) (Decision, bool) {
	if o := params.Owner; o != "" && !pr.AnyOwner && !pr.owners[o] {
		return deny(r, ReasonOwnerNotAllowed, "owner %s not allowed for this caller", echo(o)), true
	}

	type grant struct {
		field string
		toks  []string
		raw   string
	}
	var grants []grant
	for _, list := range []struct {
		field string
		chans []string
	}{
		{"subscribe", params.Subscribe},
		{"allow_subscribe", params.AllowSubscribe},
		{"allow_publish", params.AllowPublish},
	} {
		for _, ch := range list.chans {
			if _, err := parseChannel(ch); err != nil {
				return deny(r, ReasonChannelNotAllowed, "%s channel %s is malformed: %v", list.field, echo(ch), err), true
			}
			// Judge what the grant reaches on the broker: a last-token '*' reaches the subtree.
			toks, err := parseChannel(space.ChannelReach(ch))
			if err != nil {
				return deny(r, ReasonChannelNotAllowed, "%s channel %s is malformed: %v", list.field, echo(ch), err), true
			}
			grants = append(grants, grant{list.field, toks, ch})
		}
	}
	for _, g := range grants {
		for _, x := range pr.excludes {
			if intersects(x, g.toks) {
				return deny(r, ReasonChannelNotAllowed, "%s channel %s not allowed for this caller", g.field, echo(g.raw)), true
			}
		}
	}
	for _, g := range grants {
		if !slices.ContainsFunc(pr.channels, func(p []string) bool { return covers(p, g.toks) }) {
			return deny(r, ReasonChannelNotAllowed, "%s channel %s not allowed for this caller", g.field, echo(g.raw)), true
		}
	}

	if role := params.Role; role != "" && !pr.roles[role] {
		return deny(r, ReasonRoleNotAllowed, "role %s not allowed for this caller", echo(role)), true
	}
	for _, c := range params.Capabilities {
		if !pr.capabilities[c] {
			return deny(r, ReasonCapabilityNotAllowed, "capability %s not allowed for this caller", echo(c)), true
		}
	}
	return Decision{}, false
}
