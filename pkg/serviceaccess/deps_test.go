package serviceaccess_test

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestNoDeps: the wire floor links neither daemon nor a NATS client or server, so authd, signerd,
// pkg/authclient and pkg/serve can all share it without pulling one another in.
func TestNoDeps(t *testing.T) {
	testkit.NoDeps(t, []string{"github.com/cotalgo/cotal/pkg/serviceaccess"}, "github.com/nats-io/nkeys",
		"github.com/cotalgo/cotal/signerd", "github.com/cotalgo/cotal/authd", "github.com/cotalgo/cotal/managerd",
		"github.com/cotalgo/cotal/deliveryd", "github.com/cotalgo/cotal/pkg/gen", "github.com/nats-io/nats.go",
		"github.com/nats-io/nats-server")
}
