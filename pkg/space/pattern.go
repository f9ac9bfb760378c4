package space

import (
	"fmt"
	"strings"
)

// Channel patterns. Upstream lets an agent's ACL hold a channel subtree ("team.>") or a level
// ("team.*"). A pattern is a channel whose tokens may also be "*" (exactly one token) or, as the
// last token only, ">" (one or more trailing tokens), as in NATS subjects. Only the agent
// profile's channel grants take a pattern, and signerd's policy grants one only where one of the
// caller's allowed patterns covers its reach and its reach touches no excluded channel
// (ChannelReach, PatternCovers, PatternsIntersect). Every other name in this package takes a concrete channel (ValidateChannel).

// ValidateChannelPattern checks a channel grant pattern: one or more tokens joined by '.', each
// [A-Za-z0-9_-]+ or "*", and a last token that may be ">", at most MaxChannelLen bytes. A wildcard
// must be a whole token ("a*" and "a.b>" are refused). Every concrete channel is a pattern.
func ValidateChannelPattern(s string) error {
	if s == "" {
		return nameErr(KindChannel, s, "is empty")
	}
	if len(s) > MaxChannelLen {
		return nameErr(KindChannel, s, fmt.Sprintf("is longer than %d bytes", MaxChannelLen))
	}
	toks := strings.Split(s, ".")
	for i, tok := range toks {
		switch tok {
		case "":
			return nameErr(KindChannel, s, fmt.Sprintf("token %d is empty (leading, trailing or double dot)", i))
		case "*":
			continue
		case ">":
			if i != len(toks)-1 {
				return nameErr(KindChannel, s, fmt.Sprintf("token %d is '>', which may only be the last token", i))
			}
			continue
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; !isAlnum(c) && c != '_' && c != '-' {
				return nameErr(KindChannel, s, fmt.Sprintf("token %d contains %q, outside [A-Za-z0-9_-] (a wildcard is a whole token)", i, c))
			}
		}
	}
	return nil
}

// IsChannelPattern reports whether a valid channel pattern holds a wildcard token.
func IsChannelPattern(s string) bool {
	for _, tok := range strings.Split(s, ".") {
		if tok == "*" || tok == ">" {
			return true
		}
	}
	return false
}

// ChannelReach is what a channel grant reaches on the broker, as a pattern. nats-server matches a
// permission's last-token '*' against a literal '>' in the subject it checks, so the holder of a
// "team.*" row may subscribe "team.>" (and receives "team.x.y"), create a history consumer
// filtered on "team.>" and publish to the literal subject "team.>" (broker-proven in pkg/profiles).
// A '*' elsewhere cannot be widened that way: '>' is valid only last. So a pattern whose last token
// is '*' reaches its whole subtree (its last token read as '>'), and any other pattern reaches
// exactly what it names. A grant must be judged by its reach: signerd's policy checks
// ChannelReach(grant), not the grant as written.
func ChannelReach(pattern string) string {
	if pattern == "*" {
		return ">"
	}
	if rest, ok := strings.CutSuffix(pattern, ".*"); ok {
		return rest + ".>"
	}
	return pattern
}

// PatternCovers reports whether every concrete subject that pattern q matches is also matched by
// pattern p (q is a subset of p). Both are split on '.'; either side holding an empty token or a
// '>' that is not last covers nothing and is covered by nothing, so a malformed pattern never
// widens or passes. It is CoversTokens on the split forms.
func PatternCovers(p, q string) bool {
	pt, ok := patternTokens(p)
	if !ok {
		return false
	}
	qt, ok := patternTokens(q)
	return ok && CoversTokens(pt, qt)
}

// PatternsIntersect reports whether some concrete subject is matched by both patterns p and q.
// Malformed patterns (see PatternCovers) intersect nothing. It is IntersectTokens on the split
// forms.
func PatternsIntersect(p, q string) bool {
	pt, ok := patternTokens(p)
	if !ok {
		return false
	}
	qt, ok := patternTokens(q)
	return ok && IntersectTokens(pt, qt)
}

// patternTokens splits a pattern and refuses an empty token or a '>' before the last token: the
// token functions below assume neither.
func patternTokens(s string) ([]string, bool) {
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if t == "" || t == ">" && i != len(toks)-1 {
			return nil, false
		}
	}
	return toks, true
}

// CoversTokens reports whether every concrete token list that q matches is also matched by p,
// where "*" matches exactly one token and a last ">" one or more. A wildcard in q is covered only
// by a wildcard at least as wide at that place in p: "team.*" and "team.>" cover "team.a", "team.>"
// covers "team.*", "team.*" does not cover "team.>", and ">" is covered only by ">". The callers
// pass non-empty tokens with '>' last (ValidateChannelPattern).
func CoversTokens(p, q []string) bool {
	for i, pt := range p {
		if pt == ">" {
			return len(q) > i // q has a token here, and '>' takes it and all that follows
		}
		if i == len(q) {
			return false // q's subjects end here; p needs another token
		}
		switch qt := q[i]; {
		case qt == ">":
			return false // q reaches any depth; p (no '>' yet) reaches a fixed one
		case pt == "*":
		case qt == "*" || pt != qt:
			return false
		}
	}
	return len(p) == len(q)
}

// IntersectTokens reports whether some concrete token list is matched by both p and q (same
// token rules as CoversTokens). It is symmetric.
func IntersectTokens(p, q []string) bool {
	for i := 0; ; i++ {
		switch {
		case i == len(p) || i == len(q):
			return len(p) == len(q)
		case p[i] == ">" || q[i] == ">":
			return true // both have a token at i, and '>' takes it and anything after
		case p[i] == "*" || q[i] == "*" || p[i] == q[i]:
		default:
			return false
		}
	}
}
