package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cotalgo/cotal/managerd/internal/term"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/material"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// The tests run the test agent as a built binary on real PTYs, against a real signerd, broker
// and deliveryd (also a built binary: deliveryd's internal packages are not importable here).

const (
	spaceName = "alpha"
	owner     = "local"
	uidAlice  = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uidBob    = "uidbbbbbbbbbbbbbbbbbbbbbbb"
)

var agentBin string // built once by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "testagent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "testagent")
	if out, err := exec.Command("go", "build", "-o", agentBin, "github.com/cotalgo/cotal/managerd/internal/testagent").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build testagent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// stack is a signerd, an embedded broker trusting it, the provisioned space and deliveryd.
type stack struct {
	s   *signerdtest.Signer
	srv *server.Server
	url string
	n   space.Names
	mgr *signerclient.Client // managerd's signer client
	pjs jetstream.JetStream  // a provisioner connection
}

func (st *stack) signer(t *testing.T, kind string) *signerclient.Client {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: st.s.Addr, TLS: st.s.ClientFor(t, kind, spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// conn connects with a fresh credential of profile minted through managerd's signer client.
func (st *stack) conn(t *testing.T, p signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: st.mgr, Space: spaceName, Profile: p, Params: params, NatsURL: st.url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(st.url, rail.NatsOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func startStack(t *testing.T) *stack {
	t.Helper()
	st := &stack{s: signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})}
	st.srv = st.s.StartBrokerServer(t)
	st.url = st.srv.ClientURL()
	var err error
	if st.n, err = space.NewNames(spaceName); err != nil {
		t.Fatal(err)
	}
	st.mgr = st.signer(t, mtls.KindManagerd)
	if _, err := provision.Run(ctxFor(t), provision.Config{Signer: st.mgr, Space: spaceName, NatsURL: st.url}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if st.pjs, err = jetstream.New(st.conn(t, signerv1.Profile_PROFILE_PROVISIONER, nil)); err != nil {
		t.Fatal(err)
	}
	return st
}

// startDeliveryd builds and runs `deliveryd serve` for the stack until the test ends.
func (st *stack) startDeliveryd(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "deliveryd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/cotalgo/cotal/deliveryd").CombinedOutput(); err != nil {
		t.Fatalf("go build deliveryd: %v\n%s", err, out)
	}
	cf := st.s.ClientFor(t, mtls.KindDeliveryd, spaceName)
	q := strconv.Quote
	cfg := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {address: %s, ca: %s, cert: %s, key: %s}\nstate_dir: %s\nholder: %s\nbroker_gone: 15s\nlog_level: debug\n",
		q(spaceName), q(st.url), q(st.s.Addr), q(cf.ServerCAFile), q(cf.CertFile), q(cf.KeyFile), q(filepath.Join(dir, "state")), q("deliveryd-test"))
	path := filepath.Join(dir, "deliveryd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	var logs testkit.SyncBuffer
	cmd.Stderr = &logs
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("deliveryd log:\n%s", logs.String())
		}
	})
}

// agentSpec is one agent incarnation: its key, credential and material file.
type agentSpec struct {
	actor, uid   string
	seed, jwt    string
	pub          string
	materialPath string
}

// addAgent does what managerd does for a spawn: its dlv_ durable and ACL row (provisioner), a
// fresh user nkey, an agent credential minted by signerd for it, and the material file (0600 in
// a 0700 directory).
func (st *stack) addAgent(t *testing.T, actor, uid string) *agentSpec {
	t.Helper()
	ctx := ctxFor(t)
	if err := provision.EnsureDlvDurable(ctx, st.pjs, st.n, owner, actor, uid); err != nil {
		t.Fatal(err)
	}
	kv, err := st.pjs.KeyValue(ctx, "cotal_acl_"+st.n.Token())
	if err != nil {
		t.Fatal(err)
	}
	key, err := space.ACLKey(owner, actor, uid)
	if err != nil {
		t.Fatal(err)
	}
	row, _ := json.Marshal(map[string]any{"allowSubscribe": []string{"general"}, "revision": 1, "updatedAt": time.Now().UnixMilli()})
	if _, err := kv.Put(ctx, key, row); err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	a := &agentSpec{actor: actor, uid: uid, seed: string(seed), pub: pub}
	a.jwt = st.mint(t, a, 0)
	dir := filepath.Join(t.TempDir(), actor)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	a.materialPath = filepath.Join(dir, "launch-material")
	st.writeMaterial(t, a)
	return a
}

// mint mints an agent credential for a's key (ttl 0: the profile's default).
func (st *stack) mint(t *testing.T, a *agentSpec, ttl time.Duration) string {
	t.Helper()
	req := &signerv1.MintRequest{Space: spaceName, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: a.pub,
		Params: &signerv1.ProfileParams{Owner: owner, Actor: a.actor, LifecycleUid: a.uid,
			Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}}}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	cred, err := st.mgr.Mint(ctxFor(t), req)
	if err != nil {
		t.Fatalf("mint agent %s: %v", a.actor, err)
	}
	return cred.GetJwt()
}

// writeMaterial writes a's material (with a.jwt) atomically, 0600, as the launcher does.
func (st *stack) writeMaterial(t *testing.T, a *agentSpec) {
	t.Helper()
	creds, err := material.FormatCreds(a.jwt, []byte(a.seed))
	if err != nil {
		t.Fatal(err)
	}
	b, err := material.Encode(material.Material{Version: material.Version, Space: spaceName, Servers: []string{st.url},
		Owner: owner, Actor: a.actor, LifecycleUID: a.uid, InstanceID: "test-instance",
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}, Creds: creds})
	if err != nil {
		t.Fatal(err)
	}
	tmp := a.materialPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, a.materialPath); err != nil {
		t.Fatal(err)
	}
}

// running is a test agent process on a PTY, its terminal shared through managerd's term.
type running struct {
	cmd    *exec.Cmd
	term   *term.Terminal
	out    *collector
	exited chan struct{}
	err    error
}

func startAgent(t *testing.T, env []string, args ...string) *running {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBin, args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "TERM=dumb"}, env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	tm, err := term.New(master, term.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap, out, _, detach, err := tm.Attach()
	if err != nil {
		t.Fatal(err)
	}
	r := &running{cmd: cmd, term: tm, out: collect(snap, out), exited: make(chan struct{})}
	go func() { r.err = cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.exited
		detach()
		_ = tm.Close()
		if t.Failed() {
			t.Logf("agent %v terminal:\n%s", args, r.out.text())
		}
	})
	return r
}

// exitCode waits for the agent to exit and returns its status.
func (r *running) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-r.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("agent still running:\n%s", r.out.text())
	}
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		return ee.ExitCode()
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return 0
}

// collector accumulates a terminal subscription.
type collector struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func collect(snapshot []byte, out <-chan []byte) *collector {
	c := &collector{}
	c.buf.Write(snapshot)
	go func() {
		for chunk := range out {
			c.mu.Lock()
			c.buf.Write(chunk)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// lines is the terminal's output as lines (the terminal turns \n into \r\n).
func (c *collector) lines() []string {
	return strings.Split(strings.ReplaceAll(c.text(), "\r\n", "\n"), "\n")
}

// waitLine polls until a whole line satisfies match, and returns it.
func (c *collector) waitLine(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, l := range c.lines() {
			if match(l) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s line; terminal:\n%s", what, c.text())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *collector) waitExact(t *testing.T, line string) {
	t.Helper()
	c.waitLine(t, strconv.Quote(line), func(l string) bool { return l == line })
}

func (c *collector) count(line string) int {
	n := 0
	for _, l := range c.lines() {
		if l == line {
			n++
		}
	}
	return n
}

// serveManagerLiveness answers manager-plane probes as managerd will: a supervisor credential
// serving live.manager.*.* in its queue group, answering only on the probe's own .reply. leaf.
func (st *stack) serveManagerLiveness(t *testing.T) {
	t.Helper()
	nc := st.conn(t, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: owner, Actor: "manager"})
	if _, err := nc.QueueSubscribe(st.n.LiveManagerServe(), space.LiveQueue(space.LivePlaneManager), func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, m.Subject+".reply.") {
			_ = nc.Publish(m.Reply, []byte(`{"plane":"manager"}`))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// agentConn finds the broker connection of the agent named by its connection name and returns
// its id and the JWT it connected with.
func (st *stack) agentConn(t *testing.T, a *agentSpec) (uint64, string, bool) {
	t.Helper()
	cz, err := st.srv.Connz(&server.ConnzOptions{Username: true, Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == "cotal-testagent "+owner+"."+a.actor {
			return c.Cid, c.JWT, true
		}
	}
	return 0, "", false
}

// TestEndToEnd: two test agents on real PTYs against signerd, the broker and deliveryd. Each
// prints "connected" and, once deliveryd joined it to general and its dlv_ durable is bound,
// "ready". A line typed into alice's terminal is posted to general and reaches bob through
// deliveryd as "recv general local.alice <text>" (and never alice herself). The manager-liveness
// probe is unanswered ("manager-unreachable") until a supervisor-credential responder serves the
// plane, and then heard ("manager-alive"). After the material file is replaced with a newly
// minted credential and the broker drops the connection, the agent reconnects with the new JWT
// (read again from the file). SIGTERM and SIGHUP end the agents with status 0. The terminals
// never show the JWT or the seed.
func TestEndToEnd(t *testing.T) {
	st := startStack(t)
	alice, bob := st.addAgent(t, "alice", uidAlice), st.addAgent(t, "bob", uidBob)
	ra := startAgent(t, []string{material.EnvVar + "=" + alice.materialPath}, "--probe-every", "200ms")
	rb := startAgent(t, []string{material.EnvVar + "=" + bob.materialPath}, "--probe-every", "200ms")

	ra.out.waitExact(t, "connected local.alice "+uidAlice)
	rb.out.waitExact(t, "connected local.bob "+uidBob)
	// No manager yet: the probe has no responder.
	rb.out.waitExact(t, "manager-unreachable")
	if rb.out.count("manager-alive") != 0 {
		t.Fatal("manager-alive before any manager served the plane")
	}

	st.startDeliveryd(t)
	for _, r := range []*running{ra, rb} {
		r.out.waitExact(t, "joined general 1")
		r.out.waitExact(t, "ready")
	}

	const text = "hello bob, this is alice"
	if _, err := ra.term.Write(ctxFor(t), []byte(text+"\n")); err != nil {
		t.Fatal(err)
	}
	sent := ra.out.waitLine(t, "sent", func(l string) bool { return strings.HasPrefix(l, "sent general ") })
	if id := strings.TrimPrefix(sent, "sent general "); len(id) != 32 {
		t.Fatalf("sent line %q does not name a 32-hex id", sent)
	}
	rb.out.waitExact(t, "recv general local.alice "+text)

	st.serveManagerLiveness(t)
	rb.out.waitExact(t, "manager-alive")
	ra.out.waitExact(t, "manager-alive")

	// Renewal: a new credential for alice's key in the file, then the broker drops her
	// connection; she reconnects presenting the new JWT.
	cid, jwt1, ok := st.agentConn(t, alice)
	if !ok || jwt1 != alice.jwt {
		t.Fatalf("alice's connection (found %v) does not present her first credential", ok)
	}
	alice.jwt = st.mint(t, alice, 30*time.Minute)
	if alice.jwt == jwt1 {
		t.Fatal("the second mint returned the same JWT")
	}
	st.writeMaterial(t, alice)
	if err := st.srv.DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	ra.out.waitExact(t, "reconnected")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, jwt, ok := st.agentConn(t, alice); ok && jwt == alice.jwt {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alice did not reconnect with the renewed credential")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And she still posts after the reconnect.
	if _, err := ra.term.Write(ctxFor(t), []byte("after renewal\n")); err != nil {
		t.Fatal(err)
	}
	rb.out.waitExact(t, "recv general local.alice after renewal")

	if n := ra.out.count("recv general local.alice " + text); n != 0 {
		t.Fatalf("alice received her own post %d times", n)
	}
	if err := ra.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := rb.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if code := ra.exitCode(t); code != 0 {
		t.Fatalf("alice exited %d after SIGTERM", code)
	}
	if code := rb.exitCode(t); code != 0 {
		t.Fatalf("bob exited %d after SIGHUP", code)
	}
	t.Logf("alice's terminal:\n%s\nbob's terminal:\n%s", ra.out.text(), rb.out.text())
	for _, r := range []*running{ra, rb} {
		out := r.out.text()
		for _, secret := range []string{alice.seed, bob.seed, jwt1, alice.jwt, bob.jwt, "-----BEGIN"} {
			if strings.Contains(out, secret) {
				t.Fatal("a terminal shows the material's credential")
			}
		}
	}
}
