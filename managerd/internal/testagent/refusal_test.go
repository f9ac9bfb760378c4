package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/material"
)

// TestRefusals: the agent exits 1 naming the cause, before any connection, when its material is
// not set, missing, a symbolic link, readable by group or other, owned by another uid, or does
// not decode; it prints none of the file's content. --help prints the usage and exits 0; an
// argument or a non-positive probe period is a usage error (2).
func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	secret := "SUAM-NOT-A-REAL-SEED-BUT-SECRET"
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(`{"version":1,"creds":"`+secret+`"}`), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	loose := write("loose", 0o640)
	bad := write("bad", 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(bad, link); err != nil {
		t.Fatal(err)
	}
	foreign := write("foreign", 0o600)
	if os.Geteuid() == 0 {
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, path, want string
		skip             bool
	}{
		{"fail/unset", "", material.EnvVar + " is not set", false},
		{"fail/missing", filepath.Join(dir, "none"), "no such file", false},
		{"fail/symlink", link, "too many levels of symbolic links", false},
		{"fail/group-readable", loose, "mode 0640 is looser than 0600", false},
		{"fail/foreign-owner", foreign, "is not owned by uid 0", os.Geteuid() != 0},
		{"fail/undecodable", bad, "launch material " + bad, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.skip {
				t.Skip("needs root to give the file another owner")
			}
			t.Setenv(material.EnvVar, tc.path)
			var stdout, stderr bytes.Buffer
			if code := run(nil, strings.NewReader(""), &stdout, &stderr); code != 1 {
				t.Fatalf("exit %d, want 1 (stderr %q)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr %q does not name %q", stderr.String(), tc.want)
			}
			if stdout.Len() != 0 || strings.Contains(stderr.String(), secret) {
				t.Fatalf("printed stdout %q / the file's content", stdout.String())
			}
		})
	}
	t.Run("ok/help", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"--help"}, strings.NewReader(""), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "Usage: testagent") || !strings.Contains(stdout.String(), "-probe-every") {
			t.Fatalf("--help: exit %d, stdout %q", code, stdout.String())
		}
	})
	for name, args := range map[string][]string{"fail/argument": {"extra"}, "fail/probe-zero": {"--probe-every", "0s"}, "fail/unknown-flag": {"--command", "x"}} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(args, strings.NewReader(""), &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
		})
	}
}

// TestPrintable: mesh text with a control character (a newline, an escape sequence) is printed
// Go-quoted, so it can neither add a line nor drive the terminal; plain text is printed as is.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"hello bob":           "hello bob",
		"two\nlines":          `"two\nlines"`,
		"\x1b]0;pwned\x07":    `"\x1b]0;pwned\a"`,
		"caf\u00e9 \u2713":    "caf\u00e9 \u2713",
		"bad utf8 \xff":       `"bad utf8 \xff"`,
		"recv general x fake": "recv general x fake",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}
