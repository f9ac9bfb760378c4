package testkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// PingRace is what nats.go reports when the broker's RTT PING reached a connecting client
// before the refusal that followed it: a connect whose auth callout is answered by silence times
// out 2 s after CONNECT, by then the connection is over 2 s old, and the broker's auth-failure
// event measures its RTT with a PING first.
const PingRace = "expected 'PONG', got 'PING'"

// RefusedOnRecord is err, a connect's error on the client, with the PING race read from the
// broker's side: when err is the race, ns's record of the closed connection named name says why
// it closed it, and only an authentication failure maps to nats.ErrAuthorization; any other
// reason keeps err, with the reason added. Any other err (nil included) is returned as it is. The
// connection's name must be unique to the attempt.
func RefusedOnRecord(t testing.TB, ns *server.Server, name string, err error) error {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), PingRace) {
		return err
	}
	reason := ClosedReason(t, ns, name)
	if reason != server.AuthenticationViolation.String() {
		return fmt.Errorf("%w (the broker closed it for %q)", err, reason)
	}
	return fmt.Errorf("%w: the broker closed the connection for %q; the client read its RTT PING first (%w)", nats.ErrAuthorization, reason, err)
}

// ClosedReason waits up to 10 s for ns's record of the closed connection named name (Connz,
// ConnClosed) and returns why ns closed it.
func ClosedReason(t testing.TB, ns *server.Server, name string) string {
	t.Helper()
	var reason string
	Eventually(t, 10*time.Second, func() error {
		cz, err := ns.Connz(&server.ConnzOptions{State: server.ConnClosed, Limit: 1 << 16})
		if err != nil {
			return err
		}
		for _, ci := range cz.Conns {
			if ci.Name == name {
				reason = ci.Reason
				return nil
			}
		}
		return errors.New("the broker has no closed connection named " + name + " yet")
	})
	return reason
}
