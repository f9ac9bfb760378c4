package mtls

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Sentinel errors for caller identity. The typed errors below wrap them, so a caller can test
// the class with errors.Is and read the offending value with errors.As. Every one of them means
// "unauthenticated": a gRPC server maps them to codes.Unauthenticated.
var (
	// ErrInvalidID marks a string that is not a SPIFFE ID this package accepts (see ParseID).
	ErrInvalidID = errors.New("invalid SPIFFE ID")
	// ErrNoURISAN marks a certificate without a URI SAN: it names no caller.
	ErrNoURISAN = errors.New("certificate has no URI SAN")
	// ErrManyURISANs marks a certificate with more than one URI SAN: it would name two callers,
	// and picking one would let a CA-signed certificate choose which.
	ErrManyURISANs = errors.New("certificate has more than one URI SAN")
	// ErrNoPeer marks a context that carries no gRPC peer.
	ErrNoPeer = errors.New("no gRPC peer in context")
	// ErrNotTLS marks a peer that did not authenticate with TLS.
	ErrNotTLS = errors.New("peer did not authenticate with TLS")
	// ErrNotVerified marks a TLS peer whose certificate chain was not verified (no client
	// certificate, or a server that does not verify them). Unverified certificates never name a
	// caller.
	ErrNotVerified = errors.New("peer certificate chain is not verified")
)

// maxIDLen is the SPIFFE limit on the length of an ID as a URI.
const maxIDLen = 2048

// maxTrustDomainLen is the SPIFFE limit on the length of a trust domain.
const maxTrustDomainLen = 255

// IDError says why a string is not an acceptable SPIFFE ID. It matches ErrInvalidID.
type IDError struct {
	// ID is the offending text, as given.
	ID string
	// Reason says which rule it breaks.
	Reason string
}

// Error quotes the ID, shortened so a hostile certificate cannot flood a log line.
func (e *IDError) Error() string {
	id := e.ID
	if len(id) > 200 {
		id = id[:200] + "..."
	}
	return fmt.Sprintf("mtls: invalid SPIFFE ID %q: %s", id, e.Reason)
}

// Is reports whether target is ErrInvalidID.
func (e *IDError) Is(target error) bool { return target == ErrInvalidID }

// CertError says why a verified certificate names no caller. Err is ErrNoURISAN,
// ErrManyURISANs or an *IDError.
type CertError struct {
	// Subject and Serial identify the certificate in logs.
	Subject string
	Serial  string
	// URIs are the certificate's URI SANs as text.
	URIs []string
	Err  error
}

// Error names the certificate and the rule it breaks.
func (e *CertError) Error() string {
	return fmt.Sprintf("mtls: certificate %q (serial %s): %v", e.Subject, e.Serial, e.Err)
}

// Unwrap returns the reason, so errors.Is sees the sentinels.
func (e *CertError) Unwrap() error { return e.Err }

// ID is a SPIFFE ID, spiffe://<trust-domain>/<segment>[/<segment>...]. The zero ID is invalid;
// the only way to a non-zero ID is ParseID or NewID, so holding one means it passed validation.
// IDs compare with ==.
type ID struct {
	trustDomain string
	path        string // begins with "/", never empty
}

// ParseID parses s as a SPIFFE ID and refuses anything but the canonical form: scheme
// "spiffe", a trust domain of [a-z0-9._-] (no port, no userinfo), a non-empty path of
// segments of [A-Za-z0-9._-] that are neither empty, "." nor "..", no trailing slash, no
// query, no fragment, no percent-encoding, at most 2048 bytes. Accepting only one spelling of
// each ID means a policy keyed by ID.String() cannot be dodged by an equivalent spelling.
func ParseID(s string) (ID, error) {
	const scheme = "spiffe://"
	bad := func(reason string) (ID, error) { return ID{}, &IDError{ID: s, Reason: reason} }
	if len(s) > maxIDLen {
		return bad(fmt.Sprintf("longer than %d bytes", maxIDLen))
	}
	if !strings.HasPrefix(s, scheme) {
		return bad(`scheme must be "spiffe://"`)
	}
	rest := s[len(scheme):]
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return bad("no path: an ID must name a workload, not only a trust domain")
	}
	td, path := rest[:slash], rest[slash:]
	if err := checkTrustDomain(td); err != "" {
		return bad(err)
	}
	if err := checkPath(path); err != "" {
		return bad(err)
	}
	return ID{trustDomain: td, path: path}, nil
}

// NewID builds spiffe://<trustDomain>/<segments joined by "/">, for example
// NewID("cotal.local", "authd", space). It refuses what ParseID refuses; a segment may not
// contain "/".
func NewID(trustDomain string, segments ...string) (ID, error) {
	s := "spiffe://" + trustDomain + "/" + strings.Join(segments, "/")
	if len(segments) == 0 {
		s = "spiffe://" + trustDomain
	}
	for _, seg := range segments {
		if strings.Contains(seg, "/") {
			return ID{}, &IDError{ID: s, Reason: fmt.Sprintf("segment %q contains '/'", seg)}
		}
	}
	return ParseID(s)
}

// TrustDomain returns the trust domain (the URI host).
func (id ID) TrustDomain() string { return id.trustDomain }

// Path returns the path, beginning with "/".
func (id ID) Path() string { return id.path }

// Segments returns the path segments, for example ["authd", "myspace"].
func (id ID) Segments() []string {
	if id.path == "" {
		return nil
	}
	return strings.Split(id.path[1:], "/")
}

// IsZero reports whether id is the zero (invalid) ID.
func (id ID) IsZero() bool { return id.trustDomain == "" }

// String returns the canonical URI form; ParseID(id.String()) returns id.
func (id ID) String() string {
	if id.IsZero() {
		return ""
	}
	return "spiffe://" + id.trustDomain + id.path
}

// checkTrustDomain returns why td is not a valid trust domain, or "".
func checkTrustDomain(td string) string {
	if td == "" {
		return "empty trust domain"
	}
	if len(td) > maxTrustDomainLen {
		return fmt.Sprintf("trust domain longer than %d bytes", maxTrustDomainLen)
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '-', c == '_':
		case c == '@':
			return "userinfo is not allowed"
		case c == ':':
			return "a port is not allowed"
		case c == '?':
			return "a query is not allowed"
		case c == '#':
			return "a fragment is not allowed"
		case c >= 'A' && c <= 'Z':
			return "trust domain must be lower case"
		default:
			return fmt.Sprintf("trust domain has character %q outside [a-z0-9._-]", c)
		}
	}
	return ""
}

// checkPath returns why path (which begins with "/") is not a valid ID path, or "".
func checkPath(path string) string {
	if path == "/" {
		return "empty path"
	}
	for _, seg := range strings.Split(path[1:], "/") {
		switch seg {
		case "":
			return "empty path segment or trailing slash"
		case ".", "..":
			return fmt.Sprintf("path segment %q is not allowed", seg)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
				c == '.', c == '-', c == '_':
			case c == '?':
				return "a query is not allowed"
			case c == '#':
				return "a fragment is not allowed"
			case c == '%':
				return "percent-encoding is not allowed"
			default:
				return fmt.Sprintf("path has character %q outside [A-Za-z0-9._-]", c)
			}
		}
	}
	return ""
}

// IdentityFromCert returns the caller identity named by cert: its only URI SAN, which must be
// a SPIFFE ID ParseID accepts. It refuses a certificate with no URI SAN or more than one.
// cert must be the leaf of a chain crypto/tls has verified; this function does no
// verification of its own.
func IdentityFromCert(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", ErrNotVerified
	}
	certErr := func(err error) *CertError {
		ce := &CertError{Subject: cert.Subject.String(), Err: err}
		if cert.SerialNumber != nil {
			ce.Serial = cert.SerialNumber.Text(16)
		}
		for _, u := range cert.URIs {
			ce.URIs = append(ce.URIs, u.String())
		}
		return ce
	}
	switch len(cert.URIs) {
	case 0:
		return "", certErr(ErrNoURISAN)
	case 1:
	default:
		return "", certErr(ErrManyURISANs)
	}
	u := cert.URIs[0]
	// crypto/x509 has already parsed the SAN with net/url, which decodes percent-escapes and
	// splits off userinfo, port, query and fragment. Refuse those parts explicitly, then
	// re-check the re-encoded text with the strict parser, so both views agree.
	var reason string
	switch {
	case u.Scheme != "spiffe":
		reason = `scheme must be "spiffe"`
	case u.Opaque != "":
		reason = "opaque URI"
	case u.User != nil:
		reason = "userinfo is not allowed"
	case u.Host == "":
		reason = "empty trust domain"
	case u.Port() != "":
		reason = "a port is not allowed"
	case u.RawQuery != "" || u.ForceQuery:
		reason = "a query is not allowed"
	case u.Fragment != "" || u.RawFragment != "":
		reason = "a fragment is not allowed"
	case u.Path == "":
		reason = "no path"
	}
	text := u.String()
	if reason != "" {
		return "", certErr(&IDError{ID: text, Reason: reason})
	}
	id, err := ParseID(text)
	if err != nil {
		return "", certErr(err)
	}
	return id.String(), nil
}

// IdentityFromContext returns the caller identity of a gRPC request: the URI SAN of the leaf
// of the first chain crypto/tls verified for the peer. It never looks at the unverified
// PeerCertificates, so a server that forgot RequireAndVerifyClientCert gets ErrNotVerified,
// not an identity.
func IdentityFromContext(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return "", ErrNoPeer
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		if p.AuthInfo == nil {
			return "", ErrNotTLS
		}
		return "", fmt.Errorf("mtls: auth type %q: %w", p.AuthInfo.AuthType(), ErrNotTLS)
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", ErrNotVerified
	}
	return IdentityFromCert(chains[0][0])
}
