package service_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/service"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const sp = "alpha"

// env is a real signerd (loopback mTLS), the embedded broker it was initialised for (callout
// configured in the AUTH account as `signerd init` writes it), the space provisioned through a
// signerd-minted provisioner credential, and an authd configuration for it.
type env struct {
	sg  *signerdtest.Signer
	ns  *server.Server
	url string
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newEnv(t testing.TB) *env { return newEnvReplicas(t, 1) }

// newEnvReplicas is newEnv with n signerd replicas; the authd configuration then lists every
// replica under signer.addresses.
func newEnvReplicas(t testing.TB, n int) *env {
	t.Helper()
	return newEnvWith(t, signerdtest.Options{Spaces: []string{sp}, Replicas: n})
}

// newEnvWith is newEnv with signerd started with opts (a policy of the test's, say).
func newEnvWith(t testing.TB, opts signerdtest.Options) *env {
	t.Helper()
	sg := signerdtest.Start(t, opts)
	ns := sg.StartBrokerServer(t)
	url := ns.ClientURL()
	mgr, err := signerclient.Dial(signerclient.Config{Addr: sg.Addr, TLS: sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	if _, err := provision.Run(ctxT(t), provision.Config{Signer: mgr, Space: sp, NatsURL: url}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return &env{sg: sg, ns: ns, url: url}
}

// config is an authd configuration for e with its own state directory.
func (e *env) config(t testing.TB) *config.Config {
	t.Helper()
	tls := e.sg.ClientFor(t, "authd", sp)
	signer := config.Signer{Address: e.sg.Addr, CA: tls.ServerCAFile, Cert: tls.CertFile, Key: tls.KeyFile}
	if len(e.sg.Replicas) > 1 {
		signer.Address, signer.Addresses = "", e.sg.Addrs()
	}
	return &config.Config{
		Space:       sp,
		Brokers:     []string{e.url},
		Signer:      signer,
		CalloutSeed: filepath.Join(e.sg.Dir, "authd", space.Segment(sp), "callout.nk"),
		StateDir:    filepath.Join(t.TempDir(), "state"),
		PlaneTTL:    yamlx.Duration(2 * time.Second),
	}
}

// yaml renders cfg as an authd configuration file.
func yamlOf(c *config.Config) string {
	addr := "address: " + c.Signer.Address
	if len(c.Signer.Addresses) > 0 {
		addr = "addresses: [" + strings.Join(c.Signer.Addresses, ", ") + "]"
	}
	return "space: " + c.Space + "\n" +
		"brokers: [" + strings.Join(c.Brokers, ", ") + "]\n" +
		"signer: {" + addr + ", ca: " + c.Signer.CA + ", cert: " + c.Signer.Cert + ", key: " + c.Signer.Key + "}\n" +
		"callout_seed: " + c.CalloutSeed + "\n" +
		"state_dir: " + c.StateDir + "\n" +
		"plane_ttl: " + c.PlaneTTL.D().String() + "\n"
}

func start(t *testing.T, cfg *config.Config) *service.Service {
	t.Helper()
	return startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{})
}

// startWith is start with every input and option given.
func startWith(t testing.TB, in service.Inputs, opts service.RuntimeOptions) *service.Service {
	t.Helper()
	s, err := service.Start(ctxT(t), in, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	closeAtEnd(t, s)
	return s
}

// closeNow closes s where a test has no use for the release's verdict (the tests that check it
// call Close themselves).
func closeNow(s *service.Service) { _ = s.Close(context.Background()) }

// closeAtEnd closes s when the test ends; a release the broker cannot confirm then (a test that
// stopped it) is the test's to check, not the cleanup's.
func closeAtEnd(t testing.TB, s *service.Service) {
	t.Cleanup(func() { _ = s.Close(context.Background()) })
}

// planeRow reads the plane row as an auth-plane credential of its own (authd's identity may
// mint one; the profile may read exactly this key), or reports that there is none.
func (e *env) planeRow(t *testing.T) (map[string]any, bool) {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.sg.Addr, TLS: e.sg.ClientFor(t, "authd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: sp, Profile: signerv1.Profile_PROFILE_AUTH_PLANE, NatsURL: e.url})
	if err != nil {
		t.Fatal(err)
	}
	defer rail.Close()
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, append(rail.NatsOptions(), nats.NoReconnect())...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	n, _ := space.NewNames(sp)
	bucket, _ := n.Bucket(space.Auth)
	kv, err := js.KeyValue(ctxT(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := kv.Get(ctxT(t), "plane")
	if err != nil {
		return nil, false
	}
	var row map[string]any
	if err := json.Unmarshal(ent.Value(), &row); err != nil {
		t.Fatal(err)
	}
	return row, true
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// authdBinary builds the authd binary once per test run.
func authdBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "authd-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "authd")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/cotalgo/cotal/authd").CombinedOutput()
		if err != nil {
			binErr = &buildError{out: string(out), err: err}
		}
	})
	if binErr != nil {
		t.Fatalf("build authd: %v", binErr)
	}
	return binPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// child is an authd binary running `serve` on a configuration file.
type child struct {
	cmd    *exec.Cmd
	stderr *testkit.SyncBuffer
	waited chan error
}

func startChild(t *testing.T, cfg *config.Config) *child {
	t.Helper()
	path := filepath.Join(t.TempDir(), "authd.yaml")
	if err := os.WriteFile(path, []byte(yamlOf(cfg)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(authdBinary(t), "serve", "--config", path), stderr: &testkit.SyncBuffer{}, waited: make(chan error, 1)}
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.waited <- c.cmd.Wait() }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.waited
	})
	return c
}

// exitCode waits for the child to exit and returns its code.
func (c *child) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case err := <-c.waited:
		c.waited <- err
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("child did not exit")
	}
	return -1
}

func readyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
