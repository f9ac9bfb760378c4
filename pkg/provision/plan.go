// Package provision creates a space's streams and buckets, idempotently, the way upstream
// Cotal's `cotal up` does (setupSpaceStreams, canonicalBackupStreamConfig, ensureAuthorityStores
// and ensureDefaultDeliveryClass): it is used by tests, `make run` and managerd, on a short-lived
// `provisioner` credential minted by signerd (Run) or on a connection the caller holds (Ensure).
//
// Every name comes from pkg/space. Every stream is written with a fully explicit configuration, so
// what the broker stores is exactly what Plan says, and a second run reads each stream back and
// compares it field by field: equal means nothing is sent but the read; different means a
// *MismatchError naming the stream and each differing field, and nothing is changed. It never
// updates or deletes a stream, never rewrites a channel-defaults entry an operator set, and
// refuses one that does not decode.
//
// Per agent incarnation, ProvisionAgent makes what upstream's provisionAgentDurables makes (its
// dm_ and dlv_ durables, its role's shared queue and its read-ACL row, the ACL type deliveryd
// reads) on a provisioner credential. On a deprovisioner credential signerd pins to that
// lifecycle, FenceLifecycleACL narrows its ACL row to no reads and DeprovisionAgent removes its
// footprint (both durables, the ACL row and its membership rows on named channels), counting
// each slot's outcome in a Result; RunProvisionAgent, RunFenceLifecycleACL and
// RunDeprovisionAgent mint those one-shot credentials as Run does.
//
// It makes the lifecycle records store cotal_records_<t> beside the auth store cotal_auth_<t>;
// authd refuses to start unless both exist as Plan says. It deliberately leaves out what
// upstream's setup also makes and nothing here needs yet: the issued store and the endpoint-plane
// streams (deferred with the endpoint plane, see pkg/profiles).
package provision

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// Upstream's numbers (packages/core/src/streams.ts and backup-config.ts).
const (
	// MaxMsgsPerSubject caps CHAT, INBOX and DLV per subject (discard old).
	MaxMsgsPerSubject = 1000
	// DedupWindow is the Nats-Msg-Id window on INBOX and DLV: the fan-out and catch-up copies of one
	// message collapse within it.
	DedupWindow = 2 * time.Hour
	// PresenceTTL is the presence bucket's max_age.
	PresenceTTL = 6 * time.Second
	// DeliveryLeaseTTL is the delivery bucket's max_age: a crashed holder's lease.0 expires after it.
	DeliveryLeaseTTL = 30 * time.Second
	// ManagerLeaseTTL is the manager bucket's max_age.
	ManagerLeaseTTL = 10 * time.Second
	// MembershipMaxBytes caps the derived membership feed.
	MembershipMaxBytes = 64 << 20
	// AuthMarkerTTL is the auth bucket's subject-delete-marker TTL, which turns on per-key TTLs
	// (authd's plane claim and credential rows); the bucket itself has no max_age.
	AuthMarkerTTL = time.Hour

	// defaultDuplicates is the server's default dedup window, written explicitly so a read-back
	// compares equal.
	defaultDuplicates = 2 * time.Minute
)

// Kind says whether an Item is a message stream or a KV bucket.
type Kind string

// Item kinds.
const (
	Stream Kind = "stream"
	Bucket Kind = "bucket"
)

// Item is one stream the space needs: its kind, the name a user knows it by (the bucket name for a
// bucket) and the exact stream configuration.
type Item struct {
	Kind   Kind
	Name   string
	Config jetstream.StreamConfig
}

// base is upstream's baseConfig: limits retention, file storage, nothing capped, discard old,
// one replica, the server's 2 min dedup window, no compression, no direct gets.
func base(name string, subjects ...string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              name,
		Subjects:          subjects,
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		MaxConsumers:      -1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		MaxMsgSize:        -1,
		Discard:           jetstream.DiscardOld,
		Replicas:          1,
		Duplicates:        defaultDuplicates,
		Compression:       jetstream.NoCompression,
	}
}

// registry is upstream's canonical config for the channels, ACL and members buckets: a KV layout
// written as a plain stream (one value per key, discard new, direct gets, rollups) without the KV
// client's deny_delete, exactly as upstream's jsm.streams.add writes it.
func registry(stream, bucket string) jetstream.StreamConfig {
	c := base(stream, "$KV."+bucket+".>")
	c.MaxMsgsPerSubject = 1
	c.Discard = jetstream.DiscardNew
	c.AllowDirect = true
	c.AllowRollup = true
	return c
}

// kv is the stream a KV client's create makes (nats.go prepareKeyValueConfig, nats.js Kvm.create):
// history one, discard new, rollups, deny delete, direct gets, a dedup window no longer than the TTL.
func kv(stream, bucket string, ttl time.Duration) jetstream.StreamConfig {
	c := base(stream, "$KV."+bucket+".>")
	c.MaxMsgsPerSubject = 1
	c.MaxAge = ttl
	c.Discard = jetstream.DiscardNew
	c.AllowRollup = true
	c.DenyDelete = true
	c.AllowDirect = true
	if ttl > 0 && ttl < c.Duplicates {
		c.Duplicates = ttl
	}
	return c
}

// Plan lists every stream and bucket the space needs, in creation order: the five message
// streams, then the buckets, the lifecycle records store cotal_records_<t> last. It fails only
// for a Names not made by space.NewNames.
func Plan(n space.Names) ([]Item, error) {
	if n.Token() == "" {
		return nil, space.ErrZeroNames
	}
	chat := base(n.ChatStream(), n.ChatAll())
	chat.MaxMsgsPerSubject = MaxMsgsPerSubject
	chat.AllowDirect = true

	task := base(n.TaskStream(), n.SvcAll())
	task.Retention = jetstream.WorkQueuePolicy

	inbox := base(n.InboxStream(), n.DinboxAll())
	inbox.MaxMsgsPerSubject = MaxMsgsPerSubject
	inbox.Duplicates = DedupWindow

	dlv := base(n.DLVStream(), n.DlvAll())
	dlv.MaxMsgsPerSubject = MaxMsgsPerSubject
	dlv.Duplicates = DedupWindow

	items := []Item{
		{Stream, chat.Name, chat},
		{Stream, n.DMStream(), base(n.DMStream(), n.InstAll())},
		{Stream, task.Name, task},
		{Stream, inbox.Name, inbox},
		{Stream, dlv.Name, dlv},
	}
	for _, k := range []space.BucketKind{space.Presence, space.Channels, space.Members, space.ACL, space.Membership, space.Delivery, space.Manager, space.Auth, space.Records} {
		bucket, err := n.Bucket(k)
		if err != nil {
			return nil, err
		}
		stream, err := n.BucketStream(k)
		if err != nil {
			return nil, err
		}
		var c jetstream.StreamConfig
		switch k {
		case space.Channels, space.Members, space.ACL:
			c = registry(stream, bucket)
		case space.Presence:
			c = kv(stream, bucket, PresenceTTL)
		case space.Delivery:
			c = kv(stream, bucket, DeliveryLeaseTTL)
		case space.Manager:
			c = kv(stream, bucket, ManagerLeaseTTL)
		case space.Membership:
			c = kv(stream, bucket, 0)
			c.MaxBytes = MembershipMaxBytes
		case space.Auth:
			// Upstream's auth store: per-key TTLs on, with no bucket age. Direct gets stay on,
			// unlike upstream: authd's auth-plane credential reads its plane row with the direct
			// get by subject ($JS.API.DIRECT.GET.<stream>.$KV.<bucket>.plane), the only read a
			// permission can pin to one key; the leader-served STREAM.MSG.GET carries the key in
			// its body and would reach every row of the bucket. Every write to the row is a CAS,
			// so a stale read can only make a renewal retry, never let two holders in.
			c = kv(stream, bucket, 0)
			c.AllowMsgTTL = true
			c.SubjectDeleteMarkerTTL = AuthMarkerTTL
		case space.Records:
			// The lifecycle records store (heads, uid reservations, frontiers, endpoint specs):
			// limits retention, history one, no bucket age, no caps and no per-key TTLs, so a
			// row never expires. Its row executors keep three rules: a row is read only by the
			// leader-served STREAM.MSG.GET, never a direct get; every write carries the
			// expected revision (create or CAS update), never a TTL; and a row that carries a
			// TTL, a DEL or PURGE marker, or a value that does not decode is corruption to
			// refuse, never "absent". Direct gets stay on as kv makes them, like every Go bucket.
			c = kv(stream, bucket, 0)
		}
		items = append(items, Item{Bucket, bucket, c})
	}
	return items, nil
}

// AckWait is upstream's ack_wait on every durable it creates (dm_, dlv_, svc_); deliveryd creates its
// fanout and reader durables itself, with 15 s (deliveryd/internal/plane3.AckWait).
const AckWait = 60 * time.Second

// DlvDurable is upstream's dlvDurableConfig: a lifecycle's bind-only durable on DLV, filtered to
// that lifecycle's dlv subject, explicit ack, deliver all. The agent binds it; it may not create it.
func DlvDurable(n space.Names, owner, actor, uid string) (jetstream.ConsumerConfig, error) {
	name, err := n.DlvConsumer(owner, actor, uid)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	filter, err := n.Dlv(owner, actor, uid)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	return jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: AckWait, DeliverPolicy: jetstream.DeliverAllPolicy,
	}, nil
}
