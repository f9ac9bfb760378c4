package profiles_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests prove issue 23 item 3 on the broker: authd's auth-plane credential writes and reads
// exactly the lifecycle keys and serves the two auth rails; a retirement requester and a
// supervisor each call their rail as themselves and nothing else.

const nonce = "nonce1234"

// msgGet reads the last message of subject from stream with the leader-served STREAM.MSG.GET, as
// authd's row executors read, and returns its body and sequence (the KV revision).
func msgGet(t *testing.T, b *testkit.Broker, nc *nats.Conn, stream, subject string) ([]byte, uint64) {
	t.Helper()
	api, err := space.StreamMsgGet(stream)
	if err != nil {
		t.Fatal(err)
	}
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(api, req, 5*time.Second)
	if err != nil {
		t.Fatalf("STREAM.MSG.GET %s %s: %v (broker errors %v)", stream, subject, err, b.AsyncErrors(nc))
	}
	var resp struct {
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error != nil || resp.Message == nil || resp.Message.Subject != subject {
		t.Fatalf("STREAM.MSG.GET %s %s answered %.300s (%v)", stream, subject, m.Data, err)
	}
	return resp.Message.Data, resp.Message.Seq
}

// TestAuthPlaneLifecycleRows: on a space provisioned by pkg/provision, an auth-plane credential
// creates and updates (by expected revision) a key of every lifecycle family in both buckets and
// reads each back with STREAM.MSG.GET, reads a manager lease row the same way, and the broker
// refuses it every other key of each bucket, a write to the manager bucket, every consumer create,
// a rail request, and a rail subscription outside the queue group.
func TestAuthPlaneLifecycleRows(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	ctx := testCtx(t)
	const iid = iidM1
	opID := must(lifecycle.ManagedRetirementOpID(uid))
	authBucket, recordsBucket, managerBucket := must(n.Bucket(space.Auth)), must(n.Bucket(space.Records)), must(n.Bucket(space.Manager))
	authStream, recordsStream, managerStream := must(n.BucketStream(space.Auth)), must(n.BucketStream(space.Records)), must(n.BucketStream(space.Manager))

	// The manager's instance lease, written as managerd writes it (supervisor credential).
	leaseKey := must(space.ManagerLeaseKey(iid))
	if _, err := kvFor(t, connectAs(t, b, principal{profiles.Supervisor, supervisorM1}), managerBucket).Create(ctx, leaseKey, []byte(`{"holder":"m1.s1"}`)); err != nil {
		t.Fatal(err)
	}

	ap := connectAs(t, b, principal{profiles.AuthPlane, none})
	for _, tc := range []struct {
		bucket, stream, key string
	}{
		{authBucket, authStream, must(lifecycle.GateKey(uid))},
		{authBucket, authStream, must(lifecycle.StageKey(opID))},
		{authBucket, authStream, must(lifecycle.EndpointGateKey(lifecycle.ManagerEndpoint, iid))},
		{recordsBucket, recordsStream, must(lifecycle.HeadKey("o1", "a1"))},
		{recordsBucket, recordsStream, must(lifecycle.UIDKey(uid))},
		{recordsBucket, recordsStream, must(lifecycle.FrontierKey(uid))},
		{recordsBucket, recordsStream, must(lifecycle.SpecKey(lifecycle.ManagerEndpoint, iid))},
		// Seed 002's service endpoint rows (issue 24), one of each family.
		{authBucket, authStream, must(lifecycle.ServiceNameKey(svcEndpoint))},
		{authBucket, authStream, must(lifecycle.ServiceLedgerKey(svcEndpoint, svcIID))},
		{authBucket, authStream, must(lifecycle.ServiceProposalKey(svcEndpoint, svcIID))},
		{authBucket, authStream, must(lifecycle.ServiceRootKey(svcEndpoint, svcIID))},
		{authBucket, authStream, must(lifecycle.ServiceArtifactKey("sha256:" + strings.Repeat("ab", 32)))},
	} {
		family := tc.key[:strings.IndexByte(tc.key, '.')]
		if family == "sep" {
			family += "-" + strings.Split(tc.key, ".")[1]
		}
		t.Run("ok/writes-and-reads-"+family, func(t *testing.T) {
			kv := kvFor(t, ap, tc.bucket)
			rev, err := kv.Create(ctx, tc.key, []byte(`{"v":1,"n":1}`))
			if err != nil {
				t.Fatalf("create %s: %v (broker errors %v)", tc.key, err, b.AsyncErrors(ap))
			}
			rev2, err := kv.Update(ctx, tc.key, []byte(`{"v":1,"n":2}`), rev)
			if err != nil {
				t.Fatalf("update %s: %v", tc.key, err)
			}
			// A stale expected revision is the stream's refusal, not the broker's.
			if _, err := kv.Update(ctx, tc.key, []byte(`{"v":1,"n":3}`), rev); err == nil {
				t.Fatalf("update %s at stale revision %d succeeded", tc.key, rev)
			}
			data, seq := msgGet(t, b, ap, tc.stream, "$KV."+tc.bucket+"."+tc.key)
			if string(data) != `{"v":1,"n":2}` || seq != rev2 {
				t.Fatalf("read %s = %s at %d, want n=2 at %d", tc.key, data, seq, rev2)
			}
			if errs := b.AsyncErrors(ap); len(errs) != 0 {
				t.Fatalf("broker errors: %v", errs)
			}
		})
	}

	t.Run("ok/reads-manager-lease", func(t *testing.T) {
		if st, err := jsFor(t, ap).Stream(ctx, managerStream); err != nil || st.CachedInfo().Config.Name != managerStream {
			t.Fatalf("manager stream info: %v", err)
		}
		data, _ := msgGet(t, b, ap, managerStream, must(n.KV(space.Manager, leaseKey)))
		if string(data) != `{"holder":"m1.s1"}` {
			t.Fatalf("lease row = %s", data)
		}
		if errs := b.AsyncErrors(ap); len(errs) != 0 {
			t.Fatalf("broker errors: %v", errs)
		}
	})

	t.Run("ok/serves-rails-in-its-queue-group", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.AuthPlane, none})
		for _, subj := range []string{n.RetireLifecycleServe(), n.RegisterManagerServe()} {
			if _, err := nc.QueueSubscribeSync(subj, space.AuthRailQueue); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("broker refused the rail subscriptions: %v", errs)
		}
	})

	retire := must(n.RetireLifecycle(space.RetireRail{TargetOwner: "m1", TargetActor: "a1", TargetUID: uid,
		CallerOwner: "m1", CallerActor: "manager_serve_" + iid, CallerUID: managerUID, Nonce: nonce}))
	for _, tc := range []struct {
		name, subject string
	}{
		{"fail/put-auth-other-family", must(n.KV(space.Auth, "cred.x"))},
		{"fail/put-auth-gate-extra-token", must(n.KV(space.Auth, "gate."+uid+".x"))},
		{"fail/put-auth-epgate-short", must(n.KV(space.Auth, "epgate.manager"))},
		{"fail/put-auth-bare-gate", must(n.KV(space.Auth, "gate"))},
		{"fail/put-auth-sep-other-family", must(n.KV(space.Auth, "sep.other."+svcTok))},
		{"fail/put-auth-sep-name-extra-token", must(n.KV(space.Auth, "sep.name."+svcTok+"."+svcIID))},
		{"fail/put-auth-sep-root-short", must(n.KV(space.Auth, "sep.root."+svcTok))},
		{"fail/put-auth-sep-bare", must(n.KV(space.Auth, "sep"))},
		{"fail/put-records-other-key", must(n.KV(space.Records, "other"))},
		{"fail/put-records-head-short", must(n.KV(space.Records, "lifecycle.o1"))},
		{"fail/put-records-uid-extra-token", must(n.KV(space.Records, "uid."+uid+".x"))},
		{"fail/put-manager-lease", must(n.KV(space.Manager, leaseKey))},
		{"fail/put-presence", must(n.KV(space.Presence, "o1.a1"))},
		{"fail/auth-consumer-create", must(space.ConsumerCreate(authStream))},
		{"fail/auth-consumer-create-named", "$JS.API.CONSUMER.CREATE." + authStream + ".w.$KV." + authBucket + ".>"},
		{"fail/records-consumer-create", must(space.ConsumerCreate(recordsStream))},
		{"fail/records-durable-create", "$JS.API.CONSUMER.DURABLE.CREATE." + recordsStream + ".w"},
		{"fail/manager-consumer-create", must(space.ConsumerCreate(managerStream))},
		{"fail/direct-get-gate", must(space.DirectGetSubject(authStream, must(n.KV(space.Auth, must(lifecycle.GateKey(uid))))))},
		{"fail/records-direct-get", must(space.DirectGet(recordsStream))},
		{"fail/manager-direct-get", must(space.DirectGet(managerStream))},
		{"fail/records-purge", "$JS.API.STREAM.PURGE." + recordsStream},
		{"fail/records-msg-delete", "$JS.API.STREAM.MSG.DELETE." + recordsStream},
		{"fail/retire-rail-request", retire},
		{"fail/register-rail-request", must(n.RegisterManager("m1", "s1", nonce))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := connectAs(t, b, principal{profiles.AuthPlane, none})
			if err := nc.Publish(tc.subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, b, nc, testkit.PublishViolation(tc.subject))
		})
	}
	for _, tc := range []struct {
		name, subject, queue string
	}{
		{"fail/serve-retire-rail-without-queue", n.RetireLifecycleServe(), ""},
		{"fail/serve-register-rail-without-queue", n.RegisterManagerServe(), ""},
		{"fail/serve-retire-rail-other-queue", n.RetireLifecycleServe(), "other"},
		{"fail/hear-retire-replies", n.RetireLifecycleReplyAny(), ""},
		{"fail/sub-records", must(n.KVAll(space.Records)), ""},
		{"fail/sub-gate-key", must(n.KV(space.Auth, must(lifecycle.GateKey(uid)))), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := connectAs(t, b, principal{profiles.AuthPlane, none})
			if _, err := nc.QueueSubscribeSync(tc.subject, tc.queue); err != nil {
				t.Fatal(err)
			}
			want := testkit.SubscribeViolation(tc.subject)
			if tc.queue != "" {
				want += " using queue " + `"` + tc.queue + `"`
			}
			wantViolation(t, b, nc, want)
		})
	}
}

// serveRail answers every request nc receives on serve (in the rails' queue group) on
// <request>.reply, echoing the request subject, as authd answers.
func serveRail(t *testing.T, nc *nats.Conn, serve string) {
	t.Helper()
	serveQueue(t, nc, serve, space.AuthRailQueue, func(m *nats.Msg) (string, string, bool) {
		return space.RailReply(m.Subject), "answer to " + m.Subject, true
	})
}

// TestAuthRails: a retirement requester asks for its one target's retirement and a supervisor
// registers as itself; authd (auth-plane) receives both in its queue group and answers on
// <request>.reply, which each caller hears. The broker refuses a requester any other target or
// caller, a supervisor any other principal, either of them serving a rail or forging an answer,
// and every other profile the rails.
func TestAuthRails(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	authd := connectAs(t, b, principal{profiles.AuthPlane, none})
	serveRail(t, authd, n.RetireLifecycleServe())
	serveRail(t, authd, n.RegisterManagerServe())

	own := space.RetireRail{TargetOwner: "m1", TargetActor: "a1", TargetUID: uid,
		CallerOwner: "m1", CallerActor: "manager_serve_" + iidM1, CallerUID: managerUID, Nonce: nonce}
	with := func(f func(*space.RetireRail)) string {
		r := own
		f(&r)
		return must(n.RetireLifecycle(r))
	}
	ownRetire := must(n.RetireLifecycle(own))
	ownRegister := must(n.RegisterManager("m1", "s1", nonce))

	for _, tc := range []struct {
		name    string
		who     principal
		grant   string
		request string
	}{
		{"ok/retirement requester asks for its target", principal{profiles.RetirementRequester, retirementRequesterM1},
			must(n.RetireLifecycleCaller(own)), ownRetire},
		{"ok/supervisor registers as itself", principal{profiles.Supervisor, supervisorM1},
			must(n.RegisterManagerCaller("m1", "s1")), ownRegister},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := connectAs(t, b, tc.who)
			answers := subscribe(t, nc, space.RailReplyGrant(tc.grant))
			if err := nc.Publish(tc.request, []byte(`{"v":1}`)); err != nil {
				t.Fatal(err)
			}
			expectMsg(t, answers, space.RailReply(tc.request), "answer to "+tc.request)
			if errs := append(b.AsyncErrors(nc), b.AsyncErrors(authd)...); len(errs) != 0 {
				t.Fatalf("broker errors: %v", errs)
			}
		})
	}

	requester := principal{profiles.RetirementRequester, retirementRequesterM1}
	supervisor := principal{profiles.Supervisor, supervisorM1}
	agent := principal{profiles.Agent, agentO1}
	for _, tt := range []struct {
		name, op, subject string
		who               principal
	}{
		{"fail/requester asks for another target's actor", "pub", with(func(r *space.RetireRail) { r.TargetActor = "a2" }), requester},
		{"fail/requester asks for another target uid", "pub", with(func(r *space.RetireRail) { r.TargetUID = managerUID }), requester},
		{"fail/requester asks for another owner's target", "pub", with(func(r *space.RetireRail) { r.TargetOwner = "o2" }), requester},
		{"fail/requester asks as another serve principal", "pub", with(func(r *space.RetireRail) { r.CallerActor = "manager_serve_" + managerUID }), requester},
		{"fail/requester asks as another caller lifecycle", "pub", with(func(r *space.RetireRail) { r.CallerUID = uid }), requester},
		{"fail/requester forges authd's answer", "pub", space.RailReply(ownRetire), requester},
		{"fail/requester registers a manager", "pub", must(n.RegisterManager("m1", "manager_serve_"+iidM1, nonce)), requester},
		{"fail/requester posts to chat", "pub", must(n.Chat("m1", "manager_serve_"+iidM1, "general")), requester},
		{"fail/requester serves the retire rail", "sub", n.RetireLifecycleServe(), requester},
		{"fail/requester hears another target's answers", "sub", space.RailReplyGrant(must(n.RetireLifecycleCaller(space.RetireRail{TargetOwner: "m1", TargetActor: "a2", TargetUID: uid,
			CallerOwner: "m1", CallerActor: "manager_serve_" + iidM1, CallerUID: managerUID}))), requester},
		{"fail/requester hears every retire answer", "sub", n.RetireLifecycleReplyAny(), requester},
		{"fail/supervisor registers as another principal", "pub", must(n.RegisterManager("o1", "a1", nonce)), supervisor},
		{"fail/supervisor registers as another actor of its owner", "pub", must(n.RegisterManager("m1", "s2", nonce)), supervisor},
		{"fail/supervisor forges authd's answer", "pub", space.RailReply(ownRegister), supervisor},
		{"fail/supervisor asks for a retirement", "pub", ownRetire, supervisor},
		{"fail/supervisor serves the register rail", "sub", n.RegisterManagerServe(), supervisor},
		{"fail/supervisor hears another principal's answers", "sub", space.RailReplyGrant(must(n.RegisterManagerCaller("o1", "a1"))), supervisor},
		{"fail/agent registers a manager as itself", "pub", must(n.RegisterManager("o1", "a1", nonce)), agent},
		{"fail/agent asks for a retirement", "pub", ownRetire, agent},
		{"fail/delivery serves the retire rail", "sub", n.RetireLifecycleServe(), principal{profiles.Delivery, none}},
		{"fail/observer hears rail answers", "sub", n.RegisterManagerReplyAny(), principal{profiles.Observer, none}},
	} {
		t.Run(tt.name, func(t *testing.T) { wantRefused(t, b, tt.who, tt.op, tt.subject) })
	}
}
