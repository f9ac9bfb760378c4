// Package cluster runs an N-node NATS cluster with JetStream as real nats-server child processes
// for tests and drills: each node gets its own free loopback ports (client, route, monitoring),
// its own store directory and a configuration rendered by pkg/trust exactly as `signerd
// broker-config` renders it (same operator, SYS and account trust on every node, a relative
// store_dir), so credentials minted by signerd work on every node.
//
// A node can be killed with SIGKILL (Kill), stopped with SIGTERM (Stop) and restarted on the same
// ports and store (Restart). MetaLeader and StreamLeader read the monitoring port (/jsz);
// WaitHealthy polls /healthz on every running node until the meta group has a leader.
//
// The nats-server binary is built once per process from the module's own nats-server version
// (Binary), or taken from $COTAL_NATS_SERVER. Children get SIGKILL if this process dies
// (Pdeathsig), so a crashed test leaves no server behind. It is for tests and the drill only.
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// Name is the cluster name of every harness cluster.
const Name = "cotal"

// StartTimeout bounds how long a node may take to answer on its monitoring port, and
// WaitHealthy's wait.
const StartTimeout = 20 * time.Second

// TLSFiles turn on client TLS on every node (the rendered tls block).
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Config is what New needs.
type Config struct {
	// Dir holds one directory per node (n1, n2, ...): nats.conf, jetstream/ and nats.log.
	// Required.
	Dir string
	// Nodes is the cluster size; 0 means 3. One node is rendered without a cluster block (a
	// standalone JetStream server, its own meta layer).
	Nodes int
	// Broker and Spaces are the trust every node is rendered with. Broker is required.
	Broker *trust.Broker
	Spaces []*trust.Space
	// TLS, when set, turns on client TLS; URLs then use tls://.
	TLS *TLSFiles
	// Binary is the nats-server executable; empty means BuildBinary's.
	Binary string
}

// Node is one member of the cluster.
type Node struct {
	// Name is the server_name, n1..nN.
	Name string
	// Dir is the node's working directory; its store is Dir/jetstream.
	Dir string
	// Conf is the rendered configuration file.
	Conf string
	// ClientPort, ClusterPort and MonitorPort are the node's loopback ports.
	ClientPort, ClusterPort, MonitorPort int

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited; nil when never started
}

// Cluster is a running N-node cluster. Its methods are not safe for concurrent use with Kill,
// Stop, Restart or Close; the read-only queries (MetaLeader, StreamLeader, URLs) are.
type Cluster struct {
	nodes  []*Node
	bin    string
	scheme string
	mu     sync.Mutex // guards Node.cmd and Node.done
}

// Start runs an n-node cluster trusting signer's operator and spaces (n 0 means 3), waits until
// it is healthy, and stops every node when the test ends.
func Start(t testing.TB, signer *signerdtest.Signer, n int) *Cluster {
	t.Helper()
	b, spaces := signer.Trust(t)
	return StartConfig(t, Config{Nodes: n, Broker: b, Spaces: spaces})
}

// StartConfig is Start for any trust; cfg.Dir defaults to t.TempDir().
func StartConfig(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, nd := range c.nodes {
				t.Logf("cluster: %s log: %s", nd.Name, filepath.Join(nd.Dir, "nats.log"))
			}
		}
		c.Close()
	})
	if err := c.WaitHealthy(StartTimeout); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}

// New renders every node's configuration under cfg.Dir and starts every node. It returns once
// every node's monitoring port answers; call WaitHealthy before using JetStream. Close stops
// the nodes.
func New(cfg Config) (*Cluster, error) {
	if cfg.Dir == "" || cfg.Broker == nil {
		return nil, errors.New("cluster: Dir and Broker are required")
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Nodes < 1 {
		return nil, fmt.Errorf("cluster: %d nodes", cfg.Nodes)
	}
	if cfg.Binary == "" {
		if _, err := BuildBinary(); err != nil {
			return nil, err
		}
	}
	ports, err := FreePorts(3 * cfg.Nodes)
	if err != nil {
		return nil, err
	}
	var nodes []*Node
	var routes []string
	for i := range cfg.Nodes {
		nd := &Node{Name: "n" + strconv.Itoa(i+1), ClientPort: ports[3*i], ClusterPort: ports[3*i+1], MonitorPort: ports[3*i+2]}
		nd.Dir = filepath.Join(cfg.Dir, nd.Name)
		nd.Conf = filepath.Join(nd.Dir, "nats.conf")
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(nd.ClusterPort))
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		sc := trust.ServerConfig{
			Host: "127.0.0.1", Port: nd.ClientPort, ServerName: nd.Name, MonitorPort: nd.MonitorPort,
			StoreDir: "jetstream", Broker: cfg.Broker, Spaces: cfg.Spaces,
		}
		if cfg.Nodes > 1 {
			sc.Cluster = &trust.ClusterConfig{Name: Name, Port: nd.ClusterPort, Routes: routes}
		}
		if cfg.TLS != nil {
			sc.TLSCertFile, sc.TLSKeyFile, sc.TLSCAFile = cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.CAFile
		}
		conf, err := trust.RenderServerConfig(sc)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(nd.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		if err := os.WriteFile(nd.Conf, conf, 0o600); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	return Run(cfg.Binary, nodes, cfg.TLS != nil)
}

// Run starts nodes whose configurations were rendered elsewhere (by `signerd broker-config`,
// say): each Node needs Name (its server_name), Dir (the working directory its store_dir is
// relative to), Conf and MonitorPort (the harness polls it) and ClientPort; tls says the client
// URLs are tls://. bin empty means BuildBinary's. It returns once every monitoring port answers.
func Run(bin string, nodes []*Node, tls bool) (*Cluster, error) {
	if bin == "" {
		var err error
		if bin, err = BuildBinary(); err != nil {
			return nil, err
		}
	}
	c := &Cluster{bin: bin, scheme: "nats", nodes: nodes}
	if tls {
		c.scheme = "tls"
	}
	return c, c.launch()
}

// launch starts every node and waits for each monitoring port; on failure it kills them all.
func (c *Cluster) launch() error {
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			c.Close()
			return err
		}
	}
	for i := range c.nodes {
		if err := c.waitUp(i); err != nil {
			c.Close()
			return err
		}
	}
	return nil
}

// N returns the number of nodes.
func (c *Cluster) N() int { return len(c.nodes) }

// Node returns node i (0-based).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// URL returns node i's client URL, nats://127.0.0.1:<port> (tls:// with TLS).
func (c *Cluster) URL(i int) string {
	return c.scheme + "://127.0.0.1:" + strconv.Itoa(c.nodes[i].ClientPort)
}

// URLs returns every node's client URL, in node order.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.URL(i)
	}
	return out
}

// URLList returns URLs joined by commas, the form nats.Connect takes.
func (c *Cluster) URLList() string { return strings.Join(c.URLs(), ",") }

// Index returns the index of the node named name (a server_name such as "n2"), or -1.
func (c *Cluster) Index(name string) int {
	for i, nd := range c.nodes {
		if nd.Name == name {
			return i
		}
	}
	return -1
}

// Running reports whether node i's process is running.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running(i)
}

// running: mu must be held.
func (c *Cluster) running(i int) bool {
	d := c.nodes[i].done
	if d == nil {
		return false
	}
	select {
	case <-d:
		return false
	default:
		return true
	}
}

// start launches node i's process. It refuses a node that is running.
func (c *Cluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running(i) {
		return fmt.Errorf("cluster: %s is running", c.nodes[i].Name)
	}
	nd := c.nodes[i]
	logf, err := os.OpenFile(filepath.Join(nd.Dir, "nats.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	cmd := exec.Command(c.bin, "-c", nd.Conf)
	cmd.Dir = nd.Dir // the relative store_dir resolves here
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("cluster: start %s: %w", nd.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	nd.cmd, nd.done = cmd, done
	return nil
}

// waitUp polls node i's /varz until it answers.
func (c *Cluster) waitUp(i int) error {
	deadline := time.Now().Add(StartTimeout)
	for {
		if !c.Running(i) {
			return fmt.Errorf("cluster: %s exited at start; see %s", c.nodes[i].Name, filepath.Join(c.nodes[i].Dir, "nats.log"))
		}
		if _, err := c.get(i, "/varz"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: %s not answering within %v", c.nodes[i].Name, StartTimeout)
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not synchronisation
	}
}

// signal sends sig to node i and waits up to timeout for it to exit, then SIGKILLs it.
func (c *Cluster) signal(i int, sig syscall.Signal, timeout time.Duration) error {
	c.mu.Lock()
	nd := c.nodes[i]
	if !c.running(i) {
		c.mu.Unlock()
		return fmt.Errorf("cluster: %s is not running", nd.Name)
	}
	cmd, done := nd.cmd, nd.done
	c.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("cluster: signal %s: %w", nd.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("cluster: %s did not exit on %v within %v; killed", nd.Name, sig, timeout)
}

// Kill sends node i SIGKILL (kill -9) and waits for the process to be gone.
func (c *Cluster) Kill(i int) error { return c.signal(i, syscall.SIGKILL, 10*time.Second) }

// Stop sends node i SIGTERM (a clean shutdown) and waits for it to exit (SIGKILL after 10 s).
func (c *Cluster) Stop(i int) error { return c.signal(i, syscall.SIGTERM, 10*time.Second) }

// Restart starts node i again with the same configuration, ports and store, and waits until its
// monitoring port answers. The node must not be running.
func (c *Cluster) Restart(i int) error {
	if err := c.start(i); err != nil {
		return err
	}
	return c.waitUp(i)
}

// Close kills every running node. It is idempotent.
func (c *Cluster) Close() {
	for i := range c.nodes {
		if c.Running(i) {
			_ = c.Kill(i)
		}
	}
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// get reads path from node i's monitoring port and returns the body of a 200.
func (c *Cluster) get(i int, path string) ([]byte, error) {
	resp, err := httpClient.Get("http://127.0.0.1:" + strconv.Itoa(c.nodes[i].MonitorPort) + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cluster: %s %s: %s: %.200s", c.nodes[i].Name, path, resp.Status, body)
	}
	return body, nil
}

// Jsz returns node i's /jsz with query q (e.g. "accounts=true&streams=true").
func (c *Cluster) Jsz(i int, q string) (*server.JSInfo, error) {
	body, err := c.get(i, "/jsz?"+q)
	if err != nil {
		return nil, err
	}
	var js server.JSInfo
	if err := json.Unmarshal(body, &js); err != nil {
		return nil, fmt.Errorf("cluster: %s /jsz: %w", c.nodes[i].Name, err)
	}
	return &js, nil
}

// Monitor reads path (e.g. "/connz?auth=true") from node i's monitoring port and returns the
// body of a 200 answer.
func (c *Cluster) Monitor(i int, path string) ([]byte, error) { return c.get(i, path) }

// ConnNames returns the connection names (nats.Name) of node i's client connections, so a test
// can find the node a daemon is connected to.
func (c *Cluster) ConnNames(i int) ([]string, error) {
	body, err := c.get(i, "/connz?limit=100000")
	if err != nil {
		return nil, err
	}
	var cz server.Connz
	if err := json.Unmarshal(body, &cz); err != nil {
		return nil, fmt.Errorf("cluster: %s /connz: %w", c.nodes[i].Name, err)
	}
	var out []string
	for _, ci := range cz.Conns {
		out = append(out, ci.Name)
	}
	return out, nil
}

// NodeOf returns the index of the running node that has a client connection named name, or an
// error when none (or more than one) has.
func (c *Cluster) NodeOf(name string) (int, error) {
	found := -1
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		names, err := c.ConnNames(i)
		if err != nil {
			return -1, err
		}
		for _, n := range names {
			if n == name {
				if found >= 0 && found != i {
					return -1, fmt.Errorf("cluster: connection %q on %s and %s", name, c.nodes[found].Name, c.nodes[i].Name)
				}
				found = i
			}
		}
	}
	if found < 0 {
		return -1, fmt.Errorf("cluster: no running node has a connection named %q", name)
	}
	return found, nil
}

// MetaLeader returns the index of the JetStream meta leader, as every running node reports it.
// It fails when no node is running, a running node does not answer, they disagree or know no
// leader, or the leader they name is down (until the election after a kill): poll it.
func (c *Cluster) MetaLeader() (int, error) {
	leader := ""
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		js, err := c.Jsz(i, "")
		if err != nil {
			return -1, err
		}
		if js.Meta == nil && len(c.nodes) == 1 {
			return i, nil // one node runs without a cluster block: it is its own meta layer
		}
		if js.Meta == nil || js.Meta.Leader == "" {
			return -1, fmt.Errorf("cluster: %s knows no meta leader", c.nodes[i].Name)
		}
		if leader != "" && js.Meta.Leader != leader {
			return -1, fmt.Errorf("cluster: meta leader %s on one node, %s on %s", leader, js.Meta.Leader, c.nodes[i].Name)
		}
		leader = js.Meta.Leader
	}
	if leader == "" {
		return -1, errors.New("cluster: no node running")
	}
	i := c.Index(leader)
	if i < 0 {
		return -1, fmt.Errorf("cluster: meta leader %q is not a node", leader)
	}
	if !c.Running(i) {
		return -1, fmt.Errorf("cluster: meta leader %s is down (election pending)", leader)
	}
	return i, nil
}

// StreamInfo is what the running nodes report about one stream.
type StreamInfo struct {
	// Leader is the leader's node index.
	Leader int
	// Replicas are the node indexes of the leader and its followers.
	Replicas []int
	// State is the leader's view of the stream.
	State server.StreamState
}

// Stream returns the leader, replica set and state of stream in account (the data account's
// public key, trust.Space.DataAccountPublicKey) as the running nodes report it on /jsz. It
// fails while no running node reports the stream with a leader, or two disagree on the leader.
func (c *Cluster) Stream(account, stream string) (*StreamInfo, error) {
	var out *StreamInfo
	q := "accounts=true&streams=true&acc=" + url.QueryEscape(account)
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		js, err := c.Jsz(i, q)
		if err != nil {
			return nil, err
		}
		for _, ad := range js.AccountDetails {
			for _, sd := range ad.Streams {
				if sd.Name != stream || sd.Cluster == nil || sd.Cluster.Leader == "" {
					continue
				}
				li := c.Index(sd.Cluster.Leader)
				if li < 0 {
					return nil, fmt.Errorf("cluster: stream leader %q is not a node", sd.Cluster.Leader)
				}
				if out != nil && out.Leader != li {
					return nil, fmt.Errorf("cluster: stream %s leader disagreement (%s and %s)", stream, c.nodes[out.Leader].Name, sd.Cluster.Leader)
				}
				if out == nil || i == li {
					out = &StreamInfo{Leader: li, Replicas: []int{li}, State: sd.State}
					for _, r := range sd.Cluster.Replicas {
						if ri := c.Index(r.Name); ri >= 0 {
							out.Replicas = append(out.Replicas, ri)
						}
					}
				}
			}
		}
	}
	if out == nil {
		return nil, fmt.Errorf("cluster: no running node reports a leader for stream %s", stream)
	}
	if !c.Running(out.Leader) {
		return nil, fmt.Errorf("cluster: stream %s leader %s is down (election pending)", stream, c.nodes[out.Leader].Name)
	}
	return out, nil
}

// StreamLeader returns the index of the node leading stream in account (see Stream).
func (c *Cluster) StreamLeader(account, stream string) (int, error) {
	si, err := c.Stream(account, stream)
	if err != nil {
		return -1, err
	}
	return si.Leader, nil
}

// Healthy reports nil when every running node's /healthz answers 200 (JetStream enabled, meta
// group current, its streams and consumers current), the running nodes agree on a meta leader,
// and the leader sees every other running node as a current, online peer (the view it places
// new streams by: until then a create can fail "no suitable peers for placement, peer offline").
func (c *Cluster) Healthy() error {
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		if _, err := c.get(i, "/healthz"); err != nil {
			return err
		}
	}
	leader, err := c.MetaLeader()
	if err != nil {
		return err
	}
	js, err := c.Jsz(leader, "")
	if err != nil {
		return err
	}
	for i, nd := range c.nodes {
		if i == leader || !c.Running(i) {
			continue
		}
		ok := false
		for _, p := range js.Meta.Replicas {
			if p.Name == nd.Name && p.Current && !p.Offline {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("cluster: meta leader %s does not see %s as a current online peer yet", c.nodes[leader].Name, nd.Name)
		}
	}
	return nil
}

// WaitHealthy polls Healthy until it reports nil or timeout passes, and returns the last error.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	return poll(timeout, c.Healthy)
}

// WaitStreamLeader polls Stream until a leader is reported that satisfies ok (nil accepts any),
// and returns it.
func (c *Cluster) WaitStreamLeader(account, stream string, timeout time.Duration, ok func(leader int) bool) (int, error) {
	leader := -1
	err := poll(timeout, func() error {
		l, err := c.StreamLeader(account, stream)
		if err != nil {
			return err
		}
		if ok != nil && !ok(l) {
			return fmt.Errorf("cluster: stream %s leader is still %s", stream, c.nodes[l].Name)
		}
		leader = l
		return nil
	})
	return leader, err
}

func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(25 * time.Millisecond) // poll interval, not synchronisation
	}
}

// FreePorts returns n distinct free loopback TCP ports, holding all listeners until all are
// chosen so none is returned twice.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("cluster: free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// natsServer is the nats-server binary, built once per process when BinaryEnv is not set.
var natsServer = testkit.Binaries{Prefix: "cotal-nats-server-", Pkgs: []string{"github.com/nats-io/nats-server/v2"}}

// BinaryEnv names an environment variable that, when set, is the nats-server binary to use
// instead of building one (make sets it to bin/nats-server).
const BinaryEnv = "COTAL_NATS_SERVER"

// BuildBinary returns the nats-server executable: $COTAL_NATS_SERVER when set, else one built
// once per process with `go build github.com/nats-io/nats-server/v2` (the module's own version)
// into a temporary directory that Cleanup removes.
func BuildBinary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, nil
	}
	dir, err := natsServer.Build()
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	return filepath.Join(dir, "nats-server"), nil
}

// Cleanup removes the binary BuildBinary built. TestMain calls it after m.Run (see Main).
func Cleanup() { natsServer.Remove() }

// Main runs m and removes the built binary; use it as TestMain's body:
//
//	func TestMain(m *testing.M) { cluster.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}
