package space

import (
	"errors"
	"strings"
	"testing"
)

const (
	tUID   = "abcdefghijklmnopqrstuvwxyz"
	tNonce = "nonce-1234"
)

func mustNames(t *testing.T, name string) Names {
	t.Helper()
	n, err := NewNames(name)
	if err != nil {
		t.Fatalf("NewNames(%q): %v", name, err)
	}
	return n
}

func TestNewNames(t *testing.T) {
	n := mustNames(t, "demo space")
	if n.Name() != "demo space" || n.Token() != "demo_space" || n.Prefix() != "cotal.demo_space" ||
		n.Segment() != "space.64656d6f207370616365" {
		t.Fatalf("Names = %q %q %q %q", n.Name(), n.Token(), n.Prefix(), n.Segment())
	}
	if _, err := NewNames(" bad"); err == nil {
		t.Fatal("NewNames accepted a name with leading whitespace")
	}
	var zero Names
	if _, err := zero.Chat("o", "a", "c"); !errors.Is(err, ErrZeroNames) {
		t.Fatalf("zero Names: got %v, want ErrZeroNames", err)
	}
	if _, err := zero.Bucket(Presence); !errors.Is(err, ErrZeroNames) {
		t.Fatalf("zero Names bucket: got %v, want ErrZeroNames", err)
	}
}

func TestBuilders(t *testing.T) {
	n := mustNames(t, "demo space")
	type call func() (string, error)
	s := func(v string) call { return func() (string, error) { return v, nil } }
	tests := []struct {
		name string
		fn   call
		want string // "" means an error is expected
	}{
		{"ok/chat", func() (string, error) { return n.Chat("local", "bob", "team.backend") }, "cotal.demo_space.chat.local.bob.team.backend"},
		{"ok/chat from", func() (string, error) { return n.ChatFrom("local", "bob") }, "cotal.demo_space.chat.local.bob.>"},
		{"ok/chat read", func() (string, error) { return n.ChatRead("general") }, "cotal.demo_space.chat.*.*.general"},
		{"ok/chat all", s(n.ChatAll()), "cotal.demo_space.chat.>"},
		{"ok/inst", func() (string, error) { return n.Inst("local", "amy", "local", "bob") }, "cotal.demo_space.inst.local.amy.local.bob"},
		{"ok/inst from", func() (string, error) { return n.InstFrom("local", "bob") }, "cotal.demo_space.inst.*.*.local.bob"},
		{"ok/inst to", func() (string, error) { return n.InstTo("local", "bob") }, "cotal.demo_space.inst.local.bob.>"},
		{"ok/inst all", s(n.InstAll()), "cotal.demo_space.inst.>"},
		{"ok/svc", func() (string, error) { return n.Svc("review", "local", "bob") }, "cotal.demo_space.svc.review.local.bob"},
		{"ok/svc from", func() (string, error) { return n.SvcFrom("local", "bob") }, "cotal.demo_space.svc.*.local.bob"},
		{"ok/svc serve", func() (string, error) { return n.SvcServe("review") }, "cotal.demo_space.svc.review.>"},
		{"ok/svc all", s(n.SvcAll()), "cotal.demo_space.svc.>"},
		{"ok/ctl delivery", func() (string, error) { return n.CtlDelivery("local", "bob") }, "cotal.demo_space.ctl.delivery.local.bob"},
		{"ok/ctl delivery reply", func() (string, error) { return n.CtlDeliveryReply("local", "bob", tNonce) }, "cotal.demo_space.ctl.delivery.local.bob.reply.nonce-1234"},
		{"ok/ctl delivery tree", func() (string, error) { return n.CtlDeliveryTree("local", "bob") }, "cotal.demo_space.ctl.delivery.local.bob.>"},
		{"ok/ctl delivery serve", s(n.CtlDeliveryServe()), "cotal.demo_space.ctl.delivery.*.*"},
		{"ok/ctl delivery reply any", s(n.CtlDeliveryReplyAny()), "cotal.demo_space.ctl.delivery.*.*.reply.>"},
		{"ok/ctl admin", func() (string, error) { return n.CtlDeliveryAdmin("local", "mgr") }, "cotal.demo_space.ctl.delivery-admin.local.mgr"},
		{"ok/ctl admin reply", func() (string, error) { return n.CtlDeliveryAdminReply("local", "mgr", tNonce) }, "cotal.demo_space.ctl.delivery-admin.local.mgr.reply.nonce-1234"},
		{"ok/ctl admin tree", func() (string, error) { return n.CtlDeliveryAdminTree("local", "mgr") }, "cotal.demo_space.ctl.delivery-admin.local.mgr.>"},
		{"ok/ctl admin serve", s(n.CtlDeliveryAdminServe()), "cotal.demo_space.ctl.delivery-admin.*.*"},
		{"ok/ctl admin reply any", s(n.CtlDeliveryAdminReplyAny()), "cotal.demo_space.ctl.delivery-admin.*.*.reply.>"},
		{"ok/dinbox", func() (string, error) { return n.Dinbox("local", "bob", tUID) }, "cotal.demo_space.dinbox.local.bob." + tUID},
		{"ok/dinbox any", s(n.DinboxAny()), "cotal.demo_space.dinbox.*.*.*"},
		{"ok/dinbox all", s(n.DinboxAll()), "cotal.demo_space.dinbox.>"},
		{"ok/dlv", func() (string, error) { return n.Dlv("local", "bob", tUID) }, "cotal.demo_space.dlv.local.bob." + tUID},
		{"ok/dlv any", s(n.DlvAny()), "cotal.demo_space.dlv.*.*.*"},
		{"ok/dlv all", s(n.DlvAll()), "cotal.demo_space.dlv.>"},
		{"ok/chat grant subtree", func() (string, error) { return n.ChatGrant("local", "bob", "team.>") }, "cotal.demo_space.chat.local.bob.team.>"},
		{"ok/chat grant concrete", func() (string, error) { return n.ChatGrant("local", "bob", "team.a") }, "cotal.demo_space.chat.local.bob.team.a"},
		{"ok/chat read grant level", func() (string, error) { return n.ChatReadGrant("team.*") }, "cotal.demo_space.chat.*.*.team.*"},
		{"ok/live delivery", func() (string, error) { return n.LiveDelivery("local", "bob") }, "cotal.demo_space.live.delivery.local.bob"},
		{"ok/live serve", s(n.LiveDeliveryServe()), "cotal.demo_space.live.delivery.*.*"},
		{"ok/live reply any", s(n.LiveDeliveryReplyAny()), "cotal.demo_space.live.delivery.*.*.reply.>"},
		{"ok/live delivery replies", func() (string, error) { return n.LiveDeliveryReplies("local", "bob") }, "cotal.demo_space.live.delivery.local.bob.reply.>"},
		{"ok/live manager", func() (string, error) { return n.LiveManager("local", "bob") }, "cotal.demo_space.live.manager.local.bob"},
		{"ok/live manager replies", func() (string, error) { return n.LiveManagerReplies("local", "bob") }, "cotal.demo_space.live.manager.local.bob.reply.>"},
		{"ok/live manager serve", s(n.LiveManagerServe()), "cotal.demo_space.live.manager.*.*"},
		{"ok/live manager reply any", s(n.LiveManagerReplyAny()), "cotal.demo_space.live.manager.*.*.reply.>"},
		{"ok/live queues", s(LiveQueue(LivePlaneManager) + " " + LiveQueue(LivePlaneDelivery)), "live.manager live.delivery"},
		{"ok/streams", s(strings.Join([]string{n.ChatStream(), n.DMStream(), n.TaskStream(), n.InboxStream(), n.DLVStream()}, " ")), "CHAT_demo_space DM_demo_space TASK_demo_space INBOX_demo_space DLV_demo_space"},
		{"ok/fixed consumers", s(n.FanoutConsumer() + " " + n.ReaderConsumer()), "fanout reader"},
		{"ok/dlv consumer", func() (string, error) { return n.DlvConsumer("local", "bob", tUID) }, "dlv_local-bob-" + tUID},
		{"ok/dm consumer", func() (string, error) { return n.DMConsumer("local", "bob", tUID) }, "dm_local-bob-" + tUID},
		{"ok/chathist consumer", func() (string, error) { return n.ChatHistConsumer("local", "bob", tUID) }, "chathist_local-bob-" + tUID},
		{"ok/catchup consumer", func() (string, error) { return n.CatchupConsumer("local", "bob", tUID, 7) }, "cu_local-bob-" + tUID + "_7"},
		{"ok/svc consumer", func() (string, error) { return n.SvcConsumer("review") }, "svc_review"},
		{"ok/bucket", func() (string, error) { return n.Bucket(Presence) }, "cotal_presence_demo_space"},
		{"ok/bucket stream", func() (string, error) { return n.BucketStream(Issued) }, "KV_cotal_issued_demo_space"},
		{"ok/kv", func() (string, error) { return n.KV(ACL, "local.bob."+tUID) }, "$KV.cotal_acl_demo_space.local.bob." + tUID},
		{"ok/kv all", func() (string, error) { return n.KVAll(Members) }, "$KV.cotal_members_demo_space.>"},
		{"ok/kv keys", func() (string, error) { return n.KVKeys(Auth, "epgate.*.*") }, "$KV.cotal_auth_demo_space.epgate.*.*"},
		{"ok/kv keys concrete", func() (string, error) { return n.KVKeys(Records, "uid.x") }, "$KV.cotal_records_demo_space.uid.x"},
		{"fail/kv keys gt", func() (string, error) { return n.KVKeys(Auth, "gate.>") }, ""},
		{"fail/kv keys star inside a token", func() (string, error) { return n.KVKeys(Auth, "gate.a*") }, ""},
		{"fail/kv keys empty token", func() (string, error) { return n.KVKeys(Auth, "gate..*") }, ""},
		{"fail/kv keys unknown bucket", func() (string, error) { return n.KVKeys(BucketKind("nope"), "gate.*") }, ""},
		{"ok/delivery lease any", s(n.DeliveryLeaseAny()), "$KV.cotal_delivery_demo_space.lease.*"},
		{"ok/manager lease any", s(n.ManagerLeaseAny()), "$KV.cotal_manager_demo_space.lease.*"},
		{"ok/principal key", func() (string, error) { return PrincipalKey("local", "bob") }, "local.bob"},
		{"ok/acl key", func() (string, error) { return ACLKey("local", "bob", tUID) }, "local.bob." + tUID},
		{"ok/member key", func() (string, error) { return MemberKey("team.a", "local", "bob", tUID) }, "team.a/local.bob." + tUID},
		{"ok/manager lease key", func() (string, error) { return ManagerLeaseKey(tUID) }, "lease." + tUID},
		{"fail/chat owner dot", func() (string, error) { return n.Chat("a.b", "bob", "c") }, ""},
		{"fail/chat actor star", func() (string, error) { return n.Chat("local", "*", "c") }, ""},
		{"fail/chat channel gt", func() (string, error) { return n.Chat("local", "bob", ">") }, ""},
		{"fail/chat read channel star", func() (string, error) { return n.ChatRead("team.*") }, ""},
		{"fail/chat grant channel gt mid", func() (string, error) { return n.ChatGrant("local", "bob", "a.>.b") }, ""},
		{"fail/chat grant owner star", func() (string, error) { return n.ChatGrant("*", "bob", "team.>") }, ""},
		{"fail/chat read grant partial wildcard", func() (string, error) { return n.ChatReadGrant("team.a*") }, ""},
		{"fail/inst sender empty", func() (string, error) { return n.Inst("local", "amy", "", "bob") }, ""},
		{"fail/svc role dot", func() (string, error) { return n.Svc("a.b", "local", "bob") }, ""},
		{"fail/svc serve role gt", func() (string, error) { return n.SvcServe(">") }, ""},
		{"fail/ctl reply short nonce", func() (string, error) { return n.CtlDeliveryReply("local", "bob", "x") }, ""},
		{"fail/ctl reply nonce gt", func() (string, error) { return n.CtlDeliveryAdminReply("local", "bob", ">>>>>>>>>") }, ""},
		{"fail/dinbox bad uid", func() (string, error) { return n.Dinbox("local", "bob", "short") }, ""},
		{"fail/dlv consumer owner dash", func() (string, error) { return n.DlvConsumer("lo-cal", "bob", tUID) }, ""},
		{"fail/svc consumer empty", func() (string, error) { return n.SvcConsumer("") }, ""},
		{"fail/bucket unknown kind", func() (string, error) { return n.Bucket("secrets") }, ""},
		{"fail/kv key wildcard", func() (string, error) { return n.KV(Presence, "a.*") }, ""},
		{"fail/member key channel wildcard", func() (string, error) { return MemberKey("a.>", "local", "bob", tUID) }, ""},
		{"fail/manager lease key", func() (string, error) { return ManagerLeaseKey("*") }, ""},
		{"fail/live manager actor star", func() (string, error) { return n.LiveManager("local", "*") }, ""},
		{"fail/live manager replies owner gt", func() (string, error) { return n.LiveManagerReplies(">", "bob") }, ""},
		{"fail/live delivery replies owner dot", func() (string, error) { return n.LiveDeliveryReplies("a.b", "bob") }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn()
			if tc.want == "" {
				var ne *NameError
				if !errors.As(err, &ne) || got != "" {
					t.Fatalf("got %q, %v; want \"\" and a *NameError", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestJSAPI(t *testing.T) {
	type call func() (string, error)
	tests := []struct {
		name string
		fn   call
		want string
	}{
		{"ok/stream info", func() (string, error) { return StreamInfo("CHAT_t") }, "$JS.API.STREAM.INFO.CHAT_t"},
		{"ok/stream create", func() (string, error) { return StreamCreate("DM_t") }, "$JS.API.STREAM.CREATE.DM_t"},
		{"ok/stream update", func() (string, error) { return StreamUpdate("KV_x") }, "$JS.API.STREAM.UPDATE.KV_x"},
		{"ok/msg get", func() (string, error) { return StreamMsgGet("KV_x") }, "$JS.API.STREAM.MSG.GET.KV_x"},
		{"ok/direct get", func() (string, error) { return DirectGetAny("KV_x") }, "$JS.API.DIRECT.GET.KV_x.>"},
		{"ok/direct get bare", func() (string, error) { return DirectGet("CHAT_t") }, "$JS.API.DIRECT.GET.CHAT_t"},
		{"fail/direct get bare gt", func() (string, error) { return DirectGet(">") }, ""},
		{"ok/consumer create bare", func() (string, error) { return ConsumerCreate("CHAT_t") }, "$JS.API.CONSUMER.CREATE.CHAT_t"},
		{"ok/consumer create any", func() (string, error) { return ConsumerCreateAny("CHAT_t") }, "$JS.API.CONSUMER.CREATE.CHAT_t.>"},
		{"ok/consumer create named", func() (string, error) { return ConsumerCreateNamed("INBOX_t", "reader") }, "$JS.API.CONSUMER.CREATE.INBOX_t.reader.>"},
		{"ok/consumer create filtered", func() (string, error) { return ConsumerCreateFiltered("CHAT_t", "c", "cotal.t.chat.*.*.g") }, "$JS.API.CONSUMER.CREATE.CHAT_t.c.cotal.t.chat.*.*.g"},
		{"ok/durable create", func() (string, error) { return DurableCreate("INBOX_t", "reader") }, "$JS.API.CONSUMER.DURABLE.CREATE.INBOX_t.reader"},
		{"ok/durable create any", func() (string, error) { return DurableCreateAny("DM_t") }, "$JS.API.CONSUMER.DURABLE.CREATE.DM_t.>"},
		{"ok/consumer info", func() (string, error) { return ConsumerInfo("DM_t", "dm_x") }, "$JS.API.CONSUMER.INFO.DM_t.dm_x"},
		{"ok/consumer info any", func() (string, error) { return ConsumerInfoAny("DM_t") }, "$JS.API.CONSUMER.INFO.DM_t.>"},
		{"ok/consumer next", func() (string, error) { return ConsumerNext("DM_t", "dm_x") }, "$JS.API.CONSUMER.MSG.NEXT.DM_t.dm_x"},
		{"ok/consumer next any", func() (string, error) { return ConsumerNextAny("DM_t") }, "$JS.API.CONSUMER.MSG.NEXT.DM_t.>"},
		{"ok/consumer delete", func() (string, error) { return ConsumerDelete("DM_t", "dm_x") }, "$JS.API.CONSUMER.DELETE.DM_t.dm_x"},
		{"ok/consumer delete any", func() (string, error) { return ConsumerDeleteAny("DM_t") }, "$JS.API.CONSUMER.DELETE.DM_t.>"},
		{"ok/ack", func() (string, error) { return Ack("DM_t", "dm_x") }, "$JS.ACK.DM_t.dm_x.>"},
		{"ok/ack any", func() (string, error) { return AckAny("CHAT_t") }, "$JS.ACK.CHAT_t.>"},
		{"ok/inbox prefix", func() (string, error) { return InboxPrefix(tNonce) }, "_INBOX_nonce-1234"},
		{"ok/inbox filter", func() (string, error) { return InboxFilter(tNonce) }, "_INBOX_nonce-1234.>"},
		{"fail/stream dot", func() (string, error) { return StreamInfo("A.B") }, ""},
		{"fail/stream empty", func() (string, error) { return StreamCreate("") }, ""},
		{"fail/stream gt", func() (string, error) { return ConsumerCreateAny(">") }, ""},
		{"fail/consumer star", func() (string, error) { return ConsumerInfo("DM_t", "*") }, ""},
		{"fail/consumer space", func() (string, error) { return Ack("DM_t", "a b") }, ""},
		{"fail/filter gt middle", func() (string, error) { return ConsumerCreateFiltered("CHAT_t", "c", "a.>.b") }, ""},
		{"fail/stream too long", func() (string, error) { return StreamInfo(strings.Repeat("S", MaxJSNameLen+1)) }, ""},
		{"fail/inbox gt", func() (string, error) { return InboxFilter(">") }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn()
			if tc.want == "" {
				var ne *NameError
				if !errors.As(err, &ne) || got != "" {
					t.Fatalf("got %q, %v; want \"\" and a *NameError", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestBucketKindsClosed(t *testing.T) {
	n := mustNames(t, "s")
	want := []string{"presence", "channels", "members", "acl", "membership", "manager", "delivery", "auth", "records", "issued"}
	kinds := BucketKinds()
	if len(kinds) != len(want) {
		t.Fatalf("BucketKinds = %v", kinds)
	}
	for i, k := range kinds {
		b, err := n.Bucket(k)
		if err != nil || string(k) != want[i] || b != "cotal_"+want[i]+"_s" {
			t.Fatalf("kind %d: %q -> %q, %v", i, k, b, err)
		}
	}
}

// TestBearerGrammars: the scope-word and credential-id grammars signerd signs and authd verifies.
func TestBearerGrammars(t *testing.T) {
	for _, tt := range []struct {
		name string
		f    func(string) bool
		in   string
		want bool
	}{
		{"ok/scope-word", IsScopeWord, "spawn", true},
		{"ok/scope-word-max", IsScopeWord, "a" + strings.Repeat("z", MaxScopeWordLen-1), true},
		{"ok/scope-word-digits-dash", IsScopeWord, "a0_-9", true},
		{"fail/scope-word-empty", IsScopeWord, "", false},
		{"fail/scope-word-too-long", IsScopeWord, strings.Repeat("a", MaxScopeWordLen+1), false},
		{"fail/scope-word-leading-digit", IsScopeWord, "0spawn", false},
		{"fail/scope-word-upper", IsScopeWord, "Spawn", false},
		{"fail/scope-word-role-colon", IsScopeWord, "role:reviewer", false},
		{"fail/scope-word-dot", IsScopeWord, "a.b", false},
		{"ok/credential-id", IsCredentialID, "Ab_-09", true},
		{"ok/credential-id-max", IsCredentialID, strings.Repeat("x", MaxCredentialIDLen), true},
		{"fail/credential-id-empty", IsCredentialID, "", false},
		{"fail/credential-id-too-long", IsCredentialID, strings.Repeat("x", MaxCredentialIDLen+1), false},
		{"fail/credential-id-dot", IsCredentialID, "a.b", false},
		{"fail/credential-id-wildcard", IsCredentialID, "a*", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f(tt.in); got != tt.want {
				t.Fatalf("%q: got %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
