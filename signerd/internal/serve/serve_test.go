package serve_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/serve"
	"github.com/cotalgo/cotal/signerd/internal/server"
	"github.com/cotalgo/cotal/signerd/internal/setup"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const callTimeout = 10 * time.Second

// fixture is everything `signerd serve` reads: an init directory with one space (alpha), a
// server certificate and client CA, a client certificate for managerd of alpha, a policy file and
// an audit path.
type fixture struct {
	root, keyDir, publicDir     string
	cert, key, clientCA, policy string
	auditPath                   string
	client                      mtls.ClientFiles
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "cotal")
	if _, err := setup.Init(setup.Options{Dir: dir, Spaces: []string{"alpha"}, Port: -1}); err != nil {
		t.Fatalf("init: %v", err)
	}
	ca, err := mtls.NewCA("serve test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(root, "pki")
	f := fixture{
		root: root, keyDir: filepath.Join(dir, setup.SignerDir), publicDir: filepath.Join(dir, setup.PublicDir),
		clientCA: filepath.Join(pki, "ca.pem"), policy: filepath.Join(root, "policy.yaml"),
		auditPath: filepath.Join(root, "audit", "signerd.audit"),
	}
	mkdirSecret(t, pki)
	writeFile(t, f.clientCA, ca.CertPEM(), 0o644)
	writeFile(t, f.policy, []byte(signerdtest.DefaultPolicy), 0o600)
	f.cert, f.key = issue(t, ca, filepath.Join(pki, "server"), mtls.LeafSpec{
		CommonName: "signerd", URIs: []string{"spiffe://cotal.local/signerd"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	cert, key := issue(t, ca, filepath.Join(pki, "client"), mtls.LeafSpec{URIs: []string{signerdtest.ID("managerd", "alpha")}})
	f.client = mtls.ClientFiles{CertFile: cert, KeyFile: key, ServerCAFile: f.clientCA}
	return f
}

func issue(t *testing.T, ca *mtls.CA, dir string, spec mtls.LeafSpec) (certFile, keyFile string) {
	t.Helper()
	spec.NotBefore, spec.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	leaf, err := ca.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	mkdirSecret(t, dir)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, leaf.CertPEM(), 0o644)
	if err := creds.WriteFileAtomic(keyFile, leaf.KeyPEM()); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func mkdirSecret(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// yaml renders a configuration for f listening on listen; extra lines are appended verbatim and
// keyDir "" leaves key_dir out.
func (f fixture) yaml(listen, keyDir, extra string) string {
	y := "listen: " + listen + "\n" +
		"tls: {cert: " + f.cert + ", key: " + f.key + ", client_ca: " + f.clientCA + "}\n" +
		"public_dir: " + f.publicDir + "\n" +
		"policy: " + f.policy + "\n" +
		"audit: {path: " + f.auditPath + ", replica: serve-test}\n" +
		"shutdown_timeout: 5s\n"
	if keyDir != "" {
		y += "key_dir: " + keyDir + "\n"
	}
	return y + extra
}

func (f fixture) config(t *testing.T, listen, keyDir, extra string) *serve.Config {
	t.Helper()
	cfg, err := serve.ParseConfig([]byte(f.yaml(listen, keyDir, extra)))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	return cfg
}

// running is a started signer and the outcome of its Run.
type running struct {
	*serve.Signer
	exited chan struct{} // closed when Run has returned; err is set before
	err    error
}

// run starts cfg and runs it until the test ends (or the test stops it); at cleanup it stops
// the signer and fails the test if Run did not return nil.
func run(t *testing.T, cfg *serve.Config) *running {
	t.Helper()
	s, err := serve.Start(cfg, nil, serve.Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	r := &running{Signer: s, exited: make(chan struct{})}
	go func() {
		r.err = s.Run(context.Background())
		close(r.exited)
	}()
	t.Cleanup(func() {
		s.Stop()
		if err := r.wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// wait waits (bounded) for Run to return and returns its error.
func (r *running) wait() error {
	select {
	case <-r.exited:
		return r.err
	case <-time.After(10 * time.Second):
		return errors.New("Run did not return within 10s")
	}
}

func dial(t *testing.T, target string, files mtls.ClientFiles) *grpc.ClientConn {
	t.Helper()
	tlsCfg, _, err := mtls.NewClientTLS(files, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// getSpace calls GetSpace for alpha and fails t unless it is granted.
func getSpace(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	resp, err := signerv1.NewSignerServiceClient(conn).GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatalf("GetSpace: %v", err)
	}
	if resp.GetSpace() != "alpha" || resp.GetAccountPublicKey() == "" {
		t.Fatalf("GetSpace answered %v", resp)
	}
}

func TestParseConfig(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := fixture{cert: "/c.pem", key: "/k.pem", clientCA: "/ca.pem", publicDir: "/pub", policy: "/p.yaml", auditPath: "/a/log"}
	tests := []struct {
		name string
		yaml string
		// want are substrings of the error; none means ParseConfig must succeed.
		want []string
	}{
		{name: "ok/minimal", yaml: f.yaml("127.0.0.1:0", "/keys", "")},
		{name: "ok/unix-listen", yaml: f.yaml("unix:/run/signerd.sock", "/keys", "")},
		{name: "fail/unknown-key", yaml: f.yaml("127.0.0.1:0", "/keys", "metrics_listn: 127.0.0.1:0\n"), want: []string{"metrics_listn"}},
		{name: "fail/unknown-nested-key", yaml: strings.Replace(f.yaml("127.0.0.1:0", "/keys", ""), "replica: serve-test}", "replica: serve-test, fsync: never}", 1), want: []string{"fsync"}},
		{name: "fail/missing-required", yaml: "log_level: info\n",
			want: []string{"listen", "tls.cert", "tls.key", "tls.client_ca", "public_dir", "policy", "audit.path", "audit.replica", "key_dir"}},
		{name: "fail/missing-key-dir", yaml: f.yaml("127.0.0.1:0", "", ""), want: []string{"key_dir"}},
		{name: "fail/empty-unix-path", yaml: f.yaml(`"unix:"`, "/keys", ""), want: []string{"unix"}},
		{name: "fail/bad-log-level", yaml: f.yaml("127.0.0.1:0", "/keys", "log_level: loud\n"), want: []string{"loud"}},
		{name: "fail/bad-duration", yaml: f.yaml("127.0.0.1:0", "/keys", "policy_reload_interval: soon\n"), want: []string{"soon"}},
		{name: "ok/limits", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {handshake_timeout: 2s, max_connections: 100, max_connections_per_source: 10, max_recv_msg_bytes: 70000, max_concurrent_streams: 8, max_header_list_bytes: 8192, keepalive_min_time: 1m, max_connection_idle: 1m, max_connection_age: 10m, max_connection_age_grace: 5s}\n")},
		{name: "fail/limits-unknown-key", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_conns: 1}\n"), want: []string{"max_conns"}},
		{name: "fail/limits-negative", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_connections: -1}\n"), want: []string{"limits.max_connections", "negative"}},
		{name: "fail/limits-per-source-over-total", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_connections: 4, max_connections_per_source: 5}\n"), want: []string{"max_connections_per_source"}},
		{name: "fail/limits-recv-too-small", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_recv_msg_bytes: 4096}\n"), want: []string{"max_recv_msg_bytes", "4096"}},
		{name: "fail/limits-recv-too-large", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_recv_msg_bytes: 16777216}\n"), want: []string{"max_recv_msg_bytes"}},
		{name: "fail/limits-header-too-small", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_header_list_bytes: 10}\n"), want: []string{"max_header_list_bytes"}},
		{name: "fail/idempotency-unknown-key", yaml: f.yaml("127.0.0.1:0", "/keys", "idempotency: {entries: 10}\n"), want: []string{"entries"}},
		{name: "fail/idempotency-negative", yaml: f.yaml("127.0.0.1:0", "/keys", "idempotency: {max_bytes: -1}\n"), want: []string{"idempotency", "negative"}},
		{name: "fail/idempotency-share-over-total", yaml: f.yaml("127.0.0.1:0", "/keys", "idempotency: {max_bytes: 1048576, caller_bytes: 2097152}\n"), want: []string{"idempotency.caller_bytes"}},
		{name: "fail/limits-negative-duration", yaml: f.yaml("127.0.0.1:0", "/keys", "limits: {max_connection_age: -1s}\n"), want: []string{"negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := serve.ParseConfig([]byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("ParseConfig: %v", err)
				}
				if cfg.PolicyReloadInterval == 0 || cfg.TLS.ReloadInterval == 0 || cfg.ShutdownTimeout == 0 {
					t.Fatalf("defaults not applied: %+v", cfg)
				}
				l := cfg.Limits
				if l.HandshakeTimeout == 0 || l.MaxConnections == 0 || l.MaxConnectionsPerSource == 0 || l.MaxRecvMsgBytes == 0 ||
					l.MaxConcurrentStreams == 0 || l.MaxHeaderListBytes == 0 || l.KeepaliveMinTime == 0 || l.MaxConnectionIdle == 0 ||
					l.MaxConnectionAge == 0 || l.MaxConnectionAgeGrace == 0 {
					t.Fatalf("limits defaults not applied: %+v", l)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseConfig accepted the configuration: %+v", cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestStartRefusesUntrustedIdentityFiles is finding 7 of issue 7: the client CA and the policy
// decide who may mint what, so start-up refuses either when anyone but root or signerd's uid
// could rewrite it (the file or a directory above it), naming the path.
func TestStartRefusesUntrustedIdentityFiles(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	for _, tt := range []struct {
		name string
		// loosen returns the path the error must name.
		loosen func(t *testing.T, f fixture) string
	}{
		{"fail/client-ca-mode-0666", func(t *testing.T, f fixture) string {
			chmod(t, f.clientCA, 0o666)
			return f.clientCA
		}},
		{"fail/client-ca-dir-group-writable", func(t *testing.T, f fixture) string {
			dir := filepath.Dir(f.clientCA)
			chmod(t, dir, 0o770)
			return dir
		}},
		{"fail/policy-mode-0666", func(t *testing.T, f fixture) string {
			chmod(t, f.policy, 0o666)
			return f.policy
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			path := tt.loosen(t, f)
			s, err := serve.Start(f.config(t, "127.0.0.1:0", f.keyDir, ""), nil, serve.Options{})
			if err == nil {
				s.Stop()
				t.Fatal("Start accepted an identity file others could rewrite")
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

// TestStartRefusesLooseKeys: a seed file or key directory readable by others stops start-up,
// naming the path, and nothing is left listening.
func TestStartRefusesLooseKeys(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	tests := []struct {
		name string
		// loosen returns the path it loosened.
		loosen func(t *testing.T, f fixture) string
	}{
		{"fail/seed-mode-0644", func(t *testing.T, f fixture) string {
			p := filepath.Join(f.keyDir, space.Segment("alpha"), keystore.FileDataSigning)
			chmod(t, p, 0o644)
			return p
		}},
		{"fail/keydir-mode-0755", func(t *testing.T, f fixture) string {
			chmod(t, f.keyDir, 0o755)
			return f.keyDir
		}},
		{"fail/space-keydir-mode-0750", func(t *testing.T, f fixture) string {
			p := filepath.Join(f.keyDir, space.Segment("alpha"))
			chmod(t, p, 0o750)
			return p
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			path := tt.loosen(t, f)
			s, err := serve.Start(f.config(t, "127.0.0.1:0", f.keyDir, ""), nil, serve.Options{})
			if err == nil {
				s.Stop()
				t.Fatal("Start accepted loose key permissions")
			}
			if s != nil {
				t.Fatal("Start returned a signer with its error")
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

// TestStartFailureReleasesListeners: when a later part of Start fails (here the metrics port is
// taken), the gRPC listener it already bound is closed again.
func TestStartFailureReleasesListeners(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	sock := filepath.Join(f.root, "signerd.sock")
	s, err := serve.Start(f.config(t, "unix:"+sock, f.keyDir, "metrics_listen: "+busy.Addr().String()+"\n"), nil, serve.Options{})
	if err == nil {
		s.Stop()
		t.Fatal("Start succeeded on a taken metrics port")
	}
	if !strings.Contains(err.Error(), "metrics") {
		t.Fatalf("error %q does not name the metrics listener", err)
	}
	if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("gRPC socket %s still accepts connections after Start failed", sock)
	}
	// The audit log was released too: a second Start on the same files works.
	run(t, f.config(t, "unix:"+sock, f.keyDir, ""))
	getSpace(t, dial(t, "unix://"+sock, f.client))
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestCredentialsDirectory serves from a systemd-style credentials directory: flat files named
// <seg>.<file>, read-only (0400) in a read-only (0500) directory, and no key_dir at all.
func TestCredentialsDirectory(t *testing.T) {
	f := newFixture(t)
	flat := filepath.Join(f.root, "credentials")
	mkdirSecret(t, flat)
	seg := space.Segment("alpha")
	for _, name := range keystore.SecretFiles {
		data, err := os.ReadFile(filepath.Join(f.keyDir, seg, name))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(flat, seg+"."+name), data, 0o400)
	}
	chmod(t, flat, 0o500)
	t.Cleanup(func() { _ = os.Chmod(flat, 0o700) })
	// Hide the key directory so nothing can quietly fall back to it.
	if err := os.Rename(f.keyDir, f.keyDir+".moved"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", flat)

	t.Run("ok/credentials-directory", func(t *testing.T) {
		s := run(t, f.config(t, "127.0.0.1:0", "", ""))
		getSpace(t, dial(t, s.Addr().String(), f.client))
	})
}

// TestStopIsGraceful: Stop ends Run cleanly while a client connection is still open, and the
// listener is closed afterwards.
func TestStopIsGraceful(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	s := run(t, f.config(t, "127.0.0.1:0", f.keyDir, ""))
	addr := s.Addr().String()
	getSpace(t, dial(t, addr, f.client))

	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return within 10s")
	}
	if err := s.wait(); err != nil {
		t.Fatalf("Run after Stop: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("%s still accepts connections after Stop", addr)
	}
	// Stop is idempotent.
	s.Stop()
}

// TestUnixListen serves on a Unix socket created 0660 or stricter.
func TestUnixListen(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	sock := filepath.Join(f.root, "signerd.sock")
	s := run(t, f.config(t, "unix:"+sock, f.keyDir, ""))
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s is %v, not a socket", sock, fi.Mode())
	}
	if perm := fi.Mode().Perm(); perm&^0o660 != 0 {
		t.Fatalf("socket mode %v is looser than 0660", perm)
	}
	if got := s.Addr().Network(); got != "unix" {
		t.Fatalf("Addr network = %q", got)
	}
	getSpace(t, dial(t, "unix://"+sock, f.client))
}

// TestOperations: the health service, server reflection and the metrics listener.
func TestOperations(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	s := run(t, f.config(t, "127.0.0.1:0", f.keyDir, "metrics_listen: 127.0.0.1:0\n"))
	conn := dial(t, s.Addr().String(), f.client)

	t.Run("ok/health", func(t *testing.T) {
		for _, svc := range []string{"", signerv1.SignerService_ServiceDesc.ServiceName} {
			resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("health %q: %v", svc, err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health %q = %v, want SERVING", svc, resp.GetStatus())
			}
		}
	})

	t.Run("ok/reflection", func(t *testing.T) {
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""},
		}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.CloseSend()
		var names []string
		for _, svc := range resp.GetListServicesResponse().GetService() {
			names = append(names, svc.GetName())
		}
		if !slices.Contains(names, "cotal.signer.v1.SignerService") {
			t.Fatalf("reflection lists %v, want cotal.signer.v1.SignerService", names)
		}
	})

	t.Run("ok/metrics", func(t *testing.T) {
		if s.MetricsAddr() == nil {
			t.Fatal("no metrics listener")
		}
		getSpace(t, conn)
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, "http://"+s.MetricsAddr().String()+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s", resp.Status)
		}
		want := `signerd_requests_total{decision="granted",reason="",rpc="GetSpace"} 1`
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, grep(string(body), "signerd_"))
		}
		for _, bad := range []string{"managerd", "spiffe://", "alpha"} {
			if strings.Contains(grep(string(body), "signerd_"), bad) {
				t.Fatalf("signerd metrics carry %q", bad)
			}
		}
	})
}

// grep returns the lines of text containing sub.
func grep(text, sub string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// TestSIGHUPReloadsPolicy: with file polling effectively off, SIGHUP alone swaps in a new policy.
// (An invalid file keeping the old policy is shown through the file watch in the server tests.)
func TestSIGHUPReloadsPolicy(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := newFixture(t)
	s := run(t, f.config(t, "127.0.0.1:0", f.keyDir, "policy_reload_interval: 1h\n"))
	conn := dial(t, s.Addr().String(), f.client)
	client := signerv1.NewSignerServiceClient(conn)
	getSpaceCode := func() codes.Code {
		_, err := client.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
		return status.Code(err)
	}
	if c := getSpaceCode(); c != codes.OK {
		t.Fatalf("GetSpace before reload: %v", c)
	}
	hup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// A valid file that no longer lets managerd/alpha call GetSpace; only SIGHUP can load it.
	writeFile(t, f.policy, []byte(`version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint]
    spaces: ["{space}"]
    rate: {per_second: 10, burst: 10}
    profiles:
      agent: {ttl_max: 1h, any_owner: true}
`), 0o600)
	hup()
	testkit.Eventually(t, 5*time.Second, func() error {
		if c := getSpaceCode(); c != codes.PermissionDenied {
			return fmt.Errorf("GetSpace after SIGHUP: %v, want PermissionDenied", c)
		}
		return nil
	})
}

// TestIdempotencyConfig: the request_id cache's budgets default to the server package's and a
// share is never more than the total.
func TestIdempotencyConfig(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := fixture{cert: "/c.pem", key: "/k.pem", clientCA: "/ca.pem", publicDir: "/pub", policy: "/p.yaml", auditPath: "/a/log"}
	for _, tt := range []struct {
		name, extra       string
		wantMax, wantUser int64
	}{
		{"ok/defaults", "", server.DefaultIdempotencyBytes, server.DefaultIdempotencyCallerBytes},
		{"ok/set", "idempotency: {max_bytes: 8388608, caller_bytes: 1048576}\n", 8 << 20, 1 << 20},
		{"ok/small-total-caps-default-share", "idempotency: {max_bytes: 4194304}\n", 4 << 20, 4 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := serve.ParseConfig([]byte(f.yaml("127.0.0.1:0", "/keys", tt.extra)))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			if cfg.Idempotency.MaxBytes != tt.wantMax || cfg.Idempotency.CallerBytes != tt.wantUser {
				t.Fatalf("idempotency = %+v, want max %d caller %d", cfg.Idempotency, tt.wantMax, tt.wantUser)
			}
		})
	}
}

// TestNotifyReady: under systemd (Type=notify), signerd sends READY=1 only once it serves
// (a client answered right after it) and STOPPING=1 when it stops.
func TestNotifyReady(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	sock := filepath.Join(t.TempDir(), "notify.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	read := func() string {
		t.Helper()
		buf := make([]byte, 256)
		_ = l.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("no sd_notify message: %v", err)
		}
		return string(buf[:n])
	}
	f := newFixture(t)
	s, err := serve.Start(f.config(t, "127.0.0.1:0", f.keyDir, ""), nil, serve.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Start alone (listener bound, not yet served) sends nothing.
	_ = l.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := l.Read(make([]byte, 64)); err == nil {
		t.Fatalf("sd_notify before Run: %d bytes", n)
	}
	r := &running{Signer: s, exited: make(chan struct{})}
	go func() { r.err = s.Run(context.Background()); close(r.exited) }()
	if got := read(); got != "READY=1" {
		t.Fatalf("first message %q, want READY=1", got)
	}
	getSpace(t, dial(t, s.Addr().String(), f.client))
	s.Stop()
	if err := r.wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("message at stop %q, want STOPPING=1", got)
	}
}
