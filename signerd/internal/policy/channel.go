package policy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// Channel patterns are dotted channel names in which a whole token may be "*" (exactly one
// token) or, as the last token only, ">" (one or more trailing tokens), as in NATS subjects.
// Literal tokens are [A-Za-z0-9_-]+ (the channel grammar of space.ValidateChannel); anything else
// is malformed, in the policy and in a request alike, so an odd character can never slip past a
// literal comparison.

const (
	tokAny  = "*"
	tokTail = ">"
)

// parseChannel splits a channel name or pattern into tokens and checks its grammar.
func parseChannel(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("empty channel")
	}
	if len(s) > space.MaxChannelLen {
		return nil, fmt.Errorf("longer than %d bytes", space.MaxChannelLen)
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return nil, errors.New("empty token")
		case t == tokAny:
		case t == tokTail:
			if i != len(toks)-1 {
				return nil, errors.New(`">" must be the last token`)
			}
		default:
			for j := 0; j < len(t); j++ {
				if !isChannelByte(t[j]) {
					return nil, fmt.Errorf("token %q: character %q is not one of [A-Za-z0-9_-] (a wildcard must be a whole token: \"*\" or \">\")", t, t[j])
				}
			}
		}
	}
	return toks, nil
}

func isChannelByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// covers reports whether every channel that q matches is also matched by p (space.CoversTokens):
// for a literal q this is plain matching; a wildcard in q is covered only by a wildcard at least
// as wide in p, so a grant of "team.*" needs a rule of "team.*" or "team.>" or wider, never
// "team.a".
func covers(p, q []string) bool { return space.CoversTokens(p, q) }

// intersects reports whether some channel is matched by both p and q (space.IntersectTokens).
// Exclusions use it: a requested pattern that could reach an excluded channel is refused even if
// most of what it names is allowed.
func intersects(p, q []string) bool { return space.IntersectTokens(p, q) }
