// Package signerdtest runs a real signerd in process for tests: `signerd init` into a temporary
// directory, a test PKI, a policy, an audit log, and the mTLS gRPC listener on 127.0.0.1. It also
// starts an embedded nats-server (operator mode, JetStream) that trusts exactly the accounts
// signerd signs for, so a minted credential can be proven by connecting with it.
//
// It is for tests only: its CA key lives in memory so tests can issue client certificates for
// any identity, including ones the policy does not know.
package signerdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/serve"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// TrustDomain is the SPIFFE trust domain of every test identity.
const TrustDomain = "cotal.local"

// DefaultPolicy lets each daemon act on its own space only: managerd mints agents, its supervisor
// and the one-shot provisioner and deprovisioner, deliveryd its delivery and membership-rw credentials and its two $SYS users (membership observer,
// connection evictor), authd its
// callout user and plane credential, the callout answers (agents and observers), bearers, owner
// ids and registration MACs (authd alone calls Mac), one-shot retirement requesters, service
// endpoint tokens (authd alone calls SignServiceCredential) and service-serve callout grants.
const DefaultPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent:
        ttl_max: 1h
        any_owner: true
        channels: ["general", "team.*"]
        roles: [reviewer]
        capabilities: [spawn]
      supervisor: {ttl_max: 24h, any_owner: true}
      probe: {ttl_max: 1m, remint: none}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
  - id: spiffe://cotal.local/deliveryd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      delivery: {ttl_max: 24h, any_owner: true}
      membership-rw: {ttl_max: 24h, any_owner: true}
      membership-observer: {ttl_max: 24h, remint: none}
      connection-evictor: {ttl_max: 5m, remint: none}
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [Mint, Remint, GetSpace, OpenCalloutRequest, SignCalloutResponse, SignBearer, GetJWKS, DeriveOwner, Mac, SignServiceCredential]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      auth-callout: {ttl_max: 24h}
      auth-plane: {ttl_max: 24h}
      retirement-requester: {ttl_max: 5m, any_owner: true, remint: none}
      remote-manager: {ttl_max: 24h, any_owner: true, remint: none}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
      service-serve: {ttl_max: 1m, any_owner: true, remint: none}
      agent:
        ttl_max: 1h
        any_owner: true
        channels: ["general", "team.*"]
        capabilities: [spawn]
      observer: {ttl_max: 1h, any_owner: true}
`

// Options configure Start.
type Options struct {
	// Spaces to create; default ["alpha"].
	Spaces []string
	// Policy is the policy YAML; default DefaultPolicy.
	Policy string
	// Now is signerd's clock; nil means time.Now.
	Now func() time.Time
	// AuditMaxDelay is passed to the audit log (group-commit wait); default 0.
	AuditMaxDelay time.Duration
	// Replicas is how many signerd replicas to run on the one `signerd init` directory (the
	// same keys, policy and server certificate), each with its own listener, replica id
	// (test-1, test-2, ...) and audit file; default 1. Signer's own fields are replica 1's.
	Replicas int
	// NoStream serves without the Stream RPC (UNIMPLEMENTED, as a signerd from before it), for
	// tests of the clients' fallback to the unary RPCs.
	NoStream bool
}

// Signer is a running test signerd: one replica, or several (Replicas) on the same keys.
type Signer struct {
	// Dir is the `signerd init` directory.
	Dir string
	// Addr is the gRPC listener of the first replica, host:port on 127.0.0.1.
	Addr string
	// ServerCAFile is the CA bundle clients verify signerd with.
	ServerCAFile string
	// PolicyPath is the policy every replica reads; AuditPath the first replica's audit file.
	PolicyPath, AuditPath string
	// Spaces are the space names served.
	Spaces []string
	// Serve is the first replica's running server.
	Serve *serve.Signer
	// Replicas are every replica, the first one included, in order.
	Replicas []*Replica

	ca      *mtls.CA
	certDir string
	// cfgText is the serve configuration without its listen and audit lines; now is signerd's
	// clock.
	cfgText string
	now     func() time.Time
	// noStream is Options.NoStream.
	noStream bool
}

// Replica is one running signerd of a Signer. Stop, Restart, BreakAudit and cleanup are called
// from the test goroutine only.
type Replica struct {
	// ID is the replica id (audit.replica) that names its audit chain: test-1, test-2, ...
	ID string
	// Addr is its gRPC listener, host:port on 127.0.0.1; Restart keeps it.
	Addr string
	// AuditPath is its own audit file, named by its id.
	AuditPath string
	// Serve is the running server; the last one after Stop.
	Serve *serve.Signer

	s, primary *Signer // primary is s when this is the first replica, whose fields Signer mirrors
	maxDelay   time.Duration
	// full makes the audit writes fail (ENOSPC) while set; see BreakAudit.
	full atomic.Bool
	// stop stops the running server; nil when stopped.
	stop func()
}

// Start runs a signerd (opts.Replicas of them) until the test ends.
func Start(t testing.TB, opts Options) *Signer {
	t.Helper()
	if len(opts.Spaces) == 0 {
		opts.Spaces = []string{"alpha"}
	}
	if opts.Policy == "" {
		opts.Policy = DefaultPolicy
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	root := t.TempDir()
	dir := filepath.Join(root, "cotal")
	if _, err := setup.Init(setup.Options{Dir: dir, Spaces: opts.Spaces, Port: -1}); err != nil {
		t.Fatalf("signerdtest: init: %v", err)
	}
	ca, err := mtls.NewCA("signerdtest CA", time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	if err != nil {
		t.Fatalf("signerdtest: CA: %v", err)
	}
	s := &Signer{Dir: dir, Spaces: opts.Spaces, ca: ca, certDir: filepath.Join(root, "pki")}
	mustMkdir(t, s.certDir)
	s.ServerCAFile = filepath.Join(s.certDir, "ca.pem")
	mustWrite(t, s.ServerCAFile, ca.CertPEM(), 0o644)
	// One server certificate for every replica: a client verifies each replica for the same
	// name (localhost) and SPIFFE ID.
	leaf, err := ca.Issue(mtls.LeafSpec{
		CommonName: "signerd", URIs: []string{"spiffe://" + TrustDomain + "/signerd"},
		DNSNames: []string{"localhost"}, IPAddresses: loopbackIPs(),
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: serverUsages(),
	})
	if err != nil {
		t.Fatalf("signerdtest: server cert: %v", err)
	}
	certFile, keyFile := s.writeLeaf(t, "signerd", leaf)

	s.PolicyPath = filepath.Join(root, "policy.yaml")
	mustWrite(t, s.PolicyPath, []byte(opts.Policy), 0o600)

	// Paths come from t.TempDir, which carries the test's name: quote them, so a name with a
	// comma, colon or brace cannot change the YAML's structure.
	q := strconv.Quote
	s.cfgText = `
tls: {cert: ` + q(certFile) + `, key: ` + q(keyFile) + `, client_ca: ` + q(s.ServerCAFile) + `, reload_interval: 100ms}
key_dir: ` + q(filepath.Join(dir, setup.SignerDir)) + `
public_dir: ` + q(filepath.Join(dir, setup.PublicDir)) + `
policy: ` + q(s.PolicyPath) + `
policy_reload_interval: 100ms
shutdown_timeout: 5s
# Every test client connects from 127.0.0.1 and table tests keep one connection per case open
# until the test ends, so the per-source cap is the total cap here; the other limits are
# signerd's defaults.
limits: {max_connections_per_source: 512}
`
	s.now, s.noStream = opts.Now, opts.NoStream
	for i := range opts.Replicas {
		r := &Replica{ID: "test-" + strconv.Itoa(i+1), s: s, maxDelay: opts.AuditMaxDelay}
		if i == 0 {
			// The first replica keeps the file name single-replica tests have always used.
			r.primary, r.AuditPath = s, filepath.Join(root, "audit", "signerd.audit")
		} else {
			r.AuditPath = filepath.Join(root, "audit", r.ID+".audit")
		}
		s.Replicas = append(s.Replicas, r)
		r.run(t, "127.0.0.1:0")
	}
	t.Cleanup(func() {
		for _, r := range s.Replicas {
			r.Stop(t)
		}
	})
	return s
}

// Addrs returns every replica's address, in order.
func (s *Signer) Addrs() []string {
	out := make([]string, len(s.Replicas))
	for i, r := range s.Replicas {
		out[i] = r.Addr
	}
	return out
}

// run starts signerd serve on listen with the harness configuration and this replica's id and
// audit file.
func (r *Replica) run(t testing.TB, listen string) {
	t.Helper()
	text := "listen: " + listen + "\n" + r.s.cfgText +
		"audit: {path: " + strconv.Quote(r.AuditPath) + ", replica: " + r.ID + ", max_delay: " + r.maxDelay.String() + "}\n"
	cfg, err := serve.ParseConfig([]byte(text))
	if err != nil {
		t.Fatalf("signerdtest: config: %v", err)
	}
	r.full.Store(false)
	write := func(f *os.File, b []byte) (int, error) {
		if r.full.Load() {
			n, _ := f.Write(b[:len(b)/2]) // the disk fills halfway through the line
			return n, syscall.ENOSPC
		}
		return f.Write(b)
	}
	srv, err := serve.Start(cfg, nil, serve.Options{Now: r.s.now, AuditIO: audit.IO{Write: write}, NoStream: r.s.noStream})
	if err != nil {
		t.Fatalf("signerdtest: start %s: %v", r.ID, err)
	}
	r.Serve, r.Addr = srv, srv.Addr().String()
	if r.primary != nil {
		r.primary.Serve, r.primary.Addr, r.primary.AuditPath = srv, r.Addr, r.AuditPath
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(context.Background()) }()
	r.stop = func() {
		srv.Stop()
		if err := <-errc; err != nil && !(r.full.Load() && errors.Is(err, audit.ErrBroken)) {
			t.Errorf("signerdtest: run %s: %v", r.ID, err)
		}
	}
}

// Stop stops the replica (gracefully, as SIGTERM does) and waits for it; a stopped replica
// refuses connections on Addr. It is idempotent.
func (r *Replica) Stop(t testing.TB) {
	t.Helper()
	if r.stop != nil {
		r.stop()
		r.stop = nil
	}
}

// Restart starts the replica again on the same address, keys, policy and audit file, after Stop
// (or stopping it first). A torn line BreakAudit left is cut, as signerd does at start.
func (r *Replica) Restart(t testing.TB) {
	t.Helper()
	r.Stop(t)
	r.run(t, r.Addr)
}

// BreakAudit makes the replica's audit disk full: the next line is written halfway and fails
// with ENOSPC, so that call is refused UNAVAILABLE, health turns NOT_SERVING on every service
// name and the replica stops itself, as a real signerd does. Restart serves again.
func (r *Replica) BreakAudit() { r.full.Store(true) }

// Drain turns the replica's health NOT_SERVING while it keeps serving (serve.Signer.Drain).
func (r *Replica) Drain() { r.Serve.Drain() }

// AuditFile is what a verified audit file holds.
type AuditFile struct {
	// Lines counts its complete lines, every chain's.
	Lines int
	// Replicas names the replica of each chain in it, in order of first appearance.
	Replicas []string
}

// Audit verifies the replica's audit file on its own, as `signerd audit verify FILE` does (a
// torn final line, which only a restart cuts, is a failure), and says what it holds.
func (r *Replica) Audit(t testing.TB) AuditFile {
	t.Helper()
	sum, err := audit.VerifyFiles([]string{r.AuditPath}, audit.FilesOptions{})
	if err != nil {
		t.Fatalf("signerdtest: verify %s: %v", r.AuditPath, err)
	}
	out := AuditFile{Lines: sum.Lines}
	for _, h := range sum.Chains {
		out.Replicas = append(out.Replicas, h.Replica)
	}
	return out
}

// Stop stops the first replica (gracefully, as SIGTERM does) and waits for it; a stopped
// signerd refuses connections on Addr. It is idempotent.
func (s *Signer) Stop(t testing.TB) {
	t.Helper()
	s.Replicas[0].Stop(t)
}

// Restart starts the first replica again on the same address, key directory, policy and audit
// log, after Stop (or stopping it first).
func (s *Signer) Restart(t testing.TB) {
	t.Helper()
	s.Replicas[0].Restart(t)
}

// ID returns the SPIFFE ID of a daemon kind for a space: spiffe://cotal.local/<kind>/<token>.
func ID(kind, spaceName string) string {
	return "spiffe://" + TrustDomain + "/" + kind + "/" + space.Token(spaceName)
}

// Client issues a client certificate whose only URI SAN is id (any string, valid or not) and
// returns the files for mtls.NewClientTLS.
func (s *Signer) Client(t testing.TB, id string) mtls.ClientFiles {
	t.Helper()
	return s.ClientSpec(t, mtls.LeafSpec{URIs: []string{id}})
}

// ClientSpec issues a client certificate from spec (validity defaults to now ± 1h).
func (s *Signer) ClientSpec(t testing.TB, spec mtls.LeafSpec) mtls.ClientFiles {
	t.Helper()
	if spec.NotBefore.IsZero() {
		spec.NotBefore = time.Now().Add(-time.Hour)
	}
	if spec.NotAfter.IsZero() {
		spec.NotAfter = time.Now().Add(time.Hour)
	}
	if spec.CommonName == "" {
		spec.CommonName = "test client"
	}
	leaf, err := s.ca.Issue(spec)
	if err != nil {
		t.Fatalf("signerdtest: client cert: %v", err)
	}
	cert, key := s.writeLeaf(t, "", leaf)
	return mtls.ClientFiles{CertFile: cert, KeyFile: key, ServerCAFile: s.ServerCAFile}
}

// ClientFor issues the certificate of daemon kind for a space.
func (s *Signer) ClientFor(t testing.TB, kind, spaceName string) mtls.ClientFiles {
	t.Helper()
	return s.Client(t, ID(kind, spaceName))
}

// SetPolicy replaces the policy file atomically; signerd picks it up within its reload interval.
func (s *Signer) SetPolicy(t testing.TB, yaml string) {
	t.Helper()
	tmp := s.PolicyPath + ".new"
	mustWrite(t, tmp, []byte(yaml), 0o600)
	if err := os.Rename(tmp, s.PolicyPath); err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
}

// Trust returns the broker and spaces signerd signs for, read from the init directory.
func (s *Signer) Trust(t testing.TB) (*trust.Broker, []*trust.Space) {
	t.Helper()
	pub := filepath.Join(s.Dir, setup.PublicDir)
	pb, err := keystore.ReadPublicBroker(pub)
	if err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
	b, err := trust.LoadBroker(pb.OperatorJWT, pb.SystemAccountJWT)
	if err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
	var spaces []*trust.Space
	for _, name := range s.Spaces {
		ps, err := keystore.ReadPublicSpace(keystore.PublicSpacePath(pub, name))
		if err != nil {
			t.Fatalf("signerdtest: %v", err)
		}
		sp, err := trust.LoadSpace(b, name, ps.DataAccountJWT, ps.AuthAccountJWT)
		if err != nil {
			t.Fatalf("signerdtest: %v", err)
		}
		spaces = append(spaces, sp)
	}
	return b, spaces
}

// StartBroker starts an embedded nats-server on 127.0.0.1 (random port, JetStream in a temp
// dir) that trusts signerd's operator and spaces, and returns its client URL.
func (s *Signer) StartBroker(t testing.TB) string {
	t.Helper()
	return s.StartBrokerServer(t).ClientURL()
}

// StartBrokerServer is StartBroker returning the embedded server itself, for tests that read its
// monitoring state (Connz shows each connection's account and JWT tags).
func (s *Signer) StartBrokerServer(t testing.TB) *server.Server {
	t.Helper()
	b, spaces := s.Trust(t)
	opts, err := trust.ServerOptions(trust.ServerConfig{Host: "127.0.0.1", Port: -1, StoreDir: t.TempDir(), Broker: b, Spaces: spaces})
	if err != nil {
		t.Fatalf("signerdtest: broker options: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("signerdtest: broker: %v", err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("signerdtest: broker not ready")
	}
	return ns
}

func (s *Signer) writeLeaf(t testing.TB, name string, leaf *mtls.Leaf) (certFile, keyFile string) {
	t.Helper()
	dir, err := os.MkdirTemp(s.certDir, name+"*")
	if err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	mustWrite(t, certFile, leaf.CertPEM(), 0o644)
	if err := creds.WriteFileAtomic(keyFile, leaf.KeyPEM()); err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
	return certFile, keyFile
}

func mustMkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
}

func mustWrite(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatalf("signerdtest: %v", err)
	}
}

// Broker is an embedded broker trusting signerd that a test stops and starts again on the same
// port and JetStream store: a broker loss the daemons must ride out, and its return.
type Broker struct {
	t     testing.TB
	s     *Signer
	store string
	port  int
	// NS is the running server; nil while stopped.
	NS *server.Server
}

// StartRestartableBroker starts a Broker (random port, JetStream in a temp dir), stopped at
// cleanup.
func (s *Signer) StartRestartableBroker(t testing.TB) *Broker {
	t.Helper()
	b := &Broker{t: t, s: s, store: t.TempDir(), port: -1}
	b.Start()
	t.Cleanup(b.Stop)
	return b
}

// URL is the broker's client URL; the same after a restart.
func (b *Broker) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", b.port) }

// Start starts the broker again, on its port and store; it must be stopped.
func (b *Broker) Start() {
	b.t.Helper()
	tb, spaces := b.s.Trust(b.t)
	opts, err := trust.ServerOptions(trust.ServerConfig{Host: "127.0.0.1", Port: b.port, StoreDir: b.store, Broker: tb, Spaces: spaces})
	if err != nil {
		b.t.Fatalf("signerdtest: broker options: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		b.t.Fatalf("signerdtest: broker: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		b.t.Fatal("signerdtest: broker not ready")
	}
	b.NS = ns
	b.port = ns.Addr().(*net.TCPAddr).Port
}

// Stop shuts the broker down and waits for it; stopping a stopped broker does nothing.
func (b *Broker) Stop() {
	if b.NS != nil {
		b.NS.Shutdown()
		b.NS.WaitForShutdown()
		b.NS = nil
	}
}
