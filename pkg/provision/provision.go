package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// Delivery classes of the channel-defaults entry (upstream DeliveryClass).
const (
	ClassDurable = "durable"
	ClassLive    = "live"
)

// ErrMismatch matches every *MismatchError.
var ErrMismatch = errors.New("provision: exists with another configuration")

// FieldDiff is one configuration field that differs: its JSON name and both values as text.
type FieldDiff struct {
	Field     string
	Want, Got string
}

// MismatchError says a stream or bucket exists with a configuration other than the one Plan
// wants. Nothing was changed; an operator decides whether to migrate it.
type MismatchError struct {
	Kind   Kind
	Name   string
	Fields []FieldDiff
}

// Error names the stream or bucket and every differing field.
func (e *MismatchError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = fmt.Sprintf("%s is %s, want %s", f.Field, f.Got, f.Want)
	}
	return fmt.Sprintf("provision: %s %s exists with another configuration (not changed): %s", e.Kind, e.Name, strings.Join(parts, "; "))
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// DefaultsError says the channel-defaults entry exists but cannot be read as upstream's
// ChannelDefaults object; it is left as it is.
type DefaultsError struct {
	Key string
	Err error
}

func (e *DefaultsError) Error() string {
	return fmt.Sprintf("provision: channel defaults entry %q is not a JSON object with a valid deliveryClass (not changed): %v", e.Key, e.Err)
}

func (e *DefaultsError) Unwrap() error { return e.Err }

// Options tune Ensure.
type Options struct {
	// DeliveryClass is written to the channel-defaults entry when it has none; empty means
	// ClassDurable (upstream's class for a space with a delivery daemon). An entry that already
	// names a class keeps it.
	DeliveryClass string
	// Replicas is every stream's and bucket's replica count (num_replicas); zero means 1. It must
	// be 1..MaxReplicas; on a cluster use 3 (an odd count keeps a majority after a node loss).
	// The per-agent consumers leave their replica count unset, so each inherits its stream's. An
	// existing stream with another count is a *MismatchError (num_replicas), never changed.
	Replicas int
}

// MaxReplicas is the largest replica count JetStream allows.
const MaxReplicas = 5

// ValidateReplicas refuses a replica count outside 0..MaxReplicas (0 means 1).
func ValidateReplicas(r int) error {
	if r < 0 || r > MaxReplicas {
		return fmt.Errorf("provision: replicas %d is not 1..%d", r, MaxReplicas)
	}
	return nil
}

// Report says what a run did.
type Report struct {
	// Created lists the streams and buckets this run created, by Item.Name.
	Created []string
	// Verified lists those that existed with the wanted configuration.
	Verified []string
	// DefaultsWritten says whether this run wrote the channel-defaults entry.
	DefaultsWritten bool
	// DeliveryClass is the space-wide delivery class in force after the run.
	DeliveryClass string
}

// Ensure creates every Item of Plan(n) that is missing and verifies every one that exists, then
// makes sure the channel-defaults entry names a delivery class. js must be a JetStream context on
// a provisioner connection (or one with at least its rights). It stops at the first error: a
// *MismatchError for a stream with another configuration, a *DefaultsError for an unreadable
// defaults entry, or the broker's refusal.
func Ensure(ctx context.Context, js jetstream.JetStream, n space.Names, opts Options) (*Report, error) {
	class := opts.DeliveryClass
	if class == "" {
		class = ClassDurable
	}
	if class != ClassDurable && class != ClassLive {
		return nil, fmt.Errorf("provision: delivery class %q is not %q or %q", class, ClassDurable, ClassLive)
	}
	if err := ValidateReplicas(opts.Replicas); err != nil {
		return nil, err
	}
	items, err := Plan(n)
	if err != nil {
		return nil, err
	}
	if opts.Replicas > 0 {
		for i := range items {
			items[i].Config.Replicas = opts.Replicas
		}
	}
	rep := &Report{}
	for _, it := range items {
		created, err := ensureStream(ctx, js, it)
		if err != nil {
			return rep, err
		}
		if created {
			rep.Created = append(rep.Created, it.Name)
		} else {
			rep.Verified = append(rep.Verified, it.Name)
		}
	}
	rep.DeliveryClass, rep.DefaultsWritten, err = ensureDefaults(ctx, js, n, class)
	return rep, err
}

// ensureStream creates it when no stream of its name exists and otherwise compares. A create
// that loses a race to another provisioner reads the winner back and compares it.
func ensureStream(ctx context.Context, js jetstream.JetStream, it Item) (created bool, err error) {
	s, err := js.Stream(ctx, it.Config.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s, err = js.CreateStream(ctx, it.Config)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if s, err = js.Stream(ctx, it.Config.Name); err != nil {
				return false, fmt.Errorf("provision: %s %s: %w", it.Kind, it.Name, err)
			}
			break
		}
		if err != nil {
			return false, fmt.Errorf("provision: create %s %s: %w", it.Kind, it.Name, err)
		}
		created = true
	case err != nil:
		return false, fmt.Errorf("provision: %s %s: %w", it.Kind, it.Name, err)
	}
	if diffs := Compare(it.Config, s.CachedInfo().Config); len(diffs) > 0 {
		return created, &MismatchError{Kind: it.Kind, Name: it.Name, Fields: diffs}
	}
	return created, nil
}

// Compare lists the fields in which got differs from want, by JSON name. It compares every field
// that changes what a stream stores, accepts, retains or exposes, and ignores the descriptive
// ones (description, metadata, first sequence, consumer limits, persist mode).
func Compare(want, got jetstream.StreamConfig) []FieldDiff {
	var diffs []FieldDiff
	add := func(field string, w, g any) {
		if !reflect.DeepEqual(w, g) {
			diffs = append(diffs, FieldDiff{Field: field, Want: render(w), Got: render(g)})
		}
	}
	add("subjects", want.Subjects, got.Subjects)
	add("retention", want.Retention, got.Retention)
	add("storage", want.Storage, got.Storage)
	add("max_consumers", want.MaxConsumers, got.MaxConsumers)
	add("max_msgs", want.MaxMsgs, got.MaxMsgs)
	add("max_bytes", want.MaxBytes, got.MaxBytes)
	add("max_age", want.MaxAge, got.MaxAge)
	add("max_msgs_per_subject", want.MaxMsgsPerSubject, got.MaxMsgsPerSubject)
	add("max_msg_size", want.MaxMsgSize, got.MaxMsgSize)
	add("discard", want.Discard, got.Discard)
	add("discard_new_per_subject", want.DiscardNewPerSubject, got.DiscardNewPerSubject)
	add("num_replicas", want.Replicas, got.Replicas)
	add("no_ack", want.NoAck, got.NoAck)
	add("duplicate_window", want.Duplicates, got.Duplicates)
	add("compression", want.Compression, got.Compression)
	add("allow_direct", want.AllowDirect, got.AllowDirect)
	add("mirror_direct", want.MirrorDirect, got.MirrorDirect)
	add("allow_rollup_hdrs", want.AllowRollup, got.AllowRollup)
	add("deny_delete", want.DenyDelete, got.DenyDelete)
	add("deny_purge", want.DenyPurge, got.DenyPurge)
	add("sealed", want.Sealed, got.Sealed)
	add("allow_msg_ttl", want.AllowMsgTTL, got.AllowMsgTTL)
	add("subject_delete_marker_ttl", want.SubjectDeleteMarkerTTL, got.SubjectDeleteMarkerTTL)
	add("allow_msg_counter", want.AllowMsgCounter, got.AllowMsgCounter)
	add("allow_atomic", want.AllowAtomicPublish, got.AllowAtomicPublish)
	add("allow_msg_schedules", want.AllowMsgSchedules, got.AllowMsgSchedules)
	add("allow_batched", want.AllowBatchPublish, got.AllowBatchPublish)
	// A placement, mirror, source, transform or republish would make the stream something else
	// than the one its name promises (upstream refuses each).
	add("placement", want.Placement != nil, got.Placement != nil)
	add("mirror", want.Mirror != nil, got.Mirror != nil)
	add("sources", len(want.Sources), len(got.Sources))
	add("subject_transform", want.SubjectTransform != nil, got.SubjectTransform != nil)
	add("republish", want.RePublish != nil, got.RePublish != nil)
	return diffs
}

func render(v any) string {
	switch x := v.(type) {
	case []string:
		return "[" + strings.Join(x, " ") + "]"
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

// channelDefaults is upstream's ChannelDefaults; only deliveryClass matters here, the rest is kept
// as it is.
type channelDefaults map[string]json.RawMessage

// ensureDefaults writes {"deliveryClass": class} under space.ChannelDefaultsKey when no entry
// exists (a KV create, so a concurrent writer wins cleanly), merges it into an entry that has no
// class (a revision-checked update), and leaves an entry that has one alone, as upstream's
// ensureDefaultDeliveryClass does. It returns the class in force.
func ensureDefaults(ctx context.Context, js jetstream.JetStream, n space.Names, class string) (string, bool, error) {
	bucket, err := n.Bucket(space.Channels)
	if err != nil {
		return "", false, err
	}
	kvs, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return "", false, fmt.Errorf("provision: bucket %s: %w", bucket, err)
	}
	key := space.ChannelDefaultsKey
	for attempt := 0; attempt < 3; attempt++ {
		e, err := kvs.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			body, _ := json.Marshal(map[string]string{"deliveryClass": class})
			if _, err := kvs.Create(ctx, key, body); errors.Is(err, jetstream.ErrKeyExists) {
				continue // someone else wrote it first: read theirs
			} else if err != nil {
				return "", false, fmt.Errorf("provision: write %s in %s: %w", key, bucket, err)
			}
			return class, true, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("provision: read %s in %s: %w", key, bucket, err)
		}
		var d channelDefaults
		if err := json.Unmarshal(e.Value(), &d); err != nil || d == nil {
			if err == nil {
				err = errors.New("not an object")
			}
			return "", false, &DefaultsError{Key: key, Err: err}
		}
		if raw, ok := d["deliveryClass"]; ok {
			var have string
			if err := json.Unmarshal(raw, &have); err != nil || (have != ClassDurable && have != ClassLive) {
				return "", false, &DefaultsError{Key: key, Err: fmt.Errorf("deliveryClass %s", raw)}
			}
			return have, false, nil
		}
		d["deliveryClass"], _ = json.Marshal(class)
		body, err := json.Marshal(d)
		if err != nil {
			return "", false, err
		}
		if _, err := kvs.Update(ctx, key, body, e.Revision()); errors.Is(err, jetstream.ErrKeyExists) {
			continue // changed under us: read again
		} else if err != nil {
			return "", false, fmt.Errorf("provision: update %s in %s: %w", key, bucket, err)
		}
		return class, true, nil
	}
	return "", false, fmt.Errorf("provision: %s in %s kept changing while it was written", key, bucket)
}

// Config is what Run, RunProvisionAgent, RunDeprovisionAgent and RunFenceLifecycleACL need. Signer, Space and NatsURL
// are required.
type Config struct {
	// Signer mints the one-shot credential.
	Signer *signerclient.Client
	// Space is the space to provision.
	Space string
	// NatsURL is the broker (a comma-separated list for several).
	NatsURL string
	// Owner and Actor, when set, name the principal the provisioner credential is minted for
	// (the signer policy may require them); both or neither. A deprovisioner credential names
	// its target lifecycle instead and ignores them.
	Owner, Actor string
	// TTL is the credential's requested lifetime; zero asks for the profile's (5 min). signerd
	// caps it further by policy.
	TTL time.Duration
	// NatsOptions are added to the connection (TLS, a name); the credential's own options come
	// first.
	NatsOptions []nats.Option
	// Options tune Ensure (Run only).
	Options Options
}

// Run mints a provisioner credential through signerd for a user nkey held only in memory, proves
// it on the broker, connects with it, runs Ensure and closes the connection and wipes the key. The
// credential is never written anywhere and is not renewed: it only has to outlive one run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	js, done, err := cfg.provisioner(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return Ensure(ctx, js, n, cfg.Options)
}

// RollbackTimeout bounds RunProvisionAgent's rollback, which runs even when ctx has ended
// (upstream deprovisions within 15 s).
const RollbackTimeout = 15 * time.Second

// RunProvisionAgent is ProvisionAgent on a one-shot provisioner credential minted through signerd
// as Run mints it (key in memory only, never written, connection closed and key wiped at the
// end). When ProvisionAgent fails after creating something, it mints a one-shot deprovisioner
// credential pinned to a's lifecycle and removes what that run created (Rollback, bounded by
// RollbackTimeout even if ctx has ended), so a failure leaves nothing behind; the error then
// names the failed step, and also the rollback's failure if that failed too, in which case the
// returned Provisioned's Created lists what is left.
func RunProvisionAgent(ctx context.Context, cfg Config, a Agent) (Provisioned, error) {
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return Provisioned{}, fmt.Errorf("provision: %w", err)
	}
	js, done, err := cfg.provisioner(ctx)
	if err != nil {
		return Provisioned{}, err
	}
	p, err := ProvisionAgent(ctx, js, n, a)
	done()
	if err == nil || len(p.Created) == 0 {
		return p, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	djs, ddone, rerr := cfg.deprovisioner(rctx, a.Owner, a.Actor, a.LifecycleUID)
	if rerr == nil {
		var removed []string
		removed, rerr = Rollback(rctx, djs, n, p)
		ddone()
		p.Created = without(p.Created, removed)
	}
	if rerr != nil {
		return p, fmt.Errorf("%w; rollback failed, left %v: %v", err, p.Created, rerr)
	}
	return p, err
}

// RunDeprovisionAgent is DeprovisionAgent on a one-shot deprovisioner credential minted through
// signerd with the target lifecycle and memberChannels as its parameters (signerd pins its rights
// to exactly that lifecycle's dm_ and dlv_ durables, its ACL row and its membership rows on those
// channels); key in memory only, as Run. A credential that cannot be minted or connected is
// returned as that error, with an empty Result: no slot was examined.
func RunDeprovisionAgent(ctx context.Context, cfg Config, owner, actor, uid string, memberChannels []string) (Result, error) {
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return Result{}, fmt.Errorf("provision: %w", err)
	}
	if _, err := memberKeys(owner, actor, uid, memberChannels); err != nil {
		return Result{}, &StepError{Lifecycle: owner + "." + actor + "." + uid, Step: StepValidate, Err: err}
	}
	js, done, err := cfg.deprovisioner(ctx, owner, actor, uid, memberChannels...)
	if err != nil {
		return Result{}, err
	}
	defer done()
	return DeprovisionAgent(ctx, js, n, owner, actor, uid, memberChannels)
}

// RunFenceLifecycleACL is FenceLifecycleACL on a one-shot deprovisioner credential for the
// lifecycle with no member channels, minted as RunDeprovisionAgent mints one.
func RunFenceLifecycleACL(ctx context.Context, cfg Config, owner, actor, uid string) (Fence, error) {
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return Fence{}, fmt.Errorf("provision: %w", err)
	}
	js, done, err := cfg.deprovisioner(ctx, owner, actor, uid)
	if err != nil {
		return Fence{}, err
	}
	defer done()
	return FenceLifecycleACL(ctx, js, n, owner, actor, uid)
}

// without is list less the entries of drop.
func without(list, drop []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// provisioner connects with a one-shot provisioner credential for cfg's principal, if any.
func (cfg Config) provisioner(ctx context.Context) (jetstream.JetStream, func(), error) {
	if (cfg.Owner == "") != (cfg.Actor == "") {
		return nil, nil, errors.New("provision: Config.Owner and Config.Actor go together")
	}
	var params *signerv1.ProfileParams
	if cfg.Owner != "" {
		params = &signerv1.ProfileParams{Owner: cfg.Owner, Actor: cfg.Actor}
	}
	return cfg.oneShot(ctx, signerv1.Profile_PROFILE_PROVISIONER, params)
}

// deprovisioner connects with a one-shot deprovisioner credential pinned to one lifecycle and,
// when given, its membership rows on memberChannels.
func (cfg Config) deprovisioner(ctx context.Context, owner, actor, uid string, memberChannels ...string) (jetstream.JetStream, func(), error) {
	return cfg.oneShot(ctx, signerv1.Profile_PROFILE_DEPROVISIONER,
		&signerv1.ProfileParams{Owner: owner, Actor: actor, LifecycleUid: uid, MemberChannels: memberChannels})
}

// oneShot mints a credential of profile through signerd for a user nkey held only in memory,
// proves it on the broker and connects with it. done closes the connection and wipes the key.
func (cfg Config) oneShot(ctx context.Context, profile signerv1.Profile, params *signerv1.ProfileParams) (js jetstream.JetStream, done func(), err error) {
	what := strings.ToLower(strings.TrimPrefix(profile.String(), "PROFILE_"))
	rail, err := signerclient.NewRail(signerclient.RailConfig{
		Client: cfg.Signer, Space: cfg.Space, Profile: profile,
		Params: params, TTL: cfg.TTL, NatsURL: cfg.NatsURL,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("provision: %w", err)
	}
	if err := rail.Start(ctx); err != nil {
		rail.Close()
		return nil, nil, fmt.Errorf("provision: %s credential: %w", what, err)
	}
	opts := append(rail.NatsOptions(), nats.Name("cotal-"+what), nats.NoReconnect())
	nc, err := nats.Connect(cfg.NatsURL, append(opts, cfg.NatsOptions...)...)
	if err != nil {
		rail.Close()
		return nil, nil, fmt.Errorf("provision: connect %s: %w", cfg.NatsURL, err)
	}
	done = func() {
		nc.Close()
		rail.Close()
	}
	if js, err = jetstream.New(nc); err != nil {
		done()
		return nil, nil, fmt.Errorf("provision: %w", err)
	}
	return js, done, nil
}

// EnsureDlvDurable creates a lifecycle's dlv_ durable (DlvDurable) on a provisioner connection,
// as managerd does when it provisions an agent. An identical durable is left as it is; one with
// another configuration is the broker's refusal (consumer already exists), not changed.
func EnsureDlvDurable(ctx context.Context, js jetstream.JetStream, n space.Names, owner, actor, uid string) error {
	cfg, err := DlvDurable(n, owner, actor, uid)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	if _, err := js.CreateConsumer(ctx, n.DLVStream(), cfg); err != nil {
		return fmt.Errorf("provision: durable %s on %s: %w", cfg.Durable, n.DLVStream(), err)
	}
	return nil
}
