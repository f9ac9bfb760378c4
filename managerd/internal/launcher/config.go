package launcher

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/cotalgo/cotal/pkg/daemon"
)

// Config is the launcher's configuration (`managerd launcher --config FILE`). Every field that
// decides who may ask and what runs is here, on the launcher's side: a request names an agent and
// a connector, never a uid, a command or a path.
//
// The launcher changes owners and modes as root in the socket's, the token file's and the agent
// root's directories, so the directory holding each must exist and it, and every directory above
// it, must be owned by root or the launcher's uid and writable by no one else (or sticky, as
// /tmp); Start refuses otherwise, naming the directory.
type Config struct {
	// Socket is the Unix socket the launcher listens on. Required, absolute. Its directory is made
	// (or reset to) 0750 owned by the launcher's uid and Manager.GID; the socket is 0660.
	Socket string `yaml:"socket"`
	// TokenFile is where the launcher writes a fresh capability token at every start. Required,
	// absolute. The file is 0600 and its directory 0700, both owned by Manager.UID:Manager.GID, so
	// managerd alone can read it.
	TokenFile string `yaml:"token_file"`
	// Manager is managerd's uid and gid: the only peer uid admitted (SO_PEERCRED), and the group of
	// the socket and of every agent directory. Required; uid 0 is refused.
	Manager IDs `yaml:"manager"`
	// Agent is the one uid and gid every agent runs as. Required; 0, and the manager's uid or gid,
	// are refused. A request naming any other uid or gid is refused.
	Agent AgentIDs `yaml:"agent"`
	// AgentRoot holds one directory per agent, <agent_root>/<name>, 0750 owned agent:manager.
	// Required, absolute. Made 0755 if missing; refused if a group or other may write it, or if it
	// is owned by another uid than the launcher's.
	AgentRoot string `yaml:"agent_root"`
	// Connectors is the table of agent programs a request may name: name → argv. The argv is used
	// as written (argv[0] absolute); a request carries no command.
	Connectors map[string]Connector `yaml:"connectors"`
	// EnvAllow names the environment variables a request may set for the agent. Optional; the
	// launcher's own environment is never passed on. PATH, HOME, COTAL_LAUNCH_MATERIAL and LD_*
	// are the launcher's and are refused here.
	EnvAllow []string `yaml:"env_allow"`
	// Path is the agent's PATH. Optional; default DefaultPath.
	Path string `yaml:"path"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`
}

// IDs is a uid and a gid.
type IDs struct {
	UID *uint32 `yaml:"uid"`
	GID *uint32 `yaml:"gid"`
}

// AgentIDs is the agent's uid and gid and its supplementary groups (none by default: the
// launcher calls setgroups with exactly this list).
type AgentIDs struct {
	UID    *uint32  `yaml:"uid"`
	GID    *uint32  `yaml:"gid"`
	Groups []uint32 `yaml:"groups"`
}

// Connector is one agent program.
type Connector struct {
	// Argv is the program and its arguments. Required; argv[0] is an absolute, clean path.
	Argv []string `yaml:"argv"`
}

// DefaultPath is the agent's PATH when the configuration sets none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// Limits on configuration values.
const (
	maxConnectors = 64
	maxEnvAllow   = 64
	maxArgv       = 64
	maxArgBytes   = 4096
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// reservedEnv are the variables the launcher sets itself; a request can never set them.
var reservedEnv = map[string]bool{"PATH": true, "HOME": true, EnvLaunchMaterial: true}

func envReserved(k string) bool { return reservedEnv[k] || strings.HasPrefix(k, "LD_") }

// LoadConfig reads and validates the launcher's configuration strictly (pkg/daemon.LoadConfig: an
// unknown key stops start-up naming it).
func LoadConfig(path string) (Config, error) {
	var c Config
	if err := daemon.LoadConfig(path, &c); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, &daemon.ConfigError{Path: path, Err: err}
	}
	return c, nil
}

// Validate refuses a configuration that would let the launcher start anything but the configured
// agent uid's connectors, naming the key.
func (c *Config) Validate() error {
	abs := func(key, p string) error {
		if p == "" {
			return fmt.Errorf("%s is required", key)
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("%s: %q must be an absolute, clean path", key, p)
		}
		return nil
	}
	if err := abs("socket", c.Socket); err != nil {
		return err
	}
	if len(c.Socket) > 100 { // sun_path is 108 bytes with its NUL
		return fmt.Errorf("socket: %q is longer than 100 bytes", c.Socket)
	}
	if err := abs("token_file", c.TokenFile); err != nil {
		return err
	}
	if err := abs("agent_root", c.AgentRoot); err != nil {
		return err
	}
	if c.AgentRoot == "/" {
		return errors.New("agent_root: / is refused")
	}
	if filepath.Dir(c.TokenFile) == filepath.Dir(c.Socket) {
		return errors.New("token_file: must not be in the socket's directory (the token directory is the manager's own, 0700)")
	}
	if c.Manager.UID == nil || c.Manager.GID == nil {
		return errors.New("manager: uid and gid are required")
	}
	if *c.Manager.UID == 0 {
		return errors.New("manager.uid: 0 is refused: managerd must not run as root")
	}
	if *c.Manager.GID == 0 {
		return errors.New("manager.gid: 0 is refused")
	}
	if c.Agent.UID == nil || c.Agent.GID == nil {
		return errors.New("agent: uid and gid are required")
	}
	switch {
	case *c.Agent.UID == 0:
		return errors.New("agent.uid: 0 is refused")
	case *c.Agent.GID == 0:
		return errors.New("agent.gid: 0 is refused")
	case *c.Agent.UID == *c.Manager.UID:
		return errors.New("agent.uid: must differ from manager.uid (the agent must not be able to act as managerd)")
	case *c.Agent.GID == *c.Manager.GID:
		return errors.New("agent.gid: must differ from manager.gid (the manager group reaches the socket)")
	case *c.Agent.UID == ^uint32(0) || *c.Agent.GID == ^uint32(0):
		return errors.New("agent: uid and gid 4294967295 (-1) are refused")
	}
	for _, g := range c.Agent.Groups {
		if g == 0 || g == *c.Manager.GID {
			return fmt.Errorf("agent.groups: group %d is refused (root's group or the manager's)", g)
		}
	}
	if len(c.Connectors) == 0 {
		return errors.New("connectors: at least one is required")
	}
	if len(c.Connectors) > maxConnectors {
		return fmt.Errorf("connectors: more than %d", maxConnectors)
	}
	for _, name := range sortedKeys(c.Connectors) {
		if len(name) > maxNameLen || !nameRE.MatchString(name) {
			return fmt.Errorf("connectors: name %q must match %s (at most %d bytes)", name, nameRE, maxNameLen)
		}
		argv := c.Connectors[name].Argv
		if len(argv) == 0 || len(argv) > maxArgv {
			return fmt.Errorf("connectors.%s.argv: 1 to %d entries", name, maxArgv)
		}
		if err := abs("connectors."+name+".argv[0]", argv[0]); err != nil {
			return err
		}
		for i, a := range argv {
			if len(a) > maxArgBytes || strings.IndexByte(a, 0) >= 0 {
				return fmt.Errorf("connectors.%s.argv[%d]: longer than %d bytes or holds NUL", name, i, maxArgBytes)
			}
		}
	}
	if len(c.EnvAllow) > maxEnvAllow {
		return fmt.Errorf("env_allow: more than %d names", maxEnvAllow)
	}
	for _, k := range c.EnvAllow {
		if !envKeyRE.MatchString(k) || len(k) > maxEnvKey {
			return fmt.Errorf("env_allow: %q is not a variable name", k)
		}
		if envReserved(k) {
			return fmt.Errorf("env_allow: %s is set by the launcher alone", k)
		}
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	for _, p := range strings.Split(c.Path, ":") {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("path: entry %q is not absolute", p)
		}
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
