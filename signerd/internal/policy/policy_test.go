package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/profiles"
)

// callers wraps caller entries in a version-1 policy.
func callers(body string) string { return "version: 1\ncallers:\n" + body }

// readOnly is a minimal valid entry that takes no profile.
const readOnly = `  - id: spiffe://td/reader
    rpcs: [GetSpace]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
`

// retirementParams are a retirement requester's parameters: manager instance i…i's serve
// principal of owner local, asking to retire local.bob.
var retirementParams = profiles.Params{Owner: "local", Actor: "manager_serve_iiiiiiiiiiiiiiiiiiiiiiiiii", LifecycleUID: "mmmmmmmmmmmmmmmmmmmmmmmmmm",
	Target: &profiles.RetirementTarget{Owner: "local", Actor: "bob", LifecycleUID: "abcdefghijklmnopqrstuvwxyz"}}

// serviceServeParams are a service-serve grant's parameters: instance s…s of endpoint billing.api
// for a derived owner.
// remoteManagerParams are a remote manager instance's supervisor (issue 25).
var remoteManagerParams = profiles.Params{Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "manager_bbbbbbbbbbbbbbbbbbbbbbbbbb",
	InstanceID: "bbbbbbbbbbbbbbbbbbbbbbbbbb"}

var serviceServeParams = profiles.Params{Owner: "u_abcdefghijklmnopqrstuvwxyz", ServiceEndpoint: "billing.api",
	InstanceID: "ssssssssssssssssssssssssss"}

func TestParseExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(data)
	if err != nil {
		t.Fatalf("example.yaml: %v", err)
	}
	rules := p.Rules()
	if len(rules) != 5 {
		t.Fatalf("rules = %d, want 5", len(rules))
	}
	mgr := rules[0]
	if mgr.ID != "spiffe://cotal.local/managerd/{space}" || !mgr.Pattern || mgr.Index != 0 || mgr.Line != 7 {
		t.Errorf("rule 0 = %+v", mgr)
	}
	agent := mgr.Profiles[profiles.Agent]
	if agent.TTLMax != 24*time.Hour || agent.Remint != RemintOwn || agent.AnyOwner ||
		!slices.Equal(agent.Owners, []string{"local", "alice"}) ||
		!slices.Equal(agent.ExcludeChannels, []string{"team.secrets"}) {
		t.Errorf("agent rule = %+v", agent)
	}
	if got := mgr.Profiles[profiles.Provisioner].Remint; got != RemintNone {
		t.Errorf("provisioner remint = %q, want none", got)
	}
	if got := mgr.Profiles[profiles.Supervisor].Remint; got != RemintOwn {
		t.Errorf("supervisor remint = %q, want the default own", got)
	}
	if rules[3].Pattern || rules[3].Rate != (Rate{PerSecond: 1, Burst: 5}) {
		t.Errorf("monitor rule = %+v", rules[3])
	}
	if len(p.Digest()) != 64 {
		t.Errorf("digest %q is not hex SHA-256", p.Digest())
	}

	// The example's comments promise these outcomes; hold the file to them.
	for _, tc := range []struct {
		name string
		req  Request
		want Reason
	}{
		{"ok/manager-own-space", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.Agent,
			Params: profiles.Params{Owner: "alice", AllowPublish: []string{"team.build"}, Capabilities: []string{"spawn"}}}, ReasonAllowed},
		{"fail/manager-other-space", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCGetSpace, Space: "beta"}, ReasonSpaceNotAllowed},
		{"fail/manager-excluded-channel", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.Agent,
			Params: profiles.Params{Owner: "alice", AllowSubscribe: []string{"team.secrets"}}}, ReasonChannelNotAllowed},
		{"fail/manager-mac", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMac, Space: "alpha"}, ReasonRPCNotAllowed},
		{"ok/authd-mac", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCMac, Space: "alpha"}, ReasonAllowed},
		{"ok/authd-retirement-requester", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.RetirementRequester,
			Params: retirementParams}, ReasonAllowed},
		{"fail/authd-remints-retirement-requester", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCRemint, Space: "alpha", Profile: profiles.RetirementRequester,
			Params: retirementParams, Minter: "spiffe://cotal.local/authd/alpha"}, ReasonRemintNotAllowed},
		{"fail/manager-retirement-requester", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.RetirementRequester,
			Params: retirementParams}, ReasonProfileNotAllowed},
		{"fail/deliveryd-retirement-requester", Request{Caller: "spiffe://cotal.local/deliveryd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.RetirementRequester,
			Params: retirementParams}, ReasonProfileNotAllowed},
		{"ok/authd-remote-manager", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.RemoteManager,
			TTL: 24 * time.Hour, Params: remoteManagerParams}, ReasonAllowed},
		{"fail/authd-remints-remote-manager", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCRemint, Space: "alpha", Profile: profiles.RemoteManager,
			Params: remoteManagerParams, Minter: "spiffe://cotal.local/authd/alpha"}, ReasonRemintNotAllowed},
		{"fail/manager-remote-manager", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.RemoteManager,
			Params: remoteManagerParams}, ReasonProfileNotAllowed},
		{"ok/authd-provisioner", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.Provisioner,
			Params: profiles.Params{Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "cli"}}, ReasonAllowed},
		{"ok/authd-deprovisioner", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.Deprovisioner,
			Params: profiles.Params{Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "bob", LifecycleUID: "abcdefghijklmnopqrstuvwxyz"}}, ReasonAllowed},
		{"ok/authd-sign-service-credential", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCSignServiceCredential, Space: "alpha"}, ReasonAllowed},
		{"fail/authd-sign-service-credential-other-space", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCSignServiceCredential, Space: "beta"}, ReasonSpaceNotAllowed},
		{"fail/manager-sign-service-credential", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCSignServiceCredential, Space: "alpha"}, ReasonRPCNotAllowed},
		{"fail/deliveryd-sign-service-credential", Request{Caller: "spiffe://cotal.local/deliveryd/alpha", RPC: RPCSignServiceCredential, Space: "alpha"}, ReasonRPCNotAllowed},
		{"ok/authd-service-serve-grant", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCSignCalloutResponse, Space: "alpha", Profile: profiles.ServiceServe,
			TTL: time.Minute, Params: serviceServeParams}, ReasonAllowed},
		{"fail/authd-remints-service-serve", Request{Caller: "spiffe://cotal.local/authd/alpha", RPC: RPCRemint, Space: "alpha", Profile: profiles.ServiceServe,
			Params: serviceServeParams, Minter: "spiffe://cotal.local/authd/alpha"}, ReasonRemintNotAllowed},
		{"fail/manager-service-serve", Request{Caller: "spiffe://cotal.local/managerd/alpha", RPC: RPCMint, Space: "alpha", Profile: profiles.ServiceServe,
			Params: serviceServeParams}, ReasonProfileNotAllowed},
		{"ok/monitor", Request{Caller: "spiffe://cotal.local/monitor", RPC: RPCGetJWKS, Space: "anything"}, ReasonAllowed},
		{"fail/monitor-staging", Request{Caller: "spiffe://cotal.local/monitor", RPC: RPCGetJWKS, Space: "staging"}, ReasonSpaceNotAllowed},
		{"ok/canary", Request{Caller: "spiffe://cotal.local/canary/c1", RPC: RPCGetSpace, Space: "alpha"}, ReasonAllowed},
		{"fail/canary-two-segments", Request{Caller: "spiffe://cotal.local/canary/c1/x", RPC: RPCGetSpace, Space: "alpha"}, ReasonCallerUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := p.Decide(tc.req); d.Reason != tc.want {
				t.Errorf("Decide = %+v, want %s", d, tc.want)
			}
		})
	}
}

// TestDocExampleParses keeps the example in the package documentation honest.
func TestDocExampleParses(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok {
			b.WriteString(rest + "\n")
		}
	}
	doc := mustParse(t, b.String())
	data, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	file := mustParse(t, string(data))
	if a, b := withoutLines(doc.Rules()), withoutLines(file.Rules()); !reflect.DeepEqual(a, b) {
		t.Errorf("doc example and testdata/example.yaml differ:\n%+v\n%+v", a, b)
	}
	if doc.Limits() != file.Limits() || file.Limits() != DefaultLimits() {
		t.Errorf("limits: doc %+v, example %+v; both should show the defaults %+v", doc.Limits(), file.Limits(), DefaultLimits())
	}
}

func TestParseErrors(t *testing.T) {
	mint := func(profilesYAML string) string {
		return callers(`  - id: spiffe://td/m/{space}
    rpcs: [Mint]
    spaces: ["{space}"]
    rate: {per_second: 1, burst: 1}
    profiles:
` + profilesYAML)
	}
	entry := func(lines string) string {
		return callers("  - id: spiffe://td/x\n" + lines)
	}
	const base = "    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"

	for _, tc := range []struct {
		name   string
		src    string
		caller int    // want Error.Caller
		field  string // want Error.Field
		line   int    // want Error.Line (0: not checked)
		parts  []string
	}{
		{"fail/empty", "", -1, "", 0, []string{"empty policy"}},
		{"fail/syntax", "version: [1\n", -1, "", 0, []string{"line"}},
		{"fail/version-missing", "callers:\n" + readOnly, -1, "version", 0, []string{"must be 1, got 0"}},
		{"fail/version-2", "version: 2\ncallers:\n" + readOnly, -1, "version", 1, []string{"must be 1, got 2"}},
		{"fail/version-string", "version: one\ncallers:\n" + readOnly, -1, "", 1, []string{"cannot unmarshal", "into int"}},
		{"fail/unknown-top-key", "version: 1\nversoin: 1\ncallers:\n" + readOnly, -1, "versoin", 2, []string{`unknown key in the policy`}},
		{"fail/unknown-caller-key", callers(readOnly + "    rpc: [Mint]\n"), 0, "rpc", 7, []string{"unknown key in a caller"}},
		{"fail/unknown-rate-key", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1, per_minute: 3}\n"), 0, "per_minute", 6, []string{"unknown key in rate"}},
		{"fail/unknown-profile-key", mint("      agent: {ttl_max: 1h, ttl: 2h}\n"), 0, "ttl", 8, []string{"unknown key in a profile rule"}},
		{"fail/duplicate-key", callers(readOnly + "    spaces: [beta]\n"), 0, "", 7, []string{`"spaces" already defined at line 5`}},
		{"fail/second-document", callers(readOnly) + "---\nversion: 1\n", -1, "", 0, []string{"more than one YAML document"}},
		{"fail/no-callers", "version: 1\ncallers: []\n", -1, "callers", 2, []string{"no callers"}},
		{"fail/id-missing", callers("  - rpcs: [GetSpace]\n    spaces: [a]\n    rate: {per_second: 1, burst: 1}\n"), 0, "id", 3, []string{"required"}},
		{"fail/id-scheme", callers("  - id: https://td/x\n" + base), 0, "id", 3, []string{`must start with "spiffe://"`}},
		{"fail/id-upper-trust-domain", callers("  - id: spiffe://TD/x\n" + base), 0, "id", 3, []string{"trust domain"}},
		{"fail/id-no-path", callers("  - id: spiffe://td\n" + base), 0, "id", 3, []string{"no path"}},
		{"fail/id-trailing-slash", callers("  - id: spiffe://td/x/\n" + base), 0, "id", 3, []string{"empty path segment"}},
		{"fail/id-dot-segment", callers("  - id: spiffe://td/../x\n" + base), 0, "id", 3, []string{`".."`}},
		{"fail/id-partial-wildcard", callers("  - id: spiffe://td/managerd-*\n" + base), 0, "id", 3, []string{"wildcard must be a whole segment"}},
		{"fail/id-wildcard-trust-domain", callers("  - id: spiffe://*/x\n" + base), 0, "id", 3, []string{"trust domain"}},
		{"fail/id-query", callers("  - id: spiffe://td/x?y=1\n" + base), 0, "id", 3, []string{"not one of"}},
		{"fail/id-two-space-bindings", callers("  - id: spiffe://td/{space}/{space}\n" + base), 0, "id", 3, []string{"only once"}},
		{"fail/id-duplicate", callers(readOnly + readOnly), 1, "id", 7, []string{"duplicate of callers[0]"}},
		{"fail/id-pattern-shadowed", callers(
			"  - id: spiffe://td/m/*\n" + base + "  - id: spiffe://td/m/{space}\n" + base), 1, "id", 7, []string{"can never match", "callers[0]"}},
		{"fail/rpcs-missing", entry("    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "rpcs", 0, []string{"required"}},
		{"fail/rpc-unknown", entry("    rpcs: [GetSpace, Sign]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "rpcs[1]", 4, []string{`unknown RPC "Sign"`}},
		{"fail/rpc-case", entry("    rpcs: [mint]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "rpcs[0]", 4, []string{`unknown RPC "mint"`}},
		{"fail/rpc-duplicate", entry("    rpcs: [GetSpace, GetSpace]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "rpcs[1]", 4, []string{"duplicate"}},
		{"fail/spaces-missing", entry("    rpcs: [GetSpace]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces", 0, []string{"required"}},
		{"fail/spaces-bound-without-binding", entry("    rpcs: [GetSpace]\n    spaces: [\"{space}\"]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces[0]", 5, []string{`needs an id with a "{space}" segment`}},
		{"fail/spaces-any-and-more", entry("    rpcs: [GetSpace]\n    spaces: [\"*\", alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces", 5, []string{"list nothing else"}},
		{"fail/spaces-reserved-char", entry("    rpcs: [GetSpace]\n    spaces: [\"a*\"]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces[0]", 5, []string{"reserved for patterns"}},
		{"fail/spaces-whitespace", entry("    rpcs: [GetSpace]\n    spaces: [\" a\"]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces[0]", 5, []string{"whitespace"}},
		{"fail/spaces-duplicate", entry("    rpcs: [GetSpace]\n    spaces: [a, a]\n    rate: {per_second: 1, burst: 1}\n"), 0, "spaces[1]", 5, []string{"duplicate"}},
		{"fail/exclude-spaces-any", entry(base + "    exclude_spaces: [\"*\"]\n"), 0, "exclude_spaces[0]", 7, []string{"reserved for patterns"}},
		{"fail/rate-missing", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n"), 0, "rate", 0, []string{"required"}},
		{"fail/rate-zero", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: 0, burst: 1}\n"), 0, "rate.per_second", 6, []string{"> 0"}},
		{"fail/rate-negative", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: -1, burst: 1}\n"), 0, "rate.per_second", 6, []string{"> 0"}},
		{"fail/rate-nan", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: .nan, burst: 1}\n"), 0, "rate.per_second", 6, []string{"finite"}},
		{"fail/rate-inf", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: .inf, burst: 1}\n"), 0, "rate.per_second", 6, []string{"finite"}},
		{"fail/burst-zero", entry("    rpcs: [GetSpace]\n    spaces: [alpha]\n    rate: {per_second: 1}\n"), 0, "rate.burst", 6, []string{">= 1"}},
		{"fail/profiles-missing", entry("    rpcs: [Mint]\n    spaces: [alpha]\n    rate: {per_second: 1, burst: 1}\n"), 0, "profiles", 4, []string{"required"}},
		{"fail/profiles-unused", entry(base + "    profiles: {agent: {ttl_max: 1h}}\n"), 0, "profiles", 7, []string{"no listed RPC takes a profile"}},
		{"fail/profile-unknown", mint("      superuser: {ttl_max: 1h}\n"), 0, "profiles.superuser", 8, []string{"superuser"}},
		{"fail/ttl-missing", mint("      agent: {owners: [a]}\n"), 0, "profiles.agent.ttl_max", 8, []string{"required"}},
		{"fail/ttl-null-rule", mint("      agent:\n"), 0, "profiles.agent.ttl_max", 8, []string{"required"}},
		{"fail/ttl-unparsable", mint("      agent: {ttl_max: 1 day}\n"), 0, "profiles.agent.ttl_max", 8, []string{"not a duration"}},
		{"fail/ttl-no-unit", mint("      agent: {ttl_max: 60}\n"), 0, "profiles.agent.ttl_max", 8, []string{"not a duration"}},
		{"fail/ttl-zero", mint("      agent: {ttl_max: 0s}\n"), 0, "profiles.agent.ttl_max", 8, []string{"must be > 0"}},
		{"fail/ttl-negative", mint("      agent: {ttl_max: -1h}\n"), 0, "profiles.agent.ttl_max", 8, []string{"must be > 0"}},
		{"fail/owners-and-any-owner", mint("      agent: {ttl_max: 1h, any_owner: true, owners: [a]}\n"), 0, "profiles.agent.owners", 8, []string{"not both"}},
		{"fail/owner-malformed", mint("      agent: {ttl_max: 1h, owners: [a.b]}\n"), 0, "profiles.agent.owners[0]", 8, []string{`"a.b"`, "outside [A-Za-z0-9_]"}},
		{"fail/owner-wildcard", mint("      agent: {ttl_max: 1h, owners: [\"*\"]}\n"), 0, "profiles.agent.owners[0]", 8, []string{"outside"}},
		{"fail/owner-duplicate", mint("      agent: {ttl_max: 1h, owners: [a, a]}\n"), 0, "profiles.agent.owners[1]", 8, []string{"duplicate"}},
		{"fail/role-malformed", mint("      agent: {ttl_max: 1h, roles: [\"re viewer\"]}\n"), 0, "profiles.agent.roles[0]", 8, []string{"outside"}},
		{"fail/capability-wildcard", mint("      agent: {ttl_max: 1h, capabilities: [\"*\"]}\n"), 0, "profiles.agent.capabilities[0]", 8, []string{"not one of"}},
		{"fail/channel-empty-token", mint("      agent: {ttl_max: 1h, channels: [\"team..a\"]}\n"), 0, "profiles.agent.channels[0]", 8, []string{"empty token"}},
		{"fail/channel-tail-not-last", mint("      agent: {ttl_max: 1h, channels: [\"a.>.b\"]}\n"), 0, "profiles.agent.channels[0]", 8, []string{"last token"}},
		{"fail/channel-partial-wildcard", mint("      agent: {ttl_max: 1h, channels: [\"team*\"]}\n"), 0, "profiles.agent.channels[0]", 8, []string{"whole token"}},
		{"fail/channel-duplicate", mint("      agent: {ttl_max: 1h, channels: [a, a]}\n"), 0, "profiles.agent.channels[1]", 8, []string{"duplicate"}},
		{"fail/exclude-channel-malformed", mint("      agent:\n        ttl_max: 1h\n        exclude_channels: [\"a b\"]\n"), 0, "profiles.agent.exclude_channels[0]", 10, []string{"not one of"}},
		{"fail/remint-mode", mint("      agent: {ttl_max: 1h, remint: mine}\n"), 0, "profiles.agent.remint", 8, []string{"own, any or none"}},
		{"fail/limits-unknown-key", "version: 1\nlimits:\n  unknown: {per_second: 1, burst: 1}\ncallers:\n" + readOnly, -1, "unknown", 3, []string{"unknown key in limits"}},
		{"fail/limits-unknown-rate-zero", "version: 1\nlimits:\n  unknown_callers: {per_second: 0, burst: 1}\ncallers:\n" + readOnly, -1, "limits.unknown_callers.per_second", 3, []string{"> 0"}},
		{"fail/limits-global-burst-zero", "version: 1\nlimits:\n  global: {per_second: 10}\ncallers:\n" + readOnly, -1, "limits.global.burst", 3, []string{">= 1"}},
		{"fail/limits-global-rate-inf", "version: 1\nlimits:\n  global: {per_second: .inf, burst: 1}\ncallers:\n" + readOnly, -1, "limits.global.per_second", 3, []string{"finite"}},
		{"fail/limits-interval-unparsable", "version: 1\nlimits:\n  refusal_audit_interval: 10\ncallers:\n" + readOnly, -1, "limits.refusal_audit_interval", 3, []string{"not a duration"}},
		{"fail/limits-interval-too-short", "version: 1\nlimits:\n  refusal_audit_interval: 100ms\ncallers:\n" + readOnly, -1, "limits.refusal_audit_interval", 3, []string{"between 1s and 1h0m0s"}},
		{"fail/limits-interval-too-long", "version: 1\nlimits:\n  refusal_audit_interval: 2h\ncallers:\n" + readOnly, -1, "limits.refusal_audit_interval", 3, []string{"between"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.src))
			if p != nil {
				t.Errorf("Parse returned a policy with error %v", err)
			}
			wantErrContains(t, err, tc.parts...)
			e := asError(t, err)
			if e.Caller != tc.caller {
				t.Errorf("Caller = %d, want %d (%v)", e.Caller, tc.caller, err)
			}
			if e.Field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", e.Field, tc.field, err)
			}
			if tc.line != 0 && e.Line != tc.line {
				t.Errorf("Line = %d, want %d (%v)", e.Line, tc.line, err)
			}
			if tc.caller >= 0 && !strings.Contains(err.Error(), "callers[") {
				t.Errorf("error %q does not name the caller", err)
			}
		})
	}
}

// TestParseLimits: the limits block is optional, each key in it too, and what it leaves out is
// the default.
func TestParseLimits(t *testing.T) {
	def := DefaultLimits()
	for _, tc := range []struct {
		name string
		src  string
		want Limits
	}{
		{"ok/absent", callers(readOnly), def},
		{"ok/empty", "limits: {}\n" + callers(readOnly), def},
		{"ok/unknown-only", "limits:\n  unknown_callers: {per_second: 0.5, burst: 2}\n" + callers(readOnly),
			Limits{UnknownCallers: Rate{PerSecond: 0.5, Burst: 2}, Global: def.Global, RefusalAuditInterval: def.RefusalAuditInterval}},
		{"ok/all", "limits:\n  unknown_callers: {per_second: 2, burst: 3}\n  global: {per_second: 100, burst: 200}\n  refusal_audit_interval: 1m\n" + callers(readOnly),
			Limits{UnknownCallers: Rate{PerSecond: 2, Burst: 3}, Global: Rate{PerSecond: 100, Burst: 200}, RefusalAuditInterval: time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.src)
			if got := p.Limits(); got != tc.want {
				t.Errorf("Limits() = %+v, want %+v", got, tc.want)
			}
		})
	}
	var nilPolicy *Policy
	if got := nilPolicy.Limits(); got != def {
		t.Errorf("nil policy Limits() = %+v, want the defaults %+v", got, def)
	}
}

func TestParseReportsEveryUnknownKey(t *testing.T) {
	_, err := Parse([]byte(callers(readOnly + "    color: red\n    size: 3\n")))
	wantErrContains(t, err, `color`, `size`, "line 7", "line 8", "callers[0] (spiffe://td/reader)")
	// A top-level key after the callers list belongs to no caller.
	_, err = Parse([]byte(callers(readOnly) + "extra: 1\n"))
	wantErrContains(t, err, "line 7: extra: unknown key in the policy")
	if e := asError(t, err); e.Caller != -1 {
		t.Errorf("Caller = %d, want -1", e.Caller)
	}
}

func TestParseTooLarge(t *testing.T) {
	_, err := Parse(make([]byte, MaxFileSize+1))
	wantErrContains(t, err, "larger than")
}

func TestLoad(t *testing.T) {
	src := callers(readOnly)
	for _, tc := range []struct {
		name  string
		path  func(t *testing.T) string
		parts []string // empty: must succeed
	}{
		{"ok/0600", func(t *testing.T) string { return writeFile(t, src, 0o600) }, nil},
		{"ok/0644", func(t *testing.T) string { return writeFile(t, src, 0o644) }, nil},
		{"fail/group-writable", func(t *testing.T) string { return writeFile(t, src, 0o660) }, []string{"is looser than 0644"}},
		{"fail/world-writable", func(t *testing.T) string { return writeFile(t, src, 0o606) }, []string{"is looser than 0644"}},
		{"fail/missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.yaml") }, []string{"no such file"}},
		{"fail/directory", func(t *testing.T) string { return t.TempDir() }, []string{"is a directory, want a regular file"}},
		{"fail/too-large", func(t *testing.T) string {
			return writeFile(t, src+"#"+strings.Repeat("x", MaxFileSize)+"\n", 0o600)
		}, []string{"larger than"}},
		{"fail/invalid", func(t *testing.T) string { return writeFile(t, "version: 2\n", 0o600) }, []string{"must be 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			p, err := Load(path)
			if len(tc.parts) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if d := p.Decide(Request{Caller: "spiffe://td/reader", RPC: RPCGetSpace, Space: "alpha"}); !d.Allow {
					t.Errorf("loaded policy denies: %+v", d)
				}
				return
			}
			wantErrContains(t, err, append(tc.parts, path)...)
			if e := asError(t, err); e.Path != path {
				t.Errorf("Path = %q, want %q", e.Path, path)
			}
		})
	}
}

func TestRulesAreCopies(t *testing.T) {
	p := mustParse(t, callers(`  - id: spiffe://td/m
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
    profiles:
      agent: {ttl_max: 1h, owners: [alice]}
`))
	r, ok := p.Match("spiffe://td/m")
	if !ok {
		t.Fatal("Match: no rule")
	}
	r.Spaces[0] = "beta"
	r.RPCs[0] = RPCGetSpace
	pr := r.Profiles[profiles.Agent]
	pr.Owners[0] = "mallory"
	delete(r.Profiles, profiles.Agent)

	req := Request{Caller: "spiffe://td/m", RPC: RPCMint, Space: "alpha", Profile: profiles.Agent, Params: profiles.Params{Owner: "alice"}}
	if d := p.Decide(req); !d.Allow {
		t.Errorf("mutating a returned Rule changed a decision: %+v", d)
	}
	if got := p.Rules()[0].Profiles[profiles.Agent].Owners; !slices.Equal(got, []string{"alice"}) {
		t.Errorf("Rules owners = %v", got)
	}
}

func TestErrorString(t *testing.T) {
	e := &Error{Path: "/etc/p.yaml", Line: 3, Caller: 1, ID: "spiffe://td/x", Field: "rpcs[0]", Reason: "bad"}
	if got, want := e.Error(), "policy /etc/p.yaml: line 3: callers[1] (spiffe://td/x): rpcs[0]: bad"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &Error{Caller: -1, Reason: "empty policy"}
	if got, want := e.Error(), "policy: empty policy"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var target *Error
	if !errors.As(error(e), &target) {
		t.Error("errors.As failed")
	}
}

// TestDecisionCarriesPolicyDigest: a decision names the policy that made it, so signerd can tie
// what it grants (an idempotent Mint's cached answer) to that policy.
func TestDecisionCarriesPolicyDigest(t *testing.T) {
	a, b := mustParse(t, callers(readOnly)), mustParse(t, callers(readOnly)+"# edited\n")
	if a.Digest() == "" || a.Digest() == b.Digest() {
		t.Fatalf("digests %q and %q: want two different non-empty digests", a.Digest(), b.Digest())
	}
	req := Request{Caller: "spiffe://td/reader", RPC: RPCGetSpace, Space: "alpha"}
	for _, p := range []*Policy{a, b} {
		if d := p.Decide(req); d.PolicyDigest != p.Digest() {
			t.Errorf("Decide: PolicyDigest %q, want %q", d.PolicyDigest, p.Digest())
		}
		if e := p.Explain(req); e.Decision.PolicyDigest != p.Digest() {
			t.Errorf("Explain: PolicyDigest %q, want %q", e.Decision.PolicyDigest, p.Digest())
		}
	}
}
