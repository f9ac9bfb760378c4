package profiles_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/profiles"
	spaceprov "github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests prove issue 10's profile fixes on the broker: the delivery daemon follows its own
// lease key and serves the liveness rail, the membership feed has its membership-rw credential,
// and observer and admin read the delivery lease key and nothing more of that bucket.

// provisionedSpace starts a broker and provisions every stream and bucket with pkg/provision on a
// provisioner credential, so the rows are proven against the configurations deliveryd meets.
func provisionedSpace(t *testing.T) (*testkit.Broker, space.Names) {
	t.Helper()
	b := testkit.StartBroker(t, brokerSpace)
	js := jsFor(t, connectAs(t, b, principal{profiles.Provisioner, none}))
	if _, err := spaceprov.Ensure(testCtx(t), js, names(t), spaceprov.Options{}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return b, names(t)
}

// rawUser connects a test-only data-account user with exactly the given rows, signed here with
// the data signing key: it plays a party no profile exists for yet (a liveness prober).
func rawUser(t *testing.T, b *testkit.Broker, pub, sub []string) *nats.Conn {
	t.Helper()
	sp := b.Space(brokerSpace)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pk, _ := kp.PublicKey()
	uc := jwt.NewUserClaims(pk)
	uc.IssuerAccount = sp.Trust.DataAccountPublicKey()
	uc.Expires = time.Now().Add(time.Hour).Unix()
	uc.Pub.Allow.Add(pub...)
	uc.Sub.Allow.Add(append([]string{"_INBOX_" + pk + ".>"}, sub...)...)
	skp, err := sp.Signing.DataSigning.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer skp.Wipe()
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

func kvFor(t *testing.T, nc *nats.Conn, bucket string) jetstream.KeyValue {
	t.Helper()
	kv, err := jsFor(t, nc).KeyValue(testCtx(t), bucket)
	if err != nil {
		t.Fatalf("bind %s: %v", bucket, err)
	}
	return kv
}

func wantViolation(t *testing.T, b *testkit.Broker, nc *nats.Conn, text string) {
	t.Helper()
	if err := b.WaitAsyncError(t, nc, text); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("broker error %v is not a permissions violation", err)
	}
}

// TestDeliveryFollowsItsLeaseKey is issue 10 item 8's first finding: the delivery profile could not
// watch lease.0. It now follows the key with a core subscription (see deliveryPerms for why not a
// watch consumer): a second instance's create, a competing create the stream refuses, and a delete
// each reach the subscriber, and the get shows which of them the stream kept.
func TestDeliveryFollowsItsLeaseKey(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	bucket := must(n.Bucket(space.Delivery))
	leaseSubj := must(n.KV(space.Delivery, space.DeliveryLeaseKey))
	me := connectAs(t, b, principal{profiles.Delivery, none})
	other := connectAs(t, b, principal{profiles.Delivery, none})
	feed := subscribe(t, me, leaseSubj)
	mine, theirs := kvFor(t, me, bucket), kvFor(t, other, bucket)
	ctx := testCtx(t)

	t.Run("ok/a create by another instance reaches the subscription", func(t *testing.T) {
		if _, err := theirs.Create(ctx, space.DeliveryLeaseKey, []byte(`{"holder":"other"}`)); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, feed, leaseSubj, `{"holder":"other"}`)
	})
	t.Run("ok/a refused create reaches it too, and the get shows the kept row", func(t *testing.T) {
		if _, err := mine.Create(ctx, space.DeliveryLeaseKey, []byte(`{"holder":"me"}`)); !errors.Is(err, jetstream.ErrKeyExists) {
			t.Fatalf("second create: err = %v, want key exists", err)
		}
		expectMsg(t, feed, leaseSubj, `{"holder":"me"}`)
		e, err := mine.Get(ctx, space.DeliveryLeaseKey)
		if err != nil || string(e.Value()) != `{"holder":"other"}` {
			t.Fatalf("get lease.0: %v %v", e, err)
		}
	})
	t.Run("ok/a delete reaches it as a DEL marker", func(t *testing.T) {
		if err := theirs.Delete(ctx, space.DeliveryLeaseKey); err != nil {
			t.Fatal(err)
		}
		m, err := feed.NextMsg(5 * time.Second)
		if err != nil || m.Header.Get("KV-Operation") != "DEL" {
			t.Fatalf("delete: %v %v", m, err)
		}
	})
	if errs := b.AsyncErrors(me); len(errs) != 0 {
		t.Fatalf("broker errors: %v", errs)
	}

	for _, tt := range []struct {
		name, op, subject string
	}{
		{"fail/delivery subscribes to the whole delivery bucket", "sub", must(n.KVAll(space.Delivery))},
		{"fail/delivery subscribes to another bucket's puts", "sub", must(n.KVAll(space.Presence))},
		{"fail/delivery creates a watch consumer on the delivery bucket", "pub", must(space.ConsumerCreateNamed(must(n.BucketStream(space.Delivery)), "w1"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := connectAs(t, b, principal{profiles.Delivery, none})
			subject := tt.subject
			if tt.op == "sub" {
				if _, err := nc.SubscribeSync(subject); err != nil {
					t.Fatal(err)
				}
				wantViolation(t, b, nc, testkit.SubscribeViolation(subject))
				return
			}
			subject = strings.TrimSuffix(subject, ">") + leaseSubj
			if err := nc.PublishRequest(subject, nc.NewRespInbox(), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, b, nc, testkit.PublishViolation(subject))
		})
	}
}

// TestDeliveryServesLiveness is the second finding: the delivery profile now serves the liveness
// rail upstream's daemon answers, in its queue group, and replies on the .reply.> leaf; it still
// cannot publish a probe itself.
func TestDeliveryServesLiveness(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	probe := must(n.LiveDelivery("o1", "a1"))
	prober := rawUser(t, b, []string{probe}, []string{probe + ".reply.>"})
	dc := connectAs(t, b, principal{profiles.Delivery, none})
	if _, err := dc.QueueSubscribe(n.LiveDeliveryServe(), "live.delivery", func(m *nats.Msg) {
		_ = dc.Publish(m.Subject+".reply.n1", []byte(`{"plane":"delivery","responder":"bound"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := dc.Flush(); err != nil {
		t.Fatal(err)
	}
	answers := subscribe(t, prober, probe+".reply.>")
	if err := prober.Publish(probe, nil); err != nil {
		t.Fatal(err)
	}
	expectMsg(t, answers, probe+".reply.n1", `{"plane":"delivery","responder":"bound"}`)
	if errs := append(b.AsyncErrors(dc), b.AsyncErrors(prober)...); len(errs) != 0 {
		t.Fatalf("broker errors: %v", errs)
	}

	t.Run("fail/delivery publishes a probe", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.Delivery, none})
		if err := nc.Publish(probe, nil); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, b, nc, testkit.PublishViolation(probe))
	})
}

// TestMembershipRW is the third finding: the membership feed's credential reads the members
// registry (gets and a key listing), reads and writes the membership bucket, and nothing else.
func TestMembershipRW(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	ctx := testCtx(t)
	members, membership := must(n.Bucket(space.Members)), must(n.Bucket(space.Membership))
	memberKey := must(space.MemberKey("general", "o1", "a1", uid))
	if _, err := kvFor(t, connectAs(t, b, principal{profiles.Delivery, none}), members).Put(ctx, memberKey, []byte(`{"state":"durable-active"}`)); err != nil {
		t.Fatalf("delivery writes a member row: %v", err)
	}
	rw := connectAs(t, b, principal{profiles.MembershipRW, none})

	t.Run("ok/reads and lists the members registry", func(t *testing.T) {
		kv := kvFor(t, rw, members)
		e, err := kv.Get(ctx, memberKey)
		if err != nil || string(e.Value()) != `{"state":"durable-active"}` {
			t.Fatalf("get: %v %v", e, err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) != 1 || keys[0] != memberKey {
			t.Fatalf("keys: %v %v", keys, err)
		}
	})
	t.Run("ok/writes, reads and deletes a membership feed row", func(t *testing.T) {
		kv := kvFor(t, rw, membership)
		if _, err := kv.Put(ctx, "o1.a1", []byte(`["general"]`)); err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "o1.a1")
		if err != nil || string(e.Value()) != `["general"]` {
			t.Fatalf("get: %v %v", e, err)
		}
		if err := kv.Delete(ctx, "o1.a1"); err != nil {
			t.Fatal(err)
		}
	})
	if errs := b.AsyncErrors(rw); len(errs) != 0 {
		t.Fatalf("broker errors: %v", errs)
	}
	for _, tt := range []struct{ name, subject string }{
		{"fail/membership-rw writes the members registry", must(n.KV(space.Members, memberKey))},
		{"fail/membership-rw reads the ACL registry", must(space.StreamInfo(must(n.BucketStream(space.ACL))))},
		{"fail/membership-rw posts to chat", must(n.Chat("o1", "a1", "general"))},
		{"fail/membership-rw writes the delivery lease", must(n.KV(space.Delivery, space.DeliveryLeaseKey))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := connectAs(t, b, principal{profiles.MembershipRW, none})
			if err := nc.Publish(tt.subject, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, b, nc, testkit.PublishViolation(tt.subject))
		})
	}
}

// TestReadersGetTheDeliveryLease is the fourth finding: observer and admin read lease.0 with a
// KV get, so a dashboard can show whether delivery is ready, and hold no other read of the bucket.
func TestReadersGetTheDeliveryLease(t *testing.T) {
	b, n := provisionedSpace(t)
	must := mustOf(t)
	ctx := testCtx(t)
	bucket := must(n.Bucket(space.Delivery))
	stream := must(n.BucketStream(space.Delivery))
	row := `{"holder":"local.U1","incarnation":"i1","since":1,"ready":true}`
	if _, err := kvFor(t, connectAs(t, b, principal{profiles.Delivery, none}), bucket).Create(ctx, space.DeliveryLeaseKey, []byte(row)); err != nil {
		t.Fatal(err)
	}
	readers := []principal{
		{profiles.Observer, none},
		{profiles.Admin, profiles.Params{Owner: "u_viewer", Actor: "web"}},
	}
	for _, p := range readers {
		t.Run("ok/"+string(p.profile)+" gets lease.0", func(t *testing.T) {
			nc := connectAs(t, b, p)
			e, err := kvFor(t, nc, bucket).Get(ctx, space.DeliveryLeaseKey)
			if err != nil || string(e.Value()) != row {
				t.Fatalf("get lease.0: %v %v (broker errors %v)", e, err, b.AsyncErrors(nc))
			}
		})
		for _, tt := range []struct{ name, op, subject string }{
			{"another key by direct get", "pub", must(space.DirectGet(stream)) + "." + must(n.KV(space.Delivery, "lease.1"))},
			{"the bucket by leader-served get", "pub", must(space.StreamMsgGet(stream))},
			{"a write of lease.0", "pub", must(n.KV(space.Delivery, space.DeliveryLeaseKey))},
			{"a follow of the bucket", "sub", must(n.KVAll(space.Delivery))},
		} {
			t.Run("fail/"+string(p.profile)+" "+tt.name, func(t *testing.T) {
				nc := connectAs(t, b, p)
				if tt.op == "sub" {
					if _, err := nc.SubscribeSync(tt.subject); err != nil {
						t.Fatal(err)
					}
					wantViolation(t, b, nc, testkit.SubscribeViolation(tt.subject))
					return
				}
				if err := nc.PublishRequest(tt.subject, nc.NewRespInbox(), []byte(`{"last_by_subj":"x"}`)); err != nil {
					t.Fatal(err)
				}
				wantViolation(t, b, nc, testkit.PublishViolation(tt.subject))
			})
		}
	}
}
