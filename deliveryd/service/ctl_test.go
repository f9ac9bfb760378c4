package service_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

type ctlReply struct {
	OK    bool            `json:"ok"`
	Data  json.RawMessage `json:"data"`
	Error string          `json:"error"`
}

// ctlCall sends op as local.<actor> on ctl.<service> over nc and waits for the reply.
func ctlCall(t *testing.T, nc *nats.Conn, service, actor, op string, args any) ctlReply {
	t.Helper()
	subj := "cotal." + plane3test.Space + ".ctl." + service + "." + plane3test.Owner + "." + actor
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	replyTo := subj + ".reply." + hex.EncodeToString(b)
	sub, err := nc.SubscribeSync(replyTo)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(map[string]any{"op": op, "args": args, "from": map[string]string{"id": plane3test.Owner + "." + actor, "name": actor}})
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Reply: replyTo, Data: body}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("%s: no reply: %v", op, err)
	}
	var r ctlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return r
}

// TestCtlWired: the service binds deliveryd's ctl responders by default: an agent's durableJoin
// makes it a durable member that then receives the channel, and the supervisor's reloadCreds
// renews the service's own credential through signerd.
func TestCtlWired(t *testing.T) {
	e := plane3test.New(t)
	pjs := e.Provisioner(t)
	e.AddLifecycle(t, pjs, "bob", uidBob, []string{"general"})
	var logs logBuffer
	svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
	bobNC := e.Agent(t, "bob", uidBob)
	r := ctlCall(t, bobNC, space.CtlServiceDelivery, "bob", "durableJoin", map[string]string{"channel": "general"})
	var join struct {
		Durable    bool   `json:"durable"`
		Generation uint64 `json:"generation"`
	}
	if !r.OK || json.Unmarshal(r.Data, &join) != nil || !join.Durable || join.Generation != 1 {
		t.Fatalf("durableJoin = %+v", r)
	}
	bob := plane3test.Receive(t, e, "bob", uidBob)
	e.Post(t, plane3test.JS(t, e.Agent(t, "alice", uidAlice)), "alice", "j-1", "after the join")
	eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"j-1"}) })

	sup := e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "manager"})
	r = ctlCall(t, sup, space.CtlServiceDeliveryAdmin, "manager", "reloadCreds", map[string]any{})
	var reload struct {
		Delivery struct {
			OK             bool `json:"ok"`
			BrokerAccepted struct {
				Identity string `json:"identity"`
				IAT      int64  `json:"iat"`
				EXP      int64  `json:"exp"`
			} `json:"brokerAccepted"`
		} `json:"delivery"`
	}
	if !r.OK || json.Unmarshal(r.Data, &reload) != nil || !reload.Delivery.OK || reload.Delivery.BrokerAccepted.EXP <= reload.Delivery.BrokerAccepted.IAT {
		t.Fatalf("reloadCreds = %+v", r)
	}
	if id := reload.Delivery.BrokerAccepted.Identity; id == "" || id != svc.Identity() {
		t.Fatalf("reloadCreds identity %q, want the service's %q", id, svc.Identity())
	}
	e.Post(t, plane3test.JS(t, e.Agent(t, "alice", uidAlice)), "alice", "j-2", "after the reload")
	eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"j-1", "j-2"}) })
}
