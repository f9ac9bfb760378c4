package profiles_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests prove the issue-8 narrowing on a real broker: observer, admin and agent cannot
// reach a consumer that is not theirs, no non-daemon profile can create a KV-watch (push)
// consumer, and each narrowed profile still does its job.

// provisioned is a space whose streams, buckets and daemon consumers exist, set up the way the
// provisioner and delivery profiles would: CHAT and DM streams, the presence, channels and
// membership buckets, deliveryd's fanout durable on CHAT and o1.a1's DM durable.
type provisioned struct {
	b   *testkit.Broker
	n   space.Names
	dmC string // o1.a1's dm_ durable
}

func provision(t *testing.T) provisioned {
	t.Helper()
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	ctx := testCtx(t)
	pjs := jsFor(t, connectAs(t, b, principal{profiles.Provisioner, none}))
	for _, s := range []jetstream.StreamConfig{
		{Name: n.ChatStream(), Subjects: []string{n.ChatAll()}},
		// DM allows direct gets, so the admin's history read takes the bare DIRECT.GET path and the
		// observer's on CHAT the leader-served STREAM.MSG.GET path: both rows are exercised.
		{Name: n.DMStream(), Subjects: []string{n.InstAll()}, AllowDirect: true},
	} {
		if _, err := pjs.CreateStream(ctx, s); err != nil {
			t.Fatalf("provisioner creates %s: %v", s.Name, err)
		}
	}
	for _, k := range []space.BucketKind{space.Presence, space.Channels, space.Membership} {
		if _, err := pjs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: must(n.Bucket(k))}); err != nil {
			t.Fatalf("provisioner creates bucket %s: %v", k, err)
		}
	}
	dmC := must(n.DMConsumer("o1", "a1", uid))
	if _, err := pjs.CreateOrUpdateConsumer(ctx, n.DMStream(), jetstream.ConsumerConfig{
		Durable: dmC, FilterSubject: must(n.InstTo("o1", "a1")), AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatalf("provisioner creates %s: %v", dmC, err)
	}
	djs := jsFor(t, connectAs(t, b, principal{profiles.Delivery, none}))
	if _, err := djs.CreateOrUpdateConsumer(ctx, n.ChatStream(), jetstream.ConsumerConfig{
		Durable: n.FanoutConsumer(), AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatalf("delivery creates fanout: %v", err)
	}
	return provisioned{b: b, n: n, dmC: dmC}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func jsFor(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishStored publishes as p and waits for the stream's ack, so the message is stored.
func publishStored(t *testing.T, nc *nats.Conn, subject, body string) {
	t.Helper()
	if _, err := jsFor(t, nc).Publish(testCtx(t), subject, []byte(body)); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// consumerState reads a consumer's info with the delivery daemon's (CHAT, presence) or the
// provisioner's (DM) credential.
func consumerState(t *testing.T, p provisioned, by principal, stream, consumer string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := jsFor(t, connectAs(t, p.b, by)).Consumer(testCtx(t), stream, consumer)
	if err != nil {
		t.Fatalf("consumer %s on %s: %v", consumer, stream, err)
	}
	ci, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

// TestNarrowReadersCannotTouchOthersConsumers is finding 1 and 2 of issue 8: observer and admin
// cannot fetch from, ack on, rewrite or delete deliveryd's fanout or an agent's dm_ durable, and
// an agent cannot create any consumer on the presence bucket's stream (the ordered push consumer
// a KV watch creates names itself and carries its deliver subject in the body, neither of which
// the broker checks). Each refusal is the broker's own permissions violation.
func TestNarrowReadersCannotTouchOthersConsumers(t *testing.T) {
	p := provision(t)
	n, must := p.n, mustOf(t)
	chat, dm, pres := n.ChatStream(), n.DMStream(), must(n.BucketStream(space.Presence))
	fanout := n.FanoutConsumer()
	observer := principal{profiles.Observer, profiles.Params{Owner: "u_viewer", Actor: "web"}}
	admin := principal{profiles.Admin, profiles.Params{Owner: "u_viewer", Actor: "web"}}
	agent := principal{profiles.Agent, agentO1}
	operator := principal{profiles.Operator, profiles.Params{Owner: "o1", Actor: "human"}}
	tests := []struct {
		name    string
		user    principal
		subject string
		body    string
	}{
		{"fail/observer fetches from fanout", observer, must(space.ConsumerNext(chat, fanout)), `{"batch":1}`},
		{"fail/observer acks on fanout", observer, "$JS.ACK." + chat + "." + fanout + ".1.1.1.0.0", ""},
		{"fail/observer deletes fanout", observer, must(space.ConsumerDelete(chat, fanout)), ""},
		{"fail/observer rewrites fanout by named create", observer, must(space.ConsumerCreateNamed(chat, fanout)), ""},
		{"fail/observer rewrites fanout by legacy create", observer, must(space.ConsumerCreate(chat)), ""},
		{"fail/observer rewrites fanout by durable create", observer, must(space.DurableCreate(chat, fanout)), ""},
		{"fail/observer reads fanout's info", observer, must(space.ConsumerInfo(chat, fanout)), ""},
		{"fail/admin fetches from an agent's dm durable", admin, must(space.ConsumerNext(dm, p.dmC)), `{"batch":1}`},
		{"fail/admin acks on an agent's dm durable", admin, "$JS.ACK." + dm + "." + p.dmC + ".1.1.1.0.0", ""},
		{"fail/admin deletes an agent's dm durable", admin, must(space.ConsumerDelete(dm, p.dmC)), ""},
		{"fail/admin rewrites an agent's dm durable", admin, must(space.ConsumerCreateNamed(dm, p.dmC)), ""},
		{"fail/admin creates a legacy ephemeral on DM", admin, must(space.ConsumerCreate(dm)), ""},
		{"fail/admin fetches from fanout", admin, must(space.ConsumerNext(chat, fanout)), `{"batch":1}`},
		{"fail/agent creates a named consumer on the presence stream", agent, must(space.ConsumerCreateNamed(pres, "watch1")), ""},
		{"fail/agent creates a legacy consumer on the presence stream", agent, must(space.ConsumerCreate(pres)), ""},
		{"fail/agent deletes a consumer on the presence stream", agent, must(space.ConsumerDelete(pres, "watch1")), ""},
		{"fail/agent creates a legacy consumer on CHAT", agent, must(space.ConsumerCreate(chat)), ""},
		{"fail/agent fetches from fanout", agent, must(space.ConsumerNext(chat, fanout)), `{"batch":1}`},
		{"fail/operator creates a named consumer on the presence stream", operator, must(space.ConsumerCreateNamed(pres, "watch1")), ""},
		{"fail/operator creates a legacy consumer on the channels stream", operator, must(space.ConsumerCreate(must(n.BucketStream(space.Channels)))), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc := connectAs(t, p.b, tt.user)
			subject := tt.subject
			if strings.HasSuffix(subject, ".>") {
				subject = strings.TrimSuffix(subject, ">") + "cotal." + n.Token() + ".chat.>"
			}
			if err := nc.PublishRequest(subject, nc.NewRespInbox(), []byte(tt.body)); err != nil {
				t.Fatal(err)
			}
			err := p.b.WaitAsyncError(t, nc, testkit.PublishViolation(subject))
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("broker error %v is not a permissions violation", err)
			}
		})
	}

	// The refusals are real: a message stored before all of the above is still pending on both
	// durables, and neither was deleted or rewritten.
	t.Run("ok/the durables are untouched", func(t *testing.T) {
		delivery := principal{profiles.Delivery, none}
		for _, c := range []struct {
			by               principal
			stream, consumer string
		}{{delivery, chat, fanout}, {principal{profiles.Provisioner, none}, dm, p.dmC}} {
			ci := consumerState(t, p, c.by, c.stream, c.consumer)
			if ci.Delivered.Consumer != 0 || ci.AckFloor.Consumer != 0 {
				t.Fatalf("%s delivered %d, acked %d: someone consumed it", c.consumer, ci.Delivered.Consumer, ci.AckFloor.Consumer)
			}
			if c.consumer == fanout && ci.Config.FilterSubject != "" {
				t.Fatalf("fanout was rewritten: filter %q", ci.Config.FilterSubject)
			}
		}
	})
}

// TestNarrowAgentPushConsumerIntoChat is finding 2 as the issue saw it: an agent creates a push
// consumer on the presence stream whose deliver subject CHAT captures. The broker refuses the
// create, and nothing lands in CHAT when the agent then writes its presence.
func TestNarrowAgentPushConsumerIntoChat(t *testing.T) {
	p := provision(t)
	n, must := p.n, mustOf(t)
	pres := must(n.BucketStream(space.Presence))
	nc := connectAs(t, p.b, principal{profiles.Agent, agentO1})
	filter := must(n.KVAll(space.Presence))
	create := must(space.ConsumerCreateFiltered(pres, "pushy", filter))
	body, err := json.Marshal(map[string]any{"stream_name": pres, "config": map[string]any{
		"name": "pushy", "filter_subject": filter, "deliver_policy": "all",
		"deliver_subject": must(n.Chat("o2", "a2", "general")),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request(create, body, 500*time.Millisecond); err == nil {
		t.Fatal("the broker answered the push-consumer create")
	}
	if err := p.b.WaitAsyncError(t, nc, testkit.PublishViolation(create)); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("broker error %v is not a permissions violation", err)
	}
	kv, err := jsFor(t, nc).KeyValue(testCtx(t), must(n.Bucket(space.Presence)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testCtx(t), "o1.a1", []byte("online")); err != nil {
		t.Fatalf("agent writes its presence: %v", err)
	}
	djs := jsFor(t, connectAs(t, p.b, principal{profiles.Delivery, none}))
	if _, err := djs.Consumer(testCtx(t), pres, "pushy"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("consumer pushy: err = %v, want not found", err)
	}
	s, err := djs.Stream(testCtx(t), n.ChatStream())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 0 {
		t.Fatalf("CHAT holds %d messages after the agent's presence write", got)
	}
}

// TestNarrowProfilesStillWork is the other half of the acceptance: what each narrowed profile must
// still do, over TCP to the broker.
func TestNarrowProfilesStillWork(t *testing.T) {
	p := provision(t)
	n, must := p.n, mustOf(t)
	agent := connectAs(t, p.b, principal{profiles.Agent, agentO1})
	sender := connectAs(t, p.b, principal{profiles.Agent, agentO2})
	posts := []string{"one", "two", "three"}
	for _, body := range posts {
		publishStored(t, agent, must(n.Chat("o1", "a1", "general")), body)
	}
	publishStored(t, sender, must(n.Inst("o1", "a1", "o2", "a2")), "dm for o1")
	presBucket := must(n.Bucket(space.Presence))

	t.Run("ok/observer reads chat history with message gets", func(t *testing.T) {
		nc := connectAs(t, p.b, principal{profiles.Observer, none})
		got := readStream(t, nc, n.ChatStream(), n.ChatAll(), len(posts))
		if strings.Join(got, ",") != strings.Join(posts, ",") {
			t.Fatalf("observer read %v, want %v", got, posts)
		}
	})

	t.Run("ok/observer reads live chat", func(t *testing.T) {
		nc := connectAs(t, p.b, principal{profiles.Observer, none})
		live := subscribe(t, nc, n.ChatAll())
		subject := must(n.Chat("o1", "a1", "general"))
		publishStored(t, agent, subject, "live")
		expectMsg(t, live, subject, "live")
	})

	t.Run("ok/observer reads and follows the roster", func(t *testing.T) {
		ctx := testCtx(t)
		nc := connectAs(t, p.b, principal{profiles.Observer, none})
		feed := subscribe(t, nc, must(n.KVAll(space.Presence)))
		putPresence(t, agent, presBucket, "o1.a1", "online")
		expectMsg(t, feed, must(n.KV(space.Presence, "o1.a1")), "online")
		kv, err := jsFor(t, nc).KeyValue(ctx, presBucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "o1.a1")
		if err != nil || string(e.Value()) != "online" {
			t.Fatalf("observer gets o1.a1: %v %v", e, err)
		}
	})

	t.Run("ok/admin reads DMs without consuming anyone's durable", func(t *testing.T) {
		ctx := testCtx(t)
		nc := connectAs(t, p.b, principal{profiles.Admin, profiles.Params{Owner: "u_viewer", Actor: "web"}})
		live := subscribe(t, nc, n.InstAll())
		if got := readStream(t, nc, n.DMStream(), n.InstAll(), 1); got[0] != "dm for o1" {
			t.Fatalf("admin read %v", got)
		}
		subject := must(n.Inst("o1", "a1", "o2", "a2"))
		publishStored(t, sender, subject, "second dm")
		expectMsg(t, live, subject, "second dm")
		// The consumer's pending count follows the stream asynchronously: poll until the second
		// DM is counted, then require that nothing was delivered from the durable.
		testkit.Eventually(t, 5*time.Second, func() error {
			ci := consumerState(t, p, principal{profiles.Provisioner, none}, n.DMStream(), p.dmC)
			if ci.NumPending != 2 || ci.Delivered.Consumer != 0 {
				return fmt.Errorf("%s: pending %d delivered %d, want 2 and 0", p.dmC, ci.NumPending, ci.Delivered.Consumer)
			}
			return nil
		})
		// The agent still gets both from its own durable.
		c, err := jsFor(t, agent).Consumer(ctx, n.DMStream(), p.dmC)
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Join(got, ",") != "dm for o1,second dm" {
			t.Fatalf("agent fetched %v", got)
		}
	})

	t.Run("ok/agent writes and watches its own presence", func(t *testing.T) {
		ctx := testCtx(t)
		feed := subscribe(t, agent, must(n.KVAll(space.Presence)))
		putPresence(t, agent, presBucket, "o1.a1", "busy")
		expectMsg(t, feed, must(n.KV(space.Presence, "o1.a1")), "busy")
		kv, err := jsFor(t, agent).KeyValue(ctx, presBucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "o1.a1")
		if err != nil || string(e.Value()) != "busy" {
			t.Fatalf("agent gets its presence: %v %v", e, err)
		}
		if errs := p.b.AsyncErrors(agent); len(errs) != 0 {
			t.Fatalf("agent got broker errors: %v", errs)
		}
	})

	t.Run("ok/operator writes its presence and reads the roster with gets", func(t *testing.T) {
		ctx := testCtx(t)
		nc := connectAs(t, p.b, principal{profiles.Operator, profiles.Params{Owner: "o1", Actor: "human"}})
		putPresence(t, nc, presBucket, "o1.human", "here")
		putPresence(t, agent, presBucket, "o1.a1", "idle")
		kv, err := jsFor(t, nc).KeyValue(ctx, presBucket)
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]string{"o1.human": "here", "o1.a1": "idle"} {
			if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != want {
				t.Fatalf("operator gets %s: %v %v", key, e, err)
			}
		}
	})

	t.Run("ok/agent reads channel history through its pinned chathist consumer", func(t *testing.T) {
		ctx := testCtx(t)
		hist := must(n.ChatHistConsumer("o1", "a1", uid))
		c, err := jsFor(t, agent).CreateOrUpdateConsumer(ctx, n.ChatStream(), jetstream.ConsumerConfig{
			Name: hist, FilterSubject: must(n.ChatRead("general")), AckPolicy: jetstream.AckNonePolicy,
			InactiveThreshold: time.Minute,
		})
		if err != nil {
			t.Fatalf("agent creates %s: %v", hist, err)
		}
		batch, err := c.Fetch(len(posts), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
		}
		if strings.Join(got, ",") != strings.Join(posts, ",") {
			t.Fatalf("agent read %v, want %v", got, posts)
		}
	})
}

// readStream reads the first want messages of stream matching filter with message gets
// (next_by_subj from sequence 1), the history read observer and admin hold.
func readStream(t *testing.T, nc *nats.Conn, stream, filter string, want int) []string {
	t.Helper()
	ctx := testCtx(t)
	s, err := jsFor(t, nc).Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream info %s: %v", stream, err)
	}
	var got []string
	for seq := uint64(1); len(got) < want; seq++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if err != nil {
			t.Fatalf("get from %d on %s: %v", seq, stream, err)
		}
		got = append(got, string(m.Data))
		seq = m.Sequence
	}
	return got
}

func subscribe(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

func expectMsg(t *testing.T, sub *nats.Subscription, subject, body string) {
	t.Helper()
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("nothing on %s: %v", sub.Subject, err)
	}
	if m.Subject != subject || string(m.Data) != body {
		t.Fatalf("got %s %q, want %s %q", m.Subject, m.Data, subject, body)
	}
}

func putPresence(t *testing.T, nc *nats.Conn, bucket, key, value string) {
	t.Helper()
	kv, err := jsFor(t, nc).KeyValue(testCtx(t), bucket)
	if err != nil {
		t.Fatalf("bind %s: %v", bucket, err)
	}
	if _, err := kv.Put(testCtx(t), key, []byte(value)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// TestBrokerLimitsTheRowsCannotExpress pins down, on the real broker, the two facts the package
// doc builds on. If a broker release changes either, this test fails and the doc must change.
func TestBrokerLimitsTheRowsCannotExpress(t *testing.T) {
	p := provision(t)
	n, must := p.n, mustOf(t)
	ctx := testCtx(t)
	djs := jsFor(t, connectAs(t, p.b, principal{profiles.Delivery, none}))

	t.Run("ok/the legacy create takes the consumer name from the body", func(t *testing.T) {
		nc := connectAs(t, p.b, principal{profiles.Delivery, none})
		body := fmt.Sprintf(`{"stream_name":%q,"config":{"name":"chosen_by_body","ack_policy":"none","inactive_threshold":60000000000}}`, n.ChatStream())
		m, err := nc.Request(must(space.ConsumerCreate(n.ChatStream())), []byte(body), 5*time.Second)
		if err != nil || strings.Contains(string(m.Data), `"error"`) {
			t.Fatalf("legacy create: %v %s", err, m.Data)
		}
		if _, err := djs.Consumer(ctx, n.ChatStream(), "chosen_by_body"); err != nil {
			t.Fatalf("consumer named by the body: %v", err)
		}
	})

	t.Run("ok/a pinned create row cannot keep a consumer in pull mode", func(t *testing.T) {
		// The agent's chathist_ row pins name and filter, but the deliver subject rides the body.
		nc := connectAs(t, p.b, principal{profiles.Agent, agentO1})
		hist, read := must(n.ChatHistConsumer("o1", "a1", uid)), must(n.ChatRead("general"))
		body := fmt.Sprintf(`{"stream_name":%q,"config":{"name":%q,"filter_subject":%q,"deliver_subject":"elsewhere.push","ack_policy":"none","inactive_threshold":60000000000}}`,
			n.ChatStream(), hist, read)
		m, err := nc.Request(must(space.ConsumerCreateFiltered(n.ChatStream(), hist, read)), []byte(body), 5*time.Second)
		if err != nil || !strings.Contains(string(m.Data), `"deliver_subject":"elsewhere.push"`) {
			t.Fatalf("push create on the pinned row: %v %s", err, m.Data)
		}
	})

	t.Run("ok/a reply subject is not checked against the requester's permissions", func(t *testing.T) {
		// The agent may not publish to o2.a2's chat subject, but a JetStream API answer to a
		// request it sends with that reply subject is stored in CHAT under it.
		nc := connectAs(t, p.b, principal{profiles.Agent, agentO1})
		forged := must(n.Chat("o2", "a2", "general"))
		if err := nc.PublishRequest(space.JSAPIInfo, forged, nil); err != nil {
			t.Fatal(err)
		}
		c, err := djs.OrderedConsumer(ctx, n.ChatStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{forged}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("nothing stored under %s: %v", forged, err)
		}
		if m.Subject() != forged || !strings.Contains(string(m.Data()), "account_info_response") {
			t.Fatalf("stored %s %q", m.Subject(), m.Data())
		}
		if errs := p.b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("the broker refused something: %v", errs)
		}
	})
}
