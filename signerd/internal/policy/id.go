package policy

import (
	"errors"
	"fmt"
	"strings"
)

// Caller ids are SPIFFE IDs (https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE-ID.md):
// spiffe://<trust domain>/<segment>/<segment>... The grammar is pkg/mtls.ParseID's (the
// standard's, applied strictly, with a non-empty path), so an identity with a query, port, user
// info, upper-case trust domain, empty or dot segment is unknown rather than normalised into
// something a rule might match. It is repeated here because rules also need patterns.

const (
	spiffePrefix = "spiffe://"
	// maxIDLen bounds the work spent on a caller string; the standard recommends 2048 bytes.
	maxIDLen = 2048
	// maxTrustDomainLen is the standard's limit for a trust domain name.
	maxTrustDomainLen = 255

	segAny   = "*"       // exactly one path segment, any value
	segSpace = "{space}" // exactly one path segment, bound to the request's space token
)

// spiffeID is a parsed SPIFFE ID or id pattern.
type spiffeID struct {
	trustDomain string
	segments    []string
}

// parseSPIFFE parses s as a SPIFFE ID. With patterns set, a whole segment may also be "*" or
// "{space}" (the latter at most once).
func parseSPIFFE(s string, patterns bool) (spiffeID, error) {
	if len(s) > maxIDLen {
		return spiffeID{}, fmt.Errorf("longer than %d bytes", maxIDLen)
	}
	rest, ok := strings.CutPrefix(s, spiffePrefix)
	if !ok {
		return spiffeID{}, errors.New(`must start with "spiffe://"`)
	}
	td, path, hasPath := strings.Cut(rest, "/")
	if td == "" {
		return spiffeID{}, errors.New("empty trust domain")
	}
	if len(td) > maxTrustDomainLen {
		return spiffeID{}, fmt.Errorf("trust domain longer than %d bytes", maxTrustDomainLen)
	}
	for i := 0; i < len(td); i++ {
		if !isTrustDomainByte(td[i]) {
			return spiffeID{}, fmt.Errorf("trust domain %q: character %q is not one of [a-z0-9._-]", td, td[i])
		}
	}
	if !hasPath || path == "" {
		// As pkg/mtls.ParseID: an ID must name a workload, not only a trust domain.
		return spiffeID{}, errors.New("no path")
	}
	id := spiffeID{trustDomain: td}
	bound := false
	for seg := range strings.SplitSeq(path, "/") {
		switch {
		case seg == "":
			return spiffeID{}, errors.New("empty path segment")
		case seg == "." || seg == "..":
			return spiffeID{}, fmt.Errorf("path segment %q", seg)
		case patterns && seg == segAny:
		case patterns && seg == segSpace:
			if bound {
				return spiffeID{}, errors.New(`"{space}" may appear only once`)
			}
			bound = true
		default:
			for i := 0; i < len(seg); i++ {
				if !isPathByte(seg[i]) {
					if patterns {
						return spiffeID{}, fmt.Errorf("path segment %q: character %q is not one of [A-Za-z0-9._-] (a wildcard must be a whole segment: \"*\" or \"{space}\")", seg, seg[i])
					}
					return spiffeID{}, fmt.Errorf("path segment %q: character %q is not one of [A-Za-z0-9._-]", seg, seg[i])
				}
			}
		}
		id.segments = append(id.segments, seg)
	}
	return id, nil
}

func isTrustDomainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
}

func isPathByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
}

// isPattern reports whether the id has a wildcard segment.
func (p spiffeID) isPattern() bool {
	for _, s := range p.segments {
		if s == segAny || s == segSpace {
			return true
		}
	}
	return false
}

// bindsSpace reports whether the pattern has a "{space}" segment.
func (p spiffeID) bindsSpace() bool {
	for _, s := range p.segments {
		if s == segSpace {
			return true
		}
	}
	return false
}

// match reports whether the concrete id matches the pattern p and returns the segment bound
// to "{space}" ("" if p binds none).
func (p spiffeID) match(id spiffeID) (bound string, ok bool) {
	if p.trustDomain != id.trustDomain || len(p.segments) != len(id.segments) {
		return "", false
	}
	for i, s := range p.segments {
		switch s {
		case segAny:
		case segSpace:
			bound = id.segments[i]
		default:
			if s != id.segments[i] {
				return "", false
			}
		}
	}
	return bound, true
}

// shadows reports whether every id that q matches is also matched by p, so that q, listed
// after p, could never be selected.
func (p spiffeID) shadows(q spiffeID) bool {
	if p.trustDomain != q.trustDomain || len(p.segments) != len(q.segments) {
		return false
	}
	for i, s := range p.segments {
		qs := q.segments[i]
		if s == segAny || s == segSpace {
			continue
		}
		if qs == segAny || qs == segSpace || s != qs {
			return false
		}
	}
	return true
}
