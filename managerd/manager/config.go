package manager

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// Defaults.
const (
	DefaultCapacity        = 16
	DefaultLiveWindow      = 30 * time.Second
	DefaultStopGrace       = 3 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultRenewRetry is the wait after a failed agent renewal.
	DefaultRenewRetry = 30 * time.Second
	// MaxNameLen bounds an agent name (it is also the actor token).
	MaxNameLen = 64
)

// nameRE is upstream's agent-name grammar: one path segment, no dot.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Config is `managerd serve --config FILE`.
type Config struct {
	// Space is the space this manager serves. Required.
	Space string `yaml:"space"`
	// Brokers are the broker URLs (nats:// or tls://). Required.
	Brokers []string `yaml:"brokers"`
	// Authority is where the manager's own supervisor credential comes from: AuthoritySigner
	// ("signer", the default) mints it from signerd with the certificate in Signer;
	// AuthorityRemote ("remote") is a remote managerd with no signerd certificate and no seed:
	// authd's manager-service authority at AuthorityURL prepares, activates and renews it
	// (remote.go), authenticated by the IdP token in IdPTokenFile.
	Authority string `yaml:"authority"`
	// AuthorityURL is authd's base URL serving POST /manager-service-authority (its public_url,
	// or its loopback face): https, or http to a loopback host. Required with authority: remote,
	// refused otherwise.
	AuthorityURL string `yaml:"authority_url"`
	// IdPTokenFile holds the IdP token (the human proof of the owner) the remote authority
	// requires: an absolute path to a regular file of this uid, mode 0600, re-read at every call
	// (a refreshed token is picked up without a restart). Required with authority: remote,
	// refused otherwise.
	IdPTokenFile string `yaml:"idp_token_file"`
	// Signer is how to reach signerd with managerd's client certificate
	// (spiffe://<td>/managerd/<space token>). Required with authority: signer; refused with
	// authority: remote.
	Signer signerclient.FileConfig `yaml:"signer"`
	// StateDir holds the custody records of the agents this instance started (custody.go: what a
	// successor needs to reap them); 0700, created if missing. Required.
	StateDir string `yaml:"state_dir"`
	// InstanceID names this manager instance (UID grammar, [a-z0-9]{26,32}); its lease key is
	// lease.<instance_id> in cotal_manager_<space>. Required with authority: signer. With
	// authority: remote it is optional: the instance id is the remote identity's in StateDir
	// (generated at the first start when empty; a configured one must match it).
	InstanceID string `yaml:"instance_id"`
	// Root is the workspace root this instance serves, an absolute path. Required.
	Root string `yaml:"root"`
	// Owner and Actor are the manager's own principal (its supervisor credential). Required.
	// With authority: remote, Owner must be the owner authd derives from the IdP token and Actor
	// is the interactive ledger actor (holding supervise) that authenticates the requests; the
	// credential's principal is <owner>.manager_<instance id> and the lease's holder
	// <owner>.manager_serve_<instance id>.
	Owner string `yaml:"owner"`
	Actor string `yaml:"actor"`
	// AgentOwner is the owner token agents are spawned under; default Owner.
	AgentOwner string `yaml:"agent_owner"`
	// Launcher is the uid-dropping launcher's socket and the capability token file it writes.
	Launcher LauncherConfig `yaml:"launcher"`
	// API is the ManagerService socket and the peer uids it admits.
	API APIConfig `yaml:"api"`
	// Connectors are the connector names Spawn admits; each must be in the launcher's table.
	Connectors []string `yaml:"connectors"`
	// EnvAllow are the environment variables a Spawn may set (the launcher checks them again).
	EnvAllow []string `yaml:"env_allow"`
	// Capacity is the most agents held at once, spawns in progress included; default 16.
	Capacity int `yaml:"capacity"`
	// AgentTTL is the lifetime asked of signerd for each agent credential; zero means the
	// profile's default.
	AgentTTL yamlx.Duration `yaml:"agent_ttl"`
	// CredentialTTL is the lifetime asked for managerd's own supervisor credential (signer mode
	// only: the remote authority decides it).
	CredentialTTL yamlx.Duration `yaml:"credential_ttl"`
	// RenewRetry is the wait after a failed agent renewal; default 30s.
	RenewRetry yamlx.Duration `yaml:"renew_retry"`
	// LiveWindow is how recent an agent's liveness probe must be for it to count as online;
	// default 30s.
	LiveWindow yamlx.Duration `yaml:"live_window"`
	// StopGrace is the wait between SIGTERM and SIGKILL; default 3s.
	StopGrace yamlx.Duration `yaml:"stop_grace"`
	// ShutdownTimeout bounds a Shutdown; default 30s.
	ShutdownTimeout yamlx.Duration `yaml:"shutdown_timeout"`
	// SignerSeedPaths are the signer's key files or directories on this machine. managerd
	// refuses to start if it can open any seed under them (its uid must not be able to read a
	// signing key), unless started with the development flag.
	SignerSeedPaths []string `yaml:"signer_seed_paths"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
}

// Authority modes.
const (
	AuthoritySigner = "signer"
	AuthorityRemote = "remote"
)

// Remote reports whether c is a remote managerd (authority: remote).
func (c *Config) Remote() bool { return c.Authority == AuthorityRemote }

// LauncherConfig locates the launcher.
type LauncherConfig struct {
	Socket    string `yaml:"socket"`
	TokenFile string `yaml:"token_file"`
}

// APIConfig is the ManagerService socket.
type APIConfig struct {
	// Socket is the Unix socket path; its directory is made 0750 if missing.
	Socket string `yaml:"socket"`
	// AllowUIDs are the peer uids admitted (SO_PEERCRED). Required, at least one.
	AllowUIDs []uint32 `yaml:"allow_uids"`
}

// LoadConfig reads and validates path (strict YAML: an unknown key stops start-up, naming it).
func LoadConfig(path string) (*Config, error) {
	var c Config
	if err := daemon.LoadConfig(path, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, &daemon.ConfigError{Path: path, Err: err}
	}
	return &c, nil
}

// Validate applies defaults and checks every value.
func (c *Config) Validate() error {
	switch c.Authority {
	case "":
		c.Authority = AuthoritySigner
	case AuthoritySigner, AuthorityRemote:
	default:
		return fmt.Errorf("authority %q: want %s (the default) or %s", c.Authority, AuthoritySigner, AuthorityRemote)
	}
	var missing []string
	if !c.Remote() && c.InstanceID == "" {
		missing = append(missing, "instance_id")
	}
	for _, k := range []struct{ name, v string }{
		{"space", c.Space}, {"state_dir", c.StateDir}, {"root", c.Root},
		{"owner", c.Owner}, {"actor", c.Actor}, {"launcher.socket", c.Launcher.Socket},
		{"launcher.token_file", c.Launcher.TokenFile}, {"api.socket", c.API.Socket},
	} {
		if k.v == "" {
			missing = append(missing, k.name)
		}
	}
	if len(c.Brokers) == 0 {
		missing = append(missing, "brokers")
	}
	if len(c.API.AllowUIDs) == 0 {
		missing = append(missing, "api.allow_uids")
	}
	if len(c.Connectors) == 0 {
		missing = append(missing, "connectors")
	}
	if c.Remote() {
		if !reflect.ValueOf(c.Signer).IsZero() {
			return errors.New("signer: a remote managerd (authority: remote) has no signerd certificate; remove the signer section")
		}
		if c.CredentialTTL != 0 {
			return errors.New("credential_ttl: with authority: remote the authority decides the credential's lifetime; remove it")
		}
		for _, k := range []struct{ name, v string }{{"authority_url", c.AuthorityURL}, {"idp_token_file", c.IdPTokenFile}} {
			if k.v == "" {
				missing = append(missing, k.name)
			}
		}
	} else {
		if c.AuthorityURL != "" || c.IdPTokenFile != "" {
			return errors.New("authority_url and idp_token_file are for authority: remote; a signer-mode managerd takes neither")
		}
		missing = append(missing, c.Signer.Missing("signer.")...)
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing required keys: %s", strings.Join(missing, ", "))
	}
	if c.Remote() {
		if err := CheckAuthorityURL(c.AuthorityURL); err != nil {
			return fmt.Errorf("authority_url: %w", err)
		}
		if !filepath.IsAbs(c.IdPTokenFile) {
			return fmt.Errorf("idp_token_file %q: want an absolute path", c.IdPTokenFile)
		}
		if err := creds.CheckSecretDir(filepath.Dir(c.IdPTokenFile)); err != nil {
			return fmt.Errorf("idp_token_file: %w (want its directory this uid's, mode 0700)", err)
		}
		if err := creds.CheckSecretFile(c.IdPTokenFile); err != nil {
			return fmt.Errorf("idp_token_file: %w (want a regular file of this uid, mode 0600)", err)
		}
	}
	if err := space.ValidateName(c.Space); err != nil {
		return fmt.Errorf("space: %w", err)
	}
	if err := daemon.CheckBrokers(c.Brokers); err != nil {
		return err
	}
	if c.InstanceID != "" {
		if err := space.ValidateUID(c.InstanceID); err != nil {
			return fmt.Errorf("instance_id: %w", err)
		}
	}
	if c.AgentOwner == "" {
		c.AgentOwner = c.Owner
	}
	for _, k := range []struct{ name, v string }{{"owner", c.Owner}, {"agent_owner", c.AgentOwner}} {
		if err := space.ValidateOwner(k.v); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	if err := space.ValidateActor(c.Actor); err != nil {
		return fmt.Errorf("actor: %w", err)
	}
	for _, p := range []struct{ name, v string }{{"root", c.Root}, {"launcher.socket", c.Launcher.Socket},
		{"launcher.token_file", c.Launcher.TokenFile}, {"api.socket", c.API.Socket}} {
		if !filepath.IsAbs(p.v) {
			return fmt.Errorf("%s %q: want an absolute path", p.name, p.v)
		}
	}
	for _, p := range c.SignerSeedPaths {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("signer_seed_paths: %q is not an absolute path", p)
		}
	}
	seen := map[string]bool{}
	for _, n := range c.Connectors {
		if !nameRE.MatchString(n) || len(n) > MaxNameLen {
			return fmt.Errorf("connectors: %q is not a connector name (^[A-Za-z0-9_-]+$)", n)
		}
		if seen[n] {
			return fmt.Errorf("connectors: %q listed twice", n)
		}
		seen[n] = true
	}
	for _, k := range c.EnvAllow {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("env_allow: %q is not a variable name", k)
		}
	}
	switch {
	case c.Capacity == 0:
		c.Capacity = DefaultCapacity
	case c.Capacity < 0 || c.Capacity > 4096:
		return fmt.Errorf("capacity %d: want 1 to 4096", c.Capacity)
	}
	for _, d := range []struct {
		name string
		v    *yamlx.Duration
		def  time.Duration
	}{
		{"renew_retry", &c.RenewRetry, DefaultRenewRetry}, {"live_window", &c.LiveWindow, DefaultLiveWindow},
		{"stop_grace", &c.StopGrace, DefaultStopGrace}, {"shutdown_timeout", &c.ShutdownTimeout, DefaultShutdownTimeout},
	} {
		switch {
		case *d.v == 0:
			*d.v = yamlx.Duration(d.def)
		case *d.v < 0 || d.v.D() > 24*time.Hour:
			return fmt.Errorf("%s %v: want a positive duration up to 24h", d.name, d.v.D())
		}
	}
	if c.AgentTTL < 0 || c.CredentialTTL < 0 {
		return errors.New("agent_ttl and credential_ttl: want zero (profile default) or positive")
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

func (c *Config) hasConnector(name string) bool { return slices.Contains(c.Connectors, name) }

func (c *Config) envAllowed(k string) bool { return slices.Contains(c.EnvAllow, k) }
