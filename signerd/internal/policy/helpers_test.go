package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mustParse parses src or fails the test.
func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

// writeFile writes a policy file with the given mode into a fresh directory and returns its path.
func writeFile(t *testing.T, src string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	// Chmod after writing: the umask would otherwise hide the mode under test.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// replaceFile atomically replaces path with new content (a new inode, as editors and
// configuration managers do).
func replaceFile(t *testing.T, path, src string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// asError extracts the first *Error from err or fails the test.
func asError(t *testing.T, err error) *Error {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *policy.Error", err, err)
	}
	return pe
}

// wantErrContains fails unless err is non-nil and its message contains every part.
func wantErrContains(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want error containing %q, got nil", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}
