package trust

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// Defaults for ServerConfig fields left zero.
const (
	DefaultHost = "127.0.0.1"
	DefaultPort = 4222
)

// MaxControlLine is the server's max_control_line: user JWTs with many permission rows are
// larger than the 4 KiB default CONNECT line.
const MaxControlLine = 65536

// ServerConfig is what a nats-server needs to trust one broker and its spaces. It holds only
// public material.
type ServerConfig struct {
	// Host is the listen address; empty means DefaultHost (loopback).
	Host string
	// Port is the client port; 0 means DefaultPort, -1 a random port (tests).
	Port int
	// StoreDir is the JetStream store directory. Required: a server without one would keep
	// streams in a temporary directory and lose them.
	StoreDir string
	// TLSCertFile and TLSKeyFile enable client TLS; both or neither.
	TLSCertFile, TLSKeyFile string
	// TLSCAFile, optional with TLSCertFile, is nats-server's tls.ca_file (the client CA pool).
	// verify is not rendered: clients authenticate with their user JWT, not a certificate.
	TLSCAFile string
	// ServerName is the node's server_name; required with Cluster (JetStream peers are named by
	// it), optional otherwise.
	ServerName string
	// MonitorPort, when non-zero, opens the HTTP monitoring endpoint (/healthz, /jsz, /routez) on
	// Host; -1 a random port (in-process only). Zero leaves monitoring off.
	MonitorPort int
	// Cluster, when set, makes the node one member of a clustered JetStream.
	Cluster *ClusterConfig
	// Broker is the trust root. Required.
	Broker *Broker
	// Spaces are the spaces the server serves; each contributes its data and callout account.
	Spaces []*Space
}

// ClusterConfig is a node's cluster block: its route listener and the routes to the other nodes.
// Every node of a cluster shares Name and the same trust (operator, SYS, accounts).
type ClusterConfig struct {
	// Name is the cluster name, the same on every node. Required.
	Name string
	// Host and Port are the route listener; empty Host means ServerConfig.Host. Port is required
	// (1..65535).
	Host string
	Port int
	// Routes are the other nodes' route URLs, nats-route://host:port. A node may list itself
	// (nats-server ignores a route to itself), so one list can serve every node.
	Routes []string
}

// preloadEntry is one account in resolver_preload.
type preloadEntry struct {
	pub, name, jwt string
}

// check validates cfg and returns the accounts to preload, SYS first, then per space the data
// account and the callout account, in cfg.Spaces order. Every account JWT is re-decoded and
// re-checked against cfg.Broker, so a Space built for another broker is refused here too.
func (cfg *ServerConfig) check() ([]preloadEntry, error) {
	if cfg.Broker == nil || cfg.Broker.operator == nil {
		return nil, &ConfigError{Field: "Broker", Reason: "is required"}
	}
	if err := checkConfValue("Host", cfg.Host); err != nil {
		return nil, err
	}
	if cfg.Port < -1 || cfg.Port > 65535 {
		return nil, &ConfigError{Field: "Port", Reason: fmt.Sprintf("%d is not a port (0 default, -1 random)", cfg.Port)}
	}
	if cfg.StoreDir == "" {
		return nil, &ConfigError{Field: "StoreDir", Reason: "is required"}
	}
	if err := checkConfValue("StoreDir", cfg.StoreDir); err != nil {
		return nil, err
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return nil, &ConfigError{Field: "TLSCertFile/TLSKeyFile", Reason: "set both or neither"}
	}
	if err := checkConfValue("TLSCertFile", cfg.TLSCertFile); err != nil {
		return nil, err
	}
	if err := checkConfValue("TLSKeyFile", cfg.TLSKeyFile); err != nil {
		return nil, err
	}
	if cfg.TLSCAFile != "" && cfg.TLSCertFile == "" {
		return nil, &ConfigError{Field: "TLSCAFile", Reason: "needs TLSCertFile and TLSKeyFile"}
	}
	if err := checkConfValue("TLSCAFile", cfg.TLSCAFile); err != nil {
		return nil, err
	}
	if err := checkConfValue("ServerName", cfg.ServerName); err != nil {
		return nil, err
	}
	if strings.ContainsAny(cfg.ServerName, " \t") {
		return nil, &ConfigError{Field: "ServerName", Reason: "contains a space"}
	}
	if cfg.MonitorPort < -1 || cfg.MonitorPort > 65535 {
		return nil, &ConfigError{Field: "MonitorPort", Reason: fmt.Sprintf("%d is not a port (0 off, -1 random)", cfg.MonitorPort)}
	}
	if err := cfg.Cluster.check(cfg.ServerName); err != nil {
		return nil, err
	}

	b := cfg.Broker
	var out []preloadEntry
	seenPub := map[string]bool{}
	seenName := map[string]bool{}
	add := func(accountJWT string) error {
		ac, err := b.decodeAccount(accountJWT)
		if err != nil {
			return err
		}
		if seenPub[ac.Subject] || seenName[ac.Name] {
			return &DuplicateAccountError{Account: ac.Subject, Name: ac.Name}
		}
		seenPub[ac.Subject], seenName[ac.Name] = true, true
		out = append(out, preloadEntry{pub: ac.Subject, name: ac.Name, jwt: accountJWT})
		return nil
	}
	if err := add(b.sysJWT); err != nil {
		return nil, fmt.Errorf("trust: system account: %w", err)
	}
	for i, sp := range cfg.Spaces {
		if sp == nil || sp.data == nil {
			return nil, &ConfigError{Field: fmt.Sprintf("Spaces[%d]", i), Reason: "is nil"}
		}
		// Re-check the pair as a whole against this broker (names, callout wiring).
		if _, err := LoadSpace(b, sp.name, sp.dataJWT, sp.authJWT); err != nil {
			return nil, err
		}
		if err := add(sp.dataJWT); err != nil {
			return nil, err
		}
		if err := add(sp.authJWT); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkConfValue refuses values that cannot be written as a plain quoted string in the
// nats-server configuration language. Quoting with escapes would work for '"' and '\', but
// no legitimate host or path needs them, so refusing is simpler and cannot be got wrong.
func checkConfValue(field, v string) error {
	if !utf8.ValidString(v) {
		return &ConfigError{Field: field, Reason: "is not valid UTF-8"}
	}
	for _, r := range v {
		if r == '"' || r == '\\' || unicode.IsControl(r) {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("contains %q", r)}
		}
	}
	return nil
}

// check validates a cluster block; a nil one is valid (a single node).
func (c *ClusterConfig) check(serverName string) error {
	if c == nil {
		return nil
	}
	if serverName == "" {
		return &ConfigError{Field: "ServerName", Reason: "is required in a cluster"}
	}
	if c.Name == "" || strings.ContainsAny(c.Name, " \t") {
		return &ConfigError{Field: "Cluster.Name", Reason: "is required and may not contain a space"}
	}
	if err := checkConfValue("Cluster.Name", c.Name); err != nil {
		return err
	}
	if err := checkConfValue("Cluster.Host", c.Host); err != nil {
		return err
	}
	if c.Port < 1 || c.Port > 65535 {
		return &ConfigError{Field: "Cluster.Port", Reason: fmt.Sprintf("%d is not a port", c.Port)}
	}
	if len(c.Routes) == 0 {
		return &ConfigError{Field: "Cluster.Routes", Reason: "is empty"}
	}
	for i, r := range c.Routes {
		field := fmt.Sprintf("Cluster.Routes[%d]", i)
		if err := checkConfValue(field, r); err != nil {
			return err
		}
		u, err := url.Parse(r)
		if err != nil || u.Scheme != "nats-route" || u.Host == "" || u.Port() == "" {
			return &ConfigError{Field: field, Reason: "is not nats-route://host:port"}
		}
	}
	return nil
}

func (c *ClusterConfig) host(def string) string {
	if c.Host == "" {
		return def
	}
	return c.Host
}

func (cfg *ServerConfig) host() string {
	if cfg.Host == "" {
		return DefaultHost
	}
	return cfg.Host
}

func (cfg *ServerConfig) port() int {
	if cfg.Port == 0 {
		return DefaultPort
	}
	return cfg.Port
}

// RenderServerConfig renders cfg as nats-server configuration text: server_name when set, listen
// address, max_control_line, the monitoring listener when set, optional tls, the cluster block
// (name, route listener, routes) when set, jetstream store_dir, the operator JWT, the system account, a
// MEMORY resolver, and resolver_preload with SYS, every data account and every callout account.
// The output contains public keys and JWTs only, never a seed. It refuses a duplicate account
// (*DuplicateAccountError), an account not signed by cfg.Broker's operator
// (*ForeignAccountError), and unrenderable fields (*ConfigError).
func RenderServerConfig(cfg ServerConfig) ([]byte, error) {
	accounts, err := cfg.check()
	if err != nil {
		return nil, err
	}
	var w bytes.Buffer
	q := strconv.Quote // safe: checkConfValue and the JWT alphabet leave nothing to escape
	fmt.Fprintf(&w, "# nats-server configuration for broker %s, rendered by cotal.\n", q(cfg.Broker.Name()))
	fmt.Fprintf(&w, "# It holds public keys and JWTs only; no seed belongs here.\n\n")
	if cfg.ServerName != "" {
		fmt.Fprintf(&w, "server_name: %s\n", q(cfg.ServerName))
	}
	fmt.Fprintf(&w, "host: %s\n", q(cfg.host()))
	fmt.Fprintf(&w, "port: %d\n", cfg.port())
	fmt.Fprintf(&w, "max_control_line: %d\n", MaxControlLine)
	if cfg.MonitorPort != 0 {
		fmt.Fprintf(&w, "http: %s\n", q(net.JoinHostPort(cfg.host(), strconv.Itoa(cfg.MonitorPort))))
	}
	if cfg.TLSCertFile != "" {
		fmt.Fprintf(&w, "\ntls {\n  cert_file: %s\n  key_file: %s\n", q(cfg.TLSCertFile), q(cfg.TLSKeyFile))
		if cfg.TLSCAFile != "" {
			fmt.Fprintf(&w, "  ca_file: %s\n", q(cfg.TLSCAFile))
		}
		fmt.Fprintf(&w, "}\n")
	}
	if c := cfg.Cluster; c != nil {
		fmt.Fprintf(&w, "\ncluster {\n  name: %s\n  listen: %s\n  routes: [\n", q(c.Name), q(net.JoinHostPort(c.host(cfg.host()), strconv.Itoa(c.Port))))
		for _, r := range c.Routes {
			fmt.Fprintf(&w, "    %s\n", q(r))
		}
		fmt.Fprintf(&w, "  ]\n}\n")
	}
	fmt.Fprintf(&w, "\njetstream {\n  store_dir: %s\n}\n", q(cfg.StoreDir))
	fmt.Fprintf(&w, "\noperator: %s\n", q(cfg.Broker.OperatorJWT()))
	fmt.Fprintf(&w, "system_account: %s\n", q(cfg.Broker.SystemAccountPublicKey()))
	fmt.Fprintf(&w, "resolver: MEMORY\n")
	fmt.Fprintf(&w, "resolver_preload: {\n")
	for _, a := range accounts {
		// The name is quoted so no JWT field can end the comment line.
		fmt.Fprintf(&w, "  # account %s\n  %s: %s\n", q(a.name), a.pub, q(a.jwt))
	}
	fmt.Fprintf(&w, "}\n")
	return w.Bytes(), nil
}

// ServerOptions builds in-process nats-server options with the same trust as
// RenderServerConfig, for embedding (tests, the dev stack): TrustedOperators, SystemAccount, a
// MemAccResolver holding every account JWT including SYS, JetStream with StoreDir, and client
// TLS when configured. NoSigs is set because an embedded server must not take over the process's
// signal handling; logging is left to the caller. It refuses what RenderServerConfig refuses.
func ServerOptions(cfg ServerConfig) (*server.Options, error) {
	accounts, err := cfg.check()
	if err != nil {
		return nil, err
	}
	oc, err := jwt.DecodeOperatorClaims(cfg.Broker.OperatorJWT())
	if err != nil {
		return nil, fmt.Errorf("trust: operator JWT: %w", err)
	}
	res := &server.MemAccResolver{}
	for _, a := range accounts {
		if err := res.Store(a.pub, a.jwt); err != nil {
			return nil, fmt.Errorf("trust: preload account %s: %w", a.pub, err)
		}
	}
	opts := &server.Options{
		Host:             cfg.host(),
		Port:             cfg.port(),
		MaxControlLine:   MaxControlLine,
		JetStream:        true,
		StoreDir:         cfg.StoreDir,
		TrustedOperators: []*jwt.OperatorClaims{oc},
		SystemAccount:    cfg.Broker.SystemAccountPublicKey(),
		AccountResolver:  res,
		NoSigs:           true,
		ServerName:       cfg.ServerName,
	}
	if cfg.MonitorPort != 0 {
		opts.HTTPHost, opts.HTTPPort = cfg.host(), cfg.MonitorPort
	}
	if c := cfg.Cluster; c != nil {
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: c.host(cfg.host()), Port: c.Port}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("trust: route: %w", err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.TLSCertFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, CaFile: cfg.TLSCAFile})
		if err != nil {
			return nil, fmt.Errorf("trust: server TLS: %w", err)
		}
		opts.TLSConfig = tc
		opts.TLSTimeout = server.TLS_TIMEOUT.Seconds()
	}
	return opts, nil
}
