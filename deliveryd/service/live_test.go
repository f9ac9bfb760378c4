package service_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// probe sends an empty liveness request on live.delivery.local.<actor> from nc with reply
// subject reply and returns the answer, or the error of waiting for it.
func probe(t *testing.T, nc *nats.Conn, subject, reply string) (*nats.Msg, error) {
	t.Helper()
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, reply, nil); err != nil {
		t.Fatal(err)
	}
	return sub.NextMsg(10 * time.Second)
}

// TestLiveness (issue 20 item 8): deliveryd serves the delivery plane's liveness rail that the
// agent profile may probe: an agent's empty request on its own live.delivery.<owner>.<actor>,
// answered on its .reply. leaf, says the plane is bound, with an opaque instance token; a request
// whose reply subject is not under its own subject is dropped; after Close nobody answers, which
// the broker reports as no responders (upstream grades that unbound).
func TestLiveness(t *testing.T) {
	e := plane3test.New(t)
	var logs logBuffer
	svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
	servicetest.WaitReady(t, servicetest.DeliveryKV(t, e), "deliveryd-a", 5*time.Second)
	nc := e.Agent(t, "alice", uidAlice)
	subj, err := e.N.LiveDelivery(plane3test.Owner, "alice")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("fail/reply-outside-the-probe-is-dropped", func(t *testing.T) {
		// The agent's own inbox is a subject it may hear but not one under the probe; a good
		// probe sent after it is answered, and the rail serves requests in order, so the
		// dropped one was handled first.
		bad, err := nc.SubscribeSync(nc.NewInbox())
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(subj, bad.Subject, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := probe(t, nc, subj, subj+".reply.after"); err != nil {
			t.Fatalf("the good probe after the bad one: %v", err)
		}
		if m, err := bad.NextMsg(0); err == nil {
			t.Fatalf("answered a probe at %s, outside its own subject: %s", bad.Subject, m.Data)
		}
	})
	t.Run("ok/bound", func(t *testing.T) {
		m, err := probe(t, nc, subj, subj+".reply.n1")
		if err != nil {
			t.Fatalf("liveness probe: %v\n%s", err, logs.String())
		}
		var a service.LivenessAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatalf("answer %s: %v", m.Data, err)
		}
		tok, err := hex.DecodeString(a.Instance)
		if a.Plane != "delivery" || a.Responder != "bound" || err != nil || len(tok) != 8 {
			t.Fatalf("answer %+v; want the delivery plane bound with an 8-byte hex instance token", a)
		}
		if a.Instance == svc.Row().Incarnation || a.Instance == svc.Identity() {
			t.Fatalf("the instance token %q names the lease row or the credential", a.Instance)
		}
	})
	t.Run("fail/closed-has-no-responders", func(t *testing.T) {
		if err := svc.Close(ctx(t)); err != nil {
			t.Fatalf("Close = %v", err)
		}
		_, err := nc.Request(subj, nil, 5*time.Second)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("probe after Close = %v; want no responders", err)
		}
	})
}
