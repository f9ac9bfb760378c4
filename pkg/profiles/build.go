package profiles

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// Spec is a built profile: everything a user JWT will carry except the holder's key, issuer,
// times and (for data-account profiles) the reply-inbox row, which Claims adds. Its JSON form is
// what the golden files hold.
type Spec struct {
	Profile Name        `json:"profile"`
	Account AccountKind `json:"account"`
	// JWTName is the JWT name: the profile name, or <owner>-<actor> for auth-callout-path mints
	// (Params.InboxNonce set) so CONNZ attributes the connection to its principal.
	JWTName string                  `json:"jwt_name"`
	Pub     jwt.Permission          `json:"pub"`
	Sub     jwt.Permission          `json:"sub"`
	Resp    *jwt.ResponsePermission `json:"resp,omitempty"`
	Tags    []string                `json:"tags"`
	Bearer  bool                    `json:"bearer"`
	// Lifetime is the profile's lifetime class, copied so Claims can enforce it.
	Lifetime Lifetime `json:"lifetime"`
	// InboxNonce, when set, keys the reply inbox Claims adds; empty keys it on the user nkey.
	InboxNonce string `json:"inbox_nonce,omitempty"`
}

// Build validates p for profile name in the named space and returns the profile's Spec.
//
// It refuses, with *ParamError: an invalid space name; a required field left empty; any field the
// profile does not accept; Owner without Actor or the reverse; a value failing its pkg/space
// grammar (owner, actor, lifecycle UID, role, channel pattern, inbox nonce); a channel list longer
// than MaxChannels; a Subscribe pattern no AllowSubscribe pattern covers; a capability word
// outside the closed set; for the retirement requester, an Actor that is not a manager serve
// actor or a Target that fails its grammars or names another owner than Owner; for
// remote-manager, an InstanceID outside the uid grammar or an Actor other than
// manager_<InstanceID>; and, for
// service-serve, an Owner that is not a derived owner, a ServiceEndpoint outside the endpoint
// grammar or an InstanceID outside the uid grammar (its Actor, svc_<InstanceID>, is derived). Channel lists take patterns (space.ValidateChannelPattern: "team.>",
// "team.*"); only the agent accepts them, and Build does not judge how wide a pattern may be: that
// is the caller's policy (signerd grants a pattern only where one of the caller's allowed patterns
// covers it and it reaches no excluded channel). An unknown profile is refused with *UnknownProfileError. Channels and capabilities
// are deduplicated and sorted, so equal inputs give byte-equal specs.
func Build(spaceName string, name Name, p Params) (*Spec, error) {
	r, ok := matrix[name]
	if !ok {
		return nil, &UnknownProfileError{Name: string(name)}
	}
	names, err := space.NewNames(spaceName)
	if err != nil {
		return nil, paramErr(name, "space", err)
	}
	np, err := normalize(name, r, p)
	if err != nil {
		return nil, err
	}
	b := newBuilder(names, np)
	r.perms(b)
	if b.err != nil {
		// Unreachable while normalize checks every grammar the builders check; kept so a drift
		// between the two fails closed.
		return nil, fmt.Errorf("profiles: building %s: %w", name, b.err)
	}
	s := &Spec{
		Profile:    name,
		Account:    r.account,
		JWTName:    string(name),
		Pub:        jwt.Permission{Allow: dedupe(b.pubAllow), Deny: dedupe(b.pubDeny)},
		Sub:        jwt.Permission{Allow: dedupe(b.subAllow), Deny: dedupe(b.subDeny)},
		Bearer:     r.bearer,
		Lifetime:   r.lifetime,
		InboxNonce: np.InboxNonce,
	}
	if np.Owner != "" && !r.target {
		s.Tags = append(s.Tags, "owner:"+np.Owner, "actor:"+np.Actor, "principal:"+np.Owner+"."+np.Actor)
		// A callout mint names its JWT after the principal so CONNZ attributes the connection:
		// the inbox-nonce path, and service-serve, which is only ever a callout mint.
		if np.InboxNonce != "" || r.service {
			s.JWTName = np.Owner + "-" + np.Actor
		}
	}
	s.Tags = append(s.Tags, "profile:"+string(name))
	return s, nil
}

// checkBoundNonce re-checks, on the spec itself, that its inbox nonce is bound to the principal
// its tags name (Build made it so; a spec edited afterwards must not widen the inbox).
func (s *Spec) checkBoundNonce() error {
	var owner, actor string
	for _, t := range s.Tags {
		if v, ok := strings.CutPrefix(t, "owner:"); ok {
			owner = v
		} else if v, ok := strings.CutPrefix(t, "actor:"); ok {
			actor = v
		}
	}
	if err := space.ValidateBoundInboxNonce(s.InboxNonce, owner, actor); err != nil {
		return paramErr(s.Profile, "InboxNonce", err)
	}
	return nil
}

func paramErr(name Name, fieldName string, err error) *ParamError {
	return &ParamError{Profile: name, Field: fieldName, Reason: err.Error(), Err: err}
}

func refuse(name Name, fieldName, format string, args ...any) *ParamError {
	return &ParamError{Profile: name, Field: fieldName, Reason: fmt.Sprintf(format, args...)}
}

// set reports which fields of p carry a value. An empty list counts as unset.
func set(p Params) field {
	var f field
	add := func(b field, on bool) {
		if on {
			f |= b
		}
	}
	add(fOwner, p.Owner != "")
	add(fActor, p.Actor != "")
	add(fUID, p.LifecycleUID != "")
	add(fRole, p.Role != "")
	add(fSubscribe, len(p.Subscribe) > 0)
	add(fAllowSubscribe, len(p.AllowSubscribe) > 0)
	add(fAllowPublish, len(p.AllowPublish) > 0)
	add(fCapabilities, len(p.Capabilities) > 0)
	add(fInboxNonce, p.InboxNonce != "")
	add(fDataAccount, p.DataAccount != "")
	add(fTarget, p.Target != nil)
	add(fServiceEndpoint, p.ServiceEndpoint != "")
	add(fInstanceID, p.InstanceID != "")
	add(fMemberChannels, len(p.MemberChannels) > 0)
	return f
}

// normalize checks p against rule r and the grammars and returns a copy with sorted, deduplicated
// lists.
func normalize(name Name, r rule, p Params) (Params, error) {
	have := set(p)
	for _, fn := range fieldNames {
		switch {
		case have&fn.f != 0 && r.accepts&fn.f == 0:
			return Params{}, refuse(name, fn.name, "is not accepted by this profile")
		case have&fn.f == 0 && r.requires&fn.f != 0:
			return Params{}, refuse(name, fn.name, "is required by this profile")
		}
	}
	// A service-serve credential's actor is derived (svc_<InstanceID>), never a parameter.
	if !r.service && (have&fOwner != 0) != (have&fActor != 0) {
		if have&fOwner == 0 {
			return Params{}, refuse(name, "Owner", "is required with Actor")
		}
		return Params{}, refuse(name, "Actor", "is required with Owner")
	}
	checks := []struct {
		field string
		value string
		fn    func(string) error
	}{
		{"Owner", p.Owner, space.ValidateOwner},
		{"Actor", p.Actor, space.ValidateActor},
		{"LifecycleUID", p.LifecycleUID, space.ValidateUID},
		{"Role", p.Role, space.ValidateRole},
	}
	for _, c := range checks {
		if c.value == "" {
			continue
		}
		if err := c.fn(c.value); err != nil {
			return Params{}, paramErr(name, c.field, err)
		}
	}
	if r.service {
		if err := serviceCoords(name, p); err != nil {
			return Params{}, err
		}
	}
	if r.managerInstance {
		if err := space.ValidateUID(p.InstanceID); err != nil {
			return Params{}, paramErr(name, "InstanceID", err)
		}
		if want := ManagerActorPrefix + p.InstanceID; p.Actor != want {
			return Params{}, refuse(name, "Actor", "%.64q is not the manager instance's supervisor actor %s", p.Actor, want)
		}
	}
	if p.DataAccount != "" {
		if err := nkey.CheckAccount(p.DataAccount); err != nil {
			return Params{}, refuse(name, "DataAccount", "%.64q is not an account public nkey (%v)", p.DataAccount, err)
		}
	}
	// A client-chosen inbox must be bound to the principal the credential names (pkg/space
	// inbox.go): never a user nkey, never another principal's nonce.
	if p.InboxNonce != "" {
		if p.Owner == "" || r.target {
			return Params{}, refuse(name, "InboxNonce", "needs Owner and Actor naming the credential's own principal, the one it is bound to")
		}
		if err := space.ValidateBoundInboxNonce(p.InboxNonce, p.Owner, p.Actor); err != nil {
			return Params{}, paramErr(name, "InboxNonce", err)
		}
	}
	out := Params{
		Owner: p.Owner, Actor: p.Actor, LifecycleUID: p.LifecycleUID, Role: p.Role,
		InboxNonce: p.InboxNonce, DataAccount: p.DataAccount,
	}
	if r.service {
		out.Actor = ServiceActorPrefix + p.InstanceID
		out.ServiceEndpoint, out.InstanceID = p.ServiceEndpoint, p.InstanceID
	}
	if r.managerInstance {
		out.InstanceID = p.InstanceID
	}
	if r.owner != "" {
		out.Owner, out.Actor = r.owner, r.actor
	}
	if p.Target != nil {
		t, err := retirementTarget(name, p)
		if err != nil {
			return Params{}, err
		}
		out.Target = &t
	}
	var err error
	if out.Subscribe, err = channels(name, "Subscribe", p.Subscribe); err != nil {
		return Params{}, err
	}
	if out.AllowSubscribe, err = channels(name, "AllowSubscribe", p.AllowSubscribe); err != nil {
		return Params{}, err
	}
	if out.AllowPublish, err = channels(name, "AllowPublish", p.AllowPublish); err != nil {
		return Params{}, err
	}
	if out.MemberChannels, err = concreteChannels(name, "MemberChannels", p.MemberChannels); err != nil {
		return Params{}, err
	}
	for _, c := range out.Subscribe {
		if !slices.ContainsFunc(out.AllowSubscribe, func(a string) bool { return space.PatternCovers(a, c) }) {
			return Params{}, refuse(name, "Subscribe", "channel %q is not within AllowSubscribe", c)
		}
	}
	for i, c := range p.Capabilities {
		if !capabilities[c] {
			return Params{}, refuse(name, "Capabilities", "entry %d (%.64q) is not a known capability", i, c)
		}
	}
	out.Capabilities = sortedSet(p.Capabilities)
	return out, nil
}

// serviceCoords checks a service-serve credential's parameters (the rule already made Owner,
// ServiceEndpoint and InstanceID required and refused every other): the owner is a derived owner
// (the access bearer's sub), the endpoint fits pkg/lifecycle's EndpointToken grammar and the
// instance id space.ValidateUID, so svc_<InstanceID> is a valid actor and both subject families
// hold exactly one endpoint instance.
func serviceCoords(name Name, p Params) error {
	if err := space.ValidateDerivedOwner(p.Owner); err != nil {
		return paramErr(name, "Owner", err)
	}
	if _, err := lifecycle.EndpointToken(p.ServiceEndpoint); err != nil {
		return paramErr(name, "ServiceEndpoint", err)
	}
	if err := space.ValidateUID(p.InstanceID); err != nil {
		return paramErr(name, "InstanceID", err)
	}
	return nil
}

// retirementTarget checks a retirement requester's caller and target (the rule already made every
// one of Owner, Actor, LifecycleUID and Target required): the caller must be a manager instance's
// serve principal, <owner>.manager_serve_<instanceId> (pkg/lifecycle.ServePrincipal), the target's
// tokens must fit their grammars, and the target must belong to the caller's own owner, as
// upstream's authorizeRemoteManagerRetirement demands, so a credential minted for one owner's
// manager can never name another owner's lifecycle. It returns a copy of the target.
func retirementTarget(name Name, p Params) (RetirementTarget, error) {
	t := *p.Target
	iid := p.Actor[strings.LastIndexByte(p.Actor, '_')+1:]
	if sp, err := lifecycle.ServePrincipal(p.Owner, iid); err != nil || sp != p.Owner+"."+p.Actor {
		return RetirementTarget{}, refuse(name, "Actor", "%.64q is not a manager serve actor (manager_serve_<instanceId>)", p.Actor)
	}
	for _, c := range []struct {
		field, value string
		fn           func(string) error
	}{
		{"Target.Owner", t.Owner, space.ValidateOwner},
		{"Target.Actor", t.Actor, space.ValidateActor},
		{"Target.LifecycleUID", t.LifecycleUID, space.ValidateUID},
	} {
		if err := c.fn(c.value); err != nil {
			return RetirementTarget{}, paramErr(name, c.field, err)
		}
	}
	if t.Owner != p.Owner {
		return RetirementTarget{}, refuse(name, "Target.Owner", "%.64q is not the caller's owner %q", t.Owner, p.Owner)
	}
	return t, nil
}

func channels(name Name, fieldName string, in []string) ([]string, error) {
	if len(in) > MaxChannels {
		return nil, refuse(name, fieldName, "has %d channels, more than %d", len(in), MaxChannels)
	}
	for i, c := range in {
		if err := space.ValidateChannelPattern(c); err != nil {
			return nil, &ParamError{Profile: name, Field: fieldName, Reason: fmt.Sprintf("entry %d: %v", i, err), Err: err}
		}
	}
	return sortedSet(in), nil
}

// concreteChannels is channels for a list of concrete channels: a membership row's key names one
// channel, so a pattern names no key and is refused.
func concreteChannels(name Name, fieldName string, in []string) ([]string, error) {
	if len(in) > MaxChannels {
		return nil, refuse(name, fieldName, "has %d channels, more than %d", len(in), MaxChannels)
	}
	for i, c := range in {
		if err := space.ValidateChannel(c); err != nil {
			return nil, &ParamError{Profile: name, Field: fieldName, Reason: fmt.Sprintf("entry %d: %v (a concrete channel, not a pattern)", i, err), Err: err}
		}
	}
	return sortedSet(in), nil
}

func sortedSet(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := append([]string(nil), in...)
	sort.Strings(out)
	return dedupe(out)
}

// dedupeScan is the list length up to which dedupe compares each entry with the kept ones
// instead of building a set: cheaper than a map for the short lists most profiles have.
const dedupeScan = 32

// dedupe drops repeats, keeping the first occurrence, so lists keep their upstream order. It
// works in place: in must be the caller's own (the builder's lists, sortedSet's copy). The result
// is clipped, so an append to it never writes into in's spare capacity.
func dedupe(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := in[:0]
	if len(in) <= dedupeScan {
		for _, s := range in {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	} else {
		seen := make(map[string]struct{}, len(in))
		for _, s := range in {
			if _, dup := seen[s]; !dup {
				seen[s] = struct{}{}
				out = append(out, s)
			}
		}
	}
	clear(in[len(out):])
	return slices.Clip(out)
}

// builder accumulates a profile's rows; the first builder error sticks and the rest are skipped.
type builder struct {
	n                                    space.Names
	p                                    Params
	pubAllow, pubDeny, subAllow, subDeny []string
	err                                  error
}

// Initial capacities of the builder's lists, enough for every profile's rows today (the delivery
// daemon's 52 publish rows are the most) so that a Build grows none of them; a list that
// outgrows its share is reallocated alone.
const (
	capPubAllow = 56
	capPubDeny  = 12
	capSubAllow = 12
	capSubDeny  = 4
)

// newBuilder returns a builder whose four lists share one backing array, each a full slice
// expression so an append past its share cannot reach the next list's.
func newBuilder(n space.Names, p Params) *builder {
	arr := make([]string, capPubAllow+capPubDeny+capSubAllow+capSubDeny)
	i := 0
	next := func(c int) []string {
		s := arr[i : i : i+c]
		i += c
		return s
	}
	b := &builder{n: n, p: p}
	b.pubAllow, b.pubDeny, b.subAllow, b.subDeny = next(capPubAllow), next(capPubDeny), next(capSubAllow), next(capSubDeny)
	return b
}

func (b *builder) add(list *[]string, s string, err error) {
	if b.err != nil {
		return
	}
	if err != nil {
		b.err = err
		return
	}
	*list = append(*list, s)
}

func (b *builder) pub(s string, err error)  { b.add(&b.pubAllow, s, err) }
func (b *builder) deny(s string, err error) { b.add(&b.pubDeny, s, err) }
func (b *builder) sub(s string, err error)  { b.add(&b.subAllow, s, err) }

// Claims builds the user claims for this spec: subject userPub (must be a user public nkey),
// issuer account issuerAccount (must be an account public nkey: the account whose signing key will
// sign), the spec's name, permissions and tags, bearer flag, iat = now and exp = now+ttl.
//
// ttl must be at least one second and at most Lifetime.Max; for the NoExpiry profile (the
// sentinel) it must be zero and the claims carry no exp. Data- and system-account profiles but
// service-serve also get their reply inbox, _INBOX_<InboxNonce or userPub>.>, first in the
// subscribe allow list; service-serve gets none, and a spec of it carrying a nonce is refused. Claims refuses
// a spec whose profile, account, lifetime or bearer flag disagree with the matrix, and one whose
// publish or subscribe permission would be empty (which the broker reads as allow-all).
//
// jwt's Encode overwrites iat with the wall clock when it signs; exp is kept as set here.
func (s *Spec) Claims(userPub, issuerAccount string, now time.Time, ttl time.Duration) (*jwt.UserClaims, error) {
	if s == nil {
		return nil, errors.New("profiles: nil spec")
	}
	r, ok := matrix[s.Profile]
	if !ok {
		return nil, &UnknownProfileError{Name: string(s.Profile)}
	}
	if s.Account != r.account || s.Lifetime != r.lifetime || s.Bearer != r.bearer {
		return nil, refuse(s.Profile, "spec", "account, lifetime or bearer flag differ from the profile matrix")
	}
	// Canonical spelling only: nkeys' own validators accept CR and LF inside a key.
	if err := nkey.CheckUser(userPub); err != nil {
		return nil, refuse(s.Profile, "userPub", "%.64q is not a user public nkey (%v)", userPub, err)
	}
	if err := nkey.CheckAccount(issuerAccount); err != nil {
		return nil, refuse(s.Profile, "issuerAccount", "%.64q is not an account public nkey (%v)", issuerAccount, err)
	}
	switch {
	case s.Lifetime.NoExpiry && ttl != 0:
		return nil, refuse(s.Profile, "ttl", "%v requested for a credential that carries no exp", ttl)
	case !s.Lifetime.NoExpiry && ttl < time.Second:
		return nil, refuse(s.Profile, "ttl", "%v is shorter than one second", ttl)
	case !s.Lifetime.NoExpiry && ttl > s.Lifetime.Max:
		return nil, refuse(s.Profile, "ttl", "%v exceeds the profile maximum %v", ttl, s.Lifetime.Max)
	}

	uc := jwt.NewUserClaims(userPub)
	uc.Name = s.JWTName
	uc.IssuerAccount = issuerAccount
	uc.Pub = jwt.Permission{Allow: clone(s.Pub.Allow), Deny: clone(s.Pub.Deny)}
	uc.Sub = jwt.Permission{Allow: clone(s.Sub.Allow), Deny: clone(s.Sub.Deny)}
	if r.service && s.InboxNonce != "" {
		return nil, refuse(s.Profile, "InboxNonce", "is set on a profile without a reply inbox")
	}
	if (s.Account == AccountData || s.Account == AccountSystem) && !r.service {
		tok := s.InboxNonce
		if tok == "" {
			tok = userPub
		} else if err := s.checkBoundNonce(); err != nil {
			return nil, err
		}
		inbox, err := space.InboxFilter(tok)
		if err != nil {
			return nil, paramErr(s.Profile, "InboxNonce", err)
		}
		uc.Sub.Allow = append(jwt.StringList{inbox}, uc.Sub.Allow...)
	}
	if s.Resp != nil {
		rp := *s.Resp
		uc.Resp = &rp
	}
	if uc.Pub.Empty() || uc.Sub.Empty() {
		return nil, refuse(s.Profile, "spec", "empty publish or subscribe permission would allow everything")
	}
	// Assigned, not TagList.Add: Add lower-cases, which would fold distinct principals together.
	uc.Tags = jwt.TagList(clone(s.Tags))
	uc.BearerToken = s.Bearer
	uc.IssuedAt = now.Unix()
	if !s.Lifetime.NoExpiry {
		uc.Expires = now.Add(ttl).Unix()
	}
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if vr.IsBlocking(false) {
		return nil, fmt.Errorf("profiles: %s: claims do not validate: %v", s.Profile, vr.Errors())
	}
	return uc, nil
}

func clone(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	return append([]string(nil), in...)
}
