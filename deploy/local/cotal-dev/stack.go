package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

type options struct {
	dir, bin, space string
	natsPort        int
	once            bool
}

// devPolicy lets each daemon act on its own space only: managerd mints its supervisor, agents of
// owner local (managerd's agents: deliveryd serves no other plain owner) or demo (the examples in
// docs/connecting.md) on a few channels, and the one-shot provisioner and deprovisioner; deliveryd its
// delivery and membership-rw credentials and its two $SYS users; authd its callout and plane credentials, the callout
// answers (agents and observers of any derived owner: the ledger decides who), bearers, owner ids,
// MACs (authd alone calls Mac), one-shot retirement requesters, service endpoint tokens and the
// callout's service-serve grants (authd alone calls SignServiceCredential). Anything else is denied.
const devPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 50, burst: 100}
    profiles:
      agent: {ttl_max: 1h, owners: [local, demo], channels: ["general", "team.*"], capabilities: [spawn]}
      supervisor: {ttl_max: 24h, owners: [local]}
      probe: {ttl_max: 1m, remint: none}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
  - id: spiffe://cotal.local/deliveryd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 5, burst: 10}
    profiles:
      delivery: {ttl_max: 24h, any_owner: true}
      membership-rw: {ttl_max: 24h, any_owner: true}
      membership-observer: {ttl_max: 24h, remint: none}
      connection-evictor: {ttl_max: 5m, remint: none}
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [Mint, Remint, GetSpace, OpenCalloutRequest, SignCalloutResponse, SignBearer, GetJWKS, DeriveOwner, Mac, SignServiceCredential]
    spaces: ["{space}"]
    rate: {per_second: 50, burst: 100}
    profiles:
      auth-callout: {ttl_max: 24h}
      auth-plane: {ttl_max: 24h}
      retirement-requester: {ttl_max: 5m, any_owner: true, remint: none}
      remote-manager: {ttl_max: 24h, any_owner: true, remint: none}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
      service-serve: {ttl_max: 1m, any_owner: true, remint: none}
      agent: {ttl_max: 1h, any_owner: true, channels: ["general", "team.*"], capabilities: [spawn]}
      observer: {ttl_max: 1h, any_owner: true}
`

// instanceID is the dev managerd's instance (its lease key lease.<id>): fixed, so a second run
// is the same instance.
const instanceID = "cotaldevmanager00000000000"

// layout names the files of the state directory.
type layout struct {
	root, trust, pki, policy, config, audit, logs, bin, run string
	authd, deliveryd, managerd, launcher, agents            string
}

func newLayout(dir string) layout {
	p := func(s ...string) string { return filepath.Join(append([]string{dir}, s...)...) }
	return layout{
		root: dir, trust: p("trust"), pki: p("pki"), policy: p("policy.yaml"), config: p("signerd.yaml"),
		audit: p("audit", "signerd.audit"), logs: p("logs"), bin: p("bin"), run: p("run"),
		authd: p("authd"), deliveryd: p("deliveryd"), managerd: p("managerd"), launcher: p("launcher"), agents: p("agents"),
	}
}

// clientFiles are a daemon's dev client certificate, as `signerd pki init` wrote them.
func (l layout) clientFiles(kind, sp string) mtls.ClientFiles {
	tok := space.Token(sp)
	return mtls.ClientFiles{
		CertFile:     filepath.Join(l.pki, "clients", kind+"-"+tok+".pem"),
		KeyFile:      filepath.Join(l.pki, "clients", kind+"-"+tok+".key"),
		ServerCAFile: filepath.Join(l.pki, "ca.pem"),
	}
}

// stack is one run: the processes it started, in order, and what the status table shows.
type stack struct {
	o        options
	l        layout
	out      io.Writer
	users    *devUsers // nil without root
	children []*child
	closers  []func()  // in-process helpers (the dev IdP), closed after the children
	brokerID string    // the embedded broker's server id: the only one authd's callout answers
	bobTerm  *terminal // bob's terminal (Attach), open from the agent demo to the bearer demo's end
	rows     []statusRow
}

func run(ctx context.Context, o options, out io.Writer) (err error) {
	for _, b := range []string{"signerd", "authd", "deliveryd", "managerd", "testagent"} {
		if _, err := os.Stat(filepath.Join(o.bin, b)); err != nil {
			return fmt.Errorf("%s binary: %w (run `make run`, or build it and pass --bin)", b, err)
		}
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		return err
	}
	s := &stack{o: o, l: newLayout(dir), out: out}
	if os.Geteuid() == 0 {
		if s.users, err = ensureDevUsers(); err != nil {
			return err
		}
	}
	if err := s.initialise(ctx); err != nil {
		return err
	}

	ns, operator, err := startBroker(s.l, o.natsPort)
	if err != nil {
		return err
	}
	defer func() {
		s.stopAll()
		ns.Shutdown()
		fmt.Fprintln(out, "stopped: broker")
	}()
	natsURL := ns.ClientURL()
	s.brokerID = ns.ID()
	s.rows = append(s.rows, statusRow{"broker", "operator " + operator, "-", "serving " + natsURL + " (in process)", "-"})
	fmt.Fprintf(out, "broker:    nats-server %s in operator mode, JetStream in %s\n", natsURL, filepath.Join(s.l.trust, "broker", "jetstream"))

	addr, err := s.startSignerd(ctx)
	if err != nil {
		return err
	}
	signer, err := signerclient.Dial(signerclient.Config{Addr: addr, TLS: s.l.clientFiles(mtls.KindManagerd, o.space)})
	if err != nil {
		return err
	}
	defer signer.Close()
	pcfg := provision.Config{Signer: signer, Space: o.space, NatsURL: natsURL}
	rep, err := provision.Run(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("provision %s: %w", o.space, err)
	}
	fmt.Fprintf(out, "provision: space %s: %d created, %d already there, delivery class %s\n", o.space, len(rep.Created), len(rep.Verified), rep.DeliveryClass)

	if err := s.startDeliveryd(ctx, addr, natsURL); err != nil {
		return err
	}
	auth, err := s.startAuthd(ctx, addr, natsURL)
	if err != nil {
		return err
	}
	if s.users != nil {
		if err := s.startLauncher(ctx); err != nil {
			return err
		}
	}
	api, err := s.startManagerd(ctx, addr, natsURL)
	if err != nil {
		return err
	}
	if s.users != nil {
		if err := s.agentDemo(ctx, api, pcfg); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(out, "agents:    skipped: the agent demo needs root (the launcher drops to the agents' own uid); run `sudo make run` for the launcher and the two agents")
		s.rows = append(s.rows, statusRow{"launcher", "-", "-", "not started: needs root", "-"},
			statusRow{"agents", "-", "-", "not started: need root (the launcher)", "-"})
	}
	if err := s.bearerDemo(ctx, signer, auth, natsURL); err != nil {
		return err
	}
	s.printStatus()
	if o.once {
		return nil
	}
	f := s.l.clientFiles(mtls.KindManagerd, o.space)
	fmt.Fprintf(out, "\nThe stack is up; credentials renew at 75%% of their lifetime. Logs in %s. Ctrl-C stops it.\n"+
		"  grpcurl -cacert %s -cert %s -key %s %s list\n", s.l.logs, f.ServerCAFile, f.CertFile, f.KeyFile, addr)
	<-ctx.Done()
	fmt.Fprintln(out, "\nstopping")
	return nil
}

// stopAll stops the children in the reverse order of their start and says how each ended.
func (s *stack) stopAll() {
	for i := len(s.children) - 1; i >= 0; i-- {
		c := s.children[i]
		c.terminate(15 * time.Second)
		fmt.Fprintf(s.out, "stopped: %s (exit %d)\n", c.name, c.exitCode())
	}
	s.children = nil
	for _, c := range s.closers {
		c()
	}
	s.closers = nil
}

// initialise runs signerd init and pki init on first use, then (every run) lays out the
// directories, writes the dev policy and signerd's config and copies the binaries that run
// under the dev users.
func (s *stack) initialise(ctx context.Context) error {
	l, o := s.l, s.o
	if err := os.MkdirAll(l.root, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(l.trust, "public", "broker.json")); err == nil {
		fmt.Fprintf(s.out, "state:     reusing %s (keys, certificates, ledger and streams kept)\n", l.root)
	} else {
		for _, step := range []struct {
			name string
			args []string
		}{
			{"init", []string{"init", "--dir", l.trust, "--space", o.space}},
			{"pki init", []string{"pki", "init", "--dir", l.pki, "--space", o.space}},
		} {
			cmd := exec.CommandContext(ctx, filepath.Join(o.bin, "signerd"), step.args...)
			cmd.Stderr = os.Stderr
			b, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("signerd %s: %w", step.name, err)
			}
			fmt.Fprintf(s.out, "signerd %s:\n%s", step.name, indent(string(b)))
		}
	}
	// Private to cotal-dev's uid: the signer's seeds, the PKI keys, the logs, authd's and
	// deliveryd's state. With root the state directory itself is traversable (0755), so the dev
	// users reach their own directories and nothing else.
	rootMode := os.FileMode(0o700)
	if s.users != nil {
		rootMode = 0o755
		if err := traversable(l.root); err != nil {
			return err
		}
	}
	if err := os.Chmod(l.root, rootMode); err != nil {
		return err
	}
	for _, d := range []string{l.trust, l.pki, l.logs, filepath.Dir(l.audit), l.authd, l.deliveryd, l.launcher} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(l.policy, []byte(devPolicy), 0o600); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
tls: {cert: %s, key: %s, client_ca: %s}
key_dir: %s
public_dir: %s
policy: %s
audit: {path: %s, replica: dev-1}
`, q(filepath.Join(l.pki, "signerd.pem")), q(filepath.Join(l.pki, "signerd.key")), q(filepath.Join(l.pki, "ca.pem")),
		q(filepath.Join(l.trust, "signer")), q(filepath.Join(l.trust, "public")), q(l.policy), q(l.audit))
	if err := os.WriteFile(l.config, []byte(cfg), 0o600); err != nil {
		return err
	}
	if s.users != nil {
		// managerd and the test agent run as the dev users: their binaries sit in a root-owned
		// 0755 directory they can reach.
		if err := os.MkdirAll(l.bin, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(l.bin, 0o755); err != nil {
			return err
		}
		for _, b := range []string{"managerd", "testagent"} {
			if err := copyFile(filepath.Join(o.bin, b), filepath.Join(l.bin, b), 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// traversable refuses a state directory the dev users could not reach: every directory above
// it must let others search it.
func traversable(dir string) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is mode %#o: managerd and the agents run as their own users and cannot reach %s through it; "+
				"run from a clone under a directory others may search (e.g. /tmp or /srv), or chmod o+x %s", p, fi.Mode().Perm(), dir, p)
		}
		if p == "/" {
			return nil
		}
	}
}

// copyFile writes src's bytes to dst (mode), through a temporary file and a rename.
func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func q(s string) string { b, _ := json.Marshal(s); return string(b) }

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}

// startBroker runs nats-server in process from the rendered nats.conf, on 127.0.0.1.
// It returns the server and its trusted operator's public key.
func startBroker(l layout, port int) (*server.Server, string, error) {
	opts, err := server.ProcessConfigFile(filepath.Join(l.trust, "broker", "nats.conf"))
	if err != nil {
		return nil, "", fmt.Errorf("broker config: %w", err)
	}
	if len(opts.TrustedOperators) != 1 {
		return nil, "", fmt.Errorf("broker config: %d trusted operators, want 1", len(opts.TrustedOperators))
	}
	opts.Host, opts.Port, opts.NoSigs = "127.0.0.1", port, true
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("broker: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, "", errors.New("broker not ready after 10s (is the port in use? try --nats-port -1)")
	}
	return ns, opts.TrustedOperators[0].Subject, nil
}

// jsonMsg matches a JSON log line whose msg is want.
func jsonMsg(want string, into any) func([]byte) bool {
	return func(line []byte) bool {
		var rec struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Msg != want {
			return false
		}
		if into != nil {
			_ = json.Unmarshal(line, into)
		}
		return true
	}
}

// startSignerd runs `signerd serve` and returns the address it listens on.
func (s *stack) startSignerd(ctx context.Context) (string, error) {
	c, err := s.startChild("signerd", nil, filepath.Join(s.o.bin, "signerd"), "serve", "--config", s.l.config)
	if err != nil {
		return "", err
	}
	var rec struct {
		Listen string `json:"listen"`
	}
	ch := c.watch(jsonMsg("signerd serving", &rec))
	line, err := c.await(ctx, ch, "serving", 20*time.Second)
	if err != nil {
		return "", err
	}
	_ = json.Unmarshal(line, &rec)
	id, exp := certFacts(filepath.Join(s.l.pki, "signerd.pem"))
	s.rows = append(s.rows, statusRow{"signerd", id, "-", "serving mTLS on " + rec.Listen, "cert " + exp})
	fmt.Fprintf(s.out, "signerd:   separate process (pid %d) on %s (mTLS), audit %s\n", c.cmd.Process.Pid, rec.Listen, s.l.audit)
	return rec.Listen, nil
}

// startDeliveryd runs `deliveryd serve` and waits until its lease row is ready.
func (s *stack) startDeliveryd(ctx context.Context, addr, natsURL string) error {
	f := s.l.clientFiles(mtls.KindDeliveryd, s.o.space)
	cfg := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {address: %s, ca: %s, cert: %s, key: %s}\nstate_dir: %s\nholder: cotal-dev-deliveryd\n",
		s.o.space, q(natsURL), q(addr), q(f.ServerCAFile), q(f.CertFile), q(f.KeyFile), q(filepath.Join(s.l.deliveryd, "state")))
	path := filepath.Join(s.l.deliveryd, "deliveryd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	c, err := s.startHeld(ctx, "deliveryd", filepath.Join(s.l.deliveryd, "state"), "delivery-service-refusal.json", "LEASE_HELD", func() (*child, error) {
		c, err := s.startChild("deliveryd", nil, filepath.Join(s.o.bin, "deliveryd"), "serve", "--config", path)
		if err != nil {
			return nil, err
		}
		_, err = c.await(ctx, c.watch(jsonMsg("deliveryd ready", nil)), "ready", 30*time.Second)
		return c, err
	})
	if err != nil {
		return err
	}
	id, _ := certFacts(f.CertFile)
	key, exp := s.auditCredential(id, "delivery")
	s.rows = append(s.rows, statusRow{"deliveryd", id, key, "lease ready", exp})
	fmt.Fprintf(s.out, "deliveryd: separate process (pid %d), lease ready\n", c.cmd.Process.Pid)
	return nil
}

// creds is a syscall credential for a dev user.
func creds(uid, gid uint32) *syscall.Credential {
	return &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
}
