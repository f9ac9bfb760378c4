package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHelp: every command answers --help on stdout with exit 0; unknown commands, unknown flags, positional arguments and a missing
// --config are usage errors (2); a config that cannot be loaded is a refusal (1) naming it.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
		err  string
	}{
		{"ok/top-help", []string{"--help"}, 0, "managerd launcher --config FILE", ""},
		{"ok/top-help-serve", []string{"--help"}, 0, "managerd serve --config FILE", ""},
		{"ok/serve-help", []string{"serve", "--help"}, 0, "-dev-allow-readable-seeds", ""},
		{"ok/serve-help-schema", []string{"serve", "-h"}, 0, "signer_seed_paths:", ""},
		{"ok/serve-help-remote", []string{"serve", "-h"}, 0, "idp_token_file:", ""},
		{"fail/serve-without-config", []string{"serve"}, 2, "", "--config is required"},
		{"fail/serve-missing-config-file", []string{"serve", "--config", "/nonexistent/managerd.yaml"}, 1, "", "/nonexistent/managerd.yaml"},
		{"ok/help-word", []string{"help"}, 0, "managerd launcher --config FILE", ""},
		{"ok/launcher-help", []string{"launcher", "--help"}, 0, "-config", ""},
		{"ok/launcher-help-schema", []string{"launcher", "-h"}, 0, "env_allow:", ""},
		{"fail/no-args", nil, 2, "", "Usage:"},
		{"fail/unknown-command", []string{"launch"}, 2, "", `unknown command "launch"`},
		{"fail/unknown-flag", []string{"launcher", "--cfg", "x"}, 2, "", "flag provided but not defined"},
		{"fail/positional", []string{"launcher", "--config", "x", "extra"}, 2, "", "unexpected arguments: extra"},
		{"fail/launcher-without-config", []string{"launcher"}, 2, "", "--config is required"},
		{"fail/missing-config-file", []string{"launcher", "--config", "/nonexistent/launcher.yaml"}, 1, "", "/nonexistent/launcher.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Fatalf("stdout %q lacks %q", out.String(), tc.out)
			}
			if !strings.Contains(errb.String(), tc.err) {
				t.Fatalf("stderr %q lacks %q", errb.String(), tc.err)
			}
		})
	}
}
