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
agent: {uid: 991, gid: 991}
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
	if cfg.Path != DefaultPath || *cfg.Agent.UID != 991 || *cfg.Manager.UID != 990 || cfg.Connectors["echo"].Argv[1] != "hi" {
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
		{"fail/agent-root", "agent: {uid: 991, gid: 991}", "agent: {uid: 0, gid: 991}", "agent.uid: 0 is refused"},
		{"fail/agent-root-gid", "agent: {uid: 991, gid: 991}", "agent: {uid: 991, gid: 0}", "agent.gid: 0 is refused"},
		{"fail/agent-is-manager", "agent: {uid: 991, gid: 991}", "agent: {uid: 990, gid: 991}", "must differ from manager.uid"},
		{"fail/agent-gid-is-manager", "agent: {uid: 991, gid: 991}", "agent: {uid: 991, gid: 990}", "must differ from manager.gid"},
		{"fail/agent-group-manager", "agent: {uid: 991, gid: 991}", "agent: {uid: 991, gid: 991, groups: [990]}", "agent.groups"},
		{"fail/agent-minus-one", "agent: {uid: 991, gid: 991}", "agent: {uid: 4294967295, gid: 991}", "(-1)"},
		{"fail/agent-negative", "agent: {uid: 991, gid: 991}", "agent: {uid: -1, gid: 991}", "uint32"},
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
