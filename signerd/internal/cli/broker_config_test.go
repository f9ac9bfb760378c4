package cli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// TestBrokerConfigBootsCluster: `signerd broker-config` renders three node configurations from an
// init directory, with client TLS; the real nats-server binary boots each from its own working
// directory (relative store), the three form a cluster with a JetStream meta leader, and each
// node's client port speaks TLS with the given certificate and refuses a client without a
// credential (operator trust in force).
func TestBrokerConfigBootsCluster(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "cotal")
	if code, _, errs := run(t, "init", "--dir", dir, "--space", "alpha"); code != 0 {
		t.Fatalf("init: %s", errs)
	}
	// Node TLS: one server certificate for 127.0.0.1 from a test CA, at a {name}-templated path.
	ca, err := mtls.NewCA("broker CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := cluster.FreePorts(9)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "conf")
	args := []string{"broker-config", "--dir", dir, "--out", out, "--tls-cert", "tls/{name}.crt", "--tls-key", "tls/{name}.key", "--tls-ca", "tls/ca.pem"}
	var nodes []*cluster.Node
	for i := range 3 {
		nd := &cluster.Node{Name: "n" + strconv.Itoa(i+1), ClientPort: ports[3*i], ClusterPort: ports[3*i+1], MonitorPort: ports[3*i+2]}
		nd.Dir = filepath.Join(root, nd.Name)
		nd.Conf = filepath.Join(out, nd.Name+".conf")
		args = append(args, "--node", fmt.Sprintf("%s=127.0.0.1,%d,%d,%d", nd.Name, nd.ClientPort, nd.ClusterPort, nd.MonitorPort))
		leaf, err := ca.Issue(mtls.LeafSpec{CommonName: nd.Name, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{nd.Name + ".crt": leaf.CertPEM(), nd.Name + ".key": leaf.KeyPEM(), "ca.pem": ca.CertPEM()} {
			mustWriteFile(t, filepath.Join(nd.Dir, "tls", name), data)
		}
		nodes = append(nodes, nd)
	}
	code, stdout, errs := run(t, args...)
	if code != 0 {
		t.Fatalf("broker-config: exit %d: %s", code, errs)
	}
	for _, nd := range nodes {
		if !strings.Contains(stdout, nd.Conf) {
			t.Fatalf("stdout %q does not name %s", stdout, nd.Conf)
		}
		conf, err := os.ReadFile(nd.Conf)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`server_name: "` + nd.Name + `"`, `store_dir: "jetstream"`, `cert_file: "tls/` + nd.Name + `.crt"`, "cluster {", `name: "cotal"`} {
			if !strings.Contains(string(conf), want) {
				t.Fatalf("%s lacks %s", nd.Conf, want)
			}
		}
		if strings.Contains(string(conf), root) {
			t.Fatalf("%s names a path of the rendering machine", nd.Conf)
		}
	}

	c, err := cluster.Run("", nodes, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
		t.Fatal(err)
	}
	leader, err := c.MetaLeader()
	if err != nil {
		t.Fatal(err)
	}
	if js, err := c.Jsz(leader, ""); err != nil || js.Meta.Size != 3 {
		t.Fatalf("meta cluster %+v (%v), want size 3", js.Meta, err)
	}
	for i, u := range c.URLs() {
		if !strings.HasPrefix(u, "tls://") {
			t.Fatalf("URL %s is not tls://", u)
		}
		if _, err := os.Stat(filepath.Join(nodes[i].Dir, "jetstream")); err != nil {
			t.Fatalf("%s: store not under its working directory: %v", nodes[i].Name, err)
		}
		_, err := nats.Connect(u, nats.RootCAs(filepath.Join(nodes[i].Dir, "tls", "ca.pem")), nats.MaxReconnects(0))
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("%s: connect without a credential over TLS: %v, want an authorization violation", nodes[i].Name, err)
		}
	}
}

func TestBrokerConfigRefuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cotal")
	if code, _, errs := run(t, "init", "--dir", dir, "--space", "alpha"); code != 0 {
		t.Fatalf("init: %s", errs)
	}
	out := filepath.Join(t.TempDir(), "conf")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"ok/help", []string{"broker-config", "--help"}, 0, "--node NAME=HOST"},
		{"fail/no-node", []string{"broker-config", "--dir", dir, "--out", out}, 1, "at least one --node"},
		{"fail/bad-node", []string{"broker-config", "--dir", dir, "--out", out, "--node", "n1"}, 2, "NAME=HOST"},
		{"fail/bad-port", []string{"broker-config", "--dir", dir, "--out", out, "--node", "n1=h,1,99999"}, 2, "not 1..65535"},
		{"fail/same-name", []string{"broker-config", "--dir", dir, "--out", out, "--node", "n1=a", "--node", "n1=b"}, 1, "repeated"},
		{"fail/same-route", []string{"broker-config", "--dir", dir, "--out", out, "--node", "n1=a", "--node", "n2=a"}, 1, "route to a:6222"},
		{"fail/cert-without-key", []string{"broker-config", "--dir", dir, "--out", out, "--node", "n1=a", "--node", "n2=b", "--tls-cert", "c"}, 1, "TLSCertFile/TLSKeyFile"},
		{"fail/no-init-dir", []string{"broker-config", "--dir", filepath.Join(dir, "nope"), "--out", out, "--node", "n1=a"}, 1, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, errs := run(t, tc.args...)
			if code != tc.code || !strings.Contains(stdout+errs, tc.want) {
				t.Fatalf("exit %d output %q; want %d and %q", code, stdout+errs, tc.code, tc.want)
			}
		})
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused run wrote %s (%v)", out, err)
	}
}

func mustWriteFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
