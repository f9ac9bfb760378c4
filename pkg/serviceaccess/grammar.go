package serviceaccess

import (
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxEndpointLen caps an endpoint name in bytes (lifecycle.MaxEndpointTokenLen).
const MaxEndpointLen = 64

// ValidEndpoint reports whether name is an endpoint name: one or more '.'-joined labels of
// [a-z0-9]([a-z0-9-]*[a-z0-9])?, at most MaxEndpointLen bytes. It is lifecycle.EndpointToken's
// grammar, kept here so that pkg/lifecycle may import this package; a test holds the two equal.
func ValidEndpoint(name string) bool {
	if name == "" || len(name) > MaxEndpointLen {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// EndpointTokenOf returns an endpoint's key token (its labels joined by '_'), refusing a name
// outside the grammar.
func EndpointTokenOf(name string) (string, error) {
	if !ValidEndpoint(name) {
		return "", fail("endpoint", "%.80q is not an endpoint name", name)
	}
	return strings.ReplaceAll(name, ".", "_"), nil
}

// validInstance reports whether s is an instance id (space.ValidateUID: 26 to 32 of [a-z0-9]).
func validInstance(s string) bool { return space.ValidateUID(s) == nil }

// validDerivedOwner reports whether s is a derived owner (space.ValidateDerivedOwner).
func validDerivedOwner(s string) bool { return space.ValidateDerivedOwner(s) == nil }

// prefixedBase32 reports whether s is prefix and n lowercase base32 characters ([a-z2-7]).
func prefixedBase32(s, prefix string, n int) bool {
	if len(s) != len(prefix)+n || !strings.HasPrefix(s, prefix) {
		return false
	}
	return isBase32(s[len(prefix):])
}

func isBase32(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// ValidWitness reports whether w is "w_" and 52 lowercase base32 characters.
func ValidWitness(w string) bool { return prefixedBase32(w, "w_", 52) }

// ValidRoot reports whether r is a root id: "r_" and 26 lowercase base32 characters.
func ValidRoot(r string) bool { return prefixedBase32(r, "r_", 26) }

// ValidProposal reports whether p is a proposal id: "p_" and 26 lowercase base32 characters.
func ValidProposal(p string) bool { return prefixedBase32(p, "p_", 26) }

// ValidJTI reports whether j is a service token id: 26 lowercase base32 characters.
func ValidJTI(j string) bool { return len(j) == 26 && isBase32(j) }

// ValidRequestID reports whether id is a requestId: 8 to 64 of [A-Za-z0-9_-].
func ValidRequestID(id string) bool {
	if len(id) < 8 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validDigest reports whether d is "sha256:" and 64 lowercase hex characters.
func validDigest(d string) bool {
	if len(d) != len("sha256:")+64 || !strings.HasPrefix(d, "sha256:") {
		return false
	}
	for i := len("sha256:"); i < len(d); i++ {
		if c := d[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validTokenText reports whether t could be a compact JWS: 1 to MaxTokenBytes of
// [A-Za-z0-9_.-]. The token's own checks come later, from its verifier.
func validTokenText(t string) bool {
	if t == "" || len(t) > MaxTokenBytes {
		return false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// validSlug reports whether s is 1 to 64 of [a-z0-9-] (a denial reason).
func validSlug(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
