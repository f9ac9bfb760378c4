package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// Agent names one agent incarnation to provision: its principal (Owner, Actor), its lifecycle
// UID, its role (empty for none) and its read ACL. AllowSubscribe is written as it is (the caller
// resolves upstream's defaults: subscribe defaults to ["general"], allowSubscribe to subscribe);
// an empty list is a row that reads nothing.
type Agent struct {
	Owner, Actor, LifecycleUID string
	Role                       string
	AllowSubscribe             []string
}

// Provisioned names what an agent's provisioning is made of, whether this run created it or
// found it: its dm_ and dlv_ durables, its role's shared queue (empty without a role) and its ACL
// row's bucket and key. Created lists what this run created, in creation order, by those names
// (the ACL row by ACLKey).
type Provisioned struct {
	DM, Dlv, RoleQueue string
	ACLBucket, ACLKey  string
	Created            []string
}

// Durables lists the agent's consumer names: dm_, dlv_ and, with a role, svc_<role>.
func (p Provisioned) Durables() []string {
	out := []string{p.DM, p.Dlv}
	if p.RoleQueue != "" {
		out = append(out, p.RoleQueue)
	}
	return out
}

// Steps of ProvisionAgent, Rollback, FenceLifecycleACL and DeprovisionAgent's validation, named
// in a *StepError.
const (
	StepValidate   = "validate"
	StepStreams    = "read streams"
	StepBucket     = "open ACL bucket"
	StepCheckDM    = "check dm_ durable"
	StepCheckDlv   = "check dlv_ durable"
	StepCheckRole  = "check role queue"
	StepCheckACL   = "check ACL row"
	StepCreateDM   = "create dm_ durable"
	StepCreateDlv  = "create dlv_ durable"
	StepWriteACL   = "write ACL row"
	StepCreateRole = "create role queue"
	StepDeleteDM   = "delete dm_ durable"
	StepDeleteDlv  = "delete dlv_ durable"
	StepPurgeACL   = "purge ACL row"
	StepFenceACL   = "fence ACL row"
)

// ErrConflict matches a StepError about something that exists in another shape than the one
// ProvisionAgent wants (a durable with another filter, an ACL row with another list); nothing
// was changed.
var ErrConflict = errors.New("exists with another configuration")

// StepError says which step of provisioning or deprovisioning one lifecycle failed.
type StepError struct {
	// Lifecycle is <owner>.<actor>.<uid> (as given, when it did not validate).
	Lifecycle string
	Step      string
	Err       error
}

// Error names the lifecycle, the step and the cause.
func (e *StepError) Error() string {
	return fmt.Sprintf("provision: agent %s: %s: %v", e.Lifecycle, e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *StepError) Unwrap() error { return e.Err }

// DMDurable is upstream's dmDurableConfig for a pre-created lifecycle: the bind-only durable on
// DM filtered to every DM to the principal (inst.<owner>.<actor>.>), explicit ack, starting at
// the activation frontier: frontier is the DM stream's last sequence when the lifecycle was
// provisioned, and delivery begins after it, so a successor of the same principal inherits none
// of its predecessor's pending DMs (0: from the stream's start).
func DMDurable(n space.Names, owner, actor, uid string, frontier uint64) (jetstream.ConsumerConfig, error) {
	name, err := n.DMConsumer(owner, actor, uid)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	filter, err := n.InstTo(owner, actor)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	c := jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: AckWait, DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if frontier > 0 {
		c.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		c.OptStartSeq = frontier + 1
	}
	return c, nil
}

// RoleQueue is upstream's taskDurableConfig: a role's work-queue durable on TASK, shared by
// every agent of the role, filtered to every anycast to the role (svc.<role>.>), explicit ack.
func RoleQueue(n space.Names, role string) (jetstream.ConsumerConfig, error) {
	name, err := n.SvcConsumer(role)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	filter, err := n.SvcServe(role)
	if err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	return jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: AckWait, DeliverPolicy: jetstream.DeliverAllPolicy,
	}, nil
}

// sameConsumer reports whether an existing consumer got is the one want describes: the fields
// that decide what it delivers and to whom. A dm_ durable (dm true) may start at any sequence:
// its frontier was fixed when it was first created.
func sameConsumer(want, got jetstream.ConsumerConfig, dm bool) bool {
	if want.Durable != got.Durable || want.FilterSubject != got.FilterSubject || len(got.FilterSubjects) != 0 ||
		want.AckPolicy != got.AckPolicy || want.AckWait != got.AckWait ||
		got.DeliverSubject != "" || got.InactiveThreshold != 0 {
		return false
	}
	if dm {
		return got.DeliverPolicy == jetstream.DeliverAllPolicy || got.DeliverPolicy == jetstream.DeliverByStartSequencePolicy
	}
	return want.DeliverPolicy == got.DeliverPolicy
}

// plannedConsumer is one consumer ProvisionAgent makes, and whether it already exists.
type plannedConsumer struct {
	stream string
	cfg    jetstream.ConsumerConfig
	dm     bool
	exists bool
	check  string
	create string
}

// ProvisionAgent pre-creates what one agent incarnation needs before it starts, on a
// provisioner connection (upstream provisionAgentDurables): its dm_ durable on DM starting at the
// activation frontier (DMDurable), its dlv_ durable on DLV (DlvDurable), its ACL row in
// cotal_acl_<t> (revision 1) and, with a role, the role's shared queue on TASK (RoleQueue), in
// that order. The agent may bind these but never create them.
//
// It first checks everything it can read: the names, the streams and the ACL bucket, and each
// item that already exists. An identical existing item is kept (a re-run creates and writes
// nothing); one in another shape is a *StepError matching ErrConflict, and nothing is created.
// A failure after something was created returns a *StepError naming the step, with the
// Provisioned whose Created lists what this run left: the provisioner holds no delete right (as
// upstream, it provisions and never tears down), so the caller removes those with Rollback on a
// deprovisioner connection for this lifecycle. RunProvisionAgent does. The role queue comes last
// because it is shared: nothing after it can fail, so no rollback ever deletes it.
func ProvisionAgent(ctx context.Context, js jetstream.JetStream, n space.Names, a Agent) (Provisioned, error) {
	lc := a.Owner + "." + a.Actor + "." + a.LifecycleUID
	fail := func(step string, err error) error { return &StepError{Lifecycle: lc, Step: step, Err: err} }

	p, err := lifecycleNames(n, a.Owner, a.Actor, a.LifecycleUID)
	if err != nil {
		return Provisioned{}, fail(StepValidate, err)
	}
	if a.Role != "" {
		if p.RoleQueue, err = n.SvcConsumer(a.Role); err != nil {
			return Provisioned{}, fail(StepValidate, err)
		}
	}
	row := ACL{AllowSubscribe: a.AllowSubscribe, Revision: 1}
	if _, err := row.Encode(); err != nil {
		return Provisioned{}, fail(StepValidate, err)
	}

	// Read: the streams (the DM frontier), the bucket, and what exists already.
	dmInfo, err := streamInfo(ctx, js, n.DMStream())
	if err != nil {
		return Provisioned{}, fail(StepStreams, err)
	}
	if _, err := streamInfo(ctx, js, n.DLVStream()); err != nil {
		return Provisioned{}, fail(StepStreams, err)
	}
	if a.Role != "" {
		if _, err := streamInfo(ctx, js, n.TaskStream()); err != nil {
			return Provisioned{}, fail(StepStreams, err)
		}
	}
	kv, err := js.KeyValue(ctx, p.ACLBucket)
	if err != nil {
		return Provisioned{}, fail(StepBucket, fmt.Errorf("%s: %w", p.ACLBucket, err))
	}

	dmCfg, err := DMDurable(n, a.Owner, a.Actor, a.LifecycleUID, dmInfo.State.LastSeq)
	if err != nil {
		return Provisioned{}, fail(StepValidate, err)
	}
	dlvCfg, err := DlvDurable(n, a.Owner, a.Actor, a.LifecycleUID)
	if err != nil {
		return Provisioned{}, fail(StepValidate, err)
	}
	plan := []*plannedConsumer{
		{stream: n.DMStream(), cfg: dmCfg, dm: true, check: StepCheckDM, create: StepCreateDM},
		{stream: n.DLVStream(), cfg: dlvCfg, check: StepCheckDlv, create: StepCreateDlv},
	}
	var role *plannedConsumer
	if a.Role != "" {
		cfg, err := RoleQueue(n, a.Role)
		if err != nil {
			return Provisioned{}, fail(StepValidate, err)
		}
		role = &plannedConsumer{stream: n.TaskStream(), cfg: cfg, check: StepCheckRole, create: StepCreateRole}
		plan = append(plan, role)
	}
	for _, c := range plan {
		if c.exists, err = existing(ctx, js, c); err != nil {
			return Provisioned{}, fail(c.check, err)
		}
	}
	rowExists, err := existingRow(ctx, kv, p.ACLKey, a.AllowSubscribe)
	if err != nil {
		return Provisioned{}, fail(StepCheckACL, err)
	}

	// Write, in order; the role queue last.
	for _, c := range plan[:2] {
		if !c.exists {
			if err := createConsumer(ctx, js, c); err != nil {
				return p, fail(c.create, err)
			}
			p.Created = append(p.Created, c.cfg.Durable)
		}
	}
	if !rowExists {
		row.UpdatedAt = time.Now().UnixMilli()
		body, _ := row.Encode()
		if _, err := kv.Create(ctx, p.ACLKey, body); errors.Is(err, jetstream.ErrKeyExists) {
			// Written since it was checked: keep it only if it is the same grant.
			if _, err := existingRow(ctx, kv, p.ACLKey, a.AllowSubscribe); err != nil {
				return p, fail(StepWriteACL, err)
			}
		} else if err != nil {
			return p, fail(StepWriteACL, fmt.Errorf("%s in %s: %w", p.ACLKey, p.ACLBucket, err))
		} else {
			p.Created = append(p.Created, p.ACLKey)
		}
	}
	if role != nil && !role.exists {
		if err := createConsumer(ctx, js, role); err != nil {
			return p, fail(role.create, err)
		}
		p.Created = append(p.Created, role.cfg.Durable)
	}
	return p, nil
}

// lifecycleNames fills the lifecycle's names.
func lifecycleNames(n space.Names, owner, actor, uid string) (Provisioned, error) {
	var p Provisioned
	var err error
	if p.DM, err = n.DMConsumer(owner, actor, uid); err != nil {
		return p, err
	}
	if p.Dlv, err = n.DlvConsumer(owner, actor, uid); err != nil {
		return p, err
	}
	if p.ACLBucket, err = n.Bucket(space.ACL); err != nil {
		return p, err
	}
	if p.ACLKey, err = space.ACLKey(owner, actor, uid); err != nil {
		return p, err
	}
	return p, nil
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s.CachedInfo(), nil
}

// existing reads consumer c: false when there is none, an ErrConflict when it is another one.
func existing(ctx context.Context, js jetstream.JetStream, c *plannedConsumer) (bool, error) {
	got, err := js.Consumer(ctx, c.stream, c.cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("durable %s on %s: %w", c.cfg.Durable, c.stream, err)
	}
	if !sameConsumer(c.cfg, got.CachedInfo().Config, c.dm) {
		g := got.CachedInfo().Config
		return true, fmt.Errorf("durable %s on %s (filter %q, ack %v %v, deliver %v): %w",
			c.cfg.Durable, c.stream, g.FilterSubject, g.AckPolicy, g.AckWait, g.DeliverPolicy, ErrConflict)
	}
	return true, nil
}

// createConsumer creates c; one created meanwhile by another run is accepted if it is the same.
func createConsumer(ctx context.Context, js jetstream.JetStream, c *plannedConsumer) error {
	_, err := js.CreateConsumer(ctx, c.stream, c.cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		if _, err := existing(ctx, js, c); err != nil {
			return err
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("durable %s on %s: %w", c.cfg.Durable, c.stream, err)
	}
	return nil
}

// existingRow reads the ACL row: false when there is none (or it was purged), an ErrConflict
// when it grants another list or does not decode.
func existingRow(ctx context.Context, kv jetstream.KeyValue, key string, allow []string) (bool, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", key, err)
	}
	got, ok := DecodeACL(e.Value())
	if !ok {
		return true, fmt.Errorf("%s does not decode as an ACL row: %w", key, ErrConflict)
	}
	if !got.sameGrant(allow) {
		return true, fmt.Errorf("%s grants %q, not %q: %w", key, got.AllowSubscribe, allow, ErrConflict)
	}
	return true, nil
}

// Rollback removes what a failed ProvisionAgent created (p.Created), on a deprovisioner
// connection for that lifecycle: the durables by exact name, the ACL row by an unconditional
// purge (this run wrote it moments ago); items this run found already there stay. A role queue in Created is left (it is shared, and the deprovisioner may not delete it).
func Rollback(ctx context.Context, js jetstream.JetStream, n space.Names, p Provisioned) ([]string, error) {
	return remove(ctx, js, n, p, p.Created...)
}

// remove deletes the items of p named in which.
func remove(ctx context.Context, js jetstream.JetStream, n space.Names, p Provisioned, which ...string) ([]string, error) {
	lc := p.ACLKey
	want := map[string]bool{}
	for _, w := range which {
		want[w] = true
	}
	var removed []string
	for _, c := range []struct{ stream, name, step string }{
		{n.DMStream(), p.DM, StepDeleteDM},
		{n.DLVStream(), p.Dlv, StepDeleteDlv},
	} {
		if !want[c.name] {
			continue
		}
		err := js.DeleteConsumer(ctx, c.stream, c.name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return removed, &StepError{Lifecycle: lc, Step: c.step, Err: fmt.Errorf("durable %s on %s: %w", c.name, c.stream, err)}
		}
		removed = append(removed, c.name)
	}
	if want[p.ACLKey] {
		kv, err := js.KeyValue(ctx, p.ACLBucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return removed, nil
		}
		if err != nil {
			return removed, &StepError{Lifecycle: lc, Step: StepPurgeACL, Err: fmt.Errorf("%s: %w", p.ACLBucket, err)}
		}
		if err := kv.Purge(ctx, p.ACLKey); err != nil {
			return removed, &StepError{Lifecycle: lc, Step: StepPurgeACL, Err: fmt.Errorf("%s in %s: %w", p.ACLKey, p.ACLBucket, err)}
		}
		removed = append(removed, p.ACLKey)
	}
	return removed, nil
}
