package main

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestNoSignerdDeps: managerd links no signerd package (STYLE.md §1): the key store, the signing
// code and the policy engine stay in signerd's binary, so nothing in managerd (nor its launcher,
// the one part that runs as root) can hold or read a signing seed. It looks at the whole binary
// (serve: the Manager, ManagerService; launcher; provision) and, on its own, at the public
// package a host embeds (managerd/manager), so that an embedding links no signing code either;
// and the remote authority client links no authd package.
func TestNoSignerdDeps(t *testing.T) {
	t.Run("ok/binary", func(t *testing.T) {
		testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/managerd"}, "github.com/cotalgo/cotal/managerd/manager", "github.com/cotalgo/cotal/signerd")
	})
	t.Run("ok/managerd/manager", func(t *testing.T) {
		testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/managerd/manager"}, "github.com/cotalgo/cotal/pkg/signerclient", "github.com/cotalgo/cotal/signerd")
	})
	// A remote managerd (authority: remote) asks authd's manager-service authority over HTTP with
	// pkg/managerauthority's wire: it links neither signerd nor authd's own packages.
	t.Run("ok/remote authority client", func(t *testing.T) {
		testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/managerd", "github.com/cotalgo/cotal/managerd/manager"},
			"github.com/cotalgo/cotal/pkg/managerauthority", "github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd")
	})
}
