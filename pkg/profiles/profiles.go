// Package profiles is the credential profile matrix as data: for each profile, the account its
// users live in, the parameters it requires and accepts, its lifetime class, and the exact NATS
// permissions it grants. signerd is its only minting caller: a caller names a profile and supplies
// Params; Build validates them against pkg/space grammars and the profile's declared fields and
// returns a Spec; Spec.Claims is the only place user claims are built. No caller ever supplies a
// permission.
//
// The rows follow upstream Cotal's provision.ts permissionsFor (see reference/auth.md §2). Common
// rules and the choices made here:
//
//   - Default deny. Every profile has a non-empty publish and subscribe permission (an empty one
//     would mean allow-all to the broker); Claims refuses a spec that would encode one.
//   - Reply inbox. Upstream gives every profile _INBOX_<connId>.>. At Build time we do not know
//     the connection, so the data-account profiles get their inbox row in Claims:
//     _INBOX_<Params.InboxNonce>.> on the auth-callout path (the client chose the nonce and sent it
//     as its connection name) or _INBOX_<user nkey>.> on the static path. Clients connect with
//     space.InboxPrefix of the same token as their custom inbox prefix. Keying on the nkey rather
//     than on the principal keeps two credentials of one principal (say, two incarnations) from
//     reading each other's replies. The AUTH-account users (auth-callout, sentinel) get no inbox:
//     the callout only answers on server-chosen reply subjects and the sentinel may do nothing.
//     Nor does service-serve (seed 002): a service instance only hears its own serve subjects
//     and answers on their reply family, so it needs no inbox and is bound to no nonce.
//   - No profile sets resp (response permissions): replies ride explicit .reply.> rows, as upstream.
//   - Tags are owner:<o>, actor:<a>, principal:<o>.<a> when the credential holder is a principal,
//     and always profile:<name>. jwt.TagList.Add lower-cases tags; Claims assigns the list as is so
//     the principal tag keeps the case of the owner and actor it attributes.
//   - Channels may be patterns, as upstream's ACLs hold them: the agent's Subscribe,
//     AllowSubscribe and AllowPublish take space.ValidateChannelPattern ("team.>" a subtree,
//     "team.*" one level; a wildcard is a whole token, '>' last), become the rows
//     chat.<o>.<a>.<pattern> (post), chat.*.*.<pattern> (read) and the chathist_ create row
//     filtered on the read pattern, and Subscribe must be within AllowSubscribe
//     (space.PatternCovers). Build does not judge a pattern's width: signerd grants one only where
//     a channel pattern of the caller's policy covers its broker reach (space.ChannelReach: a
//     trailing '*' reaches the subtree, since the broker lets such a row admit a literal '>') and
//     that reach overlaps no excluded pattern; channels_test.go proves both ends on a broker.
//     Every other channel in the project (chat subjects, member keys, durable joins, ACL reads of
//     one channel) stays concrete.
//   - KV reads carry both read verbs: the leader-served STREAM.MSG.GET upstream's JS client uses,
//     and DIRECT.GET.<stream>.> that the Go KV client uses on allow_direct buckets. Both reach every
//     key of the bucket, so the pair grants nothing the upstream row does not. Every KV watch
//     carries CONSUMER.DELETE as well as CREATE and INFO, because an ordered consumer deletes its
//     predecessor when it rebuilds (upstream added it to the agent and observer for that reason).
//
// Narrowed from upstream (issue 8), each proved on the broker by narrow_test.go. Upstream's rows let
// the observer consume, ack, rewrite and delete deliveryd's fanout durable on CHAT and the admin do
// the same to every agent's dm_ durable on DM, and let every non-daemon profile create any
// consumer on the bucket streams it watches; the example signer policy mints observer for any
// signed-in owner, so any user could stall delivery for a space. The rules here:
//
//   - No profile but delivery may fetch from, ack on, update or delete fanout or reader, and none
//     but the owner (bind-only) and the deprovisioner (INFO and delete by exact name) may touch a
//     member's dm_ or dlv_ durable; the provisioner creates them and reads none
//     (TestOnlyOwnersTouchDurables checks this over every profile).
//   - Observer and admin hold no consumer verb at all, and deny $JS.API.CONSUMER.> and $JS.ACK.>
//     as defence in depth. They read history with message gets (STREAM.MSG.GET, and DIRECT.GET
//     bare and by subject, for streams with allow_direct), whose request carries the sequence or
//     next_by_subj filter and whose answer comes to their own inbox, and read live traffic with the
//     core subscriptions upstream already grants. A get leaves no server-side state to steal.
//   - No non-daemon profile (agent, observer, admin, operator) may create a KV-watch consumer. A
//     watch is an ordered push consumer: nats.go names it with a random hash and puts its deliver
//     subject in the request body. The broker checks neither against the creator's permissions
//     (issue 8 saw an upstream agent's presence pushed into CHAT; narrow_test.go shows the broker
//     accepting a deliver subject its creator may neither publish nor subscribe to), and a create
//     row cannot pin a name the client does not choose, so the row is refused, not granted. Instead they read
//     a bucket with gets and follow it with a core subscription on its put subjects
//     ($KV.<bucket>.>): agent on presence and channels, observer and admin on presence, channels
//     and membership; the operator, which receives no feed, reads with gets only. This reads what a
//     watch reads. $JS.FC.> (flow control, used only by push consumers) goes with the watch rows.
//     Clients use KeyValue.Get and a subscription, not KeyValue.Watch/Keys.
//   - The auth-plane profile (authd's data-account connection; authd is the lifecycle authority and
//     the only writer of lifecycle rows) holds no consumer verb and no subscription on a bucket.
//     It writes only the plane claim and the lifecycle key families of cotal_auth_<space> (gate.*,
//     stage.*, epgate.*.*, and seed 002's sep.name.*, sep.req.*.*, sep.prop.*.*, sep.root.*.*,
//     sep.art.*) and cotal_records_<space> (lifecycle.*.*, uid.*, frontier.*, svc.*.*),
//     each row pinning a family's prefix and token count. It reads those two buckets and the
//     manager bucket with the leader-served STREAM.MSG.GET, whose key rides the body and so reaches
//     every key of each: granted because the holder is the authority that must read every
//     lifecycle row and each manager's lease, and to no other profile. It reads the plane row
//     with the direct get whose API subject names the key (pkg/lease's path). It serves the two
//     auth rails (retire-lifecycle, register-manager) in their queue group only (a "<subject>
//     <queue>" row) and publishes only their .reply answers. Its one row outside the data
//     buckets and rails is the account-scoped CONNZ request ($SYS.REQ.ACCOUNT.PING.CONNZ,
//     answered with the data account's connections only), the liveness sweep authd runs before
//     it reclaims a held plane claim early and the retirement barrier's containment poll. As
//     principal local.authd (fixed by the profile) it publishes its own delivery-admin request
//     subject and hears its .reply.<nonce> lane, for lifecycleMemberships, the one op deliveryd
//     answers that principal there. The
//     retirement requester (a manager's serve principal, one target) publishes only its one
//     retire-lifecycle subject and the supervisor only its own register-manager subject; each
//     hears only those subjects' answers. The service-serve credential (seed 002; actor
//     svc_<instanceId>, granted only through the callout on a verified service access bearer,
//     at most 60 s) subscribes only cotal.<t>.sep.<epTok>.<iid>.> and publishes only
//     cotal.<t>.sep.reply.<epTok>.<iid>.>: no inbox, no JetStream, no bucket. The daemon profiles
//     (supervisor, delivery, membership-rw), minted by policy only to their daemons, keep
//     upstream's watch rows where they list a bucket; delivery follows its own lease key the
//     non-daemon way (see deliveryPerms).
//   - The legacy bare $JS.API.CONSUMER.CREATE.<stream> is never granted to a non-daemon profile: the
//     server takes that consumer's name from the request body (the broker test shows a create named
//     by its body), so no permission can pin it. Named creates ($JS.API.CONSUMER.CREATE.<stream>.
//     <name>.<filter>) pin the name and, since the server refuses a body filter that differs from
//     the subject's, the filter; the agent's chathist_<o>-<a>-<uid> rows are the only create rows a
//     non-daemon profile holds.
//
// What the broker cannot express, and what is left:
//
//   - A create row cannot restrict a consumer to pull mode or its deliver subject to the holder's
//     inbox: both ride the body. So the agent can still make its own chathist_ consumer a push
//     consumer delivering elsewhere; what it pushes is only channel history the agent may read,
//     and it is the one create row kept, since no permission can pin a per-channel history read
//     any other way (a get's next_by_subj filter rides the body too).
//   - The broker checks no reply subject. The answer to any request (a JetStream API response, a
//     message get, a pull fetch) goes to whatever reply subject the requester chose, published by
//     the server, so a stream capturing that subject stores it; the broker test shows an agent's
//     $JS.API.INFO answer stored in CHAT under another principal's chat subject. No permission row
//     can close this for any profile holding a JetStream verb; consumers of the space's streams
//     must not take a stored message's subject alone as proof of its sender.
//
// Deferred, and said so where each row would go: the v0.4 endpoint (ep.*) rows, but for the two auth rails, and everything that
// hangs off them (the agent's baseline and capability rows, its ep reply rail and goal-progress
// rows, the delivery daemon's timer writer on ept.*, the provisioner's endpoint-plane streams and
// object store, issued-authority rows).
//
// The delivery daemon's two $SYS users (membership-observer, connection-evictor) are profiles of
// the system account (AccountSystem), signed by its signing key, which signerd holds. Their rows
// name the space's data account (Params.DataAccount, which signerd fills from the space, never
// from a caller): the observer may request that account's CONNZ and hear its CONNECT and
// DISCONNECT events; the evictor may only ask a server to KICK a connection id. The KICK row
// carries no account (the server's API has none), so the evictor's reach is every connection of
// the broker: it is minted per eviction, for minutes, and only to deliveryd, which kicks only
// connection ids its observer found in its own data account.
//
// Plane liveness (upstream #1577, SPEC §6.1): each plane's own credential serves live.<plane>.*.*
// and replies only on its .reply.> leaves (delivery for the delivery plane, supervisor for the
// manager plane); the agent, the peer upstream lets ask, publishes a probe of either plane as its
// own principal and subscribes its own .reply.> lane. Observer and admin hold no probe row, as
// upstream: the observer has no principal to pin a probe to, and neither is a peer.
package profiles

import (
	"sort"
	"time"
)

// Capability words an agent may carry. The set is closed: Build refuses any other word. Upstream
// maps each to endpoint-rail rows, which are deferred, so today a capability is validated and
// recorded in the agent's policy but adds no broker row.
const (
	CapSpawn = "spawn"
	CapRun   = "run"
	CapAdmin = "admin"
)

var capabilities = map[string]bool{CapSpawn: true, CapRun: true, CapAdmin: true}

// MaxChannels caps each channel list in Params. A user JWT carries its grants inline in the
// CONNECT line, which the broker caps; 128 channels keeps an agent JWT far below that.
const MaxChannels = 128

// field is a bit set of Params fields.
type field uint16

const (
	fOwner field = 1 << iota
	fActor
	fUID
	fRole
	fSubscribe
	fAllowSubscribe
	fAllowPublish
	fCapabilities
	fInboxNonce
	fDataAccount
	fTarget
	fServiceEndpoint
	fInstanceID
	fMemberChannels
)

// fieldNames maps each field bit to its Params field name, in declaration order.
var fieldNames = []struct {
	f    field
	name string
}{
	{fOwner, "Owner"},
	{fActor, "Actor"},
	{fUID, "LifecycleUID"},
	{fRole, "Role"},
	{fSubscribe, "Subscribe"},
	{fAllowSubscribe, "AllowSubscribe"},
	{fAllowPublish, "AllowPublish"},
	{fCapabilities, "Capabilities"},
	{fInboxNonce, "InboxNonce"},
	{fDataAccount, "DataAccount"},
	{fTarget, "Target"},
	{fServiceEndpoint, "ServiceEndpoint"},
	{fInstanceID, "InstanceID"},
	{fMemberChannels, "MemberChannels"},
}

const (
	day      = 24 * time.Hour
	standing = day
	oneShot  = 5 * time.Minute
)

// ServiceServeLifetime is the service-serve profile's lifetime (default and maximum): an access
// bearer's cap, which the callout's grant never exceeds.
const ServiceServeLifetime = 60 * time.Second

// ServiceActorPrefix starts a service-serve credential's actor: svc_<instanceId>.
const ServiceActorPrefix = "svc_"

// ManagerActorPrefix starts a remote-manager credential's actor: manager_<instanceId>, the
// manager instance's supervisor actor (pkg/lifecycle.ManagerActors).
const ManagerActorPrefix = "manager_"

// The auth-plane credential's fixed principal, local.authd: it is not a parameter (the profile
// accepts none), Build sets it, and the credential carries its owner, actor and principal tags.
// deliveryd's delivery-admin lane admits this principal for lifecycleMemberships alone.
const (
	AuthPlaneOwner = "local"
	AuthPlaneActor = "authd"
)

// rule is one row of the matrix.
type rule struct {
	account  AccountKind
	lifetime Lifetime
	// requires must be set; accepts may be set (a superset of requires). Owner and Actor are
	// always accepted or required together.
	requires field
	accepts  field
	// target marks profiles whose Owner/Actor/LifecycleUID name the credential's target (the
	// deprovisioner's departed agent), not its holder: they get no principal tags or name.
	target bool
	// service marks the service-serve profile: its Owner is a derived owner, its Actor is not a
	// parameter but svc_<InstanceID>, it gets no reply inbox, and it is granted only through the
	// auth callout (CalloutOnly).
	service bool
	// managerInstance marks the remote-manager profile: InstanceID names the manager instance
	// and Actor must be that instance's supervisor actor, manager_<InstanceID>.
	managerInstance bool
	// owner and actor, when set, are the profile's fixed principal (auth-plane's local.authd):
	// Build fills them in, and the profile accepts neither as a parameter.
	owner, actor string
	bearer       bool
	perms        func(*builder)
}

func lt(d time.Duration) Lifetime { return Lifetime{Default: d, Max: d} }

// matrix is the profile table. It is never mutated after init.
var matrix = map[Name]rule{
	Agent: {
		account: AccountData, lifetime: lt(standing),
		requires: fOwner | fActor | fUID,
		accepts:  fOwner | fActor | fUID | fRole | fSubscribe | fAllowSubscribe | fAllowPublish | fCapabilities | fInboxNonce,
		perms:    agentPerms,
	},
	Supervisor: {
		account: AccountData, lifetime: lt(standing),
		requires: fOwner | fActor, accepts: fOwner | fActor | fInboxNonce,
		perms: supervisorPerms,
	},
	Provisioner: {
		account: AccountData, lifetime: lt(oneShot),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   provisionerPerms,
	},
	Deprovisioner: {
		account: AccountData, lifetime: lt(oneShot),
		requires: fOwner | fActor | fUID, accepts: fOwner | fActor | fUID | fInboxNonce | fMemberChannels,
		target: true,
		perms:  deprovisionerPerms,
	},
	Delivery: {
		account: AccountData, lifetime: lt(standing),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   deliveryPerms,
	},
	// The membership feed's writer runs inside deliveryd next to the delivery credential and is
	// renewed the same way.
	MembershipRW: {
		account: AccountData, lifetime: lt(standing),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   membershipRWPerms,
	},
	// Upstream observer and admin are static credentials with no exp. We never issue a
	// non-expiring credential that can read anything, so they are standing 24h credentials and
	// their holder renews them.
	Observer: {
		account: AccountData, lifetime: lt(standing),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   observerPerms,
	},
	Admin: {
		account: AccountData, lifetime: lt(standing),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   adminPerms,
	},
	Operator: {
		account: AccountData, lifetime: lt(oneShot),
		requires: fOwner | fActor, accepts: fOwner | fActor | fInboxNonce,
		perms: operatorPerms,
	},
	Probe: {
		account: AccountData, lifetime: lt(60 * time.Second),
		accepts: fOwner | fActor | fInboxNonce,
		perms:   probePerms,
	},
	// Upstream's callout user carries no exp; ours is a standing 24h credential authd renews.
	AuthCallout: {
		account: AccountAuth, lifetime: lt(standing),
		perms: authCalloutPerms,
	},
	// authd's data-account connection (issue 9's plane claim, issue 23's lifecycle authority),
	// renewed by the rail like any daemon credential.
	AuthPlane: {
		account: AccountData, lifetime: lt(standing),
		owner: AuthPlaneOwner, actor: AuthPlaneActor,
		perms: authPlanePerms,
	},
	// One retirement request (issue 23): authd mints it for a manager's serve principal, which
	// uses it once on the retire-lifecycle rail. Owner, Actor and LifecycleUID name the holder
	// (the caller), Target the lifecycle it may ask to retire.
	RetirementRequester: {
		account: AccountData, lifetime: lt(oneShot),
		requires: fOwner | fActor | fUID | fTarget, accepts: fOwner | fActor | fUID | fTarget,
		perms: retirementRequesterPerms,
	},
	// A service endpoint instance's serving connection (seed 002): authd's callout grants it on a
	// verified service access bearer, for at most the bearer's remaining life (<= 60 s).
	ServiceServe: {
		account: AccountData, lifetime: lt(ServiceServeLifetime),
		requires: fOwner | fServiceEndpoint | fInstanceID, accepts: fOwner | fServiceEndpoint | fInstanceID,
		service: true,
		perms:   serviceServePerms,
	},
	// A remote managerd's supervisor credential (issue 25): authd mints it for the manager's
	// supervisor nkey on the manager-service authority's prepare and renew.
	RemoteManager: {
		account: AccountData, lifetime: lt(standing),
		requires: fOwner | fActor | fInstanceID, accepts: fOwner | fActor | fInstanceID | fInboxNonce,
		managerInstance: true,
		perms:           remoteManagerPerms,
	},
	// The delivery daemon's two $SYS users (upstream's membership-observer and
	// connection-evictor, static 30-day credentials there). Ours are short: deliveryd mints the
	// observer for its feed connection and renews it by minting again, and mints the evictor per
	// eviction. Neither takes a principal; both name the space's data account.
	MembershipObserver: {
		account: AccountSystem, lifetime: lt(standing),
		requires: fDataAccount, accepts: fDataAccount,
		perms: membershipObserverPerms,
	},
	ConnectionEvictor: {
		account: AccountSystem, lifetime: lt(oneShot),
		requires: fDataAccount, accepts: fDataAccount,
		perms: connectionEvictorPerms,
	},
	// The sentinel is public and powerless (deny everything), so it is the one credential
	// without exp: clients ship it next to their bearer token.
	Sentinel: {
		account: AccountAuth, lifetime: Lifetime{NoExpiry: true},
		bearer: true,
		perms:  sentinelPerms,
	},
}

// Parse maps a profile name to its Name, refusing anything outside the matrix with
// *UnknownProfileError. It is exact: no case folding or trimming.
func Parse(s string) (Name, error) {
	if _, ok := matrix[Name(s)]; ok {
		return Name(s), nil
	}
	return "", &UnknownProfileError{Name: s}
}

// All lists every profile, sorted by name.
func All() []Name {
	out := make([]Name, 0, len(matrix))
	for n := range matrix {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Account is the account the profile's users live in; zero for an unknown name.
func (n Name) Account() AccountKind { return matrix[n].account }

// CalloutOnly reports whether the profile is granted only through the auth callout
// (SignCalloutResponse), never by Mint or Remint: service-serve, whose grant follows a verified
// service access bearer.
func (n Name) CalloutOnly() bool { return matrix[n].service }

// HasInbox reports whether the profile's credentials carry a reply-inbox row (Claims adds it):
// every data-account and system-account profile but service-serve.
func (n Name) HasInbox() bool {
	r, ok := matrix[n]
	return ok && (r.account == AccountData || r.account == AccountSystem) && !r.service
}

// Lifetime is the profile's lifetime class; the zero Lifetime for an unknown name (which Claims
// refuses, since its Max is zero).
func (n Name) Lifetime() Lifetime { return matrix[n].lifetime }

// String returns the profile name.
func (n Name) String() string { return string(n) }
