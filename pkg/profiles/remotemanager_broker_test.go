package profiles_test

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// Issue 25 on the broker: a remote-manager credential (a remote managerd's supervisor, minted by
// authd) holds its own instance lease, its own presence and the manager plane's liveness, and is
// refused every other instance's lease, the renewal lease key, the delivery-admin lane and the
// register-manager rail.

// remoteManagerR1 is manager instance iidM1's supervisor of owner m1.
var remoteManagerR1 = profiles.Params{Owner: "m1", Actor: "manager_" + iidM1, InstanceID: iidM1}

func TestRemoteManagerBroker(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	ctx := testCtx(t)
	rm := principal{profiles.RemoteManager, remoteManagerR1}
	nc := connectAs(t, b, rm)
	managerBucket, presenceBucket := must(n.Bucket(space.Manager)), must(n.Bucket(space.Presence))

	t.Run("ok/creates, updates and reads its own instance lease", func(t *testing.T) {
		kv := kvFor(t, nc, managerBucket)
		key := must(space.ManagerLeaseKey(iidM1))
		rev, err := kv.Create(ctx, key, []byte(`{"holder":"m1.manager_serve_`+iidM1+`"}`))
		if err != nil {
			t.Fatalf("create %s: %v (broker errors %v)", key, err, b.AsyncErrors(nc))
		}
		if _, err := kv.Update(ctx, key, []byte(`{"holder":"m1.manager_serve_`+iidM1+`","pid":2}`), rev); err != nil {
			t.Fatalf("update %s: %v", key, err)
		}
		e, err := kv.Get(ctx, key)
		if err != nil || string(e.Value()) != `{"holder":"m1.manager_serve_`+iidM1+`","pid":2}` {
			t.Fatalf("get %s = %v, %v", key, e, err)
		}
	})
	t.Run("ok/publishes its own presence", func(t *testing.T) {
		kv := kvFor(t, nc, presenceBucket)
		key := must(space.PrincipalKey("m1", "manager_"+iidM1))
		if _, err := kv.Put(ctx, key, []byte(`{"state":"up"}`)); err != nil {
			t.Fatalf("put presence: %v (broker errors %v)", err, b.AsyncErrors(nc))
		}
		// It watches the roster rather than reading it with gets; an observer reads the row.
		if e, err := kvFor(t, connectAs(t, b, principal{profiles.Observer, none}), presenceBucket).Get(ctx, key); err != nil || string(e.Value()) != `{"state":"up"}` {
			t.Fatalf("get presence = %v, %v", e, err)
		}
	})
	t.Run("ok/serves the manager plane's liveness", func(t *testing.T) {
		serveLiveness(t, connectAs(t, b, rm), n.LiveManagerServe(), space.LivePlaneManager)
		prober := connectAs(t, b, principal{profiles.Agent, agentO1})
		probe := must(n.LiveManager("o1", "a1"))
		answers := subscribe(t, prober, must(n.LiveManagerReplies("o1", "a1")))
		if err := prober.PublishRequest(probe, probe+".reply.n1", nil); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, answers, probe+".reply.n1", `{"plane":"`+space.LivePlaneManager+`","responder":"bound"}`)
	})

	otherIID := "jjjjjjjjjjjjjjjjjjjjjjjjjj"
	for _, tt := range []struct{ name, op, subject string }{
		{"fail/pub another instance's lease", "pub", must(n.KV(space.Manager, must(space.ManagerLeaseKey(otherIID))))},
		{"fail/pub the renewal lease key", "pub", must(n.KV(space.Manager, space.ManagerRenewalKey))},
		{"fail/pub the delivery-admin lane", "pub", must(n.CtlDeliveryAdmin("m1", "manager_"+iidM1))},
		{"fail/sub the delivery-admin answers", "sub", must(n.CtlDeliveryAdminTree("m1", "manager_"+iidM1))},
		{"fail/pub the register-manager rail", "pub", must(n.RegisterManager("m1", "manager_"+iidM1, "nonce1234"))},
		{"fail/pub another principal's presence", "pub", must(n.KV(space.Presence, "m1.manager_"+otherIID))},
		{"fail/pub a chat post", "pub", must(n.Chat("m1", "manager_"+iidM1, "general"))},
		{"fail/pub a retire-lifecycle request", "pub", must(n.RetireLifecycle(space.RetireRail{TargetOwner: "m1", TargetActor: "a1", TargetUID: uid, CallerOwner: "m1", CallerActor: "manager_serve_" + iidM1, CallerUID: managerUID, Nonce: "nonce1234"}))},
		{"fail/pub a liveness probe as a peer", "pub", must(n.LiveManager("o1", "a1"))},
		{"fail/pub an auth bucket write", "pub", must(n.KV(space.Auth, "gate."+uid))},
	} {
		t.Run(tt.name, func(t *testing.T) { wantRefused(t, b, rm, tt.op, tt.subject) })
	}
}
