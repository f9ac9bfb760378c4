package main

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestNoSignerdDeps: authd links no signerd package (STYLE.md §1): the key store, the signing
// code and the policy engine stay in signerd's binary, so nothing in authd can hold or read a
// signing seed.
func TestNoSignerdDeps(t *testing.T) {
	testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/authd"}, "github.com/cotalgo/cotal/authd/service", "github.com/cotalgo/cotal/signerd")
}
