package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHelp: every command answers --help on stdout with exit 0; unknown commands and flags are
// usage errors (2); serve without --config refuses.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"ok/top-help", []string{"--help"}, 0, "deliveryd serve --config FILE"},
		{"ok/help-word", []string{"help"}, 0, "deliveryd serve --config FILE"},
		{"ok/serve-help", []string{"serve", "--help"}, 0, "-config"},
		{"fail/no-args", nil, 2, ""},
		{"fail/unknown-command", []string{"srve"}, 2, ""},
		{"fail/unknown-flag", []string{"serve", "--cfg", "x"}, 2, ""},
		{"fail/positional", []string{"serve", "--config", "x", "extra"}, 2, ""},
		{"fail/serve-without-config", []string{"serve"}, 2, ""},
		{"fail/missing-config-file", []string{"serve", "--config", "/nonexistent/deliveryd.yaml"}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Fatalf("stdout %q lacks %q", out.String(), tc.out)
			}
		})
	}
}
