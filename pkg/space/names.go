package space

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Control and liveness service tokens (upstream CONTROL_DELIVERY, CONTROL_DELIVERY_ADMIN and the
// liveness rail's two planes, LIVENESS_PLANES). The liveness planes are a closed set: each plane's
// responder answers only for itself, on live.<plane>.*.*.
const (
	CtlServiceDelivery      = "delivery"
	CtlServiceDeliveryAdmin = "delivery-admin"
	LivePlaneDelivery       = "delivery"
	LivePlaneManager        = "manager"
)

// Fixed KV keys (upstream subjects.ts).
const (
	// DeliveryLeaseKey is the delivery daemon's single-shard lease key in the delivery bucket.
	DeliveryLeaseKey = "lease.0"
	// ManagerRenewalKey is the per-space daemon-credential renewal lease in the manager bucket.
	ManagerRenewalKey = "renewal"
	// ChannelDefaultsKey holds space-wide channel defaults in the channels bucket; '=' is outside
	// every channel's alphabet, so it cannot collide with a channel.
	ChannelDefaultsKey = "=defaults"
	// MembershipFeedKey is the membership feed's heartbeat key.
	MembershipFeedKey = "=feed"
)

// ErrZeroNames is returned by Names builders called on a Names not made by NewNames.
var ErrZeroNames = errors.New("space: Names not built by NewNames")

// Names builds every name one space uses. Make it with NewNames; the zero value is invalid (its
// error-returning builders return ErrZeroNames and its other builders return subjects with an
// empty token, which the broker refuses).
type Names struct {
	name  string
	token string
}

// NewNames validates spaceName with ValidateName and returns its name builder.
func NewNames(spaceName string) (Names, error) {
	if err := ValidateName(spaceName); err != nil {
		return Names{}, err
	}
	return Names{name: spaceName, token: Token(spaceName)}, nil
}

// Name is the space name as given.
func (n Names) Name() string { return n.name }

// Token is the space's wire token (see Token).
func (n Names) Token() string { return n.token }

// Segment is the space's on-disk segment (see Segment).
func (n Names) Segment() string { return Segment(n.name) }

// Prefix is cotal.<token>, the first two tokens of every subject in the space.
func (n Names) Prefix() string { return Root + "." + n.token }

// sub is <Prefix>.<rest>, in one concatenation.
func (n Names) sub(rest string) string { return Root + "." + n.token + "." + rest }

func (n Names) check() error {
	if n.token == "" {
		return ErrZeroNames
	}
	return nil
}

func (n Names) principal(owner, actor string) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ValidateActor(actor); err != nil {
		return "", err
	}
	return owner + "." + actor, nil
}

func (n Names) lifecycle(owner, actor, uid string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateUID(uid); err != nil {
		return "", err
	}
	return p + "." + uid, nil
}

// ---- chat (multicast) ----

// Chat is the subject a principal posts to a channel on: cotal.<t>.chat.<owner>.<actor>.<channel>.
func (n Names) Chat(owner, actor, channel string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateChannel(channel); err != nil {
		return "", err
	}
	return n.sub("chat." + p + "." + channel), nil
}

// ChatFrom is the publish pattern for one principal on every channel:
// cotal.<t>.chat.<owner>.<actor>.> (wildcard: the trailing '>').
func (n Names) ChatFrom(owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("chat." + p + ".>"), nil
}

// ChatRead is the read pattern for one channel from any principal:
// cotal.<t>.chat.*.*.<channel> (wildcards: the two principal tokens).
func (n Names) ChatRead(channel string) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := ValidateChannel(channel); err != nil {
		return "", err
	}
	return n.sub("chat.*.*." + channel), nil
}

// ChatGrant is the publish row for one principal on a channel pattern (ValidateChannelPattern):
// cotal.<t>.chat.<owner>.<actor>.<pattern>. For a concrete channel it equals Chat.
func (n Names) ChatGrant(owner, actor, pattern string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateChannelPattern(pattern); err != nil {
		return "", err
	}
	return n.sub("chat." + p + "." + pattern), nil
}

// ChatReadGrant is the read row for a channel pattern from any principal:
// cotal.<t>.chat.*.*.<pattern>. For a concrete channel it equals ChatRead.
func (n Names) ChatReadGrant(pattern string) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := ValidateChannelPattern(pattern); err != nil {
		return "", err
	}
	return n.sub("chat.*.*." + pattern), nil
}

// ChatAll is every chat subject, cotal.<t>.chat.> (the CHAT stream's subject).
func (n Names) ChatAll() string { return n.sub("chat.>") }

// ---- inst (unicast / DM) ----

// Inst is a DM subject: cotal.<t>.inst.<recipOwner>.<recipActor>.<sndOwner>.<sndActor>.
func (n Names) Inst(recipOwner, recipActor, sndOwner, sndActor string) (string, error) {
	r, err := n.principal(recipOwner, recipActor)
	if err != nil {
		return "", err
	}
	s, err := n.principal(sndOwner, sndActor)
	if err != nil {
		return "", err
	}
	return n.sub("inst." + r + "." + s), nil
}

// InstFrom is the send pattern for one sender to any recipient:
// cotal.<t>.inst.*.*.<owner>.<actor> (wildcards: the two recipient tokens).
func (n Names) InstFrom(owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("inst.*.*." + p), nil
}

// InstTo is the receive pattern for one recipient from any sender:
// cotal.<t>.inst.<owner>.<actor>.> (wildcard: the trailing '>').
func (n Names) InstTo(owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("inst." + p + ".>"), nil
}

// InstAll is every DM subject, cotal.<t>.inst.> (the DM stream's subject).
func (n Names) InstAll() string { return n.sub("inst.>") }

// ---- svc (anycast / tasks) ----

// Svc is an anycast subject to a role: cotal.<t>.svc.<role>.<owner>.<actor>.
func (n Names) Svc(role, owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateRole(role); err != nil {
		return "", err
	}
	return n.sub("svc." + role + "." + p), nil
}

// SvcFrom is the send pattern for one sender to any role: cotal.<t>.svc.*.<owner>.<actor>
// (wildcard: the role token).
func (n Names) SvcFrom(owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("svc.*." + p), nil
}

// SvcServe is the serve pattern for one role from any sender: cotal.<t>.svc.<role>.> (wildcard:
// the trailing '>'). It is the svc_<role> consumer's filter.
func (n Names) SvcServe(role string) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if err := ValidateRole(role); err != nil {
		return "", err
	}
	return n.sub("svc." + role + ".>"), nil
}

// SvcAll is every anycast subject, cotal.<t>.svc.> (the TASK stream's subject).
func (n Names) SvcAll() string { return n.sub("svc.>") }

// ---- ctl (delivery daemon control rails) ----

func (n Names) ctl(service, owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("ctl." + service + "." + p), nil
}

func (n Names) ctlReply(service, owner, actor, nonce string) (string, error) {
	s, err := n.ctl(service, owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateInboxNonce(nonce); err != nil {
		return "", err
	}
	return s + ".reply." + nonce, nil
}

func (n Names) ctlTree(service, owner, actor string) (string, error) {
	s, err := n.ctl(service, owner, actor)
	if err != nil {
		return "", err
	}
	return s + ".>", nil
}

// CtlDelivery is a principal's request subject to the delivery daemon:
// cotal.<t>.ctl.delivery.<owner>.<actor>.
func (n Names) CtlDelivery(owner, actor string) (string, error) {
	return n.ctl(CtlServiceDelivery, owner, actor)
}

// CtlDeliveryReply is the reply subject for one request:
// cotal.<t>.ctl.delivery.<owner>.<actor>.reply.<nonce> (nonce grammar: ValidateInboxNonce).
func (n Names) CtlDeliveryReply(owner, actor, nonce string) (string, error) {
	return n.ctlReply(CtlServiceDelivery, owner, actor, nonce)
}

// CtlDeliveryTree is the caller's reply subtree: cotal.<t>.ctl.delivery.<owner>.<actor>.>
// (wildcard: the trailing '>').
func (n Names) CtlDeliveryTree(owner, actor string) (string, error) {
	return n.ctlTree(CtlServiceDelivery, owner, actor)
}

// CtlDeliveryServe is the daemon's serve pattern: cotal.<t>.ctl.delivery.*.* (wildcards: the
// caller principal).
func (n Names) CtlDeliveryServe() string { return n.sub("ctl." + CtlServiceDelivery + ".*.*") }

// CtlDeliveryReplyAny is the daemon's reply-publish pattern:
// cotal.<t>.ctl.delivery.*.*.reply.> (wildcards: the caller principal and the reply tail).
func (n Names) CtlDeliveryReplyAny() string {
	return n.sub("ctl." + CtlServiceDelivery + ".*.*.reply.>")
}

// CtlDeliveryAdmin is a principal's request subject on the delivery daemon's admin rail:
// cotal.<t>.ctl.delivery-admin.<owner>.<actor>.
func (n Names) CtlDeliveryAdmin(owner, actor string) (string, error) {
	return n.ctl(CtlServiceDeliveryAdmin, owner, actor)
}

// CtlDeliveryAdminReply is the reply subject for one admin request:
// cotal.<t>.ctl.delivery-admin.<owner>.<actor>.reply.<nonce>.
func (n Names) CtlDeliveryAdminReply(owner, actor, nonce string) (string, error) {
	return n.ctlReply(CtlServiceDeliveryAdmin, owner, actor, nonce)
}

// CtlDeliveryAdminTree is the admin caller's reply subtree:
// cotal.<t>.ctl.delivery-admin.<owner>.<actor>.> (wildcard: the trailing '>').
func (n Names) CtlDeliveryAdminTree(owner, actor string) (string, error) {
	return n.ctlTree(CtlServiceDeliveryAdmin, owner, actor)
}

// CtlDeliveryAdminServe is the daemon's admin serve pattern: cotal.<t>.ctl.delivery-admin.*.*.
func (n Names) CtlDeliveryAdminServe() string {
	return n.sub("ctl." + CtlServiceDeliveryAdmin + ".*.*")
}

// CtlDeliveryAdminReplyAny is the daemon's admin reply-publish pattern:
// cotal.<t>.ctl.delivery-admin.*.*.reply.>.
func (n Names) CtlDeliveryAdminReplyAny() string {
	return n.sub("ctl." + CtlServiceDeliveryAdmin + ".*.*.reply.>")
}

// ---- Plane-3 durable delivery ----

// Dinbox is a lifecycle's pre-auth inbox subject (fan-out target):
// cotal.<t>.dinbox.<owner>.<actor>.<uid>.
func (n Names) Dinbox(owner, actor, uid string) (string, error) {
	l, err := n.lifecycle(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return n.sub("dinbox." + l), nil
}

// DinboxAny is the fan-out writer's publish pattern: cotal.<t>.dinbox.*.*.* (wildcards: the
// lifecycle triple; exact arity, so a short subject is refused by the broker).
func (n Names) DinboxAny() string { return n.sub("dinbox.*.*.*") }

// DinboxAll is every inbox subject, cotal.<t>.dinbox.> (the INBOX stream's and reader's filter).
func (n Names) DinboxAll() string { return n.sub("dinbox.>") }

// Dlv is a lifecycle's post-auth delivery subject: cotal.<t>.dlv.<owner>.<actor>.<uid>.
func (n Names) Dlv(owner, actor, uid string) (string, error) {
	l, err := n.lifecycle(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return n.sub("dlv." + l), nil
}

// DlvAny is the trusted reader's publish pattern: cotal.<t>.dlv.*.*.*.
func (n Names) DlvAny() string { return n.sub("dlv.*.*.*") }

// DlvAll is every delivery subject, cotal.<t>.dlv.> (the DLV stream's subject).
func (n Names) DlvAll() string { return n.sub("dlv.>") }

// ---- liveness rail ----
//
// A peer asks whether a plane is alive with an empty request on live.<plane>.<owner>.<actor>
// (its own principal) and names its reply subject under it, <request>.reply.<nonce>. The plane's
// responder subscribes live.<plane>.*.* in the queue group live.<plane> and may publish only on the
// .reply.> leaves, so it can answer any caller but never forge a probe (upstream livenessSubject,
// livenessServeFilter, livenessReplyGrant).

func (n Names) live(plane, owner, actor string) (string, error) {
	p, err := n.principal(owner, actor)
	if err != nil {
		return "", err
	}
	return n.sub("live." + plane + "." + p), nil
}

func (n Names) liveReplies(plane, owner, actor string) (string, error) {
	s, err := n.live(plane, owner, actor)
	if err != nil {
		return "", err
	}
	return s + ".reply.>", nil
}

// LiveQueue is the queue group a plane's responders serve in: live.<plane>.
func LiveQueue(plane string) string { return "live." + plane }

// LiveDelivery is a principal's liveness probe of the delivery plane:
// cotal.<t>.live.delivery.<owner>.<actor>.
func (n Names) LiveDelivery(owner, actor string) (string, error) {
	return n.live(LivePlaneDelivery, owner, actor)
}

// LiveDeliveryReplies is the prober's reply lane for its delivery probes:
// cotal.<t>.live.delivery.<owner>.<actor>.reply.>.
func (n Names) LiveDeliveryReplies(owner, actor string) (string, error) {
	return n.liveReplies(LivePlaneDelivery, owner, actor)
}

// LiveDeliveryServe is the responder's pattern: cotal.<t>.live.delivery.*.*.
func (n Names) LiveDeliveryServe() string { return n.sub("live." + LivePlaneDelivery + ".*.*") }

// LiveDeliveryReplyAny is the responder's reply-publish pattern:
// cotal.<t>.live.delivery.*.*.reply.>.
func (n Names) LiveDeliveryReplyAny() string {
	return n.sub("live." + LivePlaneDelivery + ".*.*.reply.>")
}

// LiveManager is a principal's liveness probe of the manager plane:
// cotal.<t>.live.manager.<owner>.<actor>.
func (n Names) LiveManager(owner, actor string) (string, error) {
	return n.live(LivePlaneManager, owner, actor)
}

// LiveManagerReplies is the prober's reply lane for its manager probes:
// cotal.<t>.live.manager.<owner>.<actor>.reply.>.
func (n Names) LiveManagerReplies(owner, actor string) (string, error) {
	return n.liveReplies(LivePlaneManager, owner, actor)
}

// LiveManagerServe is the manager's responder pattern: cotal.<t>.live.manager.*.*.
func (n Names) LiveManagerServe() string { return n.sub("live." + LivePlaneManager + ".*.*") }

// LiveManagerReplyAny is the manager's reply-publish pattern:
// cotal.<t>.live.manager.*.*.reply.>.
func (n Names) LiveManagerReplyAny() string {
	return n.sub("live." + LivePlaneManager + ".*.*.reply.>")
}

// ---- streams ----

// ChatStream is CHAT_<t>, capturing ChatAll.
func (n Names) ChatStream() string { return "CHAT_" + n.token }

// DMStream is DM_<t>, capturing InstAll.
func (n Names) DMStream() string { return "DM_" + n.token }

// TaskStream is TASK_<t>, capturing SvcAll.
func (n Names) TaskStream() string { return "TASK_" + n.token }

// InboxStream is INBOX_<t>, capturing DinboxAll.
func (n Names) InboxStream() string { return "INBOX_" + n.token }

// DLVStream is DLV_<t>, capturing DlvAll.
func (n Names) DLVStream() string { return "DLV_" + n.token }

// ---- consumers ----

// FanoutConsumer is the delivery daemon's durable on CHAT ("fanout").
func (n Names) FanoutConsumer() string { return "fanout" }

// ReaderConsumer is the delivery daemon's trusted-reader durable on INBOX ("reader").
func (n Names) ReaderConsumer() string { return "reader" }

func lifecycleName(owner, actor, uid string) (string, error) {
	if err := ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ValidateActor(actor); err != nil {
		return "", err
	}
	if err := ValidateUID(uid); err != nil {
		return "", err
	}
	// Owner and actor exclude '-' and the UID is [a-z0-9], so this form is injective.
	return owner + "-" + actor + "-" + uid, nil
}

// DlvConsumer is a lifecycle's bind-only durable on DLV: dlv_<owner>-<actor>-<uid>.
func (n Names) DlvConsumer(owner, actor, uid string) (string, error) {
	l, err := lifecycleName(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return "dlv_" + l, nil
}

// DMConsumer is a lifecycle's bind-only durable on DM: dm_<owner>-<actor>-<uid>.
func (n Names) DMConsumer(owner, actor, uid string) (string, error) {
	l, err := lifecycleName(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return "dm_" + l, nil
}

// ChatHistConsumer is a lifecycle's history-read consumer on CHAT: chathist_<owner>-<actor>-<uid>.
func (n Names) ChatHistConsumer(owner, actor, uid string) (string, error) {
	l, err := lifecycleName(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return "chathist_" + l, nil
}

// CatchupConsumer is the delivery daemon's activation catch-up ephemeral on CHAT:
// cu_<owner>-<actor>-<uid>_<gen>.
func (n Names) CatchupConsumer(owner, actor, uid string, gen uint64) (string, error) {
	l, err := lifecycleName(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return "cu_" + l + "_" + strconv.FormatUint(gen, 10), nil
}

// SvcConsumer is a role's shared work-queue durable on TASK: svc_<role>.
func (n Names) SvcConsumer(role string) (string, error) {
	if err := ValidateRole(role); err != nil {
		return "", err
	}
	return "svc_" + role, nil
}

// ---- KV ----

// BucketKind is one of the space's KV buckets. The set is closed; Bucket refuses anything else.
type BucketKind string

// The space's KV buckets, named cotal_<kind>_<t>.
const (
	Presence   BucketKind = "presence"
	Channels   BucketKind = "channels"
	Members    BucketKind = "members"
	ACL        BucketKind = "acl"
	Membership BucketKind = "membership"
	Manager    BucketKind = "manager"
	Delivery   BucketKind = "delivery"
	Auth       BucketKind = "auth"
	Records    BucketKind = "records"
	Issued     BucketKind = "issued"
)

// BucketKinds lists every bucket kind in a fixed order.
func BucketKinds() []BucketKind {
	return []BucketKind{Presence, Channels, Members, ACL, Membership, Manager, Delivery, Auth, Records, Issued}
}

func (k BucketKind) valid() bool {
	for _, v := range BucketKinds() {
		if k == v {
			return true
		}
	}
	return false
}

// Bucket is the KV bucket name cotal_<kind>_<t>.
func (n Names) Bucket(kind BucketKind) (string, error) {
	if err := n.check(); err != nil {
		return "", err
	}
	if !kind.valid() {
		return "", nameErr(KindBucket, string(kind), "is not a known bucket kind")
	}
	return "cotal_" + string(kind) + "_" + n.token, nil
}

// BucketStream is the stream backing a bucket: KV_cotal_<kind>_<t>.
func (n Names) BucketStream(kind BucketKind) (string, error) {
	b, err := n.Bucket(kind)
	if err != nil {
		return "", err
	}
	return "KV_" + b, nil
}

// KV is the subject a put, delete or purge of one key publishes to: $KV.<bucket>.<key>. The key
// must pass ValidateKVKey.
func (n Names) KV(kind BucketKind, key string) (string, error) {
	b, err := n.Bucket(kind)
	if err != nil {
		return "", err
	}
	if err := ValidateKVKey(key); err != nil {
		return "", err
	}
	return "$KV." + b + "." + key, nil
}

// KVAll is every key of a bucket: $KV.<bucket>.> (wildcard: the trailing '>').
func (n Names) KVAll(kind BucketKind) (string, error) {
	b, err := n.Bucket(kind)
	if err != nil {
		return "", err
	}
	return "$KV." + b + ".>", nil
}

// KVKeys is the subject of one key family of a bucket, for a permission row that grants the
// family and nothing else: $KV.<bucket>.<pattern>. pattern is a KV key (ValidateKVKey) in which a
// whole token may be "*" (exactly one token); '>' and a '*' inside a token are refused, so the
// family has a fixed token count and the row never reaches another family's keys.
func (n Names) KVKeys(kind BucketKind, pattern string) (string, error) {
	toks := strings.Split(pattern, ".")
	for i, t := range toks {
		if t == "*" {
			toks[i] = "x" // any one-token key stands in for the wildcard
		}
	}
	if _, err := n.KV(kind, strings.Join(toks, ".")); err != nil {
		return "", err
	}
	b, err := n.Bucket(kind)
	if err != nil {
		return "", err
	}
	return "$KV." + b + "." + pattern, nil
}

// DeliveryLeaseAny is every delivery-daemon shard lease: $KV.cotal_delivery_<t>.lease.*.
func (n Names) DeliveryLeaseAny() string {
	return "$KV.cotal_" + string(Delivery) + "_" + n.token + ".lease.*"
}

// ManagerLeaseAny is every manager-instance lease: $KV.cotal_manager_<t>.lease.*.
func (n Names) ManagerLeaseAny() string {
	return "$KV.cotal_" + string(Manager) + "_" + n.token + ".lease.*"
}

// PrincipalKey is the dot form <owner>.<actor> used as a presence or membership-feed key.
func PrincipalKey(owner, actor string) (string, error) {
	if err := ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ValidateActor(actor); err != nil {
		return "", err
	}
	return owner + "." + actor, nil
}

// ACLKey is a lifecycle's read-ACL key: <owner>.<actor>.<uid>.
func ACLKey(owner, actor, uid string) (string, error) {
	p, err := PrincipalKey(owner, actor)
	if err != nil {
		return "", err
	}
	if err := ValidateUID(uid); err != nil {
		return "", err
	}
	return p + "." + uid, nil
}

// MemberKey is a durable-membership row key: <channel>/<owner>.<actor>.<uid>.
func MemberKey(channel, owner, actor, uid string) (string, error) {
	if err := ValidateChannel(channel); err != nil {
		return "", err
	}
	a, err := ACLKey(owner, actor, uid)
	if err != nil {
		return "", err
	}
	return channel + "/" + a, nil
}

// ManagerLeaseKey is one manager instance's lease key: lease.<instanceID>, where the instance id
// has the UID grammar.
func ManagerLeaseKey(instanceID string) (string, error) {
	if err := ValidateUID(instanceID); err != nil {
		return "", fmt.Errorf("manager instance id: %w", err)
	}
	return "lease." + instanceID, nil
}
