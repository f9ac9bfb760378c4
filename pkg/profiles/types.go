package profiles

import (
	"encoding/json"
	"fmt"
	"time"
)

// Name is a credential profile: a closed set of permission shapes that signerd will encode.
// A caller names a profile; it never supplies permissions.
type Name string

// The profiles signerd can mint. Anything else is refused by Parse.
const (
	Agent         Name = "agent"
	Supervisor    Name = "supervisor"
	Provisioner   Name = "provisioner"
	Deprovisioner Name = "deprovisioner"
	Delivery      Name = "delivery"
	Observer      Name = "observer"
	Admin         Name = "admin"
	Operator      Name = "operator"
	Probe         Name = "probe"
	// AuthCallout is authd's callout-service user in the space's AUTH account.
	AuthCallout Name = "auth-callout"
	// Sentinel is the deny-all bearer user of the AUTH account that clients present with their token.
	Sentinel Name = "sentinel"
	// AuthPlane is authd's data-account connection, the lifecycle authority's only writer: the
	// plane claim, the lifecycle keys of cotal_auth_<space> and cotal_records_<space>, reads of
	// those buckets and of the manager bucket, serving the two auth rails, and, as principal
	// AuthPlaneOwner.AuthPlaneActor, the delivery daemon's footprint inventory.
	AuthPlane Name = "auth-plane"
	// RetirementRequester is a one-shot credential authd mints for a manager's serve principal:
	// it may publish its one retire-lifecycle rail subject (target and caller pinned, any nonce)
	// and hear that subject's replies, and nothing else.
	RetirementRequester Name = "retirement-requester"
	// ServiceServe is a service endpoint instance's serving credential (seed 002), granted only
	// by authd's callout on a service access bearer: actor svc_<instanceId>, it may hear only its
	// own serve subjects and answer only on their reply family, with no inbox and no JetStream,
	// for at most 60 s.
	ServiceServe Name = "service-serve"
	// RemoteManager is a remote managerd's supervisor credential (issue 25), minted by authd on
	// the manager-service authority's prepare and renew: actor manager_<instanceId>, the
	// supervisor's rows with its instance lease pinned to lease.<instanceId>, its own presence,
	// and no renewal key, no delivery-admin rail and no register-manager rail (a remote manager
	// registers through authd's activate). 24 h. Requires owner, actor and instance_id.
	RemoteManager Name = "remote-manager"
	// MembershipRW is the delivery daemon's membership-feed writer (upstream membership-rw).
	MembershipRW Name = "membership-rw"
	// MembershipObserver is the delivery daemon's $SYS reader: it asks the broker for the
	// connections of the space's data account (CONNZ) and hears their CONNECT and DISCONNECT
	// events, and nothing else. It lives in the system account.
	MembershipObserver Name = "membership-observer"
	// ConnectionEvictor is the delivery daemon's $SYS kick: it may ask a server to close one
	// connection by id ($SYS.REQ.SERVER.<id>.KICK), and nothing else. The connection ids it kicks
	// come from the observer's scan of the daemon's own data account. It lives in the system
	// account.
	ConnectionEvictor Name = "connection-evictor"
)

// AccountKind says which of a space's two accounts a profile's users live in.
type AccountKind int

const (
	// AccountData is the space's data account; users are signed by its signing key.
	AccountData AccountKind = iota + 1
	// AccountAuth is the space's quarantined callout account AUTH_<token>.
	AccountAuth
	// AccountSystem is the broker's system account SYS; users are signed by its signing key and
	// their rows name the space's data account (Params.DataAccount).
	AccountSystem
)

// MarshalText renders the kind as "data" or "auth" so specs and golden files read plainly.
func (k AccountKind) MarshalText() ([]byte, error) {
	switch k {
	case AccountData, AccountAuth, AccountSystem:
		return []byte(k.String()), nil
	default:
		return nil, fmt.Errorf("profiles: cannot marshal %v", k)
	}
}

// UnmarshalText accepts "data" or "auth" and refuses anything else.
func (k *AccountKind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "data":
		*k = AccountData
	case "auth":
		*k = AccountAuth
	case "system":
		*k = AccountSystem
	default:
		return fmt.Errorf("profiles: unknown account kind %q", b)
	}
	return nil
}

func (k AccountKind) String() string {
	switch k {
	case AccountData:
		return "data"
	case AccountAuth:
		return "auth"
	case AccountSystem:
		return "system"
	default:
		return fmt.Sprintf("AccountKind(%d)", int(k))
	}
}

// Params are the caller-supplied values a profile is built from. Every field is validated
// against the grammars in pkg/space before it reaches a subject; a value that would widen the
// profile is refused with a *ParamError.
type Params struct {
	// Owner is the principal's owner token ([A-Za-z0-9_]+).
	Owner string
	// Actor is the principal's actor token ([A-Za-z0-9_]+).
	Actor string
	// LifecycleUID is the incarnation id ([a-z0-9]{26,32}) that names per-agent consumers.
	LifecycleUID string
	// Role is the optional service role that binds the TASK work queue.
	Role string
	// Subscribe lists the channels the agent is joined to now (a subset of AllowSubscribe).
	Subscribe []string
	// AllowSubscribe lists the channels the agent may read.
	AllowSubscribe []string
	// AllowPublish lists the channels the agent may post to.
	AllowPublish []string
	// Capabilities are the agent's scope words (for example "spawn").
	Capabilities []string
	// InboxNonce is the client-chosen token of the private reply inbox _INBOX_<nonce> on the
	// auth-callout path, where the user nkey is chosen by the server and the client cannot know
	// it. Empty means the static path: the inbox is keyed on the credential's own user nkey. A
	// nonce also names the JWT <owner>-<actor>, as upstream callout mints do.
	InboxNonce string
	// DataAccount is the public key (A…) of the space's data account, which the system-account
	// profiles' rows name. It is never taken from a caller: signerd fills it from the space's
	// verified facts, and only the system-account profiles accept it (and require it).
	DataAccount string
	// Target is the one managed lifecycle a retirement requester may ask authd to retire. Only
	// the retirement-requester profile accepts it (and requires it); nil is unset, and a non-nil
	// Target with empty fields is set and refused.
	Target *RetirementTarget
	// ServiceEndpoint is the dotted endpoint name a service-serve credential serves
	// (pkg/lifecycle's EndpointToken grammar). Only service-serve accepts it (and requires it).
	ServiceEndpoint string
	// InstanceID is that endpoint instance's id ([a-z0-9]{26,32}). service-serve requires it
	// (the credential's actor is svc_<InstanceID>), and so does remote-manager (the manager
	// instance whose lease it holds; its Actor must be manager_<InstanceID>); every other profile
	// refuses it.
	InstanceID string
	// MemberChannels are the concrete channels (space.ValidateChannel: no pattern) on which a
	// deprovisioner may read and purge its target lifecycle's durable membership row
	// (cotal_members_<t>, key <channel>/<owner>.<actor>.<uid>). Only the deprovisioner accepts
	// it; at most MaxChannels.
	MemberChannels []string
}

// RetirementTarget names one exact lifecycle: owner and actor tokens and its lifecycle uid.
type RetirementTarget struct {
	Owner        string
	Actor        string
	LifecycleUID string
}

// Lifetime is a profile's lifetime class.
type Lifetime struct {
	// Default is used when the caller asks for no TTL.
	Default time.Duration
	// Max caps any requested TTL. Zero Max with NoExpiry means the credential carries no exp.
	Max time.Duration
	// NoExpiry marks the few public, powerless users (the sentinel) that carry no exp.
	NoExpiry bool
}

// TTL resolves a requested lifetime: zero asks for Default, anything above Max or below zero is
// refused. A NoExpiry lifetime accepts only zero and resolves to zero (no exp).
func (l Lifetime) TTL(requested time.Duration) (time.Duration, error) {
	switch {
	case requested < 0:
		return 0, fmt.Errorf("profiles: negative ttl %v", requested)
	case l.NoExpiry:
		if requested != 0 {
			return 0, fmt.Errorf("profiles: ttl %v requested for a credential that carries no exp", requested)
		}
		return 0, nil
	case requested == 0:
		return l.Default, nil
	case requested > l.Max:
		return 0, fmt.Errorf("profiles: ttl %v exceeds the profile maximum %v", requested, l.Max)
	}
	return requested, nil
}

type lifetimeJSON struct {
	Default  string `json:"default,omitempty"`
	Max      string `json:"max,omitempty"`
	NoExpiry bool   `json:"no_expiry,omitempty"`
}

// MarshalJSON renders durations as Go duration strings ("24h0m0s") so golden files are readable.
func (l Lifetime) MarshalJSON() ([]byte, error) {
	j := lifetimeJSON{NoExpiry: l.NoExpiry}
	if l.Default != 0 {
		j.Default = l.Default.String()
	}
	if l.Max != 0 {
		j.Max = l.Max.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Lifetime) UnmarshalJSON(b []byte) error {
	var j lifetimeJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := Lifetime{NoExpiry: j.NoExpiry}
	for _, f := range []struct {
		s   string
		dst *time.Duration
	}{{j.Default, &out.Default}, {j.Max, &out.Max}} {
		if f.s == "" {
			continue
		}
		d, err := time.ParseDuration(f.s)
		if err != nil {
			return fmt.Errorf("profiles: lifetime: %w", err)
		}
		*f.dst = d
	}
	*l = out
	return nil
}

// ParamError reports a profile parameter that is missing, malformed, or would widen the profile.
// Field names the Params field (or "space", "userPub", "issuerAccount", "ttl" for the values Build
// and Claims take directly). Err, when set, is the underlying grammar error (a *space.NameError).
type ParamError struct {
	Profile Name
	Field   string
	Reason  string
	Err     error
}

func (e *ParamError) Error() string {
	return fmt.Sprintf("profile %s: parameter %s: %s", e.Profile, e.Field, e.Reason)
}

// Unwrap returns the underlying grammar error, if any.
func (e *ParamError) Unwrap() error { return e.Err }

// UnknownProfileError reports a profile name that is not in the matrix.
type UnknownProfileError struct{ Name string }

func (e *UnknownProfileError) Error() string { return fmt.Sprintf("unknown profile %q", e.Name) }
