// Package config is deliveryd's configuration file: strict, plain YAML (pkg/daemon.LoadConfig,
// so an unknown key stops start-up naming it), validated before anything dials.
//
// It refuses: a missing required key (named), a space name pkg/space refuses, a broker URL that
// is not nats:// or tls:// or carries credentials, a broker-gone window or backstop out of range,
// a state directory looser than 0700 or another uid's, and a configuration file or state
// directory holding an operator, account or curve seed or a private JWK, naming the file:
// deliveryd holds no signing key, so finding one next to it means signing material leaked out of
// signerd.
package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// Defaults.
const (
	// DefaultBrokerGone is the broker-gone window (upstream COTAL_DELIVERY_BROKER_GONE_MS).
	DefaultBrokerGone = 15 * time.Second
	// DefaultShutdownTimeout bounds a graceful stop, the lease release included.
	DefaultShutdownTimeout = 10 * time.Second
)

// Config is `deliveryd serve --config FILE`.
type Config struct {
	// Space is the space this deliveryd serves. Required.
	Space string `yaml:"space"`
	// Brokers are the broker URLs (nats:// or tls://). Required, at least one.
	Brokers []string `yaml:"brokers"`
	// Signer is how to reach signerd, with deliveryd's client certificate (URI SAN
	// spiffe://<td>/deliveryd/<space token>). Required, except server_name and server_id.
	Signer signerclient.FileConfig `yaml:"signer"`
	// StateDir holds the refusal file of a refused start. 0700; created if missing. Required.
	StateDir string `yaml:"state_dir"`
	// Holder names this instance in the lease row, for whoever finds it; default
	// "deliveryd <host> pid <pid>".
	Holder string `yaml:"holder"`
	// CredentialTTL is the lifetime asked of signerd for each delivery credential; zero means
	// the profile's default (signerd caps it by the profile and its policy).
	CredentialTTL yamlx.Duration `yaml:"credential_ttl"`
	// BrokerGone is how long the connection may stay down before deliveryd exits; default
	// DefaultBrokerGone. COTAL_DELIVERY_BROKER_GONE_MS overrides it.
	BrokerGone yamlx.Duration `yaml:"broker_gone"`
	// BrokerGoneBackstop bounds every wait for the broker, an expired credential's included;
	// default 4× BrokerGone. COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS overrides it.
	BrokerGoneBackstop yamlx.Duration `yaml:"broker_gone_backstop"`
	// ShutdownTimeout bounds each wait of a graceful stop for a dropped connection to come back
	// before the lease is released. Default DefaultShutdownTimeout.
	ShutdownTimeout yamlx.Duration `yaml:"shutdown_timeout"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
	// MetricsListen is the Prometheus listener ("host:port", plain HTTP, /metrics only, no
	// authentication); empty (the default) serves no metrics.
	MetricsListen string `yaml:"metrics_listen"`
	// Membership turns on the parts that need signerd to mint deliveryd's membership-rw and $SYS
	// credentials (reference/delivery.md §4). Both are off by default; on, a credential signerd
	// refuses degrades the part with a warning and never stops delivery.
	Membership Membership `yaml:"membership"`
}

// Membership configures the membership feed and live eviction.
type Membership struct {
	// Feed runs the membership feed: a membership-observer connection watching the data
	// account's connections and a membership-rw connection writing cotal_membership_<space>.
	// Without its credentials it degrades to traffic-only, with a warning.
	Feed bool `yaml:"feed"`
	// LiveEviction wires evictPrincipal, principalLiveness and planeConnLiveness of
	// ctl.delivery-admin to per-call membership-observer and connection-evictor connections.
	// Off, or when signerd refuses the observer at start, they refuse ("no executor wired").
	LiveEviction bool `yaml:"live_eviction"`
	// PollInterval is the feed's CONNZ poll period; zero means DefaultMembershipPoll.
	PollInterval yamlx.Duration `yaml:"poll_interval"`
}

// DefaultMembershipPoll is the membership feed's poll period (the CONNECT and DISCONNECT events
// shorten it).
const DefaultMembershipPoll = 5 * time.Second

// Decode reads path strictly (daemon.LoadConfig: bounded, plain YAML, unknown keys refused, no
// secret in the file) without validating the values; service.Start validates.
func Decode(path string) (*Config, error) {
	var c Config
	if err := daemon.LoadConfig(path, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load is Decode followed by Validate.
func Load(path string) (*Config, error) {
	c, err := Decode(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, &daemon.ConfigError{Path: path, Err: err}
	}
	return c, nil
}

// Validate applies defaults and checks every value; it touches the file system only to check
// and scan the state directory.
func (c *Config) Validate() error {
	var missing []string
	if c.Space == "" {
		missing = append(missing, "space")
	}
	if len(c.Brokers) == 0 {
		missing = append(missing, "brokers")
	}
	missing = append(missing, c.Signer.Missing("signer.")...)
	if c.StateDir == "" {
		missing = append(missing, "state_dir")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing required keys: %s", strings.Join(missing, ", "))
	}
	if err := space.ValidateName(c.Space); err != nil {
		return fmt.Errorf("space: %w", err)
	}
	if err := daemon.CheckBrokers(c.Brokers); err != nil {
		return err
	}
	if len(c.Holder) > 200 || strings.ContainsAny(c.Holder, "\r\n\x00") {
		return errors.New("holder: at most 200 characters on one line")
	}
	if c.CredentialTTL < 0 {
		return fmt.Errorf("credential_ttl %v: want zero (profile default) or positive", c.CredentialTTL.D())
	}
	switch {
	case c.BrokerGone == 0:
		c.BrokerGone = yamlx.Duration(DefaultBrokerGone)
	case c.BrokerGone.D() < 100*time.Millisecond || c.BrokerGone.D() > time.Hour:
		return fmt.Errorf("broker_gone %v: want 100ms to 1h", c.BrokerGone.D())
	}
	if c.BrokerGoneBackstop != 0 && c.BrokerGoneBackstop < c.BrokerGone {
		return fmt.Errorf("broker_gone_backstop %v is shorter than broker_gone %v", c.BrokerGoneBackstop.D(), c.BrokerGone.D())
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = yamlx.Duration(DefaultShutdownTimeout)
	}
	switch p := c.Membership.PollInterval.D(); {
	case p == 0:
		c.Membership.PollInterval = yamlx.Duration(DefaultMembershipPoll)
	case p < 100*time.Millisecond || p > 10*time.Minute:
		return fmt.Errorf("membership.poll_interval %v: want 100ms to 10m", p)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return fmt.Errorf("metrics_listen %q: %w", c.MetricsListen, err)
		}
	}
	if err := daemon.CheckLogLevel(c.LogLevel); err != nil {
		return err
	}
	abs, err := daemon.CheckStateDir(c.StateDir)
	if abs != "" {
		c.StateDir = abs
	}
	return err
}
