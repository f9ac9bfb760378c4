package space

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateChannelPattern(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"general", true},
		{"team.backend", true},
		{"a-b_c.D9", true},
		{"*", true},
		{">", true},
		{"team.*", true},
		{"team.>", true},
		{"*.x.>", true},
		{"team.*.b", true},
		{"", false},
		{".", false},
		{"a.", false},
		{".a", false},
		{"a..b", false},
		{">.a", false},
		{"a.>.>", false},
		{"a*", false},
		{"a.b>", false},
		{"a.**", false},
		{"a b", false},
		{"a\tb", false},
		{"$SYS", false},
		{"ü", false},
		{strings.Repeat("a", MaxChannelLen+1), false},
	} {
		name := "fail/" + tc.in
		if tc.ok {
			name = "ok/" + tc.in
		}
		t.Run(name, func(t *testing.T) {
			err := ValidateChannelPattern(tc.in)
			if tc.ok {
				if err != nil {
					t.Fatalf("ValidateChannelPattern(%q): %v", tc.in, err)
				}
				if want := tc.in != "" && strings.ContainsAny(tc.in, "*>"); IsChannelPattern(tc.in) != want {
					t.Fatalf("IsChannelPattern(%q) = %v, want %v", tc.in, !want, want)
				}
				return
			}
			var ne *NameError
			if !errors.As(err, &ne) || ne.Kind != KindChannel {
				t.Fatalf("ValidateChannelPattern(%q) = %v, want a channel *NameError", tc.in, err)
			}
		})
	}
	// A concrete channel is a pattern, and a pattern with a wildcard is never a channel.
	for _, c := range []string{"general", "team.a", "x-y_z.9"} {
		if ValidateChannelPattern(c) != nil || ValidateChannel(c) != nil || IsChannelPattern(c) {
			t.Fatalf("%q: concrete channel not accepted as a wildcard-free pattern", c)
		}
	}
	for _, p := range []string{"*", ">", "team.*", "team.>"} {
		if ValidateChannel(p) == nil {
			t.Fatalf("ValidateChannel(%q) accepted a pattern", p)
		}
	}
}

// TestPatternCovers is the subset check a wildcard grant must pass: granted ⊆ allowed
// (PatternCovers) and granted ∩ excluded = ∅ (PatternsIntersect false). The table gives both
// relations for each pair; the "grant" column reads "allowed" (covered and no overlap with the
// exclusion) or "refused".
func TestPatternCovers(t *testing.T) {
	for _, tc := range []struct {
		name             string
		p, q             string // q is the grant, p the policy pattern
		covers, overlaps bool
	}{
		{"ok/team.> within team.>", "team.>", "team.>", true, true},
		{"ok/team.* within team.>", "team.>", "team.*", true, true},
		{"ok/team.a within team.*", "team.*", "team.a", true, true},
		{"ok/team.a.b.c within team.>", "team.>", "team.a.b.c", true, true},
		{"ok/team.*.b within team.>", "team.>", "team.*.b", true, true},
		{"ok/x.*.c within x.>", "x.>", "x.*.c", true, true},
		{"ok/exact channel within itself", "general", "general", true, true},
		{"ok/team.* within team.*", "team.*", "team.*", true, true},
		{"ok/> within >", ">", ">", true, true},
		{"ok/team.> within >", ">", "team.>", true, true},
		{"ok/a within *", "*", "a", true, true},
		{"ok/* within >", ">", "*", true, true},
		{"fail/team.> not within team.*", "team.*", "team.>", false, true},
		{"fail/> not within team.>", "team.>", ">", false, true},
		{"fail/> not within *", "*", ">", false, true},
		{"fail/> not within *.>", "*.>", ">", false, true},
		{"fail/team.* not within team.a", "team.a", "team.*", false, true},
		{"fail/team.> not within team.a", "team.a", "team.>", false, true},
		{"fail/team not within team.>", "team.>", "team", false, false},
		{"fail/team not within team.*", "team.*", "team", false, false},
		{"fail/team.a.b not within team.*", "team.*", "team.a.b", false, false},
		{"fail/other.a not within team.>", "team.>", "other.a", false, false},
		{"fail/generals not within general", "general", "generals", false, false},
		{"fail/general.x not within general", "general", "general.x", false, false},
		{"fail/a.b not within *", "*", "a.b", false, false},
		{"fail/*.b and a.* overlap without covering", "a.*", "*.b", false, true},
		{"fail/a.* and *.b overlap without covering", "*.b", "a.*", false, true},
		{"fail/*.*.c not within x.>", "x.>", "*.*.c", false, true},
		{"fail/team.a disjoint from *.b", "*.b", "team.a", false, false},
		{"fail/exclusion overlap: team.> reaches excluded team.secret", "team.secret", "team.>", false, true},
		{"fail/exclusion overlap: team.* reaches excluded team.secret", "team.secret", "team.*", false, true},
		{"fail/exclusion overlap: team.* reaches excluded *.secret", "*.secret", "team.*", false, true},
		{"ok/no exclusion overlap: team.* misses team.secret.x", "team.secret.x", "team.*", false, false},
		{"fail/malformed grant covers nothing", ">", "a.>.b", false, false},
		{"fail/malformed policy pattern covers nothing", "a.>.b", "a.x.b", false, false},
		{"fail/empty token covers nothing", ">", "a..b", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PatternCovers(tc.p, tc.q); got != tc.covers {
				t.Errorf("PatternCovers(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.covers)
			}
			if got := PatternsIntersect(tc.p, tc.q); got != tc.overlaps {
				t.Errorf("PatternsIntersect(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.overlaps)
			}
			if got := PatternsIntersect(tc.q, tc.p); got != tc.overlaps {
				t.Errorf("PatternsIntersect(%q, %q) = %v, want %v (symmetry)", tc.q, tc.p, got, tc.overlaps)
			}
		})
	}
}

func TestChannelReach(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"team.*", "team.>"},
		{"*", ">"},
		{"team.*.x", "team.*.x"},
		{"*.x", "*.x"},
		{"team.>", "team.>"},
		{">", ">"},
		{"team.a", "team.a"},
		{"team.a*", "team.a*"}, // malformed; left for the grammar to refuse
	} {
		t.Run("ok/"+tc.in, func(t *testing.T) {
			if got := ChannelReach(tc.in); got != tc.want {
				t.Fatalf("ChannelReach(%q) = %q, want %q", tc.in, got, tc.want)
			}
			// A grant's reach covers the grant: judging the reach is never looser.
			if ValidateChannelPattern(tc.in) == nil && !PatternCovers(ChannelReach(tc.in), tc.in) {
				t.Fatalf("ChannelReach(%q) does not cover %q", tc.in, tc.in)
			}
		})
	}
}

// bruteMatch is the reference matcher: NATS subject matching of a concrete subject s by pattern
// p, written independently of CoversTokens and IntersectTokens.
func bruteMatch(p, s []string) bool {
	if len(p) == 0 {
		return len(s) == 0
	}
	switch p[0] {
	case ">":
		return len(s) >= 1
	case "*":
		return len(s) >= 1 && bruteMatch(p[1:], s[1:])
	default:
		return len(s) >= 1 && s[0] == p[0] && bruteMatch(p[1:], s[1:])
	}
}

// bruteRelations decides covers(p, q) and intersects(p, q) by enumerating concrete subjects.
// It is enough to try subjects of at most max(len p, len q)+1 tokens over the literal tokens of p
// and q plus one fresh token: a counterexample (or common subject) keeps its verdict when every
// other token is replaced by the fresh one and when it is cut to that length, because neither
// pattern looks past its own length except through a final '>'.
func bruteRelations(p, q []string) (covers, intersects bool) {
	alpha := []string{"fresh0"}
	seen := map[string]bool{"fresh0": true}
	for _, t := range append(append([]string(nil), p...), q...) {
		if t != "*" && t != ">" && !seen[t] {
			seen[t] = true
			alpha = append(alpha, t)
		}
	}
	maxLen := max(len(p), len(q)) + 1
	covers = true
	var walk func(s []string)
	walk = func(s []string) {
		if len(s) > 0 {
			mq, mp := bruteMatch(q, s), bruteMatch(p, s)
			if mq && !mp {
				covers = false
			}
			if mq && mp {
				intersects = true
			}
		}
		if len(s) == maxLen {
			return
		}
		for _, t := range alpha {
			walk(append(s, t))
		}
	}
	walk(make([]string, 0, maxLen))
	return covers, intersects
}

// FuzzPatternCovers compares CoversTokens and IntersectTokens with the brute-force reference on
// every pair of valid patterns of up to four tokens.
func FuzzPatternCovers(f *testing.F) {
	for _, seed := range [][2]string{
		{"team.>", "team.>"}, {"team.>", "team.*"}, {"team.*", "team.a"}, {"team.*", "team.>"},
		{">", ">"}, {"*", ">"}, {"a.*", "*.b"}, {"x.>", "*.*.c"}, {"team.secret", "team.>"},
		{"general", "general"}, {"a.b.c.d", "a.*.c.>"}, {"*.*", "*.>"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, p, q string) {
		_, okp := patternTokens(p)
		_, okq := patternTokens(q)
		if (!okp || !okq) && (PatternCovers(p, q) || PatternsIntersect(p, q)) {
			t.Fatalf("a malformed pattern (%q, %q) covers or overlaps", p, q)
		}
		if ValidateChannelPattern(p) != nil || ValidateChannelPattern(q) != nil {
			return
		}
		pt, qt := strings.Split(p, "."), strings.Split(q, ".")
		if len(pt) > 4 || len(qt) > 4 {
			return
		}
		wantC, wantI := bruteRelations(pt, qt)
		if got := CoversTokens(pt, qt); got != wantC {
			t.Fatalf("CoversTokens(%q, %q) = %v, brute force says %v", p, q, got, wantC)
		}
		if got := IntersectTokens(pt, qt); got != wantI {
			t.Fatalf("IntersectTokens(%q, %q) = %v, brute force says %v", p, q, got, wantI)
		}
		if got := PatternCovers(p, q); got != wantC {
			t.Fatalf("PatternCovers(%q, %q) = %v, brute force says %v", p, q, got, wantC)
		}
		if got := PatternsIntersect(p, q); got != wantI {
			t.Fatalf("PatternsIntersect(%q, %q) = %v, brute force says %v", p, q, got, wantI)
		}
	})
}
