package policy

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// encode writes p back in the file form, so a parsed policy can be parsed again.
func encode(t testing.TB, p *Policy) []byte {
	t.Helper()
	f := filePolicy{Version: Version}
	for _, r := range p.Rules() {
		fc := fileCaller{
			ID:            r.ID,
			Spaces:        r.Spaces,
			ExcludeSpaces: r.ExcludeSpaces,
			Rate:          &fileRate{PerSecond: r.Rate.PerSecond, Burst: r.Rate.Burst},
		}
		for _, rpc := range r.RPCs {
			fc.RPCs = append(fc.RPCs, string(rpc))
		}
		if len(r.Profiles) > 0 {
			fc.Profiles = make(map[string]fileProfile)
		}
		for name, pr := range r.Profiles {
			fc.Profiles[string(name)] = fileProfile{
				TTLMax: pr.TTLMax.String(), AnyOwner: pr.AnyOwner, Owners: pr.Owners,
				Channels: pr.Channels, ExcludeChannels: pr.ExcludeChannels, Roles: pr.Roles,
				Capabilities: pr.Capabilities, Remint: string(pr.Remint),
			}
		}
		f.Callers = append(f.Callers, fc)
	}
	out, err := yaml.Marshal(&f)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return out
}

// withoutLines zeroes the line numbers, which differ between a file and its re-encoding.
func withoutLines(rules []Rule) []Rule {
	for i := range rules {
		rules[i].Line = 0
		for n, pr := range rules[i].Profiles {
			pr.Line = 0
			rules[i].Profiles[n] = pr
		}
	}
	return rules
}

func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example),
		decidePolicy,
		storeV1,
		"",
		"version: 1\n",
		"version: 1\ncallers: []\n",
		"version: 1\ncallers:\n  - id: spiffe://td/x\n    rpcs: [GetSpace]\n    spaces: [\"*\"]\n    rate: {per_second: 0.5, burst: 1}\n",
		"version: 1\ncallers:\n  - id: spiffe://td/*/{space}\n    rpcs: [Mint]\n    spaces: [\"{space}\"]\n    rate: {per_second: 1e3, burst: 7}\n    profiles: {agent: {ttl_max: 1h30m, channels: [\">\"], any_owner: true}}\n",
		"a: &a [*a, *a]\n",
		"version: 1\n---\nversion: 1\n",
		"{version: 1, callers: [{id: 'spiffe://td/a', rpcs: [Mac], spaces: [x], rate: {per_second: 1, burst: 1}, extra: 1}]}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if p != nil {
				t.Fatalf("policy returned with error %v", err)
			}
			return
		}
		// A parsed policy re-validates: written back out and parsed again it yields the same
		// rules, so nothing was accepted that validation would refuse on a second look.
		again, err := Parse(encode(t, p))
		if err != nil {
			t.Fatalf("re-encoded policy does not parse: %v\n%s", err, encode(t, p))
		}
		if a, b := withoutLines(p.Rules()), withoutLines(again.Rules()); !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed rules:\n%+v\n%+v", a, b)
		}
		// Deciding never panics, whatever the rules.
		for _, r := range p.Rules() {
			for _, rpc := range RPCs() {
				for name := range r.Profiles {
					_ = p.Decide(Request{Caller: r.ID, RPC: rpc, Space: "alpha", Profile: name})
				}
			}
		}
	})
}

// instantiate replaces each wildcard in a channel pattern with a literal token, giving one
// channel the pattern matches.
func instantiate(toks []string, fill string) []string {
	out := make([]string, len(toks))
	for i, tk := range toks {
		if tk == tokAny || tk == tokTail {
			tk = fill
		}
		out[i] = tk
	}
	return out
}

func FuzzChannelMatch(f *testing.F) {
	for _, s := range [][2]string{
		{"team.*", "team.a"}, {"team.>", "team.*"}, {">", ">"}, {"*", "a.b"},
		{"a.*.c", "a.b.c"}, {"a.b", "a.b"}, {"x.>", "*.*.c"}, {"", "a"}, {"a..b", "a"}, {"a.>.b", "a"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, ps, qs string) {
		p, perr := parseChannel(ps)
		q, qerr := parseChannel(qs)
		if perr != nil || qerr != nil {
			return
		}
		if !covers(p, p) || !intersects(p, p) {
			t.Fatalf("%q does not cover or intersect itself", ps)
		}
		if intersects(p, q) != intersects(q, p) {
			t.Fatalf("intersects(%q, %q) is not symmetric", ps, qs)
		}
		c := covers(p, q)
		if c && !intersects(p, q) {
			t.Fatalf("covers(%q, %q) without intersecting", ps, qs)
		}
		// Soundness: if p covers q, every concrete instance of q is matched by p.
		for _, fill := range []string{"x", "zz"} {
			inst := instantiate(q, fill)
			if c && !covers(p, inst) {
				t.Fatalf("covers(%q, %q) but not the instance %v", ps, qs, inst)
			}
			if !covers(q, inst) {
				t.Fatalf("%q does not match its own instance %v", qs, inst)
			}
			if covers(p, inst) && !intersects(p, q) {
				t.Fatalf("%q matches %v, an instance of %q, but they do not intersect", ps, inst, qs)
			}
		}
		// Widening: a longer instance of a trailing ">" is matched too.
		if q[len(q)-1] == tokTail && c && !covers(p, append(instantiate(q, "x"), "y")) {
			t.Fatalf("covers(%q, %q) but not a longer instance", ps, qs)
		}
	})
}
