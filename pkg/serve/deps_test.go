package serve

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestDeps holds pkg/serve to the service side: it verifies with pkg/serviceaccess and links
// neither signerd (seeds) nor authd (the authority, which keeps the trusted-snapshot check).
func TestDeps(t *testing.T) {
	testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/pkg/serve"}, "github.com/cotalgo/cotal/pkg/serviceaccess",
		"github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd")
}
