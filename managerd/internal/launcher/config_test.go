package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/daemon"
)

// validYAML is a configuration every refusal case below breaks in one place.
const validYAML = `socket: /run/cotal/launcher/launcher.sock
token_file: /run/cotal/managerd/launcher.token
manager: {uid: 990, gid: 990}
agents: {uid_first: 60600, uid_count: 512}
agent_root: /var/lib/cotal/agents
connectors:
  echo: {argv: [/usr/bin/echo, hi]}
env_allow: [TERM, LANG]
`

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "launcher.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadConfig: a valid file loads with PATH defaulted; each broken key is refused with a
// *daemon.ConfigError whose message names the key (or the unknown key and its line).
func TestLoadConfig(t *testing.T) {
	cfg, err := LoadConfig(writeConfig(t, validYAML))
	if err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if cfg.Path != DefaultPath || *cfg.Agents.UIDFirst != 60600 || cfg.Agents.Last() != 61111 || *cfg.Manager.UID != 990 || cfg.Connectors["echo"].Argv[1] != "hi" {
		t.Fatalf("decoded %+v", cfg)
	}
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"fail/unknown-key", "agent_root:", "agent_rot: /x\nagent_root:", "agent_rot"},
		{"fail/anchor", "manager: {uid: 990, gid: 990}", "manager: &m {uid: 990, gid: 990}", "anchor"},
		{"fail/no-socket", "socket: /run/cotal/launcher/launcher.sock\n", "", "socket is required"},
		{"fail/relative-socket", "socket: /run/cotal/launcher/launcher.sock", "socket: run/launcher.sock", "socket"},
		{"fail/unclean-root", "agent_root: /var/lib/cotal/agents", "agent_root: /var/lib/../cotal/agents", "agent_root"},
		{"fail/root-is-slash", "agent_root: /var/lib/cotal/agents", "agent_root: /", "agent_root: / is refused"},
		{"fail/long-socket", "socket: /run/cotal/launcher/launcher.sock", "socket: /" + strings.Repeat("s", 120), "longer than 100"},
		{"fail/token-beside-socket", "token_file: /run/cotal/managerd/launcher.token", "token_file: /run/cotal/launcher/token", "token_file"},
		{"fail/manager-root", "manager: {uid: 990, gid: 990}", "manager: {uid: 0, gid: 990}", "manager.uid: 0 is refused"},
		{"fail/manager-missing-gid", "manager: {uid: 990, gid: 990}", "manager: {uid: 990}", "manager: uid and gid are required"},
		{"fail/agents-missing", "agents: {uid_first: 60600, uid_count: 512}", "", "agents: uid_first and uid_count are required"},
		{"fail/agents-no-count", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 60600}", "agents: uid_first and uid_count are required"},
		{"fail/agents-root", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 0, uid_count: 10}", "below 1000"},
		{"fail/agents-system", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 999, uid_count: 10}", "agents.uid_first: 999 is below 1000"},
		{"fail/agents-holds-manager-uid", "manager: {uid: 990, gid: 990}", "manager: {uid: 60700, gid: 990}", "holds manager.uid 60700"},
		{"fail/agents-holds-manager-gid", "manager: {uid: 990, gid: 990}", "manager: {uid: 990, gid: 61111}", "holds manager.gid 61111"},
		{"fail/agents-nobody", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 65000, uid_count: 600}", "65534 (nobody)"},
		{"fail/agents-too-many", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 100000, uid_count: 65537}", "uid_count: 65537 is over 65536"},
		{"fail/agents-past-int32", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: 2147483600, uid_count: 100}", "reaches past 2147483647"},
		{"fail/agents-negative", "agents: {uid_first: 60600, uid_count: 512}", "agents: {uid_first: -1, uid_count: 10}", "uint32"},
		{"fail/agents-old-single-uid", "agents: {uid_first: 60600, uid_count: 512}", "agent: {uid: 991, gid: 991}", "agent"},
		{"fail/cgroup-parent-relative", "agent_root:", "cgroup_parent: sys/fs/cgroup\nagent_root:", "cgroup_parent"},
		{"fail/no-connectors", "connectors:\n  echo: {argv: [/usr/bin/echo, hi]}\n", "", "connectors: at least one"},
		{"fail/connector-name", "  echo: {argv", "  ../echo: {argv", "connectors: name"},
		{"fail/connector-relative", "[/usr/bin/echo, hi]", "[echo, hi]", "connectors.echo.argv[0]"},
		{"fail/connector-empty", "[/usr/bin/echo, hi]", "[]", "connectors.echo.argv: 1 to"},
		{"fail/env-path", "env_allow: [TERM, LANG]", "env_allow: [TERM, PATH]", "env_allow: PATH"},
		{"fail/env-material", "env_allow: [TERM, LANG]", "env_allow: [COTAL_LAUNCH_MATERIAL]", "env_allow: COTAL_LAUNCH_MATERIAL"},
		{"fail/env-ld", "env_allow: [TERM, LANG]", "env_allow: [LD_PRELOAD]", "env_allow: LD_PRELOAD"},
		{"fail/env-name", "env_allow: [TERM, LANG]", "env_allow: [\"A=B\"]", "not a variable name"},
		{"fail/path-relative", "env_allow: [TERM, LANG]", "path: bin:/usr/bin", "path: entry"},
		{"fail/log-level", "env_allow: [TERM, LANG]", "log_level: loud", "log_level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Replace(validYAML, tc.from, tc.to, 1)
			if body == validYAML {
				t.Fatalf("case does not change the config (%q not found)", tc.from)
			}
			_, err := LoadConfig(writeConfig(t, body))
			var ce *daemon.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a *daemon.ConfigError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %q does not name %q", err, tc.want)
			}
		})
	}
}

// TestCheckRangeFree: a range that holds a uid /etc/passwd names, or a gid /etc/group names, is
// refused naming the entry; one clear of both (or with the files missing) is not.
func TestCheckRangeFree(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\n# a comment\nalice:x:1500:1500::/home/alice:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(group, []byte("root:x:0:\nstaff:x:2500:alice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	u := func(v uint32) *uint32 { return &v }
	for _, tc := range []struct {
		name   string
		r      UIDRange
		passwd string
		want   string
	}{
		{"ok/clear", UIDRange{UIDFirst: u(1600), UIDCount: 100}, passwd, ""},
		{"ok/files-missing", UIDRange{UIDFirst: u(1000), UIDCount: 2000}, filepath.Join(dir, "none"), ""},
		{"fail/holds-a-user", UIDRange{UIDFirst: u(1000), UIDCount: 501}, passwd, `uid 1500 of "alice"`},
		{"fail/holds-a-group", UIDRange{UIDFirst: u(2000), UIDCount: 600}, passwd, `gid 2500 of "staff"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := group
			if tc.name == "ok/files-missing" {
				g = filepath.Join(dir, "none")
			}
			err := checkRangeFree(tc.r, tc.passwd, g)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to name %s", err, tc.want)
			}
		})
	}
}
