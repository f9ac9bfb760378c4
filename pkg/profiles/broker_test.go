package profiles_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests are the proof that the profile matrix is real: every credential is minted on an
// embedded broker in operator mode, used over TCP loopback, and each refusal is asserted from
// the broker's own "Permissions Violation" error, not from anything the client decided.

const brokerSpace = "alpha"

const (
	uid = "abcdefghijklmnopqrstuvwxyz"
	// iidM1 and managerUID are a manager instance id and that manager's own lifecycle uid.
	iidM1      = "iiiiiiiiiiiiiiiiiiiiiiiiii"
	managerUID = "mmmmmmmmmmmmmmmmmmmmmmmmmm"
)

var (
	agentO1 = profiles.Params{Owner: "o1", Actor: "a1", LifecycleUID: uid,
		AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}, Subscribe: []string{"general"}}
	agentO2 = profiles.Params{Owner: "o2", Actor: "a2", LifecycleUID: uid,
		AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}}
	supervisorM1 = profiles.Params{Owner: "m1", Actor: "s1"}
	// retirementRequesterM1 is manager instance iidM1's serve principal of owner m1, asking to
	// retire m1's lifecycle m1.a1 at uid.
	retirementRequesterM1 = profiles.Params{Owner: "m1", Actor: "manager_serve_" + iidM1, LifecycleUID: managerUID,
		Target: &profiles.RetirementTarget{Owner: "m1", Actor: "a1", LifecycleUID: uid}}
	// deprovisionerO1 is pinned to o1.a1 at uid and its membership row on general.
	deprovisionerO1 = profiles.Params{Owner: "o1", Actor: "a1", LifecycleUID: uid, MemberChannels: []string{"general"}}
	none            = profiles.Params{}
)

type principal struct {
	profile profiles.Name
	params  profiles.Params
}

func names(t *testing.T) space.Names {
	t.Helper()
	n, err := space.NewNames(brokerSpace)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mustOf returns a function that unwraps a subject builder's result, failing t on error.
func mustOf(t *testing.T) func(string, error) string {
	return func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// connectAs mints a user of p on sp and connects it.
func connectAs(t *testing.T, b *testkit.Broker, p principal) *nats.Conn {
	t.Helper()
	tok, kp := b.Space(brokerSpace).MintUser(t, p.profile, p.params, 0)
	nc, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatalf("%s could not connect: %v", p.profile, err)
	}
	return nc
}

// TestBrokerAllows shows one permitted flow per profile: the receiver subscribes to filter, the
// sender publishes to subject, the message arrives, and neither connection gets an error.
func TestBrokerAllows(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	tests := []struct {
		name     string
		sender   principal
		subject  string
		receiver principal
		filter   string
	}{
		{"ok/agent posts to its own chat subject and another agent reads the channel",
			principal{profiles.Agent, agentO1}, must(n.Chat("o1", "a1", "general")),
			principal{profiles.Agent, agentO2}, must(n.ChatRead("general"))},
		{"ok/agent reads its own post on the channel it joined",
			principal{profiles.Agent, agentO1}, must(n.Chat("o1", "a1", "general")),
			principal{profiles.Agent, agentO1}, must(n.ChatRead("general"))},
		{"ok/delivery subscribes to ctl.delivery.*.* and receives an agent's request",
			principal{profiles.Agent, agentO1}, must(n.CtlDelivery("o1", "a1")),
			principal{profiles.Delivery, none}, n.CtlDeliveryServe()},
		{"ok/delivery replies on the agent's ctl reply rail",
			principal{profiles.Delivery, none}, must(n.CtlDeliveryReply("o1", "a1", "nonce1234")),
			principal{profiles.Agent, agentO1}, must(n.CtlDeliveryTree("o1", "a1"))},
		{"ok/supervisor publishes to its delivery-admin subject and delivery receives it",
			principal{profiles.Supervisor, supervisorM1}, must(n.CtlDeliveryAdmin("m1", "s1")),
			principal{profiles.Delivery, none}, n.CtlDeliveryAdminServe()},
		{"ok/delivery replies on the supervisor's admin reply rail",
			principal{profiles.Delivery, none}, must(n.CtlDeliveryAdminReply("m1", "s1", "nonce1234")),
			principal{profiles.Supervisor, supervisorM1}, must(n.CtlDeliveryAdminTree("m1", "s1"))},
		// authd's plane credential is principal local.authd: it asks deliveryd's admin lane
		// (for lifecycleMemberships; deliveryd refuses it every other op) as itself only.
		{"ok/auth-plane publishes its own delivery-admin subject (local.authd) and delivery receives it",
			principal{profiles.AuthPlane, none}, must(n.CtlDeliveryAdmin(profiles.AuthPlaneOwner, profiles.AuthPlaneActor)),
			principal{profiles.Delivery, none}, n.CtlDeliveryAdminServe()},
		{"ok/delivery replies on auth-plane's admin reply lane",
			principal{profiles.Delivery, none}, must(n.CtlDeliveryAdminReply(profiles.AuthPlaneOwner, profiles.AuthPlaneActor, "nonce1234")),
			principal{profiles.AuthPlane, none}, must(n.CtlDeliveryAdmin(profiles.AuthPlaneOwner, profiles.AuthPlaneActor)) + ".reply.*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := connectAs(t, b, tt.receiver)
			sub, err := rc.SubscribeSync(tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if err := rc.Flush(); err != nil {
				t.Fatal(err)
			}
			// A separate connection even for the same profile: delivery goes through the broker.
			sc := connectAs(t, b, tt.sender)
			if err := sc.Publish(tt.subject, []byte(tt.name)); err != nil {
				t.Fatal(err)
			}
			if err := sc.Flush(); err != nil {
				t.Fatal(err)
			}
			m, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("receiver got nothing on %s: %v (receiver errors %v, sender errors %v)",
					tt.filter, err, b.AsyncErrors(rc), b.AsyncErrors(sc))
			}
			if m.Subject != tt.subject || string(m.Data) != tt.name {
				t.Fatalf("got %s %q, want %s %q", m.Subject, m.Data, tt.subject, tt.name)
			}
			if errs := append(b.AsyncErrors(rc), b.AsyncErrors(sc)...); len(errs) != 0 {
				t.Fatalf("unexpected broker errors: %v", errs)
			}
		})
	}
}

// TestBrokerRefuses shows the broker refusing what each profile does not grant, including that
// a probe can do nothing at all.
func TestBrokerRefuses(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	const pub, sub = "publish", "subscribe"
	tests := []struct {
		name    string
		user    principal
		op      string
		subject string
	}{
		{"fail/agent posts as another principal", principal{profiles.Agent, agentO1}, pub, must(n.Chat("o2", "a2", "general"))},
		{"fail/agent posts to a channel outside AllowPublish", principal{profiles.Agent, agentO1}, pub, must(n.Chat("o1", "a1", "secret"))},
		{"fail/agent reads a channel outside AllowSubscribe", principal{profiles.Agent, agentO1}, sub, must(n.ChatRead("secret"))},
		{"fail/agent reads all chat", principal{profiles.Agent, agentO1}, sub, n.ChatAll()},
		{"fail/agent reads another principal's ctl rail", principal{profiles.Agent, agentO1}, sub, must(n.CtlDeliveryTree("o2", "a2"))},
		{"fail/agent creates a consumer on the DM stream", principal{profiles.Agent, agentO1}, pub, must(space.ConsumerCreate(n.DMStream()))},
		{"fail/agent serves the delivery rail", principal{profiles.Agent, agentO1}, sub, n.CtlDeliveryServe()},
		// The gap marker's door (Cotal-Delivery-Gap, deliveryd's reader): only delivery publishes
		// into DLV, so no agent can forge a marker (or a frame) into any member's DLV subject.
		{"fail/agent publishes into another member's dlv subject (a forged gap marker)", principal{profiles.Agent, agentO1}, pub, must(n.Dlv("o2", "a2", uid))},
		{"fail/agent publishes into its own dlv subject", principal{profiles.Agent, agentO1}, pub, must(n.Dlv("o1", "a1", uid))},
		{"fail/delivery posts to chat", principal{profiles.Delivery, none}, pub, must(n.Chat("o1", "a1", "general"))},
		{"fail/delivery subscribes to chat", principal{profiles.Delivery, none}, sub, n.ChatAll()},
		{"fail/delivery publishes a request on the ctl rail", principal{profiles.Delivery, none}, pub, must(n.CtlDelivery("o1", "a1"))},
		{"fail/agent publishes on its delivery-admin rail", principal{profiles.Agent, agentO1}, pub, must(n.CtlDeliveryAdmin("o1", "a1"))},
		{"fail/agent subscribes to its delivery-admin reply lane", principal{profiles.Agent, agentO1}, sub, must(n.CtlDeliveryAdminTree("o1", "a1"))},
		{"fail/delivery publishes a request on the delivery-admin rail", principal{profiles.Delivery, none}, pub, must(n.CtlDeliveryAdmin("o1", "a1"))},
		{"fail/supervisor uses the plain ctl.delivery rail", principal{profiles.Supervisor, supervisorM1}, pub, must(n.CtlDelivery("m1", "s1"))},
		{"fail/supervisor calls delivery-admin as another principal", principal{profiles.Supervisor, supervisorM1}, pub, must(n.CtlDeliveryAdmin("o1", "a1"))},
		{"fail/supervisor serves the delivery-admin rail", principal{profiles.Supervisor, supervisorM1}, sub, n.CtlDeliveryAdminServe()},
		{"fail/auth-plane calls delivery-admin as another principal", principal{profiles.AuthPlane, none}, pub, must(n.CtlDeliveryAdmin("local", "manager"))},
		{"fail/auth-plane calls delivery-admin as another owner's authd", principal{profiles.AuthPlane, none}, pub, must(n.CtlDeliveryAdmin("u_abcdefghijklmnopqrstuvwxyz", "authd"))},
		{"fail/auth-plane uses the plain ctl.delivery rail", principal{profiles.AuthPlane, none}, pub, must(n.CtlDelivery("local", "authd"))},
		{"fail/auth-plane answers on its own admin reply lane", principal{profiles.AuthPlane, none}, pub, must(n.CtlDeliveryAdminReply("local", "authd", "nonce1234"))},
		{"fail/auth-plane hears its own admin request subject", principal{profiles.AuthPlane, none}, sub, must(n.CtlDeliveryAdmin("local", "authd"))},
		{"fail/auth-plane subscribes to its whole admin subtree", principal{profiles.AuthPlane, none}, sub, must(n.CtlDeliveryAdminTree("local", "authd"))},
		{"fail/auth-plane hears another principal's admin replies", principal{profiles.AuthPlane, none}, sub, must(n.CtlDeliveryAdminReply("local", "manager", "nonce1234"))},
		{"fail/auth-plane serves the delivery-admin rail", principal{profiles.AuthPlane, none}, sub, n.CtlDeliveryAdminServe()},
		{"fail/deprovisioner reads another lifecycle's dm_ consumer", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.ConsumerInfo(n.DMStream(), must(n.DMConsumer("o2", "a2", uid))))},
		{"fail/deprovisioner deletes another lifecycle's dlv_ consumer", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.ConsumerDelete(n.DLVStream(), must(n.DlvConsumer("o2", "a2", uid))))},
		{"fail/deprovisioner deletes its own lifecycle's consumer under another uid", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.ConsumerDelete(n.DMStream(), must(n.DMConsumer("o1", "a1", managerUID))))},
		{"fail/deprovisioner deletes a role queue", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.ConsumerDelete(n.TaskStream(), must(n.SvcConsumer("reviewer"))))},
		{"fail/deprovisioner reads another lifecycle's ACL key", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.DirectGet(must(n.BucketStream(space.ACL)))) + "." + must(n.KV(space.ACL, must(space.ACLKey("o2", "a2", uid))))},
		{"fail/deprovisioner purges another lifecycle's ACL key", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(n.KV(space.ACL, must(space.ACLKey("o2", "a2", uid))))},
		{"fail/deprovisioner reads the ACL bucket by the leader-served get", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.StreamMsgGet(must(n.BucketStream(space.ACL))))},
		{"fail/deprovisioner purges another lifecycle's members key", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(n.KV(space.Members, must(space.MemberKey("general", "o2", "a2", uid))))},
		{"fail/deprovisioner reads another lifecycle's members key", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(space.DirectGet(must(n.BucketStream(space.Members)))) + "." + must(n.KV(space.Members, must(space.MemberKey("general", "o2", "a2", uid))))},
		{"fail/deprovisioner purges its members key on a channel it was not given", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(n.KV(space.Members, must(space.MemberKey("secret", "o1", "a1", uid))))},
		{"fail/deprovisioner writes the channels bucket", principal{profiles.Deprovisioner, deprovisionerO1}, pub,
			must(n.KV(space.Channels, "general"))},
		{"fail/probe publishes to chat", principal{profiles.Probe, none}, pub, must(n.Chat("o1", "a1", "general"))},
		{"fail/probe publishes to the JetStream API", principal{profiles.Probe, none}, pub, space.JSAPIInfo},
		{"fail/probe subscribes to chat", principal{profiles.Probe, none}, sub, n.ChatAll()},
		{"fail/probe subscribes to everything", principal{profiles.Probe, none}, sub, ">"},
		{"fail/probe subscribes to the shared inbox", principal{profiles.Probe, none}, sub, "_INBOX.>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc := connectAs(t, b, tt.user)
			var want string
			switch tt.op {
			case pub:
				if err := nc.Publish(tt.subject, []byte("x")); err != nil {
					t.Fatal(err)
				}
				want = testkit.PublishViolation(tt.subject)
			case sub:
				if _, err := nc.SubscribeSync(tt.subject); err != nil {
					t.Fatal(err)
				}
				want = testkit.SubscribeViolation(tt.subject)
			}
			err := b.WaitAsyncError(t, nc, want)
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "Permissions Violation") {
				t.Fatalf("broker error %v is not a permissions violation", err)
			}
		})
	}
}

// TestBrokerAuthAccount covers the two AUTH-account profiles.
//
// refusedUnanswered reports whether the connect named name, which failed on the client with
// err, was refused by the broker: a connect whose callout nobody answers is refused at the
// broker's 2 s auth timeout, and its RTT PING can reach the client before the refusal; the
// broker's record then says why it closed the connection (testkit.RefusedOnRecord).
func refusedUnanswered(t *testing.T, b *testkit.Broker, name string, err error) bool {
	t.Helper()
	return errors.Is(testkit.RefusedOnRecord(t, b.Server, name, err), nats.ErrAuthorization)
}

// In operator mode, a user JWT of an account whose JWT sets authorization.auth_users is handed
// to the auth callout unless its key is one of those auth users. The sentinel is such a user:
// it exists only to trigger the callout for the token presented with it, so with no responder
// the server times the callout out (AuthTimeout, 2 s by default) and refuses the connection with
// an authorization violation. The sentinel therefore never holds a connection of its own, and
// its deny-all permissions are defence in depth. The auth-callout user (the registered auth user)
// connects directly, receives callout requests on $SYS.REQ.USER.AUTH, and cannot forge one.
func TestBrokerAuthAccount(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	sp := b.Space(brokerSpace)
	sentinelJWT, sentinelKP := sp.MintUser(t, profiles.Sentinel, none, 0)

	t.Run("fail/sentinel cannot connect without a callout responder", func(t *testing.T) {
		nc, err := b.Connect(t, sentinelJWT, sentinelKP, nats.Name("sentinel-unanswered"))
		if err == nil {
			nc.Close()
			t.Fatal("sentinel connected")
		}
		if !refusedUnanswered(t, b, "sentinel-unanswered", err) {
			t.Fatalf("err = %v, want an authorization violation", err)
		}
	})

	calloutJWT, calloutKP := sp.MintUser(t, profiles.AuthCallout, none, 0)
	nc, err := b.Connect(t, calloutJWT, calloutKP)
	if err != nil {
		t.Fatalf("auth-callout user could not connect: %v", err)
	}

	t.Run("ok/auth-callout subscribes to $SYS.REQ.USER.AUTH and receives a sealed request", func(t *testing.T) {
		reqs, err := nc.SubscribeSync(server.AuthCalloutSubject)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		// The sentinel's attempt sends a callout request to our subscription; nobody answers,
		// so the attempt still fails.
		done := make(chan error, 1)
		go func() {
			c, err := b.Connect(t, sentinelJWT, sentinelKP, nats.Name("sentinel-seen-by-callout"))
			if err == nil {
				c.Close()
			}
			done <- err
		}()
		m, err := reqs.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no callout request arrived: %v", err)
		}
		serverXKey := m.Header.Get(server.AuthRequestXKeyHeader)
		if serverXKey == "" || strings.HasPrefix(string(m.Data), "eyJ") {
			t.Fatalf("callout request is not sealed to the account xkey")
		}
		xkp, err := sp.Signing.XKey.KeyPair()
		if err != nil {
			t.Fatal(err)
		}
		defer xkp.Wipe()
		plain, err := xkp.Open(m.Data, serverXKey)
		if err != nil {
			t.Fatalf("cannot open the request with the space xkey: %v", err)
		}
		req, err := jwt.DecodeAuthorizationRequestClaims(string(plain))
		if err != nil {
			t.Fatal(err)
		}
		if req.ConnectOptions.JWT != sentinelJWT {
			t.Fatalf("callout request does not carry the sentinel JWT")
		}
		if err := <-done; !refusedUnanswered(t, b, "sentinel-seen-by-callout", err) {
			t.Fatalf("unanswered callout: sentinel err = %v, want an authorization violation", err)
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("auth-callout user got broker errors: %v", errs)
		}
	})

	t.Run("fail/auth-callout publishes to $SYS.REQ.USER.AUTH", func(t *testing.T) {
		if err := nc.Publish(server.AuthCalloutSubject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		err := b.WaitAsyncError(t, nc, testkit.PublishViolation(server.AuthCalloutSubject))
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("broker error %v is not a permissions violation", err)
		}
	})
}

// TestBrokerRequestReply shows the private reply inbox every data profile gets
// (_INBOX_<user nkey>.>): a request to the JetStream API is answered for the profiles that grant
// $JS.API.INFO, and the probe's request is refused by the broker.
func TestBrokerRequestReply(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	for _, p := range []principal{{profiles.Agent, agentO1}, {profiles.Supervisor, supervisorM1}, {profiles.Delivery, none}} {
		t.Run("ok/"+string(p.profile)+" requests JetStream account info", func(t *testing.T) {
			nc := connectAs(t, b, p)
			m, err := nc.Request(space.JSAPIInfo, nil, 5*time.Second)
			if err != nil {
				t.Fatalf("request: %v (broker errors %v)", err, b.AsyncErrors(nc))
			}
			if !strings.Contains(string(m.Data), `"type":"io.nats.jetstream.api.v1.account_info_response"`) {
				t.Fatalf("reply is not account info: %.200s", m.Data)
			}
			if !strings.HasPrefix(m.Subject, "_INBOX_U") {
				t.Fatalf("reply came on %s, not the private inbox", m.Subject)
			}
		})
	}
	t.Run("fail/probe requests JetStream account info", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.Probe, none})
		if _, err := nc.Request(space.JSAPIInfo, nil, 250*time.Millisecond); err == nil {
			t.Fatal("probe got a reply")
		}
		if err := b.WaitAsyncError(t, nc, testkit.PublishViolation(space.JSAPIInfo)); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("broker error %v is not a permissions violation", err)
		}
	})
}
