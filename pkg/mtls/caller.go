package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Sentinel errors of caller verification; every one means "unauthenticated".
var (
	// ErrNoClientAuth marks a caller certificate that does not list the clientAuth extended key
	// usage. crypto/x509 accepts a leaf with no extended key usage, or with
	// anyExtendedKeyUsage, for every purpose; a caller must be certified for this one.
	ErrNoClientAuth = errors.New("certificate does not list the clientAuth extended key usage")
	// ErrCallerInvalid marks a caller certificate that verified at the handshake but no longer
	// does: now is outside its validity (or an issuer's), or its chain does not reach the
	// current CA pool (the CA was removed or replaced).
	ErrCallerInvalid = errors.New("caller certificate no longer verifies")
)

// requireClientAuth refuses a caller leaf that does not list clientAuth explicitly.
func requireClientAuth(leaf *x509.Certificate) error {
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return fmt.Errorf("mtls: caller certificate %q (serial %s): %w", leaf.Subject.String(), leaf.SerialNumber.Text(16), ErrNoClientAuth)
	}
	return nil
}

// verifyClientConnection is the server's tls.Config.VerifyConnection: crypto/tls has verified
// the chain, and this adds what it does not check (see ErrNoClientAuth).
func verifyClientConnection(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return ErrNotVerified
	}
	return requireClientAuth(cs.PeerCertificates[0])
}

// VerifyCaller verifies a caller again, as the handshake did, against the CA pool and the time
// given now: the leaf the peer presented, with the intermediates it presented, must chain to
// pool for client authentication, every certificate of that chain must be valid at now, and the
// leaf must list clientAuth. It refuses a state whose handshake verified nothing
// (ErrNotVerified) and everything else with an error matching ErrCallerInvalid or
// ErrNoClientAuth. A server calls it on every request, so a connection established with a
// certificate that has since expired, or whose CA has since been removed, cannot keep calling.
func VerifyCaller(state tls.ConnectionState, pool *x509.CertPool, now time.Time) error {
	_, _, err := verifyCaller(state, pool, now)
	return err
}

// verifyCaller is VerifyCaller, also returning the interval in which the chain it found stays
// valid (the latest NotBefore and the earliest NotAfter on it).
func verifyCaller(state tls.ConnectionState, pool *x509.CertPool, now time.Time) (notBefore, notAfter time.Time, err error) {
	if len(state.VerifiedChains) == 0 || len(state.PeerCertificates) == 0 {
		return notBefore, notAfter, ErrNotVerified
	}
	leaf := state.PeerCertificates[0]
	if err := requireClientAuth(leaf); err != nil {
		return notBefore, notAfter, err
	}
	if pool == nil {
		return notBefore, notAfter, fmt.Errorf("mtls: %w: no CA pool", ErrCallerInvalid)
	}
	inter := x509.NewCertPool()
	for _, c := range state.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return notBefore, notAfter, fmt.Errorf("mtls: caller certificate %q (serial %s): %w: %v", leaf.Subject.String(), leaf.SerialNumber.Text(16), ErrCallerInvalid, err)
	}
	notBefore, notAfter = chains[0][0].NotBefore, chains[0][0].NotAfter
	for _, c := range chains[0][1:] {
		if c.NotBefore.After(notBefore) {
			notBefore = c.NotBefore
		}
		if c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	return notBefore, notAfter, nil
}

// maxCachedCallers bounds CallerVerifier's cache; past it the cache starts over, which costs
// only a verification per connection.
const maxCachedCallers = 4096

// CallerVerifier runs VerifyCaller on every request with the current CA pool and clock. A chain
// verification costs a signature check per certificate, so it remembers, per presented leaf,
// the pool it verified against and the interval its chain is valid in: while the pool is the
// same and now is inside that interval, the answer cannot differ, and only those are compared.
// A new pool (a reloaded CA file) or a time outside the interval verifies again. It is safe
// for concurrent use.
type CallerVerifier struct {
	pool func() *x509.CertPool
	now  func() time.Time

	mu sync.Mutex
	// verified maps a presented leaf (one per connection) to its last good verification; mu
	// must be held.
	verified map[*x509.Certificate]verification
}

type verification struct {
	pool                *x509.CertPool
	notBefore, notAfter time.Time
}

// NewCallerVerifier returns a CallerVerifier that reads the CA pool from pool on every request
// (Reloader.CAPool gives the current one) and the time from now (nil means time.Now). It
// refuses a nil pool function.
func NewCallerVerifier(pool func() *x509.CertPool, now func() time.Time) (*CallerVerifier, error) {
	if pool == nil {
		return nil, errors.New("mtls: NewCallerVerifier: nil CA pool function")
	}
	if now == nil {
		now = time.Now
	}
	return &CallerVerifier{pool: pool, now: now, verified: make(map[*x509.Certificate]verification)}, nil
}

// Verify runs VerifyCaller on state with the current pool and time.
func (v *CallerVerifier) Verify(state tls.ConnectionState) error {
	if len(state.VerifiedChains) == 0 || len(state.PeerCertificates) == 0 {
		return ErrNotVerified
	}
	pool, now, leaf := v.pool(), v.now(), state.PeerCertificates[0]
	v.mu.Lock()
	e, ok := v.verified[leaf]
	v.mu.Unlock()
	if ok && e.pool == pool && !now.Before(e.notBefore) && !now.After(e.notAfter) {
		return nil
	}
	notBefore, notAfter, err := verifyCaller(state, pool, now)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		delete(v.verified, leaf)
		return err
	}
	if len(v.verified) >= maxCachedCallers {
		clear(v.verified)
	}
	v.verified[leaf] = verification{pool: pool, notBefore: notBefore, notAfter: notAfter}
	return nil
}

// VerifyPeer runs Verify on the TLS state of the gRPC peer in ctx. It refuses a context with no
// peer (ErrNoPeer) or a peer that did not authenticate with TLS (ErrNotTLS).
func (v *CallerVerifier) VerifyPeer(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return ErrNoPeer
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return ErrNotTLS
	}
	return v.Verify(info.State)
}
