package profiles

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/space"
)

func TestParseAndAll(t *testing.T) {
	want := []Name{Admin, Agent, AuthCallout, AuthPlane, ConnectionEvictor, Delivery, Deprovisioner, MembershipObserver, MembershipRW, Observer, Operator, Probe, Provisioner, RemoteManager, RetirementRequester, Sentinel, ServiceServe, Supervisor}
	if got := All(); !reflect.DeepEqual(got, want) {
		t.Fatalf("All() = %v, want %v", got, want)
	}
	for _, n := range want {
		got, err := Parse(string(n))
		if err != nil || got != n {
			t.Fatalf("Parse(%q) = %q, %v", n, got, err)
		}
	}
	for _, bad := range []string{"", "Agent", " agent", "manager", "membership_observer", "system"} {
		_, err := Parse(bad)
		var ue *UnknownProfileError
		if !errors.As(err, &ue) || ue.Name != bad {
			t.Fatalf("Parse(%q): got %v, want *UnknownProfileError", bad, err)
		}
	}
}

func TestMatrixClasses(t *testing.T) {
	d24 := Lifetime{Default: 24 * time.Hour, Max: 24 * time.Hour}
	m5 := Lifetime{Default: 5 * time.Minute, Max: 5 * time.Minute}
	tests := []struct {
		name    Name
		account AccountKind
		life    Lifetime
	}{
		{Agent, AccountData, d24},
		{Supervisor, AccountData, d24},
		{Delivery, AccountData, d24},
		{MembershipRW, AccountData, d24},
		{Observer, AccountData, d24},
		{Admin, AccountData, d24},
		{Provisioner, AccountData, m5},
		{Deprovisioner, AccountData, m5},
		{Operator, AccountData, m5},
		{Probe, AccountData, Lifetime{Default: time.Minute, Max: time.Minute}},
		{AuthCallout, AccountAuth, d24},
		{AuthPlane, AccountData, d24},
		{Sentinel, AccountAuth, Lifetime{NoExpiry: true}},
		{MembershipObserver, AccountSystem, d24},
		{ConnectionEvictor, AccountSystem, m5},
		{RetirementRequester, AccountData, m5},
		{ServiceServe, AccountData, Lifetime{Default: time.Minute, Max: time.Minute}},
		{RemoteManager, AccountData, d24},
	}
	if len(tests) != len(All()) {
		t.Fatalf("table covers %d profiles, matrix has %d", len(tests), len(All()))
	}
	for _, tc := range tests {
		t.Run("ok/"+string(tc.name), func(t *testing.T) {
			if tc.name.Account() != tc.account || tc.name.Lifetime() != tc.life {
				t.Fatalf("%s: account %v lifetime %+v, want %v %+v", tc.name, tc.name.Account(), tc.name.Lifetime(), tc.account, tc.life)
			}
		})
	}
	if Name("nope").Account() != 0 || Name("nope").Lifetime() != (Lifetime{}) {
		t.Fatal("unknown name has a class")
	}
}

func TestLifetimeTTL(t *testing.T) {
	l := Agent.Lifetime()
	tests := []struct {
		name string
		life Lifetime
		in   time.Duration
		want time.Duration
		ok   bool
	}{
		{"ok/zero is default", l, 0, 24 * time.Hour, true},
		{"ok/below max", l, time.Hour, time.Hour, true},
		{"ok/at max", l, 24 * time.Hour, 24 * time.Hour, true},
		{"ok/no expiry zero", Sentinel.Lifetime(), 0, 0, true},
		{"fail/above max", l, 24*time.Hour + time.Second, 0, false},
		{"fail/negative", l, -time.Second, 0, false},
		{"fail/no expiry asked for ttl", Sentinel.Lifetime(), time.Hour, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.life.TTL(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("TTL(%v) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestAccountKindText(t *testing.T) {
	for _, k := range []AccountKind{AccountData, AccountAuth} {
		b, err := k.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back AccountKind
		if err := back.UnmarshalText(b); err != nil || back != k {
			t.Fatalf("round trip %v: %v %v", k, back, err)
		}
	}
	if _, err := AccountKind(9).MarshalText(); err == nil {
		t.Fatal("marshalled an unknown kind")
	}
	var k AccountKind
	if err := k.UnmarshalText([]byte("sys")); err == nil {
		t.Fatal("unmarshalled an unknown kind")
	}
}

// mxAgent returns valid agent params that each refusal case then breaks.
func mxAgent() Params {
	return Params{
		Owner: "local", Actor: "bob", LifecycleUID: mxUID,
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
	}
}

func mxWith(p Params, f func(*Params)) Params { f(&p); return p }

func TestBuildRefusals(t *testing.T) {
	tooMany := make([]string, MaxChannels+1)
	for i := range tooMany {
		tooMany[i] = "c" + strings.Repeat("x", i%5) + string(rune('a'+i%26))
	}
	tests := []struct {
		name    string
		space   string
		profile Name
		params  Params
		field   string // the ParamError field expected
		grammar bool   // whether the error wraps a *space.NameError
	}{
		{"fail/space empty", "", Agent, mxAgent(), "space", true},
		{"fail/space control char", "a\x00b", Probe, Params{}, "space", true},
		{"fail/agent missing owner", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Owner = "" }), "Owner", false},
		{"fail/agent missing actor", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Actor = "" }), "Actor", false},
		{"fail/agent missing uid", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.LifecycleUID = "" }), "LifecycleUID", false},
		{"fail/agent owner dot", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Owner = "a.b" }), "Owner", true},
		{"fail/agent owner star", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Owner = "*" }), "Owner", true},
		{"fail/agent owner dash", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Owner = "lo-cal" }), "Owner", true},
		{"fail/agent actor gt", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Actor = ">" }), "Actor", true},
		{"fail/agent uid short", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.LifecycleUID = "abc" }), "LifecycleUID", true},
		{"fail/agent uid upper", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.LifecycleUID = strings.ToUpper(mxUID) }), "LifecycleUID", true},
		{"fail/agent role dot", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Role = "a.b" }), "Role", true},
		{"fail/agent publish partial star", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowPublish = []string{"team.a*"} }), "AllowPublish", true},
		{"fail/agent subscribe gt not last", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowSubscribe = []string{"general", "team.>.x"} }), "AllowSubscribe", true},
		{"fail/agent subscribe wider than allow", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowSubscribe = []string{"team.*"}; p.Subscribe = []string{"team.>"} }), "Subscribe", false},
		{"fail/agent subscribe level outside allow", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowSubscribe = []string{"team.a"}; p.Subscribe = []string{"team.*"} }), "Subscribe", false},
		{"fail/agent channel empty token", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowPublish = []string{"a..b"} }), "AllowPublish", true},
		{"fail/agent channel empty string", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowSubscribe = []string{"general", ""} }), "AllowSubscribe", true},
		{"fail/agent channel space", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Subscribe = []string{"gen eral"} }), "Subscribe", true},
		{"fail/agent subscribe not subset", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Subscribe = []string{"general", "secret"} }), "Subscribe", false},
		{"fail/agent subscribe without allow", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowSubscribe = nil }), "Subscribe", false},
		{"fail/agent too many channels", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.AllowPublish = tooMany }), "AllowPublish", false},
		{"fail/agent unknown capability", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Capabilities = []string{"spawn", "root"} }), "Capabilities", false},
		{"fail/agent capability case", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.Capabilities = []string{"Spawn"} }), "Capabilities", false},
		{"fail/agent nonce short", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = "short" }), "InboxNonce", true},
		{"fail/agent nonce wildcard", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = "abcdefgh>" }), "InboxNonce", true},
		{"fail/agent nonce a user key", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = "U" + strings.Repeat("A", 55) }), "InboxNonce", true},
		{"fail/agent nonce unbound", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = "nonce-abc-123" }), "InboxNonce", true},
		{"fail/agent nonce of another principal", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = mxNonce(t, "local", "alice") }), "InboxNonce", true},
		{"fail/deprovisioner nonce bound to its target", mxSpace, Deprovisioner, Params{Owner: "local", Actor: "bob", LifecycleUID: mxUID, InboxNonce: mxNonce(t, "local", "bob")}, "InboxNonce", false},
		{"fail/delivery nonce without a principal", mxSpace, Delivery, Params{InboxNonce: mxNonce(t, "local", "bob")}, "InboxNonce", false},
		{"fail/supervisor missing owner", mxSpace, Supervisor, Params{Actor: "m"}, "Owner", false},
		{"fail/supervisor uid not accepted", mxSpace, Supervisor, Params{Owner: "o", Actor: "m", LifecycleUID: mxUID}, "LifecycleUID", false},
		{"fail/supervisor role not accepted", mxSpace, Supervisor, Params{Owner: "o", Actor: "m", Role: "r"}, "Role", false},
		{"fail/operator channels not accepted", mxSpace, Operator, Params{Owner: "o", Actor: "a", AllowPublish: []string{"general"}}, "AllowPublish", false},
		{"fail/delivery owner without actor", mxSpace, Delivery, Params{Owner: "o"}, "Actor", false},
		{"fail/probe actor without owner", mxSpace, Probe, Params{Actor: "a"}, "Owner", false},
		{"fail/observer capability not accepted", mxSpace, Observer, Params{Capabilities: []string{"admin"}}, "Capabilities", false},
		{"fail/provisioner uid not accepted", mxSpace, Provisioner, Params{LifecycleUID: mxUID}, "LifecycleUID", false},
		{"fail/deprovisioner missing uid", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a"}, "LifecycleUID", false},
		{"fail/deprovisioner bad uid", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: "*"}, "LifecycleUID", true},
		{"fail/deprovisioner member channel pattern", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: mxUID, MemberChannels: []string{"general", "team.>"}}, "MemberChannels", true},
		{"fail/deprovisioner member channel star", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: mxUID, MemberChannels: []string{"team.*"}}, "MemberChannels", true},
		{"fail/deprovisioner member channel empty", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: mxUID, MemberChannels: []string{""}}, "MemberChannels", true},
		{"fail/deprovisioner member channel slash", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: mxUID, MemberChannels: []string{"a/b"}}, "MemberChannels", true},
		{"fail/deprovisioner too many member channels", mxSpace, Deprovisioner, Params{Owner: "o", Actor: "a", LifecycleUID: mxUID, MemberChannels: tooMany}, "MemberChannels", false},
		{"fail/agent member channels not accepted", mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.MemberChannels = []string{"general"} }), "MemberChannels", false},
		{"fail/provisioner member channels not accepted", mxSpace, Provisioner, Params{MemberChannels: []string{"general"}}, "MemberChannels", false},
		{"fail/delivery member channels not accepted", mxSpace, Delivery, Params{MemberChannels: []string{"general"}}, "MemberChannels", false},
		{"fail/auth-callout owner not accepted", mxSpace, AuthCallout, Params{Owner: "o", Actor: "a"}, "Owner", false},
		{"fail/auth-callout nonce not accepted", mxSpace, AuthCallout, Params{InboxNonce: "abcdefgh"}, "InboxNonce", false},
		{"fail/sentinel subscribe not accepted", mxSpace, Sentinel, Params{Subscribe: []string{"x"}}, "Subscribe", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Build(tc.space, tc.profile, tc.params)
			var pe *ParamError
			if s != nil || !errors.As(err, &pe) {
				t.Fatalf("got %v, %v; want nil and *ParamError", s, err)
			}
			if pe.Profile != tc.profile || pe.Field != tc.field || pe.Reason == "" {
				t.Fatalf("ParamError = %+v, want profile %s field %s", pe, tc.profile, tc.field)
			}
			var ne *space.NameError
			if errors.As(err, &ne) != tc.grammar {
				t.Fatalf("wraps *space.NameError = %v, want %v (%v)", !tc.grammar, tc.grammar, err)
			}
		})
	}
	t.Run("fail/unknown profile", func(t *testing.T) {
		_, err := Build(mxSpace, "manager", Params{})
		var ue *UnknownProfileError
		if !errors.As(err, &ue) || ue.Name != "manager" {
			t.Fatalf("got %v, want *UnknownProfileError", err)
		}
	})
}

func TestBuildOK(t *testing.T) {
	t.Run("ok/agent channel patterns become pattern rows", func(t *testing.T) {
		s, err := Build(mxSpace, Agent, mxWith(mxAgent(), func(p *Params) {
			p.Subscribe = []string{"team.a", "team.*"}
			p.AllowSubscribe = []string{"team.>"}
			p.AllowPublish = []string{"team.>", "ops.*"}
		}))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []struct {
			list []string
			row  string
		}{
			{s.Pub.Allow, "cotal.demo_space.chat.local.bob.team.>"},
			{s.Pub.Allow, "cotal.demo_space.chat.local.bob.ops.*"},
			{s.Pub.Allow, "$JS.API.CONSUMER.CREATE.CHAT_demo_space.chathist_local-bob-" + mxUID + ".cotal.demo_space.chat.*.*.team.>"},
			{s.Sub.Allow, "cotal.demo_space.chat.*.*.team.>"},
		} {
			if !slices.Contains(want.list, want.row) {
				t.Errorf("no row %q in %v", want.row, want.list)
			}
		}
		for _, row := range append(append([]string(nil), s.Pub.Allow...), s.Sub.Allow...) {
			if strings.Contains(row, ".chat.") && !strings.Contains(row, "team.") && !strings.Contains(row, "ops.") {
				t.Errorf("chat row %q outside the granted patterns", row)
			}
		}
	})
	t.Run("ok/agent subscribe within allow by pattern", func(t *testing.T) {
		for _, c := range []struct{ sub, allow string }{{"team.a", "team.*"}, {"team.*", "team.>"}, {"team.>", "team.>"}, {"x.y", ">"}} {
			if _, err := Build(mxSpace, Agent, mxWith(mxAgent(), func(p *Params) {
				p.Subscribe, p.AllowSubscribe = []string{c.sub}, []string{c.allow}
			})); err != nil {
				t.Errorf("subscribe %q within allow %q: %v", c.sub, c.allow, err)
			}
		}
	})
	t.Run("ok/agent channels deduplicated and sorted", func(t *testing.T) {
		a, err := Build(mxSpace, Agent, mxWith(mxAgent(), func(p *Params) {
			p.AllowSubscribe = []string{"zeta", "alpha", "zeta", "general"}
			p.AllowPublish = []string{"zeta", "alpha", "alpha"}
			p.Capabilities = []string{"run", "spawn", "run"}
		}))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Build(mxSpace, Agent, mxWith(mxAgent(), func(p *Params) {
			p.AllowSubscribe = []string{"general", "alpha", "zeta"}
			p.AllowPublish = []string{"alpha", "zeta"}
			p.Capabilities = []string{"spawn", "run"}
		}))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("equal inputs gave different specs:\n%+v\n%+v", a, b)
		}
		want := []string{"cotal.demo_space.ctl.delivery.local.bob.>",
			"cotal.demo_space.live.manager.local.bob.reply.>", "cotal.demo_space.live.delivery.local.bob.reply.>",
			"cotal.demo_space.chat.*.*.alpha",
			"cotal.demo_space.chat.*.*.general", "cotal.demo_space.chat.*.*.zeta",
			"$KV.cotal_presence_demo_space.>", "$KV.cotal_channels_demo_space.>"}
		if !reflect.DeepEqual([]string(a.Sub.Allow), want) {
			t.Fatalf("sub allow = %v, want %v", a.Sub.Allow, want)
		}
	})
	t.Run("ok/agent without channels or role has no chat or task rows", func(t *testing.T) {
		s, err := Build(mxSpace, Agent, Params{Owner: "local", Actor: "bob", LifecycleUID: mxUID})
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range append(append([]string{}, s.Pub.Allow...), s.Sub.Allow...) {
			if strings.Contains(sub, ".chat.") || strings.Contains(sub, "svc_") || strings.Contains(sub, "STREAM.INFO.TASK") {
				t.Fatalf("channel-less, role-less agent got %q", sub)
			}
		}
		if len(s.Pub.Deny) != 9 {
			t.Fatalf("agent deny rows = %d, want 9: %v", len(s.Pub.Deny), s.Pub.Deny)
		}
	})
	t.Run("ok/callout path names the jwt after the principal", func(t *testing.T) {
		nonce := mxNonce(t, "local", "bob")
		s, err := Build(mxSpace, Agent, mxWith(mxAgent(), func(p *Params) { p.InboxNonce = nonce }))
		if err != nil {
			t.Fatal(err)
		}
		if s.JWTName != "local-bob" || s.InboxNonce != nonce {
			t.Fatalf("JWTName %q InboxNonce %q", s.JWTName, s.InboxNonce)
		}
	})
	t.Run("ok/deprovisioner target is not its principal", func(t *testing.T) {
		s, err := Build(mxSpace, Deprovisioner, Params{Owner: "local", Actor: "bob", LifecycleUID: mxUID})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(s.Tags, []string{"profile:deprovisioner"}) || s.JWTName != "deprovisioner" {
			t.Fatalf("tags %v name %q", s.Tags, s.JWTName)
		}
	})
	t.Run("ok/deprovisioner member rows only for the named channels", func(t *testing.T) {
		bare, err := Build(mxSpace, Deprovisioner, Params{Owner: "local", Actor: "bob", LifecycleUID: mxUID})
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range bare.Pub.Allow {
			if strings.Contains(row, "cotal_members_") {
				t.Fatalf("deprovisioner without member channels holds members row %q", row)
			}
		}
		s, err := Build(mxSpace, Deprovisioner, Params{Owner: "local", Actor: "bob", LifecycleUID: mxUID, MemberChannels: []string{"team.b", "team.a", "team.b"}})
		if err != nil {
			t.Fatal(err)
		}
		var members []string
		for _, row := range s.Pub.Allow {
			if strings.Contains(row, "cotal_members_") {
				members = append(members, row)
			}
		}
		key := func(ch string) string { return "$KV.cotal_members_demo_space." + ch + "/local.bob." + mxUID }
		want := []string{
			"$JS.API.STREAM.INFO.KV_cotal_members_demo_space",
			"$JS.API.DIRECT.GET.KV_cotal_members_demo_space." + key("team.a"), key("team.a"),
			"$JS.API.DIRECT.GET.KV_cotal_members_demo_space." + key("team.b"), key("team.b"),
		}
		if !slices.Equal(members, want) {
			t.Fatalf("members rows %v, want %v", members, want)
		}
		for _, other := range []string{key("team.c"), "$KV.cotal_members_demo_space.team.a/local.carol." + mxUID, "$KV.cotal_members_demo_space.team.a/local.bob.cccccccccccccccccccccccccc"} {
			if pubAllowed(s, other) {
				t.Errorf("deprovisioner may publish %q", other)
			}
		}
	})
	t.Run("ok/optional principal tags", func(t *testing.T) {
		s, err := Build(mxSpace, Probe, Params{Owner: "Local", Actor: "Bob"})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"owner:Local", "actor:Bob", "principal:Local.Bob", "profile:probe"}
		if !reflect.DeepEqual(s.Tags, want) {
			t.Fatalf("tags %v, want %v", s.Tags, want)
		}
	})
	t.Run("ok/no profile sets resp", func(t *testing.T) {
		for _, n := range All() {
			s, err := Build(mxSpace, n, mxGoldenParams[n])
			if err != nil {
				t.Fatal(err)
			}
			if s.Resp != nil {
				t.Fatalf("%s sets resp", n)
			}
		}
	})
}

// TestNonDaemonConsumerRows is issue 8's rule as data: a non-daemon profile (agent, observer,
// admin, operator) holds no consumer row that reaches another principal's consumer. Every
// consumer verb it is allowed names one consumer of its own (no '>' or '*' in the name slot), it
// never holds the legacy bare create (whose consumer name rides the body), and it holds no
// $JS.FC.> (which only push consumers use). Observer, admin and operator hold no consumer verb
// at all and deny them all.
func TestNonDaemonConsumerRows(t *testing.T) {
	own := map[Name][]string{
		Agent: {"chathist_local-bob-" + mxUID, "dm_local-bob-" + mxUID, "dlv_local-bob-" + mxUID, "svc_review"},
	}
	for _, name := range []Name{Agent, Observer, Admin, Operator} {
		t.Run("ok/"+string(name), func(t *testing.T) {
			s, err := Build(mxSpace, name, mxGoldenParams[name])
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range s.Pub.Allow {
				if row == "$JS.FC.>" {
					t.Fatalf("%s holds %s", name, row)
				}
				consumerRow := strings.HasPrefix(row, "$JS.API.CONSUMER.") || strings.HasPrefix(row, "$JS.ACK.")
				if !consumerRow {
					continue
				}
				tok := strings.Split(row, ".")
				// $JS.API.CONSUMER.<VERB>[.<VERB2>].<stream>.<consumer>...; $JS.ACK.<stream>.<consumer>...
				i := 5
				switch {
				case tok[1] == "ACK":
					i = 3
				case tok[3] == "MSG" || tok[3] == "DURABLE":
					i = 6
				}
				if len(tok) <= i {
					t.Fatalf("%s holds %s, which names no consumer", name, row)
				}
				if !slices.Contains(own[name], tok[i]) {
					t.Fatalf("%s holds %s, on consumer %q that is not its own %v", name, row, tok[i], own[name])
				}
			}
			if name == Agent {
				return
			}
			for _, want := range []string{"$JS.API.CONSUMER.>", "$JS.ACK.>"} {
				if !slices.Contains(s.Pub.Deny, want) {
					t.Fatalf("%s does not deny %s: %v", name, want, s.Pub.Deny)
				}
			}
		})
	}
}

// TestOnlyOwnersTouchDurables is issue 8's ownership rule as data, over every profile: only
// delivery may fetch from, ack on, create (and so rewrite) or delete fanout and reader; a member's
// dm_ and dlv_ durables are fetched and acked only by that member's agent, deleted only by the
// deprovisioner naming it, and created only by the provisioner, which pre-creates them. A
// publish is allowed when an allow row matches it and no deny row does, as the broker decides.
func TestOnlyOwnersTouchDurables(t *testing.T) {
	const tk = "demo_space"
	bob := "local-bob-" + mxUID
	other := "local-carol-" + mxUID
	verbs := func(stream, consumer string) map[string]string {
		return map[string]string{
			"next":           "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
			"ack":            "$JS.ACK." + stream + "." + consumer + ".1.1.1.0.0",
			"delete":         "$JS.API.CONSUMER.DELETE." + stream + "." + consumer,
			"create":         "$JS.API.CONSUMER.CREATE." + stream + "." + consumer,
			"create-filter":  "$JS.API.CONSUMER.CREATE." + stream + "." + consumer + ".cotal." + tk + ".x",
			"durable-create": "$JS.API.CONSUMER.DURABLE.CREATE." + stream + "." + consumer,
		}
	}
	targets := []struct {
		stream, consumer string
		may              map[Name][]string // profile -> verbs it may use
	}{
		{"CHAT_" + tk, "fanout", map[Name][]string{Delivery: {"next", "ack", "delete", "create", "create-filter", "durable-create"}}},
		// deliveryd creates reader with a filter on the subject or by the legacy durable form.
		{"INBOX_" + tk, "reader", map[Name][]string{Delivery: {"next", "ack", "delete", "create-filter", "durable-create"}}},
		{"DM_" + tk, "dm_" + bob, map[Name][]string{Agent: {"next", "ack"}, Deprovisioner: {"delete"}, Provisioner: {"create", "create-filter", "durable-create"}}},
		{"DLV_" + tk, "dlv_" + bob, map[Name][]string{Agent: {"next", "ack"}, Deprovisioner: {"delete"}, Provisioner: {"create", "create-filter", "durable-create"}}},
		{"DM_" + tk, "dm_" + other, map[Name][]string{Provisioner: {"create", "create-filter", "durable-create"}}},
		{"DLV_" + tk, "dlv_" + other, map[Name][]string{Provisioner: {"create", "create-filter", "durable-create"}}},
	}
	for _, name := range All() {
		if name.Account() != AccountData {
			continue // the AUTH account has no JetStream
		}
		s, err := Build(mxSpace, name, mxGoldenParams[name])
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			for verb, subject := range verbs(tg.stream, tg.consumer) {
				want := slices.Contains(tg.may[name], verb)
				if got := pubAllowed(s, subject); got != want {
					t.Errorf("%s %s on %s: allowed %v, want %v", name, verb, tg.consumer, got, want)
				}
			}
		}
	}
}

func pubAllowed(s *Spec, subject string) bool {
	match := func(rows []string) bool {
		return slices.ContainsFunc(rows, func(p string) bool { return subjectMatch(p, subject) })
	}
	return match(s.Pub.Allow) && !match(s.Pub.Deny)
}

// subjectMatch reports whether the literal subject matches the NATS pattern ('*' one token,
// a trailing '>' one or more).
func subjectMatch(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// TestRetirementRequesterParams: the retirement requester takes exactly a manager serve principal,
// its lifecycle uid and a target of the same owner; every other profile refuses a target.
func TestRetirementRequesterParams(t *testing.T) {
	good := mxGoldenParams[RetirementRequester]
	with := func(f func(*Params)) Params {
		p := good
		tg := *good.Target
		p.Target = &tg
		f(&p)
		return p
	}
	t.Run("ok/golden", func(t *testing.T) {
		s, err := Build(mxSpace, RetirementRequester, good)
		if err != nil {
			t.Fatal(err)
		}
		want := "cotal.demo_space.ep.one.auth.retire-lifecycle.handle.local.bob.cccccccccccccccccccccccccc.local.manager_serve_" + mxIID + "." + mxUID + ".*"
		if !slices.Equal(s.Pub.Allow, []string{want}) || !slices.Equal(s.Sub.Allow, []string{want + ".reply"}) || len(s.Pub.Deny)+len(s.Sub.Deny) != 0 {
			t.Fatalf("pub %v sub %v", s.Pub, s.Sub)
		}
	})
	t.Run("ok/build copies the target", func(t *testing.T) {
		p := with(func(*Params) {})
		s, err := Build(mxSpace, RetirementRequester, p)
		if err != nil {
			t.Fatal(err)
		}
		p.Target.Actor = "mallory"
		if strings.Contains(strings.Join(s.Pub.Allow, " "), "mallory") {
			t.Fatal("the spec follows a change to the caller's target")
		}
	})
	for _, tc := range []struct {
		name  string
		p     Params
		field string
	}{
		{"fail/no target", with(func(p *Params) { p.Target = nil }), "Target"},
		{"fail/no caller uid", with(func(p *Params) { p.LifecycleUID = "" }), "LifecycleUID"},
		{"fail/empty target", with(func(p *Params) { p.Target = &RetirementTarget{} }), "Target.Owner"},
		{"fail/caller not a serve actor", with(func(p *Params) { p.Actor = "manager" }), "Actor"},
		{"fail/caller a supervisor actor", with(func(p *Params) { p.Actor = "manager_" + mxIID }), "Actor"},
		{"fail/caller serve actor with a short instance", with(func(p *Params) { p.Actor = "manager_serve_abc" }), "Actor"},
		{"fail/caller serve actor behind a prefix", with(func(p *Params) { p.Actor = "x_manager_serve_" + mxIID }), "Actor"},
		{"fail/target of another owner", with(func(p *Params) { p.Target.Owner = "other" }), "Target.Owner"},
		{"fail/target actor wildcard", with(func(p *Params) { p.Target.Actor = "*" }), "Target.Actor"},
		{"fail/target actor dotted", with(func(p *Params) { p.Target.Actor = "a.b" }), "Target.Actor"},
		{"fail/target uid short", with(func(p *Params) { p.Target.LifecycleUID = "abc" }), "Target.LifecycleUID"},
		{"fail/target uid upper case", with(func(p *Params) { p.Target.LifecycleUID = strings.ToUpper(mxUID) }), "Target.LifecycleUID"},
		{"fail/inbox nonce", with(func(p *Params) { p.InboxNonce = mxNonce(t, p.Owner, p.Actor) }), "InboxNonce"},
		{"fail/role", with(func(p *Params) { p.Role = "review" }), "Role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(mxSpace, RetirementRequester, tc.p)
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field {
				t.Fatalf("Build = %v, want a *ParamError on %s", err, tc.field)
			}
		})
	}
	for _, name := range All() {
		if name == RetirementRequester {
			continue
		}
		t.Run("fail/"+string(name)+" refuses a target", func(t *testing.T) {
			p := mxGoldenParams[name]
			p.Target = &RetirementTarget{Owner: "local", Actor: "bob", LifecycleUID: mxUID}
			_, err := Build(mxSpace, name, p)
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != "Target" {
				t.Fatalf("Build = %v, want a *ParamError on Target", err)
			}
		})
	}
}

// TestLifecycleAuthorityRowsOnlyAuthPlane is issue 23's "authd is the only writer" as data: over
// every data-account profile (the rails and buckets live in the data account; the AUTH account's
// callout user may publish anything there, which reaches none of them), only auth-plane may write
// a lifecycle key, read the lifecycle buckets or serve an auth rail, and only the retirement
// requester and the supervisor may call a rail. auth-plane's one other subscribe row is its own
// delivery-admin reply lane (issue 25).
func TestLifecycleAuthorityRowsOnlyAuthPlane(t *testing.T) {
	const tk = "demo_space"
	authd := map[string]string{
		"gate":     "$KV.cotal_auth_" + tk + ".gate." + mxUID,
		"stage":    "$KV.cotal_auth_" + tk + ".stage." + mxUID,
		"epgate":   "$KV.cotal_auth_" + tk + ".epgate.manager." + mxIID,
		"head":     "$KV.cotal_records_" + tk + ".lifecycle.local.bob",
		"uid":      "$KV.cotal_records_" + tk + ".uid." + mxUID,
		"frontier": "$KV.cotal_records_" + tk + ".frontier." + mxUID,
		"spec":     "$KV.cotal_records_" + tk + ".svc.manager." + mxIID,
		"auth get": "$JS.API.STREAM.MSG.GET.KV_cotal_auth_" + tk,
		"rec get":  "$JS.API.STREAM.MSG.GET.KV_cotal_records_" + tk,
		"answer":   "cotal." + tk + ".ep.one.auth.register-manager.local.manager.n1.reply",
		// Seed 002's service endpoint rows (issue 24).
		"sep name":     "$KV.cotal_auth_" + tk + ".sep.name.billing_api-v2",
		"sep ledger":   "$KV.cotal_auth_" + tk + ".sep.req.billing_api-v2." + mxSvcIID,
		"sep proposal": "$KV.cotal_auth_" + tk + ".sep.prop.billing_api-v2." + mxSvcIID,
		"sep root":     "$KV.cotal_auth_" + tk + ".sep.root.billing_api-v2." + mxSvcIID,
		"sep artifact": "$KV.cotal_auth_" + tk + ".sep.art." + strings.Repeat("ab", 32),
	}
	register := "cotal." + tk + ".ep.one.auth.register-manager.local.manager.n1"
	retire := "cotal." + tk + ".ep.one.auth.retire-lifecycle.handle.local.bob.cccccccccccccccccccccccccc.local.manager_serve_" + mxIID + "." + mxUID + ".n1"
	for _, name := range All() {
		if name.Account() != AccountData {
			continue
		}
		t.Run("ok/"+string(name), func(t *testing.T) {
			s, err := Build(mxSpace, name, mxGoldenParams[name])
			if err != nil {
				t.Fatal(err)
			}
			for what, subj := range authd {
				if got := pubAllowed(s, subj); got != (name == AuthPlane) {
					t.Errorf("%s publishes %s (%s): %v", name, what, subj, got)
				}
			}
			if got := pubAllowed(s, register); got != (name == Supervisor) {
				t.Errorf("%s requests register-manager: %v", name, got)
			}
			if got := pubAllowed(s, retire); got != (name == RetirementRequester) {
				t.Errorf("%s requests retire-lifecycle: %v", name, got)
			}
			for _, row := range s.Sub.Allow {
				// Issue 25: auth-plane (local.authd) also hears its own delivery-admin reply
				// lane, for lifecycleMemberships; no rail.
				if name == AuthPlane && row == "cotal."+tk+".ctl.delivery-admin.local.authd.reply.*" {
					continue
				}
				subj, _, queued := strings.Cut(row, " ")
				serves := subjectMatch(subj, register) || subjectMatch(subj, retire)
				if serves != (name == AuthPlane) || queued != (name == AuthPlane) {
					t.Errorf("%s subscribe row %q: serves a rail %v, queue-pinned %v", name, row, serves, queued)
				}
			}
		})
	}
}
