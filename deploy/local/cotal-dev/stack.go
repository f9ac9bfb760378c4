package main

import (
	"bufio"
	"context"
	"crypto/rand"
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
	"github.com/nats-io/nats.go"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

type options struct {
	dir, signerd, space string
	natsPort            int
	once                bool
}

// devPolicy lets the dev managerd mint agents for owner "demo" on a few channels, and each other
// daemon only its own credential. Anything else is denied.
const devPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 50, burst: 100}
    profiles:
      agent: {ttl_max: 1h, owners: [demo], channels: ["general", "team.*"], capabilities: [spawn]}
      supervisor: {ttl_max: 24h, owners: [demo]}
      provisioner: {ttl_max: 5m, owners: [demo], remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
  - id: spiffe://cotal.local/deliveryd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 5, burst: 10}
    profiles:
      delivery: {ttl_max: 24h, owners: [demo]}
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 50, burst: 100}
    profiles:
      auth-callout: {ttl_max: 24h}
      auth-plane: {ttl_max: 24h}
`

// layout names the files of the state directory.
type layout struct{ root, trust, pki, policy, config, audit, log string }

func newLayout(dir string) layout {
	return layout{
		root: dir, trust: filepath.Join(dir, "trust"), pki: filepath.Join(dir, "pki"),
		policy: filepath.Join(dir, "policy.yaml"), config: filepath.Join(dir, "signerd.yaml"),
		audit: filepath.Join(dir, "audit", "signerd.audit"), log: filepath.Join(dir, "signerd.log"),
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	if _, err := os.Stat(o.signerd); err != nil {
		return fmt.Errorf("signerd binary: %w (run `make build` or pass --signerd)", err)
	}
	l := newLayout(o.dir)
	if err := l.initialise(ctx, o, out); err != nil {
		return err
	}

	ns, err := startBroker(l, o.natsPort)
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	fmt.Fprintf(out, "broker:  nats-server %s in operator mode, JetStream in %s\n", ns.ClientURL(), filepath.Join(l.trust, "broker", "jetstream"))

	addr, stopSignerd, err := startSignerd(ctx, o.signerd, l)
	if err != nil {
		return err
	}
	defer stopSignerd()
	fmt.Fprintf(out, "signerd: separate process on %s (mTLS), log %s, audit %s\n", addr, l.log, l.audit)

	return demo(ctx, o, l, addr, ns.ClientURL(), out)
}

// initialise runs signerd init and pki init on first use and writes the dev policy and config.
func (l layout) initialise(ctx context.Context, o options, out io.Writer) error {
	if _, err := os.Stat(filepath.Join(l.trust, "public", "broker.json")); err == nil {
		fmt.Fprintf(out, "state:   reusing %s\n", l.root)
		return nil
	}
	if err := os.MkdirAll(l.root, 0o700); err != nil {
		return err
	}
	for _, step := range []struct {
		name string
		args []string
	}{
		{"init", []string{"init", "--dir", l.trust, "--space", o.space}},
		{"pki init", []string{"pki", "init", "--dir", l.pki, "--space", o.space}},
	} {
		cmd := exec.CommandContext(ctx, o.signerd, step.args...)
		cmd.Stderr = os.Stderr
		b, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("signerd %s: %w", step.name, err)
		}
		fmt.Fprintf(out, "signerd %s:\n%s", step.name, indent(string(b)))
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
	return os.WriteFile(l.config, []byte(cfg), 0o600)
}

func q(s string) string { b, _ := json.Marshal(s); return string(b) }

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}

// startBroker runs nats-server in process from the rendered nats.conf, on 127.0.0.1.
func startBroker(l layout, port int) (*server.Server, error) {
	opts, err := server.ProcessConfigFile(filepath.Join(l.trust, "broker", "nats.conf"))
	if err != nil {
		return nil, fmt.Errorf("broker config: %w", err)
	}
	opts.Host, opts.Port, opts.NoSigs = "127.0.0.1", port, true
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("broker not ready after 10s (is the port in use? try --nats-port -1)")
	}
	return ns, nil
}

// startSignerd runs `signerd serve` as a child process, waits for its "signerd serving" line
// and returns the address it listens on and a function that stops it with SIGTERM.
func startSignerd(ctx context.Context, bin string, l layout) (string, func(), error) {
	logf, err := os.OpenFile(l.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", l.config)
	// If cotal-dev dies without stopping it (a panic, SIGKILL), the kernel stops signerd too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", nil, err
	}
	exited := make(chan error, 1)
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			fmt.Fprintf(logf, "%s\n", line)
			var rec struct {
				Msg    string `json:"msg"`
				Listen string `json:"listen"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "signerd serving" {
				select {
				case ready <- rec.Listen:
				default:
				}
			}
		}
		exited <- cmd.Wait()
		logf.Close()
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	select {
	case addr := <-ready:
		return addr, stop, nil
	case err := <-exited:
		return "", nil, fmt.Errorf("signerd exited before serving (%v); see %s", err, l.log)
	case <-time.After(20 * time.Second):
		stop()
		return "", nil, fmt.Errorf("signerd not serving after 20s; see %s", l.log)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
}

// demo mints an agent credential through signerd as managerd, proves it on the broker, uses it
// and shows the broker refusing what the profile forbids.
func demo(ctx context.Context, o options, l layout, addr, natsURL string, out io.Writer) error {
	tok := space.Token(o.space)
	client, err := signerclient.Dial(signerclient.Config{Addr: addr, TLS: mtls.ClientFiles{
		CertFile:     filepath.Join(l.pki, "clients", "managerd-"+tok+".pem"),
		KeyFile:      filepath.Join(l.pki, "clients", "managerd-"+tok+".key"),
		ServerCAFile: filepath.Join(l.pki, "ca.pem"),
	}})
	if err != nil {
		return err
	}
	defer client.Close()
	uid := randomUID()
	rail, err := signerclient.NewRail(signerclient.RailConfig{
		Client: client, Space: o.space, Profile: signerv1.Profile_PROFILE_AGENT, NatsURL: natsURL, TTL: time.Hour,
		Params: &signerv1.ProfileParams{Owner: "demo", Actor: "alice", LifecycleUid: uid,
			AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}, Subscribe: []string{"general"}},
		OnRenew: func(jti string, exp time.Time) {
			fmt.Fprintf(out, "renewed: jti %s, expires %s\n", jti, exp.Format(time.RFC3339))
		},
	})
	if err != nil {
		return err
	}
	defer rail.Close()
	if err := rail.Start(ctx); err != nil {
		return fmt.Errorf("mint demo credential: %w", err)
	}
	jti, exp := rail.Current()
	fmt.Fprintf(out, "minted:  agent demo.alice (uid %s) for user key %s\n         jti %s, expires %s (JWT not shown)\n", uid, rail.PublicKey(), jti, exp.Format(time.RFC3339))

	names, err := space.NewNames(o.space)
	if err != nil {
		return err
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(natsURL, append(rail.NatsOptions(), nats.Name("cotal-dev demo"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	if err != nil {
		return fmt.Errorf("connect with the demo credential: %w", err)
	}
	defer nc.Close()
	own, _ := names.Chat("demo", "alice", "general")
	read, _ := names.ChatRead("general")
	sub, err := nc.SubscribeSync(read)
	if err != nil {
		return err
	}
	if err := nc.Publish(own, []byte("hello from the demo agent")); err != nil {
		return err
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		return fmt.Errorf("demo round trip: %w", err)
	}
	fmt.Fprintf(out, "used:    published on %s and received %q on %s\n", own, msg.Data, read)

	other, _ := names.Chat("demo", "mallory", "general")
	if err := nc.Publish(other, []byte("spoof")); err != nil {
		return err
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		fmt.Fprintf(out, "refused: the broker denied publishing as another principal: %v\n", err)
	case <-time.After(5 * time.Second):
		return errors.New("the broker did not refuse a publish the agent profile forbids")
	}

	if o.once {
		return nil
	}
	fmt.Fprintf(out, "\nThe stack is up; the credential renews at 75%% of its lifetime. Ctrl-C stops it.\n"+
		"  grpcurl -cacert %s -cert %s -key %s %s list\n", filepath.Join(l.pki, "ca.pem"),
		filepath.Join(l.pki, "clients", "managerd-"+tok+".pem"), filepath.Join(l.pki, "clients", "managerd-"+tok+".key"), addr)
	return rail.Run(ctx)
}

// randomUID returns a lifecycle uid: 26 characters of [a-z0-9].
func randomUID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 26)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
