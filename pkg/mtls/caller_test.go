package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// stateFor is the server-side TLS state of a handshake that verified leaf against ca.
func stateFor(leaf *Leaf, ca *CA) tls.ConnectionState {
	return tls.ConnectionState{
		PeerCertificates: []*x509.Certificate{leaf.Certificate()},
		VerifiedChains:   [][]*x509.Certificate{{leaf.Certificate(), ca.Certificate()}},
	}
}

func poolOf(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Certificate())
	}
	return p
}

// TestVerifyCaller is finding 6 of issue 7: a caller is verified again per request against the
// current pool and clock, so an expired certificate or a removed CA stops an established
// connection.
func TestVerifyCaller(t *testing.T) {
	const id = "spiffe://" + testTD + "/authd/sp1"
	now := time.Now()
	ca, other := newTestCA(t, "client CA"), newTestCA(t, "other CA")
	valid := issue(t, ca, LeafSpec{CommonName: "valid", URIs: []string{id}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Minute)})
	noEKU := issue(t, ca, LeafSpec{CommonName: "noeku", URIs: []string{id}, OmitExtKeyUsage: true})
	tests := []struct {
		name  string
		state tls.ConnectionState
		pool  *x509.CertPool
		now   time.Time
		want  error
	}{
		{"ok/valid", stateFor(valid, ca), poolOf(ca), now, nil},
		{"ok/ca-among-others", stateFor(valid, ca), poolOf(other, ca), now, nil},
		{"fail/expired", stateFor(valid, ca), poolOf(ca), now.Add(2 * time.Minute), ErrCallerInvalid},
		{"fail/not-yet-valid", stateFor(valid, ca), poolOf(ca), now.Add(-2 * time.Minute), ErrCallerInvalid},
		{"fail/ca-replaced", stateFor(valid, ca), poolOf(other), now, ErrCallerInvalid},
		{"fail/no-pool", stateFor(valid, ca), nil, now, ErrCallerInvalid},
		{"fail/no-client-auth-eku", stateFor(noEKU, ca), poolOf(ca), now, ErrNoClientAuth},
		{"fail/not-verified", tls.ConnectionState{PeerCertificates: []*x509.Certificate{valid.Certificate()}}, poolOf(ca), now, ErrNotVerified},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyCaller(tt.state, tt.pool, tt.now)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("VerifyCaller = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("VerifyCaller = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestCallerVerifier checks that remembering a verification never outlives what it depended
// on: a new pool or a time outside the chain's validity verifies again.
func TestCallerVerifier(t *testing.T) {
	const id = "spiffe://" + testTD + "/authd/sp1"
	start := time.Now()
	ca, other := newTestCA(t, "client CA"), newTestCA(t, "other CA")
	leaf := issue(t, ca, LeafSpec{CommonName: "c", URIs: []string{id}, NotBefore: start.Add(-time.Minute), NotAfter: start.Add(time.Minute)})
	var pool atomic.Pointer[x509.CertPool]
	pool.Store(poolOf(ca))
	var clock atomic.Int64
	clock.Store(start.UnixNano())
	v, err := NewCallerVerifier(pool.Load, func() time.Time { return time.Unix(0, clock.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	state := stateFor(leaf, ca)
	for i := range 3 {
		if err := v.Verify(state); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	pool.Store(poolOf(other))
	if err := v.Verify(state); !errors.Is(err, ErrCallerInvalid) {
		t.Fatalf("after the CA was replaced: %v, want ErrCallerInvalid", err)
	}
	pool.Store(poolOf(ca))
	if err := v.Verify(state); err != nil {
		t.Fatalf("after the CA was restored: %v", err)
	}
	clock.Store(start.Add(2 * time.Minute).UnixNano())
	if err := v.Verify(state); !errors.Is(err, ErrCallerInvalid) {
		t.Fatalf("after expiry: %v, want ErrCallerInvalid", err)
	}
	if _, err := NewCallerVerifier(nil, nil); err == nil {
		t.Fatal("NewCallerVerifier accepted a nil pool function")
	}
}

// BenchmarkVerifyCaller: "uncached" is a full re-verification, which CallerVerifier pays once per
// connection (and after each CA reload); "cached" is what it costs on every other request.
func BenchmarkVerifyCaller(b *testing.B) {
	ca, err := NewCA("client CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	leaf, err := ca.Issue(LeafSpec{URIs: []string{"spiffe://" + testTD + "/authd/sp1"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	state, pool := stateFor(leaf, ca), poolOf(ca)
	b.Run("uncached", func(b *testing.B) {
		for b.Loop() {
			if err := VerifyCaller(state, pool, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		v, err := NewCallerVerifier(func() *x509.CertPool { return pool }, nil)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := v.Verify(state); err != nil {
				b.Fatal(err)
			}
		}
	})
}
