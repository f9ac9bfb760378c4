// Package plane3test is the test environment of deliveryd's loops: a real signerd and broker, the
// space provisioned by pkg/provision, and credentials minted through signerd for each party
// (delivery, agents, the provisioner). Tests only.
package plane3test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// Space is the environment's space; Owner is every agent's owner (a real principal owner).
const (
	Space = "alpha"
	Owner = "local"
)

// Env is a provisioned space on a real signerd and broker.
type Env struct {
	S   *signerdtest.Signer
	URL string
	N   space.Names
}

// Ctx is a context bounded for one test step.
func Ctx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// New starts signerd and a broker and provisions the space through a signerd-minted provisioner.
func New(t testing.TB) *Env {
	t.Helper()
	return NewWith(t, signerdtest.Options{})
}

// NewWith is New with signerd's options (a policy, say); Spaces is always [Space].
func NewWith(t testing.TB, opts signerdtest.Options) *Env {
	t.Helper()
	opts.Spaces = []string{Space}
	s := signerdtest.Start(t, opts)
	return On(t, s, s.StartBroker(t))
}

// On provisions the space on the broker at url, which trusts signerd s (a broker the test
// stops and restarts, say).
func On(t testing.TB, s *signerdtest.Signer, url string) *Env {
	t.Helper()
	return OnWith(t, s, url, provision.Options{})
}

// OnWith is On with provisioning options (Replicas 3 on a cluster, say); url may be a
// comma-separated list of a cluster's URLs.
func OnWith(t testing.TB, s *signerdtest.Signer, url string, opts provision.Options) *Env {
	t.Helper()
	e := &Env{S: s, URL: url}
	var err error
	if e.N, err = space.NewNames(Space); err != nil {
		t.Fatal(err)
	}
	e.Provision(t, e.signer(t, mtls.KindManagerd), opts, nil)
	return e
}

// Provision provisions the space on e.URL with signer (a managerd client, which may mint the
// provisioner credential). Provisioning is create-or-verify, so a run that a loaded machine timed
// out, or that met a cluster peer not yet current ("no suitable peers for placement"), is run
// again: at most three attempts of up to a minute each, with settle between them (nil: a
// one-second pause; a cluster's WaitHealthy, say).
func (e *Env) Provision(t testing.TB, signer *signerclient.Client, opts provision.Options, settle func() error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := provision.Run(ctx, provision.Config{Signer: signer, Space: Space, NatsURL: e.URL, Options: opts})
		cancel()
		if err == nil {
			return
		}
		if attempt == 3 {
			t.Fatalf("provision: %v", err)
		}
		t.Logf("provision attempt %d: %v; once more", attempt, err)
		if settle == nil {
			time.Sleep(time.Second) // a pause before a retry, not a wait for an event
		} else if err := settle(); err != nil {
			t.Fatal(err)
		}
	}
}

// Unprovisioned starts signerd and a broker; the space has no stream or bucket yet.
func Unprovisioned(t testing.TB) *Env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{Space}})
	e := &Env{S: s, URL: s.StartBroker(t)}
	var err error
	if e.N, err = space.NewNames(Space); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *Env) signer(t testing.TB, kind string) *signerclient.Client {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.S.Addr, TLS: e.S.ClientFor(t, kind, Space)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Conn mints a credential of profile through signerd as caller kind and connects with it.
func (e *Env) Conn(t testing.TB, kind string, p signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: e.signer(t, kind), Space: Space, Profile: p, Params: params, NatsURL: e.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(Ctx(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.URL, append(rail.NatsOptions(), nats.Name(p.String()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JS wraps nc.
func JS(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Delivery is a delivery-credential connection, as deliveryd holds.
func (e *Env) Delivery(t testing.TB) *nats.Conn {
	t.Helper()
	return e.Conn(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_DELIVERY, nil)
}

// Agent is an agent connection of local.<actor> for lifecycle uid, reading and posting general.
func (e *Env) Agent(t testing.TB, actor, uid string) *nats.Conn {
	t.Helper()
	return e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT, &signerv1.ProfileParams{
		Owner: Owner, Actor: actor, LifecycleUid: uid,
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
	})
}

// Provisioner is a provisioner-credential JetStream context, as managerd holds while it provisions.
func (e *Env) Provisioner(t testing.TB) jetstream.JetStream {
	t.Helper()
	return JS(t, e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_PROVISIONER, nil))
}

// AddLifecycle does what managerd does for a new agent incarnation: its dlv_ durable and its ACL
// row (allow nil writes no row).
func (e *Env) AddLifecycle(t testing.TB, pjs jetstream.JetStream, actor, uid string, allow []string) {
	t.Helper()
	e.AddLifecycleOf(t, pjs, Owner, actor, uid, allow)
}

// AddLifecycleOf is AddLifecycle for owner.actor (a derived owner, say, for an agent connected
// through authd's callout).
func (e *Env) AddLifecycleOf(t testing.TB, pjs jetstream.JetStream, owner, actor, uid string, allow []string) {
	t.Helper()
	if err := provision.EnsureDlvDurable(Ctx(t), pjs, e.N, owner, actor, uid); err != nil {
		t.Fatal(err)
	}
	if allow != nil {
		e.setACL(t, pjs, owner, actor, uid, allow)
	}
}

// SetACL writes a lifecycle's ACL row with the provisioner.
func (e *Env) SetACL(t testing.TB, pjs jetstream.JetStream, actor, uid string, allow []string) {
	t.Helper()
	e.setACL(t, pjs, Owner, actor, uid, allow)
}

func (e *Env) setACL(t testing.TB, pjs jetstream.JetStream, owner, actor, uid string, allow []string) {
	t.Helper()
	kv, err := pjs.KeyValue(Ctx(t), "cotal_acl_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, err := space.ACLKey(owner, actor, uid)
	if err != nil {
		t.Fatal(err)
	}
	b, err := provision.ACL{AllowSubscribe: allow, Revision: 1, UpdatedAt: time.Now().UnixMilli()}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(Ctx(t), key, b); err != nil {
		t.Fatalf("ACL row %s: %v", key, err)
	}
}

// Join writes a durable membership row for local.<actor>.<uid> on channel, as durableJoin commits
// it, with the delivery credential.
func (e *Env) Join(t testing.TB, djs jetstream.JetStream, channel, actor, uid string, joinCursor, generation uint64) {
	t.Helper()
	e.JoinOf(t, djs, channel, Owner, actor, uid, joinCursor, generation)
}

// JoinOf is Join for owner.actor.
func (e *Env) JoinOf(t testing.TB, djs jetstream.JetStream, channel, owner, actor, uid string, joinCursor, generation uint64) {
	t.Helper()
	kv, err := djs.KeyValue(Ctx(t), "cotal_members_"+e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, err := space.MemberKey(channel, owner, actor, uid)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"channel": channel, "owner": owner + "." + actor, "lifecycleUid": uid,
		"state": "durable-active", "joinCursor": joinCursor, "generation": generation, "activated": true,
		"writerIdentity": "test", "updatedAt": time.Now().UnixMilli()})
	if _, err := kv.Put(Ctx(t), key, b); err != nil {
		t.Fatalf("member row %s: %v", key, err)
	}
}

// Post publishes a chat message as local.<actor> on general and waits for it to be stored; it
// returns the CHAT sequence.
func (e *Env) Post(t testing.TB, ajs jetstream.JetStream, actor, id, text string, mentions ...string) uint64 {
	t.Helper()
	subj, err := e.N.Chat(Owner, actor, "general")
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"id": id, "from": map[string]string{"id": Owner + "." + actor}, "text": text, "to": "someone"}
	if len(mentions) > 0 {
		msg["mentions"] = mentions
	}
	b, _ := json.Marshal(msg)
	ack, err := ajs.Publish(Ctx(t), subj, b)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	return ack.Sequence
}
