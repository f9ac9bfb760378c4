// Package serve is `signerd serve`: it loads and validates the configuration, opens the key
// store, policy and audit log, and runs the mTLS gRPC listener (SignerService, the standard
// health service and server reflection) and the Prometheus listener until its context ends,
// then stops gracefully within a deadline and wipes every key.
//
// It refuses to start on an unknown configuration key, a missing policy, a seed file or
// directory looser than 0600/0700 or owned by another uid (naming the path), and a listener
// address it cannot bind.
package serve

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cotalgo/cotal/signerd/internal/policy"
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
}

// Duration is a time.Duration written as "10s" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: duration must be a string like \"10s\"", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %s is negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

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
	if err := policy.CheckPlainYAML(data); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); err == nil {
		return nil, errors.New("more than one YAML document")
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
	if c.PolicyReloadInterval == 0 {
		c.PolicyReloadInterval = Duration(2 * time.Second)
	}
	if c.TLS.ReloadInterval == 0 {
		c.TLS.ReloadInterval = Duration(5 * time.Second)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(10 * time.Second)
	}
	return nil
}
