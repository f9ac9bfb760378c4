package profiles

import (
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// Row helpers. Each appends the rows for one upstream grant shape; stream names come from
// space.Names so they cannot drift from the wire layout.

func (b *builder) bucketStream(k space.BucketKind) string {
	s, err := b.n.BucketStream(k)
	if err != nil && b.err == nil {
		b.err = err
	}
	return s
}

// kvBind lets a client open (bind) a bucket.
func (b *builder) kvBind(k space.BucketKind) {
	b.pub(space.StreamInfo(b.bucketStream(k)))
}

// kvGet lets a client read any key: the leader-served and the direct form (see package doc).
func (b *builder) kvGet(k space.BucketKind) {
	s := b.bucketStream(k)
	b.pub(space.StreamMsgGet(s))
	b.pub(space.DirectGetAny(s))
}

// kvGetKey lets a client read one key of an allow_direct bucket and nothing else: the Go and JS
// KV clients read such a bucket by a direct get whose subject names the key
// ($JS.API.DIRECT.GET.<stream>.$KV.<bucket>.<key>), so the broker pins it. The leader-served
// STREAM.MSG.GET is not granted: its key rides the body.
func (b *builder) kvGetKey(k space.BucketKind, key string) {
	direct, err := space.DirectGet(b.bucketStream(k))
	if err != nil {
		b.pub("", err)
		return
	}
	subject, err := b.n.KV(k, key)
	if err != nil {
		b.pub("", err)
		return
	}
	b.pub(direct+"."+subject, nil)
}

// kvWatch lets a client run an ordered consumer (watch, keys) on a bucket, including the delete
// the consumer sends when it rebuilds itself.
func (b *builder) kvWatch(k space.BucketKind) {
	s := b.bucketStream(k)
	b.pub(space.ConsumerCreateAny(s))
	b.pub(space.ConsumerInfoAny(s))
	b.pub(space.ConsumerDeleteAny(s))
}

// kvFeed lets a non-daemon profile follow a bucket live with a core subscription to its put
// subjects ($KV.<bucket>.>) instead of a watch consumer (see the package doc): together with kvGet
// for the current values it reads what a watch reads, and leaves no consumer behind.
func (b *builder) kvFeed(k space.BucketKind) {
	b.sub(b.n.KVAll(k))
}

// kvRead is bind + get + watch.
func (b *builder) kvRead(k space.BucketKind) {
	b.kvBind(k)
	b.kvGet(k)
	b.kvWatch(k)
}

// bindConsumer lets a client bind, fetch from and ack one pre-created consumer it may not create.
func (b *builder) bindConsumer(stream, consumer string, err error) {
	if err != nil {
		b.pub("", err)
		return
	}
	b.pub(space.ConsumerInfo(stream, consumer))
	b.pub(space.ConsumerNext(stream, consumer))
	b.pub(space.Ack(stream, consumer))
}

// readStream lets a daemon create, read, ack and delete any consumer on a stream it may read
// whole (delivery on CHAT). The bare create covers multi-filter and unnamed ephemerals; the .>
// form covers named ones.
func (b *builder) readStream(s string) {
	b.pub(space.StreamInfo(s))
	b.pub(space.ConsumerCreate(s))
	b.pub(space.ConsumerCreateAny(s))
	b.pub(space.ConsumerInfoAny(s))
	b.pub(space.ConsumerNextAny(s))
	b.pub(space.ConsumerDeleteAny(s))
	b.pub(space.AckAny(s))
}

// getStream lets a client read a whole stream by message get, the request carrying the sequence
// or next_by_subj filter, the answer coming to its own inbox: the leader-served STREAM.MSG.GET and
// both DIRECT.GET forms (the bare one for batches, the .> one for last-by-subject). No consumer is
// created, so there is nothing to fetch from, ack, rewrite or delete.
func (b *builder) getStream(s string) {
	b.pub(space.StreamInfo(s))
	b.pub(space.StreamMsgGet(s))
	b.pub(space.DirectGet(s))
	b.pub(space.DirectGetAny(s))
}

// denyConsumers refuses every consumer verb and every ack on every stream: defence in depth for
// the profiles that hold no consumer row at all (observer, admin, operator), so a row added later
// by mistake cannot reach another principal's durable.
func (b *builder) denyConsumers() {
	b.deny(space.JSConsumerAPI, nil)
	b.deny(space.JSAckAll, nil)
}

// denyCreate refuses every consumer-create form on a stream (bare, named, legacy durable).
func (b *builder) denyCreate(s string) {
	b.deny(space.ConsumerCreate(s))
	b.deny(space.ConsumerCreateAny(s))
	b.deny(space.DurableCreateAny(s))
}

func (b *builder) ownPresence() {
	b.pub(b.n.KV(space.Presence, b.p.Owner+"."+b.p.Actor))
}

// agentPerms is upstream's agent arm: post as itself to its AllowPublish channels, DM and anycast
// as itself, ask the delivery daemon for durable joins, read history of and live-subscribe its
// AllowSubscribe channels, bind (never create) its own DM, DLV and role TASK consumers, publish
// its own presence key and read the roster, channel registry and delivery lease, and probe the
// manager and delivery planes' liveness as itself.
//
// Narrowed from upstream: the roster and the channel registry are read with gets and followed
// with a core subscription on their $KV subjects, not watched through a consumer, so the agent
// holds no consumer-create row on a bucket stream and no $JS.FC.> (see the package doc). Its only
// create row is the name- and filter-pinned chathist_ consumer.
//
// Deferred: the v0.4 endpoint baseline rows, the spawn/run/admin capability rows and the ep reply
// rail (ep.reply.*.*.*.<o>.<a>.<uid>.*), the goal-progress rows and issued-authority rows.
// Capabilities are validated but add no row until the ep plane exists.
func agentPerms(b *builder) {
	n, p := b.n, b.p
	chat, dm, dlv := n.ChatStream(), n.DMStream(), n.DLVStream()
	for _, ch := range p.AllowPublish {
		b.pub(n.ChatGrant(p.Owner, p.Actor, ch))
	}
	b.pub(n.InstFrom(p.Owner, p.Actor))
	b.pub(n.SvcFrom(p.Owner, p.Actor))
	b.pub(n.CtlDelivery(p.Owner, p.Actor))
	b.pub(space.JSAPIInfo, nil)
	b.pub(space.StreamInfo(chat))
	b.kvBind(space.Presence)
	b.kvBind(space.Channels)

	// History reads: one create grant per readable channel, name- and filter-pinned (the server
	// refuses a body filter that differs from the subject's), plus info/fetch/delete of the name.
	hist, err := n.ChatHistConsumer(p.Owner, p.Actor, p.LifecycleUID)
	if err != nil {
		b.pub("", err)
		return
	}
	for _, ch := range p.AllowSubscribe {
		read, err := n.ChatReadGrant(ch)
		if err != nil {
			b.pub("", err)
			return
		}
		b.pub(space.ConsumerCreateFiltered(chat, hist, read))
	}
	b.pub(space.ConsumerInfo(chat, hist))
	b.pub(space.ConsumerNext(chat, hist))
	b.pub(space.ConsumerDelete(chat, hist))

	dmC, err := n.DMConsumer(p.Owner, p.Actor, p.LifecycleUID)
	b.bindConsumer(dm, dmC, err)
	dlvC, err := n.DlvConsumer(p.Owner, p.Actor, p.LifecycleUID)
	b.bindConsumer(dlv, dlvC, err)

	b.kvGet(space.Presence)
	b.ownPresence()
	b.kvGet(space.Channels)
	b.kvBind(space.Delivery)
	b.kvGet(space.Delivery)

	task := n.TaskStream()
	if p.Role != "" {
		svc, err := n.SvcConsumer(p.Role)
		b.pub(space.StreamInfo(task))
		b.bindConsumer(task, svc, err)
	}

	// Defence in depth over default deny: no consumer-create of any form on the streams whose
	// create-time filter or deliver subject would expose other principals' messages.
	b.denyCreate(dm)
	b.denyCreate(task)
	b.denyCreate(dlv)

	// Plane liveness (upstream #1577): the agent may ask whether the manager or the delivery
	// daemon is up, as itself only, and hear the answers on its own .reply.> lane; it can neither
	// serve a plane nor answer another peer's probe.
	b.pub(n.LiveManager(p.Owner, p.Actor))
	b.pub(n.LiveDelivery(p.Owner, p.Actor))

	b.sub(n.CtlDeliveryTree(p.Owner, p.Actor))
	b.sub(n.LiveManagerReplies(p.Owner, p.Actor))
	b.sub(n.LiveDeliveryReplies(p.Owner, p.Actor))
	for _, ch := range p.AllowSubscribe {
		b.sub(n.ChatReadGrant(ch))
	}
	b.kvFeed(space.Presence)
	b.kvFeed(space.Channels)
}

// supervisorPerms is upstream's supervisor arm: the manager's standing credential. It holds its
// instance lease, publishes its presence and watches the roster, calls the delivery daemon's
// admin rail, and answers the manager plane's liveness probes: it serves live.manager.*.* (in the
// queue group live.manager) and publishes only on the .reply.> leaves under them, so it can answer
// any peer but never send a probe as one, and it cannot serve the delivery plane. Two rows go beyond the stored upstream version, both for the renewal ownership in
// reference/manager.md §3: the per-space renewal lease key ($KV.cotal_manager_<t>.renewal) and a
// point read of the delivery lease (lease.0), which the manager checks before each remint. Issue
// 23 adds the register-manager rail as itself: it publishes
// cotal.<t>.ep.one.auth.register-manager.<owner>.<actor>.* for its own principal only (any nonce)
// and hears the answers on those subjects' .reply leaves; authd accepts the registration only
// if the instance lease's holder is that principal.
func supervisorPerms(b *builder) {
	n, p := b.n, b.p
	b.pub(space.JSAPIInfo, nil)
	b.kvBind(space.Manager)
	b.kvGet(space.Manager)
	b.pub(n.ManagerLeaseAny(), nil)
	b.pub(n.KV(space.Manager, space.ManagerRenewalKey))
	b.ownPresence()
	b.kvBind(space.Presence)
	b.kvWatch(space.Presence)
	b.pub(space.JSFlowControl, nil)
	b.kvBind(space.Delivery)
	b.kvGet(space.Delivery)
	b.pub(n.CtlDeliveryAdmin(p.Owner, p.Actor))
	b.pub(n.LiveManagerReplyAny(), nil)
	reg, err := n.RegisterManagerCaller(p.Owner, p.Actor)
	b.pub(reg, err)
	b.sub(n.CtlDeliveryAdminTree(p.Owner, p.Actor))
	b.sub(n.LiveManagerServe(), nil)
	b.sub(space.RailReplyGrant(reg), err)
}

// remoteManagerPerms is a remote managerd's supervisor credential (issue 25): supervisorPerms
// pinned to one manager instance. It holds only its own instance lease
// ($KV.cotal_manager_<t>.lease.<instanceId>), publishes its own presence, watches the roster,
// reads the manager and delivery buckets, and answers the manager plane's liveness probes. It has
// none of the supervisor's rows a signer-mode manager needs and a remote one must not hold: no
// renewal lease key (a remote manager reminting nothing owns no renewal), no delivery-admin rail
// (deliveryd's admin lane stays with the host), and no register-manager rail (a remote manager
// registers through authd's manager-service authority activate, never the rail).
func remoteManagerPerms(b *builder) {
	n, p := b.n, b.p
	b.pub(space.JSAPIInfo, nil)
	b.kvBind(space.Manager)
	b.kvGet(space.Manager)
	lease, err := space.ManagerLeaseKey(p.InstanceID)
	if err != nil {
		b.pub("", err)
		return
	}
	b.pub(n.KV(space.Manager, lease))
	b.ownPresence()
	b.kvBind(space.Presence)
	b.kvWatch(space.Presence)
	b.pub(space.JSFlowControl, nil)
	b.kvBind(space.Delivery)
	b.kvGet(space.Delivery)
	b.pub(n.LiveManagerReplyAny(), nil)
	b.sub(n.LiveManagerServe(), nil)
}

// provisionerPerms is upstream's provisioner arm: the one-shot onboarding credential. It creates
// (or verifies) every space stream and bucket, updates the TTL buckets (presence and the two
// leases) and the hardened authority stores (records, issued), pre-creates DM, DLV and TASK
// consumers without reading them, and writes and reads the ACL and channel registries.
//
// Deferred: the endpoint-plane streams, the artifact object store (OBJ_), the accepted and
// admission stores, and the records-store slot reads of the static manager.
func provisionerPerms(b *builder) {
	n := b.n
	b.pub(space.JSAPIInfo, nil)
	streams := []string{n.ChatStream(), n.DMStream(), n.TaskStream(), n.InboxStream(), n.DLVStream()}
	for _, k := range space.BucketKinds() {
		streams = append(streams, b.bucketStream(k))
	}
	for _, s := range streams {
		b.pub(space.StreamCreate(s))
		b.pub(space.StreamInfo(s))
	}
	for _, k := range []space.BucketKind{space.Presence, space.Delivery, space.Manager, space.Records, space.Issued} {
		b.pub(space.StreamUpdate(b.bucketStream(k)))
	}
	for _, s := range []string{n.DMStream(), n.DLVStream(), n.TaskStream()} {
		b.pub(space.ConsumerCreateAny(s))
		b.pub(space.DurableCreateAny(s))
		b.pub(space.ConsumerInfoAny(s))
	}
	b.pub(n.KVAll(space.ACL))
	b.pub(n.KVAll(space.Channels))
	b.kvGet(space.ACL)
	b.kvGet(space.Channels)
}

// deprovisionerPerms is upstream's deprovisioner arm, pinned to one departed lifecycle (Owner,
// Actor, LifecycleUID name the target, not the holder): read (INFO) and delete its DM and DLV
// consumers by exact name; read its ACL row by the direct get that names the key, and write it
// (the revision-conditioned purge, and the fence's empty-read row); and, for each of
// MemberChannels, read and purge that lifecycle's membership row on that channel by exact key.
// It reads no message body and reaches no other lifecycle.
func deprovisionerPerms(b *builder) {
	n, p := b.n, b.p
	b.pub(space.JSAPIInfo, nil)
	dmC, err := n.DMConsumer(p.Owner, p.Actor, p.LifecycleUID)
	if err != nil {
		b.pub("", err)
		return
	}
	dlvC, err := n.DlvConsumer(p.Owner, p.Actor, p.LifecycleUID)
	if err != nil {
		b.pub("", err)
		return
	}
	b.pub(space.ConsumerInfo(n.DMStream(), dmC))
	b.pub(space.ConsumerDelete(n.DMStream(), dmC))
	b.pub(space.ConsumerInfo(n.DLVStream(), dlvC))
	b.pub(space.ConsumerDelete(n.DLVStream(), dlvC))
	b.kvBind(space.ACL)
	key, err := space.ACLKey(p.Owner, p.Actor, p.LifecycleUID)
	if err != nil {
		b.pub("", err)
		return
	}
	b.kvGetKey(space.ACL, key)
	b.pub(n.KV(space.ACL, key))
	if len(p.MemberChannels) == 0 {
		return
	}
	b.kvBind(space.Members)
	for _, ch := range p.MemberChannels {
		mk, err := space.MemberKey(ch, p.Owner, p.Actor, p.LifecycleUID)
		if err != nil {
			b.pub("", err)
			return
		}
		b.kvGetKey(space.Members, mk)
		b.pub(n.KV(space.Members, mk))
	}
}

// deliveryPerms is upstream's delivery arm: the fan-out writer reads all of CHAT, the trusted
// reader binds only the "reader" durable on INBOX, the daemon reads presence, channels, members
// and ACL, writes members and its own lease keys, publishes any lifecycle's dinbox and dlv
// subjects, serves both ctl rails and the liveness rail (live.delivery.*.*, newer than the stored
// upstream profile) and replies only on their .reply.> leaves, and reads the info of any dlv_
// durable on DLV and a DLV subject's last message (the reader's gate, newer than the stored
// upstream profile). It holds no native
// chat, dinbox or dlv subscription.
//
// The lease watch (issue 10 item 3) is a core subscription on exactly $KV.cotal_delivery_<t>.lease.0
// plus the gets it already holds, not a KV watch: a watch is an ordered push consumer whose name
// and deliver subject the broker cannot pin (see the package doc), it leaves server state that must
// be retired on every stop, reconnect and rebind (the seeds' "Delivery lease watches"), and it
// must be re-created after a reconnect, while a subscription pins the one key, leaves nothing on
// the server and is restored by the client library. The subscription sees every write published
// to the key, including ones the stream then rejects (a competing create or a stale CAS; the
// broker test shows one), so a watcher treats a message as a prompt to get the key and acts on
// the stored row only. Sharding is refused, so lease.0 is the only key.
//
// Deferred: the timer writer (ept.* rows, EPT_REQ/EPT streams, records reads).
func deliveryPerms(b *builder) {
	n := b.n
	chat, inbox, dlv := n.ChatStream(), n.InboxStream(), n.DLVStream()
	reader := n.ReaderConsumer()
	b.pub(space.JSAPIInfo, nil)
	b.readStream(chat)
	b.pub(space.StreamInfo(inbox))
	b.pub(space.StreamInfo(dlv))
	// The reader's gate on a lifecycle's DLV subject (deliveryd/internal/reader, gate.go) reads
	// the dlv_ durable's info (its pending and unacked counts); newer than the stored upstream
	// profile. Info only: no create, fetch, ack or delete on DLV. It also reads the last stored
	// message of a lifecycle's DLV subject (STREAM.MSG.GET, last by subject: its sequence bounds
	// the frames the gate did not publish itself); the body is a frame the reader wrote from an
	// INBOX entry it already reads.
	b.pub(space.ConsumerInfoAny(dlv))
	b.pub(space.StreamMsgGet(dlv))
	b.pub(space.DurableCreateAny(chat))
	b.pub(space.ConsumerCreateNamed(inbox, reader))
	b.pub(space.DurableCreate(inbox, reader))
	b.pub(space.ConsumerInfo(inbox, reader))
	b.pub(space.ConsumerNext(inbox, reader))
	b.pub(space.ConsumerDelete(inbox, reader))
	b.pub(space.Ack(inbox, reader))
	b.pub(space.JSFlowControl, nil)
	for _, k := range []space.BucketKind{space.Presence, space.Channels, space.Members, space.ACL} {
		b.kvRead(k)
	}
	b.pub(n.KVAll(space.Members))
	b.kvBind(space.Delivery)
	b.kvGet(space.Delivery)
	b.pub(n.DeliveryLeaseAny(), nil)
	b.pub(n.DinboxAny(), nil)
	b.pub(n.DlvAny(), nil)
	b.pub(n.CtlDeliveryReplyAny(), nil)
	b.pub(n.CtlDeliveryAdminReplyAny(), nil)
	b.pub(n.LiveDeliveryReplyAny(), nil)
	b.sub(n.CtlDeliveryServe(), nil)
	b.sub(n.CtlDeliveryAdminServe(), nil)
	b.sub(n.LiveDeliveryServe(), nil)
	b.sub(n.KV(space.Delivery, space.DeliveryLeaseKey))
}

// membershipRWPerms is upstream's membership-rw arm: deliveryd's membership feed reads the durable
// members registry and reads and writes the derived membership bucket, and nothing else (no chat,
// DM, ctl or $SYS row). It is a daemon credential, minted only to deliveryd by policy, so like the
// delivery profile it keeps upstream's watch rows on the two buckets it reads: the feed lists
// every key (KeyValue.Keys and Watch run an ordered consumer), which gets cannot do.
func membershipRWPerms(b *builder) {
	b.pub(space.JSAPIInfo, nil)
	for _, k := range []space.BucketKind{space.Members, space.Membership} {
		b.kvRead(k)
	}
	b.pub(b.n.KVAll(space.Membership))
	b.pub(space.JSFlowControl, nil)
}

// observerPerms is upstream's observer arm, narrowed: read-only chat (live and history), roster,
// channel registry and membership feed, and the delivery lease key (lease.0) by get alone, so a
// dashboard can show whether delivery is ready (upstream added that read later). History is read
// with message gets (getStream) and live chat with a core subscription; the buckets with gets and
// a core subscription on their $KV subjects. Upstream grants every consumer verb on CHAT instead, which reaches deliveryd's fanout
// durable; here the observer holds no consumer verb at all and denies them all. No DM, anycast or
// endpoint subject is named, so those stay invisible.
func observerPerms(b *builder) {
	n := b.n
	b.pub(space.JSAPIInfo, nil)
	b.getStream(n.ChatStream())
	for _, k := range []space.BucketKind{space.Presence, space.Channels, space.Membership} {
		b.kvBind(k)
		b.kvGet(k)
	}
	b.kvBind(space.Delivery)
	b.kvGetKey(space.Delivery, space.DeliveryLeaseKey)
	b.denyConsumers()
	b.sub(n.ChatAll(), nil)
	for _, k := range []space.BucketKind{space.Presence, space.Channels, space.Membership} {
		b.kvFeed(k)
	}
}

// adminPerms is upstream's admin arm, narrowed like the observer: the observer plus DM history by
// message get and live DM and anycast subscriptions. Upstream grants every consumer verb on DM,
// which consumes agents' dm_ durables; here the admin holds none. It is a god-view over messaging,
// so signer policy should grant it only to a trusted audit dashboard; endpoint planes stay
// excluded.
func adminPerms(b *builder) {
	observerPerms(b)
	n := b.n
	b.getStream(n.DMStream())
	b.sub(n.InstAll(), nil)
	b.sub(n.SvcAll(), nil)
}

// operatorPerms is upstream's operator arm, the one-shot human CLI credential: post as itself to
// any channel, DM and anycast as itself, publish its presence, and read the roster and channel
// registry. It receives no feed. Narrowed from upstream: it reads both buckets with gets, not a
// watch consumer, and denies every consumer verb (see the package doc).
func operatorPerms(b *builder) {
	n, p := b.n, b.p
	b.pub(n.ChatFrom(p.Owner, p.Actor))
	b.pub(n.InstFrom(p.Owner, p.Actor))
	b.pub(n.SvcFrom(p.Owner, p.Actor))
	b.ownPresence()
	b.pub(space.JSAPIInfo, nil)
	b.kvBind(space.Presence)
	b.kvGet(space.Presence)
	b.kvBind(space.Channels)
	b.kvGet(space.Channels)
	b.denyConsumers()
}

// probePerms is upstream's probe arm: connect and nothing else.
func probePerms(b *builder) {
	b.deny(space.All, nil)
}

// authCalloutPerms is authd's callout service user in the AUTH account: it receives callout
// requests and may answer on any reply subject, but may never publish a forged request.
func authCalloutPerms(b *builder) {
	b.pub(space.All, nil)
	b.deny(space.AuthCalloutSubject, nil)
	b.sub(space.AuthCalloutSubject, nil)
}

// authPlanePerms is authd's data-account connection. authd is the lifecycle authority and the
// only writer of the lifecycle rows (issue 23), so this is the one credential that writes them;
// every other profile holds no row on cotal_auth_<space> or cotal_records_<space>. It holds:
//
//   - writes, as publishes to $KV.<bucket>.<key> (create, CAS update and CAS delete are all
//     publishes there, with headers the broker checks), to exactly these key families and no
//     other key: cotal_auth_<t>'s plane claim "plane" and gate.<uid>, stage.<opId> and
//     epgate.<endpoint>.<instanceId>, and the service endpoint rows of seed 002
//     (pkg/lifecycle's ServiceAuthKeyPatterns: sep.name.<epTok>, sep.req.<epTok>.<iid>,
//     sep.prop.<epTok>.<iid>, sep.root.<epTok>.<iid>, sep.art.<hex>); cotal_records_<t>'s lifecycle.<owner>.<actor>, uid.<uid>,
//     frontier.<uid> and svc.<endpoint>.<instanceId> (pkg/lifecycle's AuthKeyPatterns and
//     RecordsKeyPatterns: each row pins the family's prefix and token count, so a key of another
//     family, say cred.<x> or an ad hoc key, is refused by the broker);
//   - reads of both buckets by the leader-served $JS.API.STREAM.MSG.GET.<stream>, the only read
//     authd's row executors use (a direct get may answer from a lagging replica). Its key rides
//     the request body, so the row reaches every key of the bucket, other daemons' keys among
//     them; that is acceptable because the holder is authd, the lifecycle authority, which must
//     read every lifecycle row and reads nothing there it could not be trusted to write. The
//     manager bucket (cotal_manager_<t>) is read the same way, for the lease.<instanceId> rows a
//     manager registration and selection check against, with the same reach: every key of that
//     bucket, read-only;
//   - the stream info of the three buckets (binding a bucket, the start check that both
//     lifecycle stores exist as provisioned, and listing keys with a subjects filter);
//   - the direct get by subject of the plane row alone, $JS.API.DIRECT.GET.KV_cotal_auth_<t>.
//     $KV.cotal_auth_<t>.plane, which pkg/lease's plane claim reads with (nats.go's KeyValue.Get
//     takes this path on allow_direct buckets);
//   - serving the two auth rails: subscriptions to the retire-lifecycle and register-manager
//     serve patterns pinned to the queue group space.AuthRailQueue (the "<subject> <queue>" form:
//     the broker refuses a plain subscription and any other queue, so no authd can take every
//     request for itself outside the group), and publishes only on their .reply leaves, so it
//     answers any caller but never sends a rail request as one.
//
// Consumer verbs and acks are denied as defence in depth: a watch is an ordered push consumer
// whose name and deliver subject ride the request body (see the package doc). Nothing follows a
// key with a subscription: the plane lease needs no watch (a CAS renewal notices a lost claim
// within half the TTL), so the old $KV.cotal_auth_<t>.plane subscription is gone.
//
// One row reaches outside the buckets: $SYS.REQ.ACCOUNT.PING.CONNZ, the account-scoped CONNZ a
// successor authd sends to prove a plane holder's connection gone before it reclaims the claim
// early (issue 22 row 6) and the retirement barrier polls for a lifecycle's connections. The
// broker answers it only with the requester's own account's connections (the data account), so
// it reads no other account; no other profile holds it.
//
// The credential is principal local.authd (AuthPlaneOwner, AuthPlaneActor; fixed, never a
// parameter), and as that principal it asks the delivery daemon for a retiring lifecycle's
// footprint (issue 25): it publishes its own delivery-admin request subject,
// cotal.<t>.ctl.delivery-admin.local.authd, and hears only the answers on that subject's
// .reply.<nonce> lane. The lane carries every admin op on one subject, so the broker cannot
// narrow it to one op; deliveryd does, answering this principal lifecycleMemberships alone.
func authPlanePerms(b *builder) {
	n, p := b.n, b.p
	plane, err := n.KV(space.Auth, PlaneKey)
	b.pub(plane, err)
	for _, k := range lifecycle.AuthKeyPatterns() {
		b.pub(n.KVKeys(space.Auth, k))
	}
	for _, k := range lifecycle.ServiceAuthKeyPatterns() {
		b.pub(n.KVKeys(space.Auth, k))
	}
	for _, k := range lifecycle.RecordsKeyPatterns() {
		b.pub(n.KVKeys(space.Records, k))
	}
	for _, k := range []space.BucketKind{space.Auth, space.Records, space.Manager} {
		b.kvBind(k)
		b.pub(space.StreamMsgGet(b.bucketStream(k)))
	}
	b.pub(space.DirectGetSubject(b.bucketStream(space.Auth), plane))
	b.pub(space.AccountConnzPing, nil)
	b.sub(queueRow(n.RetireLifecycleServe(), space.AuthRailQueue), nil)
	b.sub(queueRow(n.RegisterManagerServe(), space.AuthRailQueue), nil)
	b.pub(n.RetireLifecycleReplyAny(), nil)
	b.pub(n.RegisterManagerReplyAny(), nil)
	admin, err := n.CtlDeliveryAdmin(p.Owner, p.Actor)
	b.pub(admin, err)
	b.sub(admin+".reply.*", err)
	b.denyConsumers()
}

// queueRow is a subscribe row that admits only a queue subscription in group queue: the broker's
// "<subject> <queue>" permission form.
func queueRow(subject, queue string) string { return subject + " " + queue }

// retirementRequesterPerms is the one-shot credential authd mints for a manager's serve principal
// (Owner, Actor: <owner>.manager_serve_<instanceId>; LifecycleUID: the manager's own lifecycle)
// to ask for one managed lifecycle's retirement (Target). It publishes only
// cotal.<t>.ep.one.auth.retire-lifecycle.handle.<tO>.<tA>.<tUid>.<cO>.<cA>.<cUid>.* (any nonce),
// so neither the target nor the caller can be changed on the wire, and hears only that subject's
// answers on <request>.reply; its reply inbox (Claims) is the only other row. authd still
// checks the request (opId, gate, serve epoch): the credential only says who may ask.
func retirementRequesterPerms(b *builder) {
	p := b.p
	grant, err := b.n.RetireLifecycleCaller(space.RetireRail{
		TargetOwner: p.Target.Owner, TargetActor: p.Target.Actor, TargetUID: p.Target.LifecycleUID,
		CallerOwner: p.Owner, CallerActor: p.Actor, CallerUID: p.LifecycleUID,
	})
	b.pub(grant, err)
	b.sub(space.RailReplyGrant(grant), err)
}

// serviceServePerms is a service endpoint instance's serving credential (seed 002): authd's
// callout grants it on a verified service access bearer for owner Owner (the bearer's sub) and
// actor svc_<InstanceID>. It subscribes only cotal.<t>.sep.<epTok>.<iid>.>, the requests of its
// own endpoint instance, and publishes only cotal.<t>.sep.reply.<epTok>.<iid>.>, its answers
// there; epTok is the endpoint's key token (pkg/lifecycle.EndpointToken). It holds no reply
// inbox (Claims adds none), no JetStream verb and nothing else, so another instance's or
// endpoint's requests, the space's chat, KV and API subjects are all refused by the broker.
func serviceServePerms(b *builder) {
	n, p := b.n, b.p
	epTok, err := lifecycle.EndpointToken(p.ServiceEndpoint)
	if err != nil {
		b.sub("", err)
		return
	}
	b.sub(n.ServiceServe(epTok, p.InstanceID))
	b.pub(n.ServiceReply(epTok, p.InstanceID))
}

// PlaneKey is the key of cotal_auth_<space> that holds authd's plane claim.
const PlaneKey = "plane"

// sentinelPerms is the AUTH account's public bearer user: deny everything both ways. Its only use
// is to make the server run the callout for the token presented with it.
func sentinelPerms(b *builder) {
	b.deny(space.All, nil)
	b.add(&b.subDeny, space.All, nil)
}

// membershipObserverPerms is upstream's membership-observer: a system-account user that requests
// the connection list of the space's data account ($SYS.REQ.ACCOUNT.<acct>.CONNZ; the request
// fans out to every server, each answering for its own connections) and hears that account's
// CONNECT and DISCONNECT events, pinned to the one account, never $SYS.ACCOUNT.*. Its answers come
// to its private inbox, which Claims adds. Nothing else: no other account, no server-wide CONNZ,
// no KICK.
func membershipObserverPerms(b *builder) {
	acct := b.p.DataAccount
	b.pub(space.SysAccountConnz(acct))
	b.sub(space.SysAccountConnect(acct))
	b.sub(space.SysAccountDisconnect(acct))
}

// connectionEvictorPerms is upstream's connection-evictor: KICK by connection id on any server and
// nothing else, not even a scan; the ids come from the observer's scan of the data account named
// by DataAccount (which the credential records in no row, since KICK has no account token: it is
// required so a mint names the space it serves). Its KICK answers come to its private inbox.
func connectionEvictorPerms(b *builder) {
	if err := nkey.CheckAccount(b.p.DataAccount); err != nil {
		b.err = err
		return
	}
	b.pub(space.SysKickAny, nil)
}
