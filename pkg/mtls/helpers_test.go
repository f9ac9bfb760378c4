package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const testTD = "cotal.local"

// writeFile writes data to path with exactly mode, replacing it atomically (temp + rename), so
// a polling Reloader never sees half a file.
func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // the umask may have cleared bits
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// writeLeaf writes leaf's certificate and key (0600) to <dir>/<name>.pem and .key.
func writeLeaf(t *testing.T, dir, name string, leaf *Leaf) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	writeFile(t, certFile, leaf.CertPEM(), 0o644)
	writeFile(t, keyFile, leaf.KeyPEM(), 0o600)
	return certFile, keyFile
}

// writeCA writes ca's certificate to <dir>/<name>.pem.
func writeCA(t *testing.T, dir, name string, ca *CA) string {
	t.Helper()
	p := filepath.Join(dir, name+".pem")
	writeFile(t, p, ca.CertPEM(), 0o644)
	return p
}

// serverLeaf issues a signerd-style server certificate.
func serverLeaf(t *testing.T, ca *CA) *Leaf {
	t.Helper()
	return issue(t, ca, LeafSpec{
		CommonName:  "signerd",
		URIs:        []string{"spiffe://" + testTD + "/signerd"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// clientLeaf issues a client certificate with the given URI SANs.
func clientLeaf(t *testing.T, ca *CA, uris ...string) *Leaf {
	t.Helper()
	return issue(t, ca, LeafSpec{CommonName: "client", URIs: uris})
}

// testServer is a gRPC health server on 127.0.0.1 behind NewServerTLS. Its interceptor does
// what signerd's will: take the caller identity from the verified chain, refuse the call with
// Unauthenticated if there is none, and otherwise echo the identity in the "caller-id" header.
type testServer struct {
	addr     string
	reloader *Reloader

	mu      sync.Mutex
	lastErr error // last IdentityFromContext error

	// handshakeErrs receives every failed server-side handshake. A refused client sees only
	// Unavailable, and with TLS 1.3 its text is racy (the alert, or a broken pipe if the client
	// writes first), so tests read why the server refused from here.
	handshakeErrs chan error
}

// recordingCreds passes handshakes through and records server-side failures.
type recordingCreds struct {
	credentials.TransportCredentials
	errs chan<- error
}

func (c recordingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		select {
		case c.errs <- err:
		default:
		}
	}
	return out, info, err
}

func (c recordingCreds) Clone() credentials.TransportCredentials {
	return recordingCreds{TransportCredentials: c.TransportCredentials.Clone(), errs: c.errs}
}

// handshakeErr waits for the next failed server-side handshake.
func (s *testServer) handshakeErr(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.handshakeErrs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a failed server handshake")
		return nil
	}
}

func (s *testServer) identityErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

func (s *testServer) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	id, err := IdentityFromContext(ctx)
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, "caller identity refused")
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("caller-id", id)); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func startServer(t *testing.T, files ServerFiles, opts ...Option) *testServer {
	t.Helper()
	cfg, r, err := NewServerTLS(files, opts...)
	if err != nil {
		t.Fatalf("NewServerTLS: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: lis.Addr().String(), reloader: r, handshakeErrs: make(chan error, 16)}
	creds := recordingCreds{TransportCredentials: credentials.NewTLS(cfg), errs: ts.handshakeErrs}
	s := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(ts.intercept))
	healthpb.RegisterHealthServer(s, health.NewServer())
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ts
}

// callResult is what one health check over a fresh connection saw.
type callResult struct {
	callerID   string            // the server's "caller-id" header
	serverCert *x509.Certificate // the leaf the server presented
	err        error
}

// call dials addr with a fresh connection (so a fresh handshake) and runs one health check.
func call(t *testing.T, addr string, cfg *tls.Config) callResult {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	defer func() {
		if err := conn.Close(); err != nil {
			t.Errorf("conn.Close: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var md metadata.MD
	var p peer.Peer
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md), grpc.Peer(&p))
	res := callResult{err: err}
	if ids := md.Get("caller-id"); len(ids) == 1 {
		res.callerID = ids[0]
	}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
		res.serverCert = info.State.PeerCertificates[0]
	}
	return res
}

// eventually polls cond every 10ms until it returns true or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
