package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/profiles"
)

const decidePolicy = `version: 1
callers:
  - id: spiffe://td/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 10, burst: 2}
    profiles:
      agent:
        ttl_max: 1h
        owners: [alice]
        channels: ["general", "team.*", "proj.>"]
        exclude_channels: ["team.secret", "proj.x.>"]
        roles: [reviewer]
        capabilities: [spawn]
      supervisor: {ttl_max: 24h, any_owner: true, remint: any}
      provisioner: {ttl_max: 5m, remint: none}
  - id: spiffe://td/managerd/special
    rpcs: [GetSpace]
    spaces: [gamma]
    rate: {per_second: 1, burst: 1}
  - id: spiffe://td/*/ops
    rpcs: [GetSpace, GetJWKS]
    spaces: ["*"]
    exclude_spaces: ["prod.eu"]
    rate: {per_second: 3, burst: 4}
  - id: spiffe://td/authd/*
    rpcs: [SignCalloutResponse, GetSpace]
    spaces: [alpha, "team one"]
    rate: {per_second: 1, burst: 1}
    profiles:
      agent: {ttl_max: 2h, any_owner: true, channels: [">"]}
`

func TestDecide(t *testing.T) {
	p := mustParse(t, decidePolicy)
	const (
		mgrAlpha = "spiffe://td/managerd/alpha"
		mgrRule  = "spiffe://td/managerd/{space}"
		opsRule  = "spiffe://td/*/ops"
		authRule = "spiffe://td/authd/*"
	)
	mint := func(params profiles.Params) Request {
		return Request{Caller: mgrAlpha, RPC: RPCMint, Space: "alpha", Profile: profiles.Agent, TTL: 30 * time.Minute, Params: params}
	}
	good := profiles.Params{
		Owner: "alice", Actor: "bot", LifecycleUID: "abcdefghijklmnopqrstuvwxyz",
		Role: "reviewer", Subscribe: []string{"general"}, AllowSubscribe: []string{"general", "team.a", "proj.y.z"},
		AllowPublish: []string{"team.b"}, Capabilities: []string{"spawn"},
	}
	with := func(f func(*profiles.Params)) Request {
		pp := good
		f(&pp)
		return mint(pp)
	}
	remint := func(profile profiles.Name, minter string) Request {
		return Request{Caller: mgrAlpha, RPC: RPCRemint, Space: "alpha", Profile: profile, Minter: minter}
	}

	for _, tc := range []struct {
		name   string
		req    Request
		want   Reason
		rule   string        // want Decision.Caller
		cap    time.Duration // want Decision.TTLCap
		detail string        // substring of Detail
	}{
		// Allowed.
		{"ok/mint-full-params", mint(good), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/mint-no-params", mint(profiles.Params{}), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/mint-ttl-above-cap-is-capped-not-denied", func() Request { r := mint(good); r.TTL = 100 * time.Hour; return r }(), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/mint-ttl-zero-default", func() Request { r := mint(good); r.TTL = 0; return r }(), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/mint-wildcard-covered", with(func(p *profiles.Params) { p.AllowSubscribe = []string{"proj.y.*", "proj.y.>"} }), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/any-owner", Request{Caller: mgrAlpha, RPC: RPCMint, Space: "alpha", Profile: profiles.Supervisor, Params: profiles.Params{Owner: "zed"}}, ReasonAllowed, mgrRule, 24 * time.Hour, ""},
		{"ok/get-space-no-profile-checks", Request{Caller: mgrAlpha, RPC: RPCGetSpace, Space: "alpha", Profile: "bogus", TTL: -1}, ReasonAllowed, mgrRule, 0, ""},
		{"ok/remint-own", remint(profiles.Agent, mgrAlpha), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/remint-any", remint(profiles.Supervisor, "spiffe://td/managerd/beta"), ReasonAllowed, mgrRule, 24 * time.Hour, ""},
		{"ok/remint-params-within-rule", func() Request {
			r := remint(profiles.Agent, mgrAlpha)
			r.Params = good
			return r
		}(), ReasonAllowed, mgrRule, time.Hour, ""},
		{"ok/callout-any-channel", Request{Caller: "spiffe://td/authd/a1", RPC: RPCSignCalloutResponse, Space: "alpha", Profile: profiles.Agent,
			Params: profiles.Params{Owner: "u_x", AllowPublish: []string{"deep.a.b.c"}}}, ReasonAllowed, authRule, 2 * time.Hour, ""},
		{"ok/callout-refusal-mints-nothing", Request{Caller: "spiffe://td/authd/a1", RPC: RPCSignCalloutResponse, Space: "alpha"}, ReasonAllowed, authRule, 0, ""},
		{"ok/space-name-with-space", Request{Caller: "spiffe://td/authd/a1", RPC: RPCGetSpace, Space: "team one"}, ReasonAllowed, authRule, 0, ""},
		{"ok/space-any", Request{Caller: "spiffe://td/x/ops", RPC: RPCGetJWKS, Space: "whatever"}, ReasonAllowed, opsRule, 0, ""},
		{"ok/space-bound-by-token", Request{Caller: "spiffe://td/managerd/team_one", RPC: RPCGetSpace, Space: "team one"}, ReasonAllowed, mgrRule, 0, ""},

		// caller-unknown.
		{"fail/caller-unlisted", Request{Caller: "spiffe://td/nobody", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-other-trust-domain", Request{Caller: "spiffe://evil/managerd/alpha", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-extra-segment", Request{Caller: "spiffe://td/managerd/alpha/x", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-too-few-segments", Request{Caller: "spiffe://td/managerd", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-empty", Request{RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-malformed", Request{Caller: "spiffe://td/managerd/al*pha", RPC: RPCGetSpace, Space: "al*pha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-is-pattern-text", Request{Caller: "spiffe://td/managerd/{space}", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-uppercase-td", Request{Caller: "spiffe://TD/managerd/alpha", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},
		{"fail/caller-query", Request{Caller: "spiffe://td/managerd/alpha?x", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown, "", 0, ""},

		// rpc-not-allowed.
		{"fail/rpc-unlisted", Request{Caller: mgrAlpha, RPC: RPCSignBearer, Space: "alpha"}, ReasonRPCNotAllowed, mgrRule, 0, `"SignBearer"`},
		{"fail/rpc-unknown", Request{Caller: mgrAlpha, RPC: "DumpSeeds", Space: "alpha"}, ReasonRPCNotAllowed, mgrRule, 0, ""},
		{"fail/rpc-empty", Request{Caller: mgrAlpha, Space: "alpha"}, ReasonRPCNotAllowed, mgrRule, 0, ""},

		// space-not-allowed.
		{"fail/space-bound-other", Request{Caller: mgrAlpha, RPC: RPCGetSpace, Space: "beta"}, ReasonSpaceNotAllowed, mgrRule, 0, `"beta"`},
		{"fail/space-bound-mint-other", func() Request { r := mint(good); r.Space = "beta"; return r }(), ReasonSpaceNotAllowed, mgrRule, 0, ""},
		{"fail/space-empty", Request{Caller: mgrAlpha, RPC: RPCGetSpace}, ReasonSpaceNotAllowed, mgrRule, 0, "no space"},
		{"fail/space-empty-any", Request{Caller: "spiffe://td/x/ops", RPC: RPCGetSpace}, ReasonSpaceNotAllowed, opsRule, 0, ""},
		{"fail/space-unlisted", Request{Caller: "spiffe://td/authd/a1", RPC: RPCGetSpace, Space: "beta"}, ReasonSpaceNotAllowed, authRule, 0, ""},
		{"fail/space-listed-name-other-spelling", Request{Caller: "spiffe://td/authd/a1", RPC: RPCGetSpace, Space: "team_one"}, ReasonSpaceNotAllowed, authRule, 0, ""},
		{"fail/space-excluded", Request{Caller: "spiffe://td/x/ops", RPC: RPCGetSpace, Space: "prod.eu"}, ReasonSpaceNotAllowed, opsRule, 0, ""},
		{"fail/space-excluded-by-token", Request{Caller: "spiffe://td/x/ops", RPC: RPCGetSpace, Space: "prod_eu"}, ReasonSpaceNotAllowed, opsRule, 0, ""},

		// profile-not-allowed.
		{"fail/profile-unlisted", func() Request { r := mint(good); r.Profile = profiles.Admin; return r }(), ReasonProfileNotAllowed, mgrRule, 0, `"admin"`},
		{"fail/profile-empty", func() Request { r := mint(good); r.Profile = ""; return r }(), ReasonProfileNotAllowed, mgrRule, 0, ""},
		{"fail/profile-empty-remint", remint("", mgrAlpha), ReasonProfileNotAllowed, mgrRule, 0, ""},
		{"fail/profile-callout-unlisted", Request{Caller: "spiffe://td/authd/a1", RPC: RPCSignCalloutResponse, Space: "alpha", Profile: profiles.Admin}, ReasonProfileNotAllowed, authRule, 0, ""},
		{"fail/profile-remint-unlisted", remint(profiles.Delivery, mgrAlpha), ReasonProfileNotAllowed, mgrRule, 0, ""},

		// ttl-invalid.
		{"fail/ttl-negative", func() Request { r := mint(good); r.TTL = -time.Second; return r }(), ReasonTTLInvalid, mgrRule, time.Hour, ""},
		{"fail/ttl-negative-remint", func() Request { r := remint(profiles.Agent, mgrAlpha); r.TTL = -time.Second; return r }(), ReasonTTLInvalid, mgrRule, time.Hour, ""},

		// owner-not-allowed.
		{"fail/owner-unlisted", with(func(p *profiles.Params) { p.Owner = "bob" }), ReasonOwnerNotAllowed, mgrRule, time.Hour, `"bob"`},
		{"fail/owner-case", with(func(p *profiles.Params) { p.Owner = "Alice" }), ReasonOwnerNotAllowed, mgrRule, time.Hour, ""},

		// channel-not-allowed.
		{"fail/channel-unlisted-publish", with(func(p *profiles.Params) { p.AllowPublish = []string{"random"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, `allow_publish channel "random"`},
		{"fail/channel-unlisted-subscribe", with(func(p *profiles.Params) { p.Subscribe = []string{"other"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, "subscribe"},
		{"fail/channel-star-is-one-token", with(func(p *profiles.Params) { p.AllowSubscribe = []string{"team.a.b"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		{"fail/channel-tail-needs-a-token", with(func(p *profiles.Params) { p.AllowSubscribe = []string{"proj"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		{"fail/channel-excluded", with(func(p *profiles.Params) { p.AllowPublish = []string{"team.secret"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		{"fail/channel-excluded-subtree", with(func(p *profiles.Params) { p.AllowSubscribe = []string{"proj.x.y"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		{"fail/channel-wildcard-reaches-excluded", with(func(p *profiles.Params) {
			p.AllowSubscribe = []string{"team.*"}
			p.Subscribe = nil
			p.AllowPublish = nil
		}), ReasonChannelNotAllowed, mgrRule, time.Hour, `"team.*"`},
		{"fail/channel-wider-than-rule", with(func(p *profiles.Params) { p.AllowSubscribe = []string{">"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		// A last-token '*' reaches the subtree on the broker (space.ChannelReach): proj.* reaches
		// proj.x.y, which the rule excludes, though proj.* alone would not touch proj.x.>.
		{"fail/channel-trailing-star-reaches-excluded-subtree", with(func(p *profiles.Params) {
			p.AllowSubscribe = []string{"proj.*"}
			p.Subscribe = nil
		}), ReasonChannelNotAllowed, mgrRule, time.Hour, `"proj.*"`},
		{"fail/channel-malformed", with(func(p *profiles.Params) { p.AllowSubscribe = []string{"team. a"} }), ReasonChannelNotAllowed, mgrRule, time.Hour, "malformed"},
		{"fail/channel-empty", with(func(p *profiles.Params) { p.AllowPublish = []string{""} }), ReasonChannelNotAllowed, mgrRule, time.Hour, ""},
		{"fail/channel-none-allowed", Request{Caller: mgrAlpha, RPC: RPCMint, Space: "alpha", Profile: profiles.Supervisor,
			Params: profiles.Params{AllowPublish: []string{"general"}}}, ReasonChannelNotAllowed, mgrRule, 24 * time.Hour, ""},

		// role-not-allowed and capability-not-allowed.
		{"fail/role-unlisted", with(func(p *profiles.Params) { p.Role = "admin" }), ReasonRoleNotAllowed, mgrRule, time.Hour, `"admin"`},
		{"fail/role-none-allowed", Request{Caller: mgrAlpha, RPC: RPCMint, Space: "alpha", Profile: profiles.Supervisor,
			Params: profiles.Params{Role: "reviewer"}}, ReasonRoleNotAllowed, mgrRule, 24 * time.Hour, ""},
		{"fail/capability-unlisted", with(func(p *profiles.Params) { p.Capabilities = []string{"spawn", "admin"} }), ReasonCapabilityNotAllowed, mgrRule, time.Hour, `"admin"`},

		{"fail/callout-capability-unlisted", Request{Caller: "spiffe://td/authd/a1", RPC: RPCSignCalloutResponse, Space: "alpha", Profile: profiles.Agent,
			Params: profiles.Params{Owner: "u_x", Capabilities: []string{"spawn"}}}, ReasonCapabilityNotAllowed, authRule, 2 * time.Hour, ""},

		// remint.
		// Remint re-checks the credential's parameters under the policy in force (issue 7, 6).
		{"fail/remint-params-rechecked-owner", func() Request {
			r := remint(profiles.Agent, mgrAlpha)
			r.Params = profiles.Params{Owner: "mallory", Actor: "a"}
			return r
		}(), ReasonOwnerNotAllowed, mgrRule, time.Hour, `"mallory"`},
		{"fail/remint-params-rechecked-channel", func() Request {
			r := remint(profiles.Agent, mgrAlpha)
			r.Params = good
			r.Params.AllowPublish = []string{"team.secret"}
			return r
		}(), ReasonChannelNotAllowed, mgrRule, time.Hour, `"team.secret"`},
		{"fail/remint-none", remint(profiles.Provisioner, mgrAlpha), ReasonRemintNotAllowed, mgrRule, 5 * time.Minute, ""},
		{"fail/remint-foreign", remint(profiles.Agent, "spiffe://td/managerd/beta"), ReasonRemintForeignMinter, mgrRule, time.Hour, ""},
		{"fail/remint-minter-unknown", remint(profiles.Agent, ""), ReasonRemintForeignMinter, mgrRule, time.Hour, ""},

		// precedence.
		{"ok/exact-wins-over-pattern", Request{Caller: "spiffe://td/managerd/special", RPC: RPCGetSpace, Space: "gamma"}, ReasonAllowed, "spiffe://td/managerd/special", 0, ""},
		{"fail/exact-wins-even-when-pattern-would-allow", Request{Caller: "spiffe://td/managerd/special", RPC: RPCGetSpace, Space: "special"}, ReasonSpaceNotAllowed, "spiffe://td/managerd/special", 0, ""},
		{"fail/first-pattern-wins", Request{Caller: "spiffe://td/authd/ops", RPC: RPCSignCalloutResponse, Space: "alpha", Profile: profiles.Agent}, ReasonRPCNotAllowed, opsRule, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Decide(tc.req)
			if d.Reason != tc.want || d.Allow != (tc.want == ReasonAllowed) {
				t.Fatalf("Decide = %+v, want reason %s", d, tc.want)
			}
			if d.Caller != tc.rule {
				t.Errorf("Caller = %q, want %q", d.Caller, tc.rule)
			}
			if d.TTLCap != tc.cap {
				t.Errorf("TTLCap = %v, want %v", d.TTLCap, tc.cap)
			}
			if d.Allow && d.Detail != "" {
				t.Errorf("allowed with Detail %q", d.Detail)
			}
			if !d.Allow && d.Detail == "" {
				t.Error("denied without Detail")
			}
			if !strings.Contains(d.Detail, tc.detail) {
				t.Errorf("Detail = %q, want it to contain %q", d.Detail, tc.detail)
			}
			// Explain must agree with Decide.
			e := p.Explain(tc.req)
			if e.Decision != d {
				t.Errorf("Explain decision %+v != Decide %+v", e.Decision, d)
			}
			if (e.Rule == nil) != (tc.rule == "") || (e.Rule != nil && e.Rule.ID != tc.rule) {
				t.Errorf("Explain rule = %+v, want id %q", e.Rule, tc.rule)
			}
		})
	}
}

func TestDecideBinding(t *testing.T) {
	p := mustParse(t, decidePolicy)
	for _, tc := range []struct {
		caller, space string
		allow         bool
	}{
		{"spiffe://td/managerd/alpha", "alpha", true},
		{"spiffe://td/managerd/alpha", "beta", false},
		{"spiffe://td/managerd/beta", "beta", true},
		{"spiffe://td/managerd/beta", "alpha", false},
		{"spiffe://td/managerd/a_b", "a.b", true}, // same token, same account
		{"spiffe://td/managerd/a.b", "a.b", false},
		{"spiffe://td/managerd/_", "", false},
	} {
		name := "fail/"
		if tc.allow {
			name = "ok/"
		}
		t.Run(name+tc.caller+"@"+tc.space, func(t *testing.T) {
			d := p.Decide(Request{Caller: tc.caller, RPC: RPCGetSpace, Space: tc.space})
			if d.Allow != tc.allow {
				t.Errorf("Decide = %+v, want allow=%v", d, tc.allow)
			}
		})
	}
	e := p.Explain(Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCGetSpace, Space: "alpha"})
	if e.BoundSpace != "alpha" {
		t.Errorf("BoundSpace = %q, want alpha", e.BoundSpace)
	}
}

func TestDecideNilPolicy(t *testing.T) {
	var p *Policy
	if d := p.Decide(Request{Caller: "spiffe://td/x", RPC: RPCGetSpace, Space: "a"}); d.Allow || d.Reason != ReasonCallerUnknown {
		t.Errorf("nil policy Decide = %+v", d)
	}
	if _, _, ok := p.Rate("spiffe://td/x"); ok {
		t.Error("nil policy has a rate")
	}
	if p.Rules() != nil || p.Digest() != "" {
		t.Error("nil policy has rules or a digest")
	}
	if d := (&Policy{}).Decide(Request{Caller: "spiffe://td/x", RPC: RPCGetSpace, Space: "a"}); d.Allow {
		t.Errorf("zero policy allows: %+v", d)
	}
}

func TestPolicyRateAndMatch(t *testing.T) {
	p := mustParse(t, decidePolicy)
	for _, tc := range []struct {
		caller string
		ps     float64
		burst  int
		ok     bool
	}{
		{"spiffe://td/managerd/alpha", 10, 2, true},
		{"spiffe://td/managerd/special", 1, 1, true},
		{"spiffe://td/any/ops", 3, 4, true},
		{"spiffe://td/unknown", 0, 0, false},
		{"not a spiffe id", 0, 0, false},
	} {
		ps, burst, ok := p.Rate(tc.caller)
		if ps != tc.ps || burst != tc.burst || ok != tc.ok {
			t.Errorf("Rate(%q) = %v, %v, %v; want %v, %v, %v", tc.caller, ps, burst, ok, tc.ps, tc.burst, tc.ok)
		}
		if _, ok := p.Match(tc.caller); ok != tc.ok {
			t.Errorf("Match(%q) ok = %v", tc.caller, ok)
		}
	}
}

func TestDetailTruncatesEcho(t *testing.T) {
	p := mustParse(t, decidePolicy)
	d := p.Decide(Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCGetSpace, Space: "alpha" + strings.Repeat("x", 1000)})
	if d.Reason != ReasonSpaceNotAllowed || len(d.Detail) > 200 {
		t.Errorf("Decide = %+v (detail %d bytes)", d, len(d.Detail))
	}
}

func TestReasonsAndRPCs(t *testing.T) {
	seen := map[Reason]bool{}
	for _, r := range Reasons() {
		if seen[r] || r == "" || strings.ToLower(string(r)) != string(r) {
			t.Errorf("reason %q duplicate, empty or not lower-case", r)
		}
		seen[r] = true
	}
	if len(seen) != 13 {
		t.Errorf("%d reasons, want 13", len(seen))
	}
	var profileRPCs []RPC
	for _, r := range RPCs() {
		if !r.Valid() {
			t.Errorf("%s not valid", r)
		}
		if r.TakesProfile() {
			profileRPCs = append(profileRPCs, r)
		}
	}
	if len(RPCs()) != 10 || len(profileRPCs) != 3 {
		t.Errorf("RPCs = %v, profile RPCs = %v", RPCs(), profileRPCs)
	}
	if RPC("mint").Valid() {
		t.Error("RPC names are case-sensitive")
	}
}

// TestAdmit: Admit judges caller, RPC and space only, with the denial Decide would give, so the
// server can ask it before it reads anything that depends on the space existing.
func TestAdmit(t *testing.T) {
	p := mustParse(t, decidePolicy)
	for _, tc := range []struct {
		name string
		req  Request
		want Reason
	}{
		{"ok/remint-own-space-no-profile", Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCRemint, Space: "alpha"}, ReasonAllowed},
		{"ok/profile-and-params-ignored", Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCRemint, Space: "alpha", Profile: "bogus", TTL: -1,
			Params: profiles.Params{Owner: "mallory"}}, ReasonAllowed},
		{"fail/caller-unknown", Request{Caller: "spiffe://td/nobody", RPC: RPCRemint, Space: "alpha"}, ReasonCallerUnknown},
		{"fail/rpc-not-allowed", Request{Caller: "spiffe://td/managerd/special", RPC: RPCRemint, Space: "gamma"}, ReasonRPCNotAllowed},
		{"fail/other-space", Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCRemint, Space: "beta"}, ReasonSpaceNotAllowed},
		{"fail/no-space", Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCRemint}, ReasonSpaceNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Admit(tc.req)
			if d.Reason != tc.want || d.Allow != (tc.want == ReasonAllowed) {
				t.Fatalf("Admit = %+v, want %s", d, tc.want)
			}
			if !d.Allow {
				if full := p.Decide(tc.req); full.Reason != d.Reason || full.Detail != d.Detail {
					t.Fatalf("Admit denied %+v, Decide %+v", d, full)
				}
			}
		})
	}
	var nilPolicy *Policy
	if d := nilPolicy.Admit(Request{Caller: "spiffe://td/managerd/alpha", RPC: RPCRemint, Space: "alpha"}); d.Allow || d.Reason != ReasonCallerUnknown {
		t.Fatalf("nil policy Admit = %+v", d)
	}
}
