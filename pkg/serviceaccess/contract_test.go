package serviceaccess_test

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

const testAccount = "AADEXUKMFVICBSSDYCT7HJJGVFSZG434WQWE4D4D5IHCYG6P7X5O7546"

// manifestJSON is a valid manifest for root with a command, a trait and a type.
func manifestJSON(root string) string {
	return `{"v":1,"root":{"urn":"` + root + `","kind":"endpoint"},"members":[` +
		`{"urn":"urn:cmd:` + root + `:get","kind":"command","lifetime":"ephemeral"},` +
		`{"urn":"urn:trait:` + root + `:audited","kind":"trait","governed":false},` +
		`{"urn":"urn:type:` + root + `:invoice","kind":"type"}]}`
}

// contractOf builds a sorted contract of the given manifests' bytes.
func contractOf(manifests ...string) *serviceaccess.Contract {
	c := &serviceaccess.Contract{}
	for _, m := range manifests {
		d := serviceaccess.Digest([]byte(m))
		c.Closures = append(c.Closures, d)
		c.Artifacts = append(c.Artifacts, serviceaccess.Artifact{Digest: d, Bytes: []byte(m)})
	}
	sort.Strings(c.Closures)
	sort.Slice(c.Artifacts, func(i, j int) bool { return c.Artifacts[i].Digest < c.Artifacts[j].Digest })
	return c
}

func TestDigest(t *testing.T) {
	if got, want := serviceaccess.Digest([]byte("abc")), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Fatalf("Digest = %s, want %s", got, want)
	}
}

func TestContractCheck(t *testing.T) {
	t.Run("ok/one closure", func(t *testing.T) {
		ms, err := contractOf(manifestJSON(testEP)).Check(testEP)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || ms[0].Root.URN != testEP || len(ms[0].Members) != 3 || ms[0].Members[0].Lifetime != "ephemeral" {
			t.Fatalf("manifests %+v", ms)
		}
	})
	t.Run("ok/dependency closures in closure order", func(t *testing.T) {
		c := contractOf(manifestJSON(testEP), manifestJSON("ledger"), manifestJSON("ledger.audit"))
		ms, err := c.Check(testEP)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range ms {
			if serviceaccess.Digest(c.Artifacts[indexOf(c, c.Closures[i])].Bytes) != c.Closures[i] || m.Root.URN == "" {
				t.Fatalf("manifest %d out of closure order", i)
			}
			want := string(c.Artifacts[indexOf(c, c.Closures[i])].Bytes)
			if !strings.Contains(want, `"urn":"`+m.Root.URN+`","kind":"endpoint"`) {
				t.Fatalf("manifest %d root %s is not closure %d's", i, m.Root.URN, i)
			}
		}
	})
	t.Run("ok/empty members", func(t *testing.T) {
		if _, err := contractOf(`{"v":1,"root":{"urn":"` + testEP + `","kind":"endpoint"},"members":[]}`).Check(testEP); err != nil {
			t.Fatal(err)
		}
	})

	own := manifestJSON(testEP)
	member := func(m string) string {
		return `{"v":1,"root":{"urn":"` + testEP + `","kind":"endpoint"},"members":[` + m + `]}`
	}
	many := func(n int) *serviceaccess.Contract {
		ms := []string{own}
		for i := 1; i < n; i++ {
			ms = append(ms, manifestJSON("dep"+strings.Repeat("a", i%40)+"x"+itoa(i)))
		}
		return contractOf(ms...)
	}
	manyMembers := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"urn":"urn:t:` + itoa(i) + `","kind":"type"}`)
		}
		return member(b.String())
	}
	cases := []struct {
		name     string
		c        func() *serviceaccess.Contract
		endpoint string
		field    string
	}{
		{"fail/nil contract", func() *serviceaccess.Contract { return nil }, testEP, "contract"},
		{"fail/bad endpoint", func() *serviceaccess.Contract { return contractOf(own) }, "Billing", "endpoint"},
		{"fail/no closures", func() *serviceaccess.Contract { c := contractOf(own); c.Closures = nil; return c }, testEP, "contract.closures"},
		{"fail/no artifacts", func() *serviceaccess.Contract { c := contractOf(own); c.Artifacts = nil; return c }, testEP, "contract.artifacts"},
		{"fail/65 closures", func() *serviceaccess.Contract { return many(65) }, testEP, "contract.closures"},
		{"fail/257 artifacts", func() *serviceaccess.Contract {
			c := contractOf(own)
			for i := 0; i < 256; i++ {
				b := []byte(itoa(i))
				c.Artifacts = append(c.Artifacts, serviceaccess.Artifact{Digest: serviceaccess.Digest(b), Bytes: b})
			}
			sort.Slice(c.Artifacts, func(i, j int) bool { return c.Artifacts[i].Digest < c.Artifacts[j].Digest })
			return c
		}, testEP, "contract.artifacts"},
		{"fail/closure not a digest", func() *serviceaccess.Contract { c := contractOf(own); c.Closures[0] = "sha256:XYZ"; return c }, testEP, "contract.closures[0]"},
		{"fail/closure uppercase hex", func() *serviceaccess.Contract {
			c := contractOf(own)
			c.Closures[0] = strings.ToUpper(c.Closures[0][7:])
			c.Closures[0] = "sha256:" + c.Closures[0]
			return c
		}, testEP, "contract.closures[0]"},
		{"fail/closures unsorted", func() *serviceaccess.Contract {
			c := contractOf(own, manifestJSON("ledger"))
			c.Closures[0], c.Closures[1] = c.Closures[1], c.Closures[0]
			return c
		}, testEP, "contract.closures[1]"},
		{"fail/closure twice", func() *serviceaccess.Contract {
			c := contractOf(own)
			c.Closures = append(c.Closures, c.Closures[0])
			return c
		}, testEP, "contract.closures[1]"},
		{"fail/artifacts unsorted", func() *serviceaccess.Contract {
			c := contractOf(own, manifestJSON("ledger"))
			c.Artifacts[0], c.Artifacts[1] = c.Artifacts[1], c.Artifacts[0]
			return c
		}, testEP, "contract.artifacts[1].digest"},
		{"fail/artifact twice", func() *serviceaccess.Contract {
			c := contractOf(own)
			c.Artifacts = append(c.Artifacts, c.Artifacts[0])
			return c
		}, testEP, "contract.artifacts[1].digest"},
		{"fail/artifact bytes not its digest", func() *serviceaccess.Contract {
			c := contractOf(own)
			c.Artifacts[0].Bytes = []byte(manifestJSON("ledger"))
			return c
		}, testEP, "contract.artifacts[0].digest"},
		{"fail/closure without artifact", func() *serviceaccess.Contract {
			c := contractOf(own, manifestJSON("ledger"))
			c.Artifacts = c.Artifacts[:1]
			return c
		}, testEP, "contract.closures"},
		{"fail/artifact no closure names", func() *serviceaccess.Contract {
			c := contractOf(own, manifestJSON("ledger"))
			c.Closures = []string{serviceaccess.Digest([]byte(own))}
			return c
		}, testEP, "contract.artifacts"},
		{"fail/no closure rooted at the endpoint", func() *serviceaccess.Contract { return contractOf(manifestJSON("ledger")) }, testEP, "contract.closures"},
		{"fail/two closures with one root", func() *serviceaccess.Contract {
			return contractOf(own, `{"v":1,"root":{"urn":"`+testEP+`","kind":"endpoint"},"members":[]}`)
		}, testEP, "root.urn"},
		{"fail/manifest not JSON", func() *serviceaccess.Contract { return contractOf("not json") }, testEP, "manifest"},
		{"fail/manifest trailing data", func() *serviceaccess.Contract { return contractOf(own + " {}") }, testEP, "manifest"},
		{"fail/manifest unknown key", func() *serviceaccess.Contract { return contractOf(strings.Replace(own, `"v":1`, `"v":1,"x":1`, 1)) }, testEP, "manifest"},
		{"fail/manifest re-cased key", func() *serviceaccess.Contract { return contractOf(strings.Replace(own, `"root"`, `"Root"`, 1)) }, testEP, "manifest"},
		{"fail/manifest duplicate key", func() *serviceaccess.Contract { return contractOf(strings.Replace(own, `"v":1`, `"v":1,"v":1`, 1)) }, testEP, "manifest"},
		{"fail/manifest v 2", func() *serviceaccess.Contract { return contractOf(strings.Replace(own, `"v":1`, `"v":2`, 1)) }, testEP, "manifest.v"},
		{"fail/manifest members null", func() *serviceaccess.Contract {
			return contractOf(`{"v":1,"root":{"urn":"` + testEP + `","kind":"endpoint"},"members":null}`)
		}, testEP, "manifest.members"},
		{"fail/manifest no members", func() *serviceaccess.Contract {
			return contractOf(`{"v":1,"root":{"urn":"` + testEP + `","kind":"endpoint"}}`)
		}, testEP, "manifest.members"},
		{"fail/root kind command", func() *serviceaccess.Contract {
			return contractOf(`{"v":1,"root":{"urn":"` + testEP + `","kind":"command","lifetime":"ephemeral"},"members":[]}`)
		}, testEP, "manifest.root"},
		{"fail/1025 members", func() *serviceaccess.Contract { return contractOf(manyMembers(1025)) }, testEP, "manifest.members"},
		{"fail/member kind unknown", func() *serviceaccess.Contract { return contractOf(member(`{"urn":"u:x","kind":"query"}`)) }, testEP, "manifest.members[0].kind"},
		{"fail/member urn empty", func() *serviceaccess.Contract { return contractOf(member(`{"urn":"","kind":"type"}`)) }, testEP, "manifest.members[0].urn"},
		{"fail/member urn with space", func() *serviceaccess.Contract { return contractOf(member(`{"urn":"a b","kind":"type"}`)) }, testEP, "manifest.members[0].urn"},
		{"fail/member urn twice", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"type"},{"urn":"u:x","kind":"type"}`))
		}, testEP, "manifest.members[1].urn"},
		{"fail/command durable", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"command","lifetime":"durable"}`))
		}, testEP, "manifest.members[0].lifetime"},
		{"fail/command without lifetime", func() *serviceaccess.Contract { return contractOf(member(`{"urn":"u:x","kind":"command"}`)) }, testEP, "manifest.members[0].lifetime"},
		{"fail/governed trait", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"trait","governed":true}`))
		}, testEP, "manifest.members[0].governed"},
		{"fail/governed not a boolean", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"trait","governed":"false"}`))
		}, testEP, "manifest.members[0].governed"},
		{"fail/lifetime on a type", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"type","lifetime":"ephemeral"}`))
		}, testEP, "manifest.members[0].lifetime"},
		{"fail/governed on a command", func() *serviceaccess.Contract {
			return contractOf(member(`{"urn":"u:x","kind":"command","lifetime":"ephemeral","governed":false}`))
		}, testEP, "manifest.members[0].governed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := tc.c().Check(tc.endpoint)
			var e *serviceaccess.Error
			if ms != nil || !errors.As(err, &e) {
				t.Fatalf("manifests %v, err %v: want an *Error", ms, err)
			}
			if !strings.Contains(e.Field, tc.field) {
				t.Fatalf("field %q (%v), want it to name %q", e.Field, err, tc.field)
			}
		})
	}
	t.Run("ok/64 closures, 1024 members", func(t *testing.T) {
		if _, err := many(64).Check(testEP); err != nil {
			t.Fatal(err)
		}
		if _, err := contractOf(manyMembers(1024)).Check(testEP); err != nil {
			t.Fatal(err)
		}
	})
}

func indexOf(c *serviceaccess.Contract, d string) int {
	for i, a := range c.Artifacts {
		if a.Digest == d {
			return i
		}
	}
	return -1
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestValidEndpointMatchesLifecycle holds serviceaccess's copy of the endpoint grammar equal to
// lifecycle.EndpointToken's.
func TestValidEndpointMatchesLifecycle(t *testing.T) {
	for _, s := range []string{"", "a", "billing.invoices", "a-b.c1", "-a", "a-", "a..b", ".a", "a.", "A", "a_b", "a b",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "x.y.z.0", "é", "a.-b"} {
		_, err := lifecycle.EndpointToken(s)
		if got := serviceaccess.ValidEndpoint(s); got != (err == nil) {
			t.Fatalf("ValidEndpoint(%q) = %v, lifecycle says %v", s, got, err)
		}
		if err == nil {
			tok, _ := lifecycle.EndpointToken(s)
			if got, err := serviceaccess.EndpointTokenOf(s); err != nil || got != tok {
				t.Fatalf("EndpointTokenOf(%q) = %q, %v; want %q", s, got, err, tok)
			}
		}
	}
}

func FuzzValidEndpoint(f *testing.F) {
	for _, s := range []string{"a", "billing.invoices", "a-", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := lifecycle.EndpointToken(s)
		if got := serviceaccess.ValidEndpoint(s); got != (err == nil) {
			t.Fatalf("ValidEndpoint(%q) = %v, lifecycle says %v", s, got, err)
		}
	})
}

func TestGrammars(t *testing.T) {
	b32 := func(n int) string { return strings.Repeat("a2", n/2) + strings.Repeat("z", n%2) }
	for _, tc := range []struct {
		name string
		f    func(string) bool
		ok   []string
		bad  []string
	}{
		{"witness", serviceaccess.ValidWitness, []string{"w_" + b32(52)}, []string{"", "w_" + b32(51), "w_" + b32(53), "x_" + b32(52), "w_" + strings.Repeat("A", 52), "w_" + strings.Repeat("1", 52)}},
		{"root", serviceaccess.ValidRoot, []string{"r_" + b32(26)}, []string{"r_" + b32(25), "p_" + b32(26), "r_" + strings.Repeat("8", 26)}},
		{"proposal", serviceaccess.ValidProposal, []string{"p_" + b32(26)}, []string{"p_" + b32(27), "r_" + b32(26)}},
		{"jti", serviceaccess.ValidJTI, []string{b32(26)}, []string{b32(25), strings.ToUpper(b32(26))}},
		{"requestId", serviceaccess.ValidRequestID, []string{"abcd1234", "A-b_" + strings.Repeat("x", 60)}, []string{"abc1234", strings.Repeat("x", 65), "abcd 1234", "abcd.1234", "abcd/1234"}},
	} {
		for _, s := range tc.ok {
			if !tc.f(s) {
				t.Errorf("ok/%s %q refused", tc.name, s)
			}
		}
		for _, s := range tc.bad {
			if tc.f(s) {
				t.Errorf("fail/%s %q accepted", tc.name, s)
			}
		}
	}
}
