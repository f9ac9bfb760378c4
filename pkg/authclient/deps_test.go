package authclient_test

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestDeps: the client links neither signerd (no key store) nor authd (it speaks the wire
// through pkg/serviceaccess).
func TestDeps(t *testing.T) {
	testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/pkg/authclient"}, "github.com/cotalgo/cotal/pkg/serviceaccess",
		"github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd")
}
