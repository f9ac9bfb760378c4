package signerclient

import (
	"net"
	"testing"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// TestRailProvesOnAnyListedBroker: with NatsURLs listing a broker that is down and one that is
// up, the credential is proven on the live one and adopted; with only the dead one, it is not.
func TestRailProvesOnAnyListedBroker(t *testing.T) {
	e := startEnv(t, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + l.Addr().String()
	l.Close()

	r := newRail(t, e, func(c *RailConfig) { c.NatsURL, c.NatsURLs = "", []string{dead, e.url} })
	if err := r.Start(ctxT(t)); err != nil {
		t.Fatalf("ok/one-live-broker: Start: %v", err)
	}
	if jti, _ := r.Current(); jti == "" {
		t.Fatal("ok/one-live-broker: no credential adopted")
	}
	r2 := newRail(t, e, func(c *RailConfig) { c.NatsURL, c.NatsURLs = "", []string{dead} })
	if err := r2.Start(ctxT(t)); err == nil {
		t.Fatal("fail/only-dead-broker: Start succeeded")
	}
	if _, err := NewRail(RailConfig{Client: e.client, Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT}); err == nil {
		t.Fatal("fail/no-broker: NewRail accepted no URL")
	}
}
