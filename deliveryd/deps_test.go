// Package main_test holds the deliveryd binary's dependency guard (STYLE 1).
package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoSignerdDeps fails if any deliveryd package links a signerd package: deliveryd never holds
// a seed; it gets its credential from signerd over the signerclient rail. Test-only helper
// packages (named *test, which run a real signerd) are not part of the daemon and are left out.
func TestNoSignerdDeps(t *testing.T) {
	list, err := exec.Command("go", "list", "github.com/cotalgo/cotal/deliveryd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, list)
	}
	args := []string{"list", "-deps"}
	for _, p := range strings.Fields(string(list)) {
		if !strings.HasSuffix(p, "test") {
			args = append(args, p)
		}
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var pkgs int
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/cotalgo/cotal/deliveryd") {
			pkgs++
		}
		if strings.HasPrefix(p, "github.com/cotalgo/cotal/signerd") {
			t.Errorf("deliveryd links %s", p)
		}
	}
	if pkgs < 3 {
		t.Fatalf("go list found %d deliveryd packages; the guard is not looking at deliveryd", pkgs)
	}
}
