package setup

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// Defaults of ClusterOptions.
const (
	DefaultClusterName = "cotal"
	DefaultClusterPort = 6222
	DefaultStoreDir    = "jetstream"
)

// ClusterNode is one node of ClusterOptions: its server_name, the host its peers and clients
// reach it on (it also listens there), and ports; zero ports take ClusterOptions' defaults.
type ClusterNode struct {
	Name                                 string
	Host                                 string
	ClientPort, ClusterPort, MonitorPort int
}

// ParseNode reads NAME=HOST or NAME=HOST,CLIENT_PORT,CLUSTER_PORT[,MONITOR_PORT] (the second form
// runs several nodes on one host, as tests do).
func ParseNode(v string) (ClusterNode, error) {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return ClusterNode{}, fmt.Errorf("setup: --node %q: want NAME=HOST[,CLIENT_PORT,CLUSTER_PORT[,MONITOR_PORT]]", v)
	}
	parts := strings.Split(rest, ",")
	if len(parts) != 1 && len(parts) != 3 && len(parts) != 4 {
		return ClusterNode{}, fmt.Errorf("setup: --node %q: want NAME=HOST[,CLIENT_PORT,CLUSTER_PORT[,MONITOR_PORT]]", v)
	}
	n := ClusterNode{Name: name, Host: parts[0]}
	ports := []*int{&n.ClientPort, &n.ClusterPort, &n.MonitorPort}
	for i, p := range parts[1:] {
		x, err := strconv.Atoi(p)
		if err != nil || x < 1 || x > 65535 {
			return ClusterNode{}, fmt.Errorf("setup: --node %q: port %q is not 1..65535", v, p)
		}
		*ports[i] = x
	}
	return n, nil
}

// ClusterOptions configure RenderCluster.
type ClusterOptions struct {
	// Dir is the `signerd init` directory; its public/ facts are rendered. Required.
	Dir string
	// Out receives one <name>.conf per node. Required; created if missing.
	Out string
	// Nodes are the cluster's members, at least one; names and host:ports unique.
	Nodes []ClusterNode
	// Name is the cluster name; empty means DefaultClusterName.
	Name string
	// ClientPort, ClusterPort and MonitorPort are the defaults for nodes that give none: 0 means
	// trust.DefaultPort, DefaultClusterPort and no monitoring.
	ClientPort, ClusterPort, MonitorPort int
	// StoreDir is every node's JetStream store; empty means DefaultStoreDir, which nats-server
	// resolves against its working directory on that node (never a path of this machine).
	StoreDir string
	// TLSCertFile, TLSKeyFile and TLSCAFile are paths on the nodes; a "{name}" in them is
	// replaced by the node's name. Cert and key both or neither.
	TLSCertFile, TLSKeyFile, TLSCAFile string
}

// RenderCluster writes, for each node, a nats-server configuration with the same operator, SYS
// and account trust (every space in Dir/public), the node's server_name and listeners, a cluster
// block routing to every node, and the store and TLS settings. It returns the files written. A
// one-node list renders no cluster block.
func RenderCluster(opts ClusterOptions) ([]string, error) {
	if opts.Dir == "" || opts.Out == "" {
		return nil, errors.New("setup: --dir and --out are required")
	}
	if len(opts.Nodes) == 0 {
		return nil, errors.New("setup: at least one --node is required")
	}
	def := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	if opts.Name == "" {
		opts.Name = DefaultClusterName
	}
	if opts.StoreDir == "" {
		opts.StoreDir = DefaultStoreDir
	}
	names, addrs := map[string]bool{}, map[string]bool{}
	var routes []string
	for i := range opts.Nodes {
		n := &opts.Nodes[i]
		n.ClientPort = def(n.ClientPort, def(opts.ClientPort, trust.DefaultPort))
		n.ClusterPort = def(n.ClusterPort, def(opts.ClusterPort, DefaultClusterPort))
		n.MonitorPort = def(n.MonitorPort, opts.MonitorPort)
		if names[n.Name] || strings.ContainsAny(n.Name, "/\\ \t") || n.Name == "." || n.Name == ".." {
			return nil, fmt.Errorf("setup: node name %q is repeated or not a plain name", n.Name)
		}
		names[n.Name] = true
		route := net.JoinHostPort(n.Host, strconv.Itoa(n.ClusterPort))
		if addrs[route] {
			return nil, fmt.Errorf("setup: two nodes route to %s", route)
		}
		addrs[route] = true
		routes = append(routes, "nats-route://"+route)
	}
	pub := filepath.Join(opts.Dir, PublicDir)
	pb, err := keystore.ReadPublicBroker(pub)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	broker, err := trust.LoadBroker(pb.OperatorJWT, pb.SystemAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	spaceNames, err := keystore.ListPublicSpaces(pub)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	spaces, err := loadSpaces(pub, broker, spaceNames)
	if err != nil {
		return nil, err
	}
	var confs [][]byte
	for _, n := range opts.Nodes {
		sub := func(p string) string { return strings.ReplaceAll(p, "{name}", n.Name) }
		cfg := trust.ServerConfig{
			Host: n.Host, Port: n.ClientPort, ServerName: n.Name, MonitorPort: n.MonitorPort,
			StoreDir: opts.StoreDir, Broker: broker, Spaces: spaces,
			TLSCertFile: sub(opts.TLSCertFile), TLSKeyFile: sub(opts.TLSKeyFile), TLSCAFile: sub(opts.TLSCAFile),
		}
		if len(opts.Nodes) > 1 {
			cfg.Cluster = &trust.ClusterConfig{Name: opts.Name, Port: n.ClusterPort, Routes: routes}
		}
		conf, err := trust.RenderServerConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("setup: node %s: %w", n.Name, err)
		}
		confs = append(confs, conf)
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	var out []string
	for i, n := range opts.Nodes {
		path := filepath.Join(opts.Out, n.Name+".conf")
		if err := creds.WritePublicFile(path, confs[i], 0o644); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		out = append(out, path)
	}
	return out, nil
}
