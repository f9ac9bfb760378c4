package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
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
	// Agents is the uid range agents run in: each launched agent gets a uid of its own from it,
	// and the gid of the same number, for its life, with no supplementary group; the uid is
	// released only once the agent's whole cgroup is proven empty. Required. The range must lie at
	// or above MinAgentUID (the system users' uids lie below it), hold neither manager.uid nor
	// manager.gid, nor 65534/65535 (nobody and the 16-bit -1); Start also refuses a range that
	// holds the launcher's own uid or any uid or gid /etc/passwd or /etc/group names.
	Agents UIDRange `yaml:"agents"`
	// CgroupParent is the cgroup v2 directory under which the launcher makes one cgroup per agent,
	// cotal-agent-<uid>. Optional; default: the launcher's own cgroup (under systemd, the unit's
	// delegated subtree, Delegate=yes). Start refuses to run without a writable cgroup v2 there:
	// there is no fallback to process groups, whose members can leave them.
	CgroupParent string `yaml:"cgroup_parent"`
	// AgentRoot holds one directory per agent, <agent_root>/<name>, 0750, owned by the agent's
	// uid and the manager's group while it runs and by the launcher's uid once it is gone.
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

// UIDRange is the agents' uid range: UIDFirst to UIDFirst+UIDCount-1. The gid of each agent is
// the same number as its uid.
type UIDRange struct {
	UIDFirst *uint32 `yaml:"uid_first"`
	UIDCount uint32  `yaml:"uid_count"`
}

// Last is the range's last uid. The range must have been validated.
func (r UIDRange) Last() uint32 { return *r.UIDFirst + r.UIDCount - 1 }

// Contains reports whether id lies in the validated range.
func (r UIDRange) Contains(id uint32) bool { return id >= *r.UIDFirst && id <= r.Last() }

// MinAgentUID is the lowest uid an agent may run as. uids below 1000 are the system users' in
// every mainstream distribution (shadow-utils' SYS_UID_MAX default is 999); a fixed floor is used
// rather than /etc/login.defs because that file is optional (containers, minimal images) and
// editable, and an agent must never share a uid with a service whatever the file says. Start
// also refuses any uid of the range that /etc/passwd names.
const MinAgentUID = 1000

// MaxAgentUIDs bounds agents.uid_count.
const MaxAgentUIDs = 65536

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
// connectors as uids of the agents' range, naming the key.
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
	if err := c.Agents.validate(*c.Manager.UID, *c.Manager.GID); err != nil {
		return err
	}
	if c.CgroupParent != "" {
		if err := abs("cgroup_parent", c.CgroupParent); err != nil {
			return err
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

// validate refuses a range that is missing, reaches below MinAgentUID or past 2^31-1, holds
// nobody (65534) or 65535, or holds the manager's uid or gid (an agent must never act as managerd,
// nor be in the group that reaches the launcher's socket and the agents' directories).
func (r UIDRange) validate(mgrUID, mgrGID uint32) error {
	if r.UIDFirst == nil || r.UIDCount == 0 {
		return errors.New("agents: uid_first and uid_count are required (each agent runs as a uid of its own from the range)")
	}
	if r.UIDCount > MaxAgentUIDs {
		return fmt.Errorf("agents.uid_count: %d is over %d", r.UIDCount, MaxAgentUIDs)
	}
	first := uint64(*r.UIDFirst)
	last := first + uint64(r.UIDCount) - 1
	switch {
	case first < MinAgentUID:
		return fmt.Errorf("agents.uid_first: %d is below %d: uids below it are system users'", first, MinAgentUID)
	case last > 1<<31-1:
		return fmt.Errorf("agents: the range %d-%d reaches past 2147483647", first, last)
	case first <= 65535 && last >= 65534:
		return fmt.Errorf("agents: the range %d-%d holds 65534 (nobody) or 65535 (the 16-bit -1)", first, last)
	case uint64(mgrUID) >= first && uint64(mgrUID) <= last:
		return fmt.Errorf("agents: the range %d-%d holds manager.uid %d (an agent must not be able to act as managerd)", first, last, mgrUID)
	case uint64(mgrGID) >= first && uint64(mgrGID) <= last:
		return fmt.Errorf("agents: the range %d-%d holds manager.gid %d (an agent's gid is its uid, and the manager group reaches the socket)", first, last, mgrGID)
	}
	return nil
}

// checkRangeFree refuses a range that holds a uid the passwd file names or a gid the group file
// names (a human's, a service's): an agent would own that user's files. A missing file names
// nothing. Users from other NSS sources (LDAP, systemd-homed) are not seen: choose a range
// outside theirs.
func checkRangeFree(r UIDRange, passwd, group string) error {
	for _, f := range []struct{ path, what string }{{passwd, "uid"}, {group, "gid"}} {
		data, err := os.ReadFile(f.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("launcher: agents: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Split(line, ":")
			if len(fields) < 3 || strings.HasPrefix(line, "#") {
				continue
			}
			id, err := strconv.ParseUint(fields[2], 10, 32)
			if err != nil || !r.Contains(uint32(id)) {
				continue
			}
			return fmt.Errorf("launcher: agents: the range %d-%d holds %s %d of %q in %s: an agent must not run as an existing user or group",
				*r.UIDFirst, r.Last(), f.what, id, fields[0], f.path)
		}
	}
	return nil
}
