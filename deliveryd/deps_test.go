// Package main_test holds the deliveryd binary's dependency guard (STYLE 1).
package main_test

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestNoSignerdDeps fails if any deliveryd package links a signerd package: deliveryd never holds
// a seed; it gets its credential from signerd over the signerclient rail. Test-only helper
// packages (named *test, which run a real signerd) are not part of the daemon and are left out.
func TestNoSignerdDeps(t *testing.T) {
	var pkgs []string
	for _, p := range testkit.GoList(t, "github.com/cotalgo/cotal/deliveryd/...") {
		if !strings.HasSuffix(p, "test") {
			pkgs = append(pkgs, p)
		}
	}
	testkit.NoDeps(t, pkgs, "github.com/cotalgo/cotal/deliveryd/service", "github.com/cotalgo/cotal/signerd")
}
