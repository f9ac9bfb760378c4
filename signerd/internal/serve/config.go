// Package serve is `signerd serve`: it loads and validates the configuration, opens the key
// store, policy and audit log, and runs the mTLS gRPC listener (SignerService, the standard
// health service and server reflection) and the Prometheus listener until its context ends,
// then stops gracefully within a deadline and wipes every key.
//
// It refuses to start on an unknown configuration key, a missing policy, a seed file or
// directory looser than 0600/0700 or owned by another uid (naming the path), a client CA or
// policy file that anyone but root or signerd's uid could rewrite (naming the path), a limit
// out of range, and a listener address it cannot bind. Once serving, it bounds connections and
// streams by the limits configuration and closes connections over its caps at accept.
package serve

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/server"
)

// Config is signerd serve's configuration file.
type Config struct {
	// Listen is "host:port" for TCP or "unix:/path" for a Unix socket. Required.
	Listen string `yaml:"listen"`
	// TLS names the server certificate, its key and the client CA bundle. Required.
	TLS TLSConfig `yaml:"tls"`
	// KeyDir is the signer key directory. Ignored (with a log line) when $CREDENTIALS_DIRECTORY
	// is set: systemd's LoadCredential= files are read from there instead.
	KeyDir string `yaml:"key_dir"`
	// PublicDir holds broker.json and the spaces' public facts. Required.
	PublicDir string `yaml:"public_dir"`
	// Policy is the per-caller policy file. Required.
	Policy string `yaml:"policy"`
	// PolicyReloadInterval is how often the policy file is checked for changes (SIGHUP reloads
	// at once). Default 2s.
	PolicyReloadInterval Duration `yaml:"policy_reload_interval"`
	// Audit configures the audit log. Required.
	Audit AuditConfig `yaml:"audit"`
	// MetricsListen is the Prometheus listener ("host:port"); empty disables it.
	MetricsListen string `yaml:"metrics_listen"`
	// ShutdownTimeout bounds the graceful stop. Default 10s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`
	// Limits bound connections and streams on the gRPC listener; every key has a safe default.
	Limits LimitsConfig `yaml:"limits"`
	// Idempotency bounds the Mint request_id cache; every key has a safe default.
	Idempotency IdempotencyConfig `yaml:"idempotency"`
}

// IdempotencyConfig bounds the memory the Mint request_id cache may hold. A zero value means the
// server package default; a negative one, or a caller share above the total, stops start-up.
type IdempotencyConfig struct {
	// MaxBytes is the cache's byte budget. Default 64 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
	// CallerBytes is one caller's share of it: a caller over its share loses its own oldest
	// entries, never another caller's. Default 16 MiB.
	CallerBytes int64 `yaml:"caller_bytes"`
}

func (c *IdempotencyConfig) validate() error {
	if c.MaxBytes < 0 || c.CallerBytes < 0 {
		return errors.New("idempotency: max_bytes and caller_bytes must not be negative")
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = server.DefaultIdempotencyBytes
	}
	if c.CallerBytes == 0 {
		c.CallerBytes = min(server.DefaultIdempotencyCallerBytes, c.MaxBytes)
	}
	if c.CallerBytes > c.MaxBytes {
		return fmt.Errorf("idempotency.caller_bytes %d is more than idempotency.max_bytes %d", c.CallerBytes, c.MaxBytes)
	}
	return nil
}

// LimitsConfig bounds what clients, authenticated or not, can hold of signerd: file
// descriptors, handshakes, streams and buffered request bytes. A zero value means the default.
type LimitsConfig struct {
	// HandshakeTimeout bounds the TLS handshake and HTTP/2 preface of a new connection, so a
	// connection that never sends a ClientHello is closed. Default 5s.
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
	// MaxConnections caps open connections on the listener; further ones are closed at
	// accept. Default 512.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerSource caps open connections from one source IP address (not applied
	// to a Unix socket). Default 64. Daemons on one host share one source address.
	MaxConnectionsPerSource int `yaml:"max_connections_per_source"`
	// MaxRecvMsgBytes is the largest request message accepted; a stream announcing a larger
	// one is refused (RESOURCE_EXHAUSTED) before its body is read. The largest real requests
	// are a 64 KiB sealed callout request and a 64 KiB Mac payload. Default 131072 (128 KiB);
	// at least 69632 (68 KiB), at most 4194304.
	MaxRecvMsgBytes int `yaml:"max_recv_msg_bytes"`
	// MaxConcurrentStreams caps concurrent calls on one connection. Default 32.
	MaxConcurrentStreams int `yaml:"max_concurrent_streams"`
	// MaxHeaderListBytes caps the request header list. Default 16384.
	MaxHeaderListBytes int `yaml:"max_header_list_bytes"`
	// KeepaliveMinTime is the shortest interval between client keepalive pings; a client that
	// pings more often (or, with no call open, more than once in two hours: gRPC's rule when
	// pings without calls are not permitted) is disconnected. Default 30s.
	KeepaliveMinTime Duration `yaml:"keepalive_min_time"`
	// MaxConnectionIdle closes a connection with no call open for this long. Default 5m.
	MaxConnectionIdle Duration `yaml:"max_connection_idle"`
	// MaxConnectionAge closes a connection this old (plus or minus 10%), so every client
	// handshakes again and is verified afresh. Default 1h.
	MaxConnectionAge Duration `yaml:"max_connection_age"`
	// MaxConnectionAgeGrace is how long calls in flight on an aged connection may still run
	// before it is cut. Default 30s.
	MaxConnectionAgeGrace Duration `yaml:"max_connection_age_grace"`
}

// Defaults and bounds of LimitsConfig.
const (
	DefaultHandshakeTimeout        = 5 * time.Second
	DefaultMaxConnections          = 512
	DefaultMaxConnectionsPerSource = 64
	DefaultMaxRecvMsgBytes         = 128 << 10
	// MinRecvMsgBytes leaves room for a 64 KiB sealed callout request or Mac payload and the
	// rest of its message.
	MinRecvMsgBytes = 68 << 10
	// MaxRecvMsgBytes is gRPC's own default; a larger limit only lets more bytes be buffered.
	MaxRecvMsgBytes              = 4 << 20
	DefaultMaxConcurrentStreams  = 32
	DefaultMaxHeaderListBytes    = 16 << 10
	MinHeaderListBytes           = 1 << 10
	DefaultKeepaliveMinTime      = 30 * time.Second
	DefaultMaxConnectionIdle     = 5 * time.Minute
	DefaultMaxConnectionAge      = time.Hour
	DefaultMaxConnectionAgeGrace = 30 * time.Second
)

// validate refuses negative and out-of-range values and fills in the defaults.
func (l *LimitsConfig) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max_connections", l.MaxConnections}, {"max_connections_per_source", l.MaxConnectionsPerSource},
		{"max_recv_msg_bytes", l.MaxRecvMsgBytes}, {"max_concurrent_streams", l.MaxConcurrentStreams},
		{"max_header_list_bytes", l.MaxHeaderListBytes},
	} {
		if f.v < 0 {
			return fmt.Errorf("limits.%s must not be negative", f.name)
		}
	}
	setDefault(&l.HandshakeTimeout, DefaultHandshakeTimeout)
	setDefault(&l.KeepaliveMinTime, DefaultKeepaliveMinTime)
	setDefault(&l.MaxConnectionIdle, DefaultMaxConnectionIdle)
	setDefault(&l.MaxConnectionAge, DefaultMaxConnectionAge)
	setDefault(&l.MaxConnectionAgeGrace, DefaultMaxConnectionAgeGrace)
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConnectionsPerSource == 0 {
		l.MaxConnectionsPerSource = min(DefaultMaxConnectionsPerSource, l.MaxConnections)
	}
	if l.MaxRecvMsgBytes == 0 {
		l.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.MaxHeaderListBytes == 0 {
		l.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	switch {
	case l.MaxConnectionsPerSource > l.MaxConnections:
		return fmt.Errorf("limits.max_connections_per_source %d is larger than limits.max_connections %d", l.MaxConnectionsPerSource, l.MaxConnections)
	case l.MaxRecvMsgBytes < MinRecvMsgBytes || l.MaxRecvMsgBytes > MaxRecvMsgBytes:
		return fmt.Errorf("limits.max_recv_msg_bytes %d: want %d to %d (the largest request is a 64 KiB sealed callout request)", l.MaxRecvMsgBytes, MinRecvMsgBytes, MaxRecvMsgBytes)
	case int64(l.MaxConcurrentStreams) > math.MaxUint32:
		return fmt.Errorf("limits.max_concurrent_streams %d is too large", l.MaxConcurrentStreams)
	case l.MaxHeaderListBytes < MinHeaderListBytes || int64(l.MaxHeaderListBytes) > math.MaxUint32:
		return fmt.Errorf("limits.max_header_list_bytes %d: want at least %d", l.MaxHeaderListBytes, MinHeaderListBytes)
	}
	return nil
}

func setDefault(d *Duration, def time.Duration) {
	if *d == 0 {
		*d = Duration(def)
	}
}

// TLSConfig names the TLS files.
type TLSConfig struct {
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"`
	// ReloadInterval is how often the files are checked for changes. Default 5s.
	ReloadInterval Duration `yaml:"reload_interval"`
}

// AuditConfig configures the audit log.
type AuditConfig struct {
	Path    string `yaml:"path"`
	Replica string `yaml:"replica"`
	// MaxBatch caps lines per fsync; 0 means the audit package default.
	MaxBatch int `yaml:"max_batch"`
	// MaxDelay lets the writer wait for more lines; 0 means none.
	MaxDelay Duration `yaml:"max_delay"`
	// MaxBytes is the size in bytes at which the file is rotated (SIGHUP rotates too). Default
	// 64 MiB; at least 64 KiB.
	MaxBytes int64 `yaml:"max_bytes"`
}

// Duration is a time.Duration written as "10s" in YAML (pkg/yamlx's, shared by every daemon).
type Duration = yamlx.Duration

// MaxConfigBytes bounds the configuration file.
const MaxConfigBytes = 1 << 20

// LoadConfig reads and validates a configuration file. Unknown keys are errors naming the key.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("config: %s is larger than %d bytes", path, MaxConfigBytes)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes strictly and validates.
func ParseConfig(data []byte) (*Config, error) {
	var cfg Config
	if err := yamlx.Decode(data, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func (c *Config) validate() error {
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"listen", c.Listen}, {"tls.cert", c.TLS.Cert}, {"tls.key", c.TLS.Key}, {"tls.client_ca", c.TLS.ClientCA},
		{"public_dir", c.PublicDir}, {"policy", c.Policy}, {"audit.path", c.Audit.Path}, {"audit.replica", c.Audit.Replica},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if c.KeyDir == "" && os.Getenv("CREDENTIALS_DIRECTORY") == "" {
		missing = append(missing, "key_dir (or $CREDENTIALS_DIRECTORY)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing required keys: %s", strings.Join(missing, ", "))
	}
	if p, ok := strings.CutPrefix(c.Listen, "unix:"); ok && p == "" {
		return errors.New("listen: unix: needs a path")
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.Audit.MaxBatch < 0 {
		return errors.New("audit.max_batch must not be negative")
	}
	if c.Audit.MaxBytes == 0 {
		c.Audit.MaxBytes = audit.DefaultMaxBytes
	}
	if c.Audit.MaxBytes < audit.MinMaxBytes {
		return fmt.Errorf("audit.max_bytes %d is less than %d", c.Audit.MaxBytes, audit.MinMaxBytes)
	}
	if c.PolicyReloadInterval == 0 {
		c.PolicyReloadInterval = Duration(2 * time.Second)
	}
	if c.TLS.ReloadInterval == 0 {
		c.TLS.ReloadInterval = Duration(5 * time.Second)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(10 * time.Second)
	}
	if err := c.Idempotency.validate(); err != nil {
		return err
	}
	return c.Limits.validate()
}
