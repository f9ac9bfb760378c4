package testkit

import (
	"os/exec"
	"strings"
	"testing"
)

// GoList is `go list ARGS...`: the packages it prints, one per line. It fails t on an error,
// with go's output.
func GoList(t testing.TB, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
		return nil
	}
	return strings.Fields(string(out))
}

// NoDeps is a dependency guard (STYLE.md §1): it fails t if pkgs, or anything they link, is a
// package under one of the forbidden import paths (the path itself or below it). So that the
// guard cannot pass by looking at nothing, the dependencies must include seen.
func NoDeps(t testing.TB, pkgs []string, seen string, forbidden ...string) {
	t.Helper()
	if len(pkgs) == 0 || len(forbidden) == 0 {
		t.Fatalf("NoDeps: no packages (%d) or no forbidden paths (%d)", len(pkgs), len(forbidden))
		return
	}
	found := false
	for _, d := range GoList(t, append([]string{"-deps"}, pkgs...)...) {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("the dependencies of %s include %s", strings.Join(pkgs, ", "), d)
			}
		}
		found = found || d == seen
	}
	if !found {
		t.Fatalf("the dependencies of %s do not include %s: the guard is not looking at what it means to", strings.Join(pkgs, ", "), seen)
	}
}
