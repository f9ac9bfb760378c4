package server_test

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// getSpaceOn calls GetSpace for alpha on client.
func getSpaceOn(t *testing.T, client signerv1.SignerServiceClient) error {
	t.Helper()
	resp, err := client.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err == nil && resp.GetSpace() != "alpha" {
		t.Fatalf("GetSpace answered %v", resp)
	}
	return err
}

// wantRevoked asserts that calls on an established connection are refused as unauthenticated
// (not UNAVAILABLE, which a new handshake would give) and audited as denied for the caller.
func wantRevoked(t *testing.T, s *signerdtest.Signer, client signerv1.SignerServiceClient, caller string) {
	t.Helper()
	for range 2 {
		before := len(auditRecords(t, s.AuditPath))
		wantRefusal(t, getSpaceOn(t, client), codes.Unauthenticated, "")
		recs := auditRecords(t, s.AuditPath)
		if len(recs) != before+1 {
			t.Fatalf("audit grew by %d lines, want 1", len(recs)-before)
		}
		auditWant{caller: caller, rpc: "GetSpace", decision: audit.Denied, reason: "unauthenticated"}.check(t, recs[len(recs)-1])
	}
	verifyAudit(t, s.AuditPath)
}

// TestRevocationExpiredCertificate is finding 6 of issue 7: the certificate was checked only at
// the handshake, so a connection made with it kept working after it expired. Every request now
// re-verifies it against signerd's clock.
func TestRevocationExpiredCertificate(t *testing.T) {
	clock := &offsetClock{}
	s := signerdtest.Start(t, signerdtest.Options{Now: clock.Now})
	id := signerdtest.ID("managerd", "alpha")
	client := dial(t, s.Addr, s.ClientSpec(t, mtls.LeafSpec{URIs: []string{id},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * time.Minute)}))
	if err := getSpaceOn(t, client); err != nil {
		t.Fatalf("GetSpace with a valid certificate: %v", err)
	}
	clock.Set(11 * time.Minute)
	wantRevoked(t, s, client, id)
}

// TestRevocationCAReplaced is finding 6 of issue 7: after the client CA file is replaced by
// another CA and reloaded, a connection made under the old CA is refused on its next request.
func TestRevocationCAReplaced(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	id := signerdtest.ID("managerd", "alpha")
	client := dialAs(t, s, id)
	if err := getSpaceOn(t, client); err != nil {
		t.Fatalf("GetSpace under the original CA: %v", err)
	}
	other, err := mtls.NewCA("replacement CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(s.ServerCAFile), "ca.pem.new")
	if err := os.WriteFile(tmp, other.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.ServerCAFile); err != nil {
		t.Fatal(err)
	}
	// The reloader polls every 100 ms; wait until the established connection is refused.
	testkit.Eventually(t, callTimeout, func() error {
		if err := getSpaceOn(t, client); err == nil {
			return errors.New("the established connection still works")
		}
		return nil
	})
	wantRevoked(t, s, client, id)
}

// TestCallerWithoutClientAuthRefused is finding 9 of issue 7: crypto/tls takes a certificate
// with no extended key usage (or anyExtendedKeyUsage) as good for client authentication;
// signerd refuses it as a caller at the handshake.
func TestCallerWithoutClientAuthRefused(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	id := signerdtest.ID("managerd", "alpha")
	for _, tc := range []struct {
		name string
		spec mtls.LeafSpec
	}{
		{"fail/no-eku", mtls.LeafSpec{URIs: []string{id}, OmitExtKeyUsage: true}},
		{"fail/any-eku", mtls.LeafSpec{URIs: []string{id}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}},
		{"fail/server-auth-only", mtls.LeafSpec{URIs: []string{id}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantRefusal(t, getSpaceOn(t, dial(t, s.Addr, s.ClientSpec(t, tc.spec))), codes.Unavailable, "")
		})
	}
	t.Run("ok/client-auth", func(t *testing.T) {
		if err := getSpaceOn(t, dial(t, s.Addr, s.ClientSpec(t, mtls.LeafSpec{URIs: []string{id}}))); err != nil {
			t.Fatalf("GetSpace with a clientAuth certificate: %v", err)
		}
	})
}
