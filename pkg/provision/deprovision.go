package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// MaxMemberChannels bounds the member channels one DeprovisionAgent names: the deprovisioner
// credential carries one row pair per channel, and takes at most profiles.MaxChannels.
const MaxMemberChannels = profiles.MaxChannels

// ConsumerCounts are the two exact consumers' outcomes. Every examined consumer is counted once
// in Absent, Disappeared or Refused, or is one this caller removed (its DELETE acknowledged and
// its absence verified afterwards).
type ConsumerCounts struct {
	// Examined is the number of consumers looked at (2).
	Examined int
	// Absent counts consumers the first INFO found absent (verified prior absence).
	Absent int
	// Acknowledged counts native DELETE success replies, including one whose consumer was
	// live again by the second INFO (that one is also Refused).
	Acknowledged int
	// Disappeared counts consumers the first INFO saw live and the second INFO found absent
	// without this caller's acknowledged DELETE: someone removed them, nobody knows who.
	Disappeared int
	// Deleted counts consumers this caller removed (acknowledged, then verified absent); nil
	// when any consumer disappeared without a winner token, since then who removed it is
	// unknown.
	Deleted *int
	// Refused counts consumers whose state remains uncertain: an INFO or DELETE that failed
	// without a verified absence, or a consumer live again after the DELETE.
	Refused int
}

// KVCounts are one bucket's key outcomes (the ACL key, or the named member keys). Every examined
// key is counted exactly once: Absent + Deleted + Disappeared + Refused == Examined.
type KVCounts struct {
	// Examined is the number of keys looked at.
	Examined int
	// Absent counts keys the first read found absent (never written, deleted or purged).
	Absent int
	// Deleted counts live keys this caller's purge, conditioned on the revision it read,
	// removed: the condition is the winner token, so no other caller counts the same row.
	Deleted int
	// Disappeared counts live keys whose conditional purge lost to a competing deletion (the
	// re-read finds them absent): present at the first read, so never Absent, and not this
	// caller's Deleted.
	Disappeared int
	// Refused counts keys whose cleanup or state remains uncertain: a read or purge that
	// failed, or a lost condition with a live replacement (rewritten since the read).
	Refused int
}

// Result is what one DeprovisionAgent observed, slot by slot: the two exact consumers, the ACL
// key and the named member keys (the seed's durable cleanup results). The totals sum the three
// subtotals; Deleted is nil when Consumers.Deleted is. A repeat after verified absence reports
// only Examined and Absent, never an invented deletion.
type Result struct {
	Examined, Absent, Acknowledged, Disappeared, Refused int
	Deleted                                              *int

	Consumers ConsumerCounts
	ACL       KVCounts
	Members   KVCounts

	// Removed names what this caller removed, in slot order: consumer names and KV keys.
	Removed []string
}

// sum fills the totals from the subtotals.
func (r *Result) sum() {
	c, a, m := r.Consumers, r.ACL, r.Members
	r.Examined = c.Examined + a.Examined + m.Examined
	r.Absent = c.Absent + a.Absent + m.Absent
	r.Acknowledged = c.Acknowledged
	r.Disappeared = c.Disappeared + a.Disappeared + m.Disappeared
	r.Refused = c.Refused + a.Refused + m.Refused
	r.Deleted = nil
	if c.Deleted != nil {
		d := *c.Deleted + a.Deleted + m.Deleted
		r.Deleted = &d
	}
}

// String is the counts on one line, for logs (no secrets: names only).
func (r Result) String() string {
	del := "unknown"
	if r.Deleted != nil {
		del = fmt.Sprint(*r.Deleted)
	}
	return fmt.Sprintf("examined %d, absent %d, acknowledged %d, deleted %s, disappeared %d, refused %d",
		r.Examined, r.Absent, r.Acknowledged, del, r.Disappeared, r.Refused)
}

// SlotFailure is one slot DeprovisionAgent could not settle: the slot ("consumer
// DM_<t>/dm_…", "acl <key>", "member <key>") and why.
type SlotFailure struct {
	Slot string
	Err  error
}

// DeprovisionError says DeprovisionAgent left at least one slot refused (Result.Refused > 0). It
// carries the whole Result, whose other slots were settled, and one SlotFailure per refused slot
// (at most 3 + MaxMemberChannels). A retry under a fresh credential reads every slot again.
type DeprovisionError struct {
	// Lifecycle is <owner>.<actor>.<uid>.
	Lifecycle string
	Result    Result
	Failures  []SlotFailure
}

// maxListedFailures bounds how many failures Error spells out.
const maxListedFailures = 4

// Error names the lifecycle, the counts and the first few failed slots.
func (e *DeprovisionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "provision: deprovision %s: %d of %d slots refused (%s)", e.Lifecycle, e.Result.Refused, e.Result.Examined, e.Result)
	for i, f := range e.Failures {
		if i == maxListedFailures {
			fmt.Fprintf(&b, "; and %d more", len(e.Failures)-i)
			break
		}
		fmt.Fprintf(&b, "; %s: %v", f.Slot, f.Err)
	}
	return b.String()
}

// Unwrap returns each slot's cause, so errors.Is sees a deadline or a broker refusal.
func (e *DeprovisionError) Unwrap() []error {
	out := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		out[i] = f.Err
	}
	return out
}

// errLiveAfterDelete is a consumer found live by the INFO after its DELETE.
var errLiveAfterDelete = errors.New("live again after the DELETE (recreated or not removed)")

// errReplaced is a KV row rewritten between the read and the conditional purge.
var errReplaced = errors.New("rewritten since it was read (a live replacement); left as it is")

// DeprovisionAgent removes one departed lifecycle's footprint on a deprovisioner connection
// pinned to it (RunDeprovisionAgent mints one): its dm_ and dlv_ durables (DMDurable,
// DlvDurable) by exact name, its ACL row, and its durable membership row
// (<channel>/<owner>.<actor>.<uid> in cotal_members_<t>) on each of memberChannels, which are
// concrete channels (space.ValidateChannel; at most MaxMemberChannels; repeats ignored). It never
// touches the role queue, which other agents of the role share.
//
// Each consumer is read (INFO) before and after its DELETE, so a consumer already gone counts as
// Absent, one this caller's acknowledged DELETE removed as Deleted, and one that vanished under
// a competing deleter as Disappeared (which makes Consumers.Deleted and Deleted nil). Each key is
// read, then purged conditioned on the revision read: the purge winning counts as Deleted; losing
// it to a competing deletion as Disappeared; losing it to a rewrite (a live replacement) refuses
// the slot rather than claiming absence. A slot that cannot be settled is Refused, and the
// others are still examined.
//
// It returns the Result, and a *DeprovisionError carrying it when any slot was refused. Bad
// names or member channels are a *StepError (StepValidate) and nothing is touched.
func DeprovisionAgent(ctx context.Context, js jetstream.JetStream, n space.Names, owner, actor, uid string, memberChannels []string) (Result, error) {
	lc := owner + "." + actor + "." + uid
	p, err := lifecycleNames(n, owner, actor, uid)
	if err != nil {
		return Result{}, &StepError{Lifecycle: lc, Step: StepValidate, Err: err}
	}
	memberKeys, err := memberKeys(owner, actor, uid, memberChannels)
	if err != nil {
		return Result{}, &StepError{Lifecycle: lc, Step: StepValidate, Err: err}
	}
	var res Result
	var fails []SlotFailure
	refuse := func(slot string, err error) { fails = append(fails, SlotFailure{Slot: slot, Err: err}) }

	// The two exact consumers.
	deleted := 0
	for _, c := range []struct{ stream, name string }{{n.DMStream(), p.DM}, {n.DLVStream(), p.Dlv}} {
		slot := "consumer " + c.stream + "/" + c.name
		res.Consumers.Examined++
		out, acked, err := dropConsumer(ctx, js, c.stream, c.name)
		if acked {
			res.Consumers.Acknowledged++
		}
		switch out {
		case outAbsent:
			res.Consumers.Absent++
		case outDeleted:
			deleted++
			res.Removed = append(res.Removed, c.name)
		case outDisappeared:
			res.Consumers.Disappeared++
		default:
			res.Consumers.Refused++
			refuse(slot, err)
		}
	}
	if res.Consumers.Disappeared == 0 {
		res.Consumers.Deleted = &deleted
	}

	// The ACL key, then the named member keys.
	for _, b := range []struct {
		kind   space.BucketKind
		bucket string
		keys   []string
		counts *KVCounts
		label  string
	}{
		{space.ACL, p.ACLBucket, []string{p.ACLKey}, &res.ACL, "acl"},
		{space.Members, "", memberKeys, &res.Members, "member"},
	} {
		if len(b.keys) == 0 {
			continue
		}
		bucket := b.bucket
		if bucket == "" {
			if bucket, err = n.Bucket(b.kind); err != nil {
				return Result{}, &StepError{Lifecycle: lc, Step: StepValidate, Err: err}
			}
		}
		b.counts.Examined += len(b.keys)
		kv, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			b.counts.Absent += len(b.keys) // no bucket, no row
			continue
		}
		if err != nil {
			for _, k := range b.keys {
				b.counts.Refused++
				refuse(b.label+" "+k, fmt.Errorf("bucket %s: %w", bucket, err))
			}
			continue
		}
		for _, k := range b.keys {
			out, err := purgeKey(ctx, kv, k)
			switch out {
			case outAbsent:
				b.counts.Absent++
			case outDeleted:
				b.counts.Deleted++
				res.Removed = append(res.Removed, k)
			case outDisappeared:
				b.counts.Disappeared++
			default:
				b.counts.Refused++
				refuse(b.label+" "+k, fmt.Errorf("%s in %s: %w", k, bucket, err))
			}
		}
	}
	res.sum()
	if len(fails) > 0 {
		return res, &DeprovisionError{Lifecycle: lc, Result: res, Failures: fails}
	}
	return res, nil
}

// memberKeys validates and deduplicates the member channels and names their keys.
func memberKeys(owner, actor, uid string, channels []string) ([]string, error) {
	if len(channels) > MaxMemberChannels {
		return nil, fmt.Errorf("%d member channels, more than %d", len(channels), MaxMemberChannels)
	}
	seen := make(map[string]bool, len(channels))
	var keys []string
	for i, ch := range channels {
		if err := space.ValidateChannel(ch); err != nil {
			return nil, fmt.Errorf("member channel %d (a concrete channel, not a pattern): %w", i, err)
		}
		if seen[ch] {
			continue
		}
		seen[ch] = true
		k, err := space.MemberKey(ch, owner, actor, uid)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// outcome is one slot's settlement.
type outcome int

const (
	outRefused outcome = iota
	outAbsent
	outDeleted
	outDisappeared
)

// consumerGone reads a consumer: true when the broker says it (or its stream) does not exist.
func consumerGone(ctx context.Context, js jetstream.JetStream, stream, name string) (bool, error) {
	_, err := js.Consumer(ctx, stream, name)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return true, nil
	}
	return false, fmt.Errorf("INFO: %w", err)
}

// dropConsumer is one consumer slot: INFO, DELETE, INFO. acked says the DELETE was acknowledged.
func dropConsumer(ctx context.Context, js jetstream.JetStream, stream, name string) (outcome, bool, error) {
	gone, err := consumerGone(ctx, js, stream, name)
	if err != nil {
		return outRefused, false, err
	}
	if gone {
		return outAbsent, false, nil
	}
	err = js.DeleteConsumer(ctx, stream, name)
	acked := err == nil
	var derr error // a DELETE failure other than "not found"
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		derr = fmt.Errorf("DELETE: %w", err)
	}
	gone, err = consumerGone(ctx, js, stream, name)
	switch {
	case err != nil:
		return outRefused, acked, errors.Join(derr, err)
	case !gone && derr != nil:
		return outRefused, acked, derr
	case !gone:
		return outRefused, acked, errLiveAfterDelete
	case acked:
		return outDeleted, true, nil
	}
	// Absent now, without our acknowledged DELETE: it disappeared (a competing deleter, or our
	// own DELETE whose answer was lost).
	return outDisappeared, false, nil
}

// purgeKey is one key slot: read, purge conditioned on the revision read, and on a lost
// condition read again.
func purgeKey(ctx context.Context, kv jetstream.KeyValue, key string) (outcome, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return outAbsent, nil
	}
	if err != nil {
		return outRefused, fmt.Errorf("read: %w", err)
	}
	err = kv.Purge(ctx, key, jetstream.LastRevision(e.Revision()))
	if err == nil {
		return outDeleted, nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return outRefused, fmt.Errorf("purge at revision %d: %w", e.Revision(), err)
	}
	_, rerr := kv.Get(ctx, key)
	switch {
	case errors.Is(rerr, jetstream.ErrKeyNotFound):
		return outDisappeared, nil
	case rerr != nil:
		return outRefused, fmt.Errorf("purge at revision %d lost its condition; read again: %w", e.Revision(), rerr)
	}
	return outRefused, fmt.Errorf("purge at revision %d lost its condition: %w", e.Revision(), errReplaced)
}

// FenceState says what FenceLifecycleACL found and did.
type FenceState string

const (
	// FenceWritten: the row granted reads; it now grants none.
	FenceWritten FenceState = "written"
	// FenceAlready: the row already granted no reads; nothing was written.
	FenceAlready FenceState = "already"
	// FenceAbsent: there is no row (an unknown lifecycle, which deliveryd already treats as
	// reading nothing); none is created.
	FenceAbsent FenceState = "absent"
)

// Fence is FenceLifecycleACL's answer: what it did and the row's KV revision afterwards (0 when
// absent).
type Fence struct {
	State    FenceState
	Revision uint64
}

// fenceAttempts bounds FenceLifecycleACL's read-write rounds under concurrent writers.
const fenceAttempts = 3

// FenceLifecycleACL narrows one lifecycle's ACL row to no reads on a deprovisioner connection
// pinned to it (RunFenceLifecycleACL mints one): the row is rewritten as
// {"allowSubscribe":[],"revision":<row's revision + 1>,"updatedAt":<now>}, conditioned on the KV
// revision it read, so deliveryd stops routing to the lifecycle and a durable join the
// membership inventory does not see removes its own row. A row that already grants nothing is
// left as it is; an absent row stays absent; a row that does not decode is fenced too (its
// revision restarts at 1). A write that loses to a concurrent writer reads again, up to three
// times. Errors are a *StepError (StepValidate or StepFenceACL).
func FenceLifecycleACL(ctx context.Context, js jetstream.JetStream, n space.Names, owner, actor, uid string) (Fence, error) {
	lc := owner + "." + actor + "." + uid
	fail := func(step string, err error) (Fence, error) {
		return Fence{}, &StepError{Lifecycle: lc, Step: step, Err: err}
	}
	p, err := lifecycleNames(n, owner, actor, uid)
	if err != nil {
		return fail(StepValidate, err)
	}
	kv, err := js.KeyValue(ctx, p.ACLBucket)
	if err != nil {
		return fail(StepFenceACL, fmt.Errorf("bucket %s: %w", p.ACLBucket, err))
	}
	for range fenceAttempts {
		e, err := kv.Get(ctx, p.ACLKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Fence{State: FenceAbsent}, nil
		}
		if err != nil {
			return fail(StepFenceACL, fmt.Errorf("read %s: %w", p.ACLKey, err))
		}
		row, ok := DecodeACL(e.Value())
		if ok && len(row.AllowSubscribe) == 0 {
			return Fence{State: FenceAlready, Revision: e.Revision()}, nil
		}
		next := ACL{AllowSubscribe: []string{}, Revision: 1, UpdatedAt: time.Now().UnixMilli()}
		if ok {
			next.Revision = row.Revision + 1
		}
		body, err := next.Encode()
		if err != nil {
			return fail(StepFenceACL, err)
		}
		rev, err := kv.Update(ctx, p.ACLKey, body, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // written or removed since the read: read again
		}
		if err != nil {
			return fail(StepFenceACL, fmt.Errorf("write %s at revision %d: %w", p.ACLKey, e.Revision(), err))
		}
		return Fence{State: FenceWritten, Revision: rev}, nil
	}
	return fail(StepFenceACL, fmt.Errorf("%s kept changing while it was fenced", p.ACLKey))
}
