package daemon_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/daemon"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		ok       bool
		out, err string
	}{
		{"ok/config", []string{"--config", "x.yaml"}, 0, true, "", ""},
		{"ok/help", []string{"--help"}, 0, false, "Usage: demo serve --config FILE", ""},
		{"fail/unknown flag", []string{"--nope"}, 2, false, "Usage: demo serve --config FILE", "flag provided but not defined: -nope"},
		{"fail/positional", []string{"--config", "x.yaml", "extra"}, 2, false, "", "demo serve: unexpected arguments: extra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			fs := daemon.Flags("demo serve", "demo serve --config FILE", &stdout, &stderr)
			cfg := fs.String("config", "", "the configuration")
			code, ok := daemon.ParseFlags(fs, tc.args)
			if code != tc.code || ok != tc.ok {
				t.Fatalf("ParseFlags = %d, %v; want %d, %v", code, ok, tc.code, tc.ok)
			}
			if tc.ok && *cfg != "x.yaml" {
				t.Fatalf("config = %q", *cfg)
			}
			if !strings.Contains(stdout.String(), tc.out) || !strings.Contains(stderr.String(), tc.err) {
				t.Fatalf("stdout %q, stderr %q; want %q and %q", stdout.String(), stderr.String(), tc.out, tc.err)
			}
			if tc.out == "" && stdout.Len() != 0 {
				t.Fatalf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}

func TestLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "": slog.LevelInfo,
		"warn": slog.LevelWarn, "error": slog.LevelError} {
		if got := daemon.LogLevel(in); got != want {
			t.Fatalf("LogLevel(%q) = %v, want %v", in, got, want)
		}
	}
}
