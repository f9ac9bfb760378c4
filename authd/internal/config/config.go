// Package config is authd's configuration file: strict, plain YAML (pkg/daemon.LoadConfig, so an
// unknown key stops start-up naming it), validated before anything listens or dials.
//
// It refuses: a missing required key (named), a callout budget (callout_opens,
// callout_refusals) with a rate or burst that is not positive or above its bound, a space name pkg/space refuses, a broker URL that
// is not nats:// or tls://, an exchange listener that is not a loopback address, a public face
// that is half configured (public_url, public_server or public_trust_forwarded_for without
// public_listen, public_listen without public_url) or whose listener is not a loopback address,
// whose URL is not https or whose advertised server is not a broker URL, a callout seed
// file looser than 0600 or its directory looser than 0700, or either owned by another uid (as
// signerd checks its seeds), and a
// configuration file or state directory holding an operator, account or curve seed or a private
// JWK, naming the file: authd holds no signing key, so finding one next to it means signing
// material has leaked out of signerd.
package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// Defaults.
const (
	// DefaultListen is the exchange listener: loopback, a port chosen by the kernel (the
	// discovery file says which).
	DefaultListen = "127.0.0.1:0"
	// DefaultShutdownTimeout bounds a graceful stop.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultMaxInFlight bounds callout requests served at once.
	DefaultMaxInFlight = 64
	// DefaultPlaneTTL is the plane claim's lifetime without renewal.
	DefaultPlaneTTL = 30 * time.Second
)

// Config is `authd serve --config FILE`.
type Config struct {
	// Space is the space this authd serves. Required.
	Space string `yaml:"space"`
	// Brokers are the broker URLs (nats:// or tls://). Required, at least one.
	Brokers []string `yaml:"brokers"`
	// Signer is how to reach signerd. Required.
	Signer Signer `yaml:"signer"`
	// CalloutSeed is authd's callout-service user seed file (written by `signerd init` as
	// DIR/authd/space.<hex>/callout.nk): 0600, owned by authd's uid. Required.
	CalloutSeed string `yaml:"callout_seed"`
	// StateDir holds the ledger (actors/, managed-actors/), idp.json and the discovery and
	// refusal files. 0700; created if missing. Required.
	StateDir string `yaml:"state_dir"`
	// Listen is the exchange listener, a loopback host:port. Default DefaultListen.
	Listen string `yaml:"listen"`
	// PublicListen, if set, is the public face's listener (auth.md §4), a loopback host:port: the
	// face sits behind a TLS-terminating reverse proxy, which is its only direct peer. Unset,
	// authd has no public face.
	PublicListen string `yaml:"public_listen"`
	// PublicURL is the https URL the proxy publishes the public face at, a tenant path allowed
	// (no trailing slash kept). Required with public_listen, refused without it.
	PublicURL string `yaml:"public_url"`
	// PublicServer is the broker URL the public face's discovery bundle advertises (nats://,
	// tls://, ws:// or wss://): what participants dial through the proxy. Only with
	// public_listen; default the first of brokers.
	PublicServer string `yaml:"public_server"`
	// PublicTrustForwardedFor makes the public face key its per-peer limits by the last
	// X-Forwarded-For hop instead of the socket's address. Set it only when the proxy is the one
	// way to public_listen and appends that hop; default false (the header is ignored). Only
	// with public_listen.
	PublicTrustForwardedFor bool `yaml:"public_trust_forwarded_for"`
	// AllowedServers, if set, are the only broker server ids whose callout requests authd
	// answers.
	AllowedServers []string `yaml:"allowed_servers"`
	// MaxInFlight bounds callout requests served at once. Default DefaultMaxInFlight.
	MaxInFlight int `yaml:"max_in_flight"`
	// CalloutOpens bounds the callout requests authd hands to signerd to open, per second with a
	// burst; past it a request gets no reply and the broker refuses the client at its callout
	// timeout. Default callout.DefaultOpenRate (100/s, burst 200).
	CalloutOpens Rate `yaml:"callout_opens"`
	// CalloutRefusals bounds the refusals authd asks signerd to sign; past it a refused connect
	// gets no reply. Default callout.DefaultRefusalRate (20/s, burst 40).
	CalloutRefusals Rate `yaml:"callout_refusals"`
	// PlaneTTL is how long the plane claim outlives a crashed authd. Default DefaultPlaneTTL.
	PlaneTTL yamlx.Duration `yaml:"plane_ttl"`
	// InstanceID, if set, pins this authd's instance identity (32 lowercase hex digits): the
	// first start writes it to instance.json in the state directory, and a start whose
	// instance.json holds another id is refused, both left as they are. Unset, the id is the one
	// instance.json holds, made at random on the first start.
	InstanceID string `yaml:"instance_id"`
	// ShutdownTimeout bounds a graceful stop. Default DefaultShutdownTimeout.
	ShutdownTimeout yamlx.Duration `yaml:"shutdown_timeout"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
	// ServiceEndpoints turns on GET and POST /service-endpoint-authority (seed 002) on authd's
	// faces (authd/internal/sepdoor). Default off: the route answers 404.
	ServiceEndpoints bool `yaml:"service_endpoints"`
}

// Rate is a token bucket: per_second tokens a second, up to burst. Both keys are required once
// the block is given.
type Rate struct {
	PerSecond float64 `yaml:"per_second"`
	Burst     int     `yaml:"burst"`
}

// Bounds of a Rate: beyond them a budget no longer bounds what two cores can do.
const (
	MaxRatePerSecond = 100000
	MaxRateBurst     = 1000000
)

// Callout is r as the responder takes it.
func (r Rate) Callout() callout.Rate { return callout.Rate{PerSecond: r.PerSecond, Burst: r.Burst} }

// check applies def to an absent block and refuses a rate or burst out of bounds, naming key.
func (r *Rate) check(key string, def callout.Rate) error {
	if *r == (Rate{}) {
		*r = Rate{PerSecond: def.PerSecond, Burst: def.Burst}
		return nil
	}
	if !(r.PerSecond > 0 && r.PerSecond <= MaxRatePerSecond) {
		return fmt.Errorf("%s.per_second %v: want more than 0, at most %d", key, r.PerSecond, MaxRatePerSecond)
	}
	if r.Burst < 1 || r.Burst > MaxRateBurst {
		return fmt.Errorf("%s.burst %d: want 1 to %d", key, r.Burst, MaxRateBurst)
	}
	return nil
}

// checkPublic checks the public face's keys: all or none, public_listen loopback, public_url
// https, public_server a broker URL (defaulted to the first broker). The URL is normalized.
func (c *Config) checkPublic() error {
	if c.PublicListen == "" {
		switch {
		case c.PublicURL != "":
			return errors.New("public_url: set without public_listen")
		case c.PublicServer != "":
			return errors.New("public_server: set without public_listen")
		case c.PublicTrustForwardedFor:
			return errors.New("public_trust_forwarded_for: set without public_listen")
		}
		return nil
	}
	if err := exchange.CheckLoopback(c.PublicListen); err != nil {
		return fmt.Errorf("public_listen: %w (the public face binds loopback behind a TLS proxy)", err)
	}
	if c.PublicURL == "" {
		return errors.New("public_url: required with public_listen")
	}
	u, err := exchange.CheckPublicURL(c.PublicURL)
	if err != nil {
		return fmt.Errorf("public_url: %w", err)
	}
	c.PublicURL = u
	if c.PublicServer == "" {
		c.PublicServer = c.Brokers[0]
	}
	if err := exchange.CheckAdvertisedServer(c.PublicServer); err != nil {
		return fmt.Errorf("public_server: %w", err)
	}
	return nil
}

// Signer names signerd's address and authd's client certificate (URI SAN
// spiffe://<td>/authd/<space>): the `signer:` block every daemon shares.
type Signer = signerclient.FileConfig

// Decode reads path strictly (daemon.LoadConfig: bounded, plain YAML, unknown keys refused, no
// secret in the file) without validating the values: `authd serve` hands the result to
// service.Start, which validates it and, once the state directory is known, records a refusal
// in auth-service-refusal.json.
func Decode(path string) (*Config, error) {
	var c Config
	if err := daemon.LoadConfig(path, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load is Decode followed by Validate, for commands that use the configuration without starting
// authd. It refuses everything the package doc lists.
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
// the callout seed file and to scan the state directory for secrets.
func (c *Config) Validate() error {
	var missing []string
	if c.Space == "" {
		missing = append(missing, "space")
	}
	missing = append(missing, c.Signer.Missing("signer.")...)
	for _, f := range []struct{ name, v string }{{"callout_seed", c.CalloutSeed}, {"state_dir", c.StateDir}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(c.Brokers) == 0 {
		missing = append(missing, "brokers")
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
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if err := exchange.CheckLoopback(c.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := c.checkPublic(); err != nil {
		return err
	}
	for _, id := range c.AllowedServers {
		if !nkeys.IsValidPublicServerKey(id) {
			return fmt.Errorf("allowed_servers: %q is not a server public key (N…)", id)
		}
	}
	switch {
	case c.MaxInFlight == 0:
		c.MaxInFlight = DefaultMaxInFlight
	case c.MaxInFlight < 1 || c.MaxInFlight > 4096:
		return fmt.Errorf("max_in_flight %d: want 1 to 4096", c.MaxInFlight)
	}
	if err := c.CalloutOpens.check("callout_opens", callout.DefaultOpenRate); err != nil {
		return err
	}
	if err := c.CalloutRefusals.check("callout_refusals", callout.DefaultRefusalRate); err != nil {
		return err
	}
	switch {
	case c.PlaneTTL == 0:
		c.PlaneTTL = yamlx.Duration(DefaultPlaneTTL)
	case c.PlaneTTL.D() < 2*time.Second || c.PlaneTTL.D() > 10*time.Minute:
		return fmt.Errorf("plane_ttl %v: want 2s to 10m", c.PlaneTTL.D())
	}
	if c.InstanceID != "" {
		if err := CheckInstanceID(c.InstanceID); err != nil {
			return fmt.Errorf("instance_id: %w", err)
		}
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = yamlx.Duration(DefaultShutdownTimeout)
	}
	if err := daemon.CheckLogLevel(c.LogLevel); err != nil {
		return err
	}
	if err := creds.CheckSecretFile(c.CalloutSeed); err != nil {
		return fmt.Errorf("callout_seed: %w", err)
	}
	if err := creds.CheckSecretDir(filepath.Dir(c.CalloutSeed)); err != nil {
		return fmt.Errorf("callout_seed: %w", err)
	}
	abs, err := daemon.CheckStateDir(c.StateDir)
	if abs != "" {
		c.StateDir = abs
	}
	return err
}
