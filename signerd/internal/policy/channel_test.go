package policy

import (
	"strings"
	"testing"
)

func toks(t testing.TB, s string) []string {
	t.Helper()
	c, err := parseChannel(s)
	if err != nil {
		t.Fatalf("parseChannel(%q): %v", s, err)
	}
	return c
}

func TestParseChannel(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" = ok, else error substring
	}{
		{"general", ""},
		{"team.backend", ""},
		{"a-b_c.D9", ""},
		{"*", ""},
		{">", ""},
		{"team.*", ""},
		{"team.>", ""},
		{"*.x.>", ""},
		{"", "empty channel"},
		{".", "empty token"},
		{"a.", "empty token"},
		{".a", "empty token"},
		{"a..b", "empty token"},
		{">.a", "last token"},
		{"a.>.>", "last token"},
		{"a*", "whole token"},
		{"a.b>", "whole token"},
		{"a b", "not one of"},
		{"a\tb", "not one of"},
		{"$SYS", "not one of"},
		{"ü", "not one of"},
		{strings.Repeat("a", 129), "longer than"},
	} {
		name := "ok/" + tc.in
		if tc.want != "" {
			name = "fail/" + tc.in
		}
		t.Run(name, func(t *testing.T) {
			_, err := parseChannel(tc.in)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("parseChannel(%q): %v", tc.in, err)
				}
				return
			}
			wantErrContains(t, err, tc.want)
		})
	}
}

func TestCoversAndIntersects(t *testing.T) {
	for _, tc := range []struct {
		p, q              string
		covers, intersect bool
	}{
		{"general", "general", true, true},
		{"general", "generals", false, false},
		{"general", "general.x", false, false},
		{"team.*", "team.a", true, true},
		{"team.*", "team", false, false},
		{"team.*", "team.a.b", false, false},
		{"team.*", "team.*", true, true},
		{"team.*", "team.>", false, true},
		{"team.>", "team.a", true, true},
		{"team.>", "team.a.b.c", true, true},
		{"team.>", "team", false, false},
		{"team.>", "team.*", true, true},
		{"team.>", "team.>", true, true},
		{"team.>", "other.a", false, false},
		{">", "a", true, true},
		{">", "a.b.c", true, true},
		{">", ">", true, true},
		{"*", "a", true, true},
		{"*", "a.b", false, false},
		{"*", ">", false, true},
		{"*.b", "a.*", false, true},
		{"a.*", "*.b", false, true},
		{"team.a", "team.*", false, true},
		{"team.a", "team.>", false, true},
		{"team.a.b", "team.>", false, true},
		{"team.a", "*.b", false, false},
		{"x.>", "*.*.c", false, true},
		{"x.>", "x.*.c", true, true},
		{"*.*.c", "x.>", false, true},
	} {
		t.Run(tc.p+"~"+tc.q, func(t *testing.T) {
			p, q := toks(t, tc.p), toks(t, tc.q)
			if got := covers(p, q); got != tc.covers {
				t.Errorf("covers(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.covers)
			}
			if got := intersects(p, q); got != tc.intersect {
				t.Errorf("intersects(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.intersect)
			}
			if got := intersects(q, p); got != tc.intersect {
				t.Errorf("intersects(%q, %q) = %v, want %v (symmetry)", tc.q, tc.p, got, tc.intersect)
			}
		})
	}
}
