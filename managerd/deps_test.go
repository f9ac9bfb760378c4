package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoSignerdDeps: managerd links no signerd package (STYLE.md §1): the key store, the signing
// code and the policy engine stay in signerd's binary, so nothing in managerd (nor its launcher,
// the one part that runs as root) can hold or read a signing seed. It looks at the whole binary:
// serve (the Manager, ManagerService), launcher and provision.
func TestNoSignerdDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/cotalgo/cotal/managerd").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(deps), out)
	}
	var seen bool
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/cotalgo/cotal/signerd/") || d == "github.com/cotalgo/cotal/signerd" {
			t.Errorf("managerd links %s", d)
		}
		if d == "github.com/cotalgo/cotal/managerd/internal/manager" {
			seen = true
		}
	}
	if !seen {
		t.Fatal("go list -deps does not list managerd/internal/manager: the test is not looking at managerd")
	}
}
