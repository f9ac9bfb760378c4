package profiles_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests prove issue 11 item 8's profile fixes on the broker.

// serveLiveness answers every probe nc receives on the plane's serve pattern, in the plane's
// queue group, on the reply subject the caller named, but only when that subject is a .reply.
// leaf under the probe itself (upstream's bound-reply rule), so the test's responder behaves like
// managerd's will.
func serveLiveness(t *testing.T, nc *nats.Conn, serve, plane string) {
	t.Helper()
	serveQueue(t, nc, serve, space.LiveQueue(plane), func(m *nats.Msg) (string, string, bool) {
		return m.Reply, `{"plane":"` + plane + `","responder":"bound"}`, strings.HasPrefix(m.Reply, m.Subject+".reply.")
	})
}

// serveQueue answers every request nc receives on serve in queue group queue: answer says on
// which subject and with what body, or not at all.
func serveQueue(t *testing.T, nc *nats.Conn, serve, queue string, answer func(*nats.Msg) (subject, body string, ok bool)) {
	t.Helper()
	if _, err := nc.QueueSubscribe(serve, queue, func(m *nats.Msg) {
		if subject, body, ok := answer(m); ok {
			_ = nc.Publish(subject, []byte(body))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// wantRefused has who publish to ("pub") or subscribe to ("sub") subject on a connection of its
// own and waits for the broker's permissions violation.
func wantRefused(t *testing.T, b *testkit.Broker, who principal, op, subject string) {
	t.Helper()
	nc := connectAs(t, b, who)
	if op == "sub" {
		if _, err := nc.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, b, nc, testkit.SubscribeViolation(subject))
		return
	}
	if err := nc.Publish(subject, nil); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, b, nc, testkit.PublishViolation(subject))
}

// TestManagerLivenessPlane: the supervisor serves live.manager.*.* in its queue group and answers
// on the prober's .reply. leaf; an agent probes the manager and the delivery plane as itself and
// hears both answers on its own lane. Nobody else can serve, answer, or probe as another.
func TestManagerLivenessPlane(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	serveLiveness(t, connectAs(t, b, principal{profiles.Supervisor, supervisorM1}), n.LiveManagerServe(), space.LivePlaneManager)
	serveLiveness(t, connectAs(t, b, principal{profiles.Delivery, none}), n.LiveDeliveryServe(), space.LivePlaneDelivery)

	agent := connectAs(t, b, principal{profiles.Agent, agentO1})
	for _, tc := range []struct{ plane, probe, lane string }{
		{space.LivePlaneManager, must(n.LiveManager("o1", "a1")), must(n.LiveManagerReplies("o1", "a1"))},
		{space.LivePlaneDelivery, must(n.LiveDelivery("o1", "a1")), must(n.LiveDeliveryReplies("o1", "a1"))},
	} {
		t.Run("ok/agent probes the "+tc.plane+" plane and hears its answer", func(t *testing.T) {
			answers := subscribe(t, agent, tc.lane)
			if err := agent.PublishRequest(tc.probe, tc.probe+".reply.n1", nil); err != nil {
				t.Fatal(err)
			}
			expectMsg(t, answers, tc.probe+".reply.n1", `{"plane":"`+tc.plane+`","responder":"bound"}`)
		})
	}
	if errs := b.AsyncErrors(agent); len(errs) != 0 {
		t.Fatalf("agent got broker errors: %v", errs)
	}

	admin := principal{profiles.Admin, profiles.Params{Owner: "u_viewer", Actor: "web"}}
	for _, tt := range []struct {
		name, op, subject string
		who               principal
	}{
		{"fail/agent serves the manager plane", "sub", n.LiveManagerServe(), principal{profiles.Agent, agentO1}},
		{"fail/delivery serves the manager plane", "sub", n.LiveManagerServe(), principal{profiles.Delivery, none}},
		{"fail/supervisor serves the delivery plane", "sub", n.LiveDeliveryServe(), principal{profiles.Supervisor, supervisorM1}},
		{"fail/observer serves the manager plane", "sub", n.LiveManagerServe(), principal{profiles.Observer, none}},
		{"fail/agent reads another principal's manager answers", "sub", must(n.LiveManagerReplies("o2", "a2")), principal{profiles.Agent, agentO1}},
		{"fail/agent reads another principal's delivery answers", "sub", must(n.LiveDeliveryReplies("o2", "a2")), principal{profiles.Agent, agentO1}},
		{"fail/agent probes the manager as another principal", "pub", must(n.LiveManager("o2", "a2")), principal{profiles.Agent, agentO1}},
		{"fail/agent answers another principal's manager probe", "pub", must(n.LiveManager("o2", "a2")) + ".reply.n1", principal{profiles.Agent, agentO1}},
		{"fail/agent answers its own manager probe", "pub", must(n.LiveManager("o1", "a1")) + ".reply.n1", principal{profiles.Agent, agentO1}},
		{"fail/supervisor sends a probe as a peer", "pub", must(n.LiveManager("o1", "a1")), principal{profiles.Supervisor, supervisorM1}},
		{"fail/supervisor sends a probe as itself", "pub", must(n.LiveManager("m1", "s1")), principal{profiles.Supervisor, supervisorM1}},
		{"fail/supervisor answers on the delivery plane", "pub", must(n.LiveDelivery("o1", "a1")) + ".reply.n1", principal{profiles.Supervisor, supervisorM1}},
		{"fail/delivery answers on the manager plane", "pub", must(n.LiveManager("o1", "a1")) + ".reply.n1", principal{profiles.Delivery, none}},
		{"fail/admin probes the manager", "pub", must(n.LiveManager("u_viewer", "web")), admin},
		{"fail/observer probes the manager", "pub", must(n.LiveManager("o1", "a1")), principal{profiles.Observer, none}},
		{"fail/operator probes the manager", "pub", must(n.LiveManager("o1", "a1")), principal{profiles.Operator, profiles.Params{Owner: "o1", Actor: "a1"}}},
	} {
		t.Run(tt.name, func(t *testing.T) { wantRefused(t, b, tt.who, tt.op, tt.subject) })
	}
}
