// Package authoritytest gives the tests of the lifecycle authority and of its consumers (the
// callout's gate read, the exchange's activation) a space provisioned by provision.Ensure on a
// real embedded broker, with an unlimited data-account connection to build an authority.Store
// on. The profiles' own reach (auth-plane's grants on the lifecycle keys) is proven in
// pkg/profiles, never with this connection.
//
// It does not import package authority, so that package's internal tests can use it too.
package authoritytest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// Space is one provisioned space on its own broker.
type Space struct {
	Broker *testkit.Broker
	Names  space.Names
	// Conn is an unlimited data-account connection (closed at cleanup); JS is JetStream on it.
	Conn *nats.Conn
	JS   jetstream.JetStream
	// Account is the space's data account public key (authority.Config.Account).
	Account string
}

// Provisioned starts a broker for the space name, provisions it and connects. It fails t on any
// error.
func Provisioned(t testing.TB, name string) *Space {
	t.Helper()
	b := testkit.StartBroker(t, name)
	sp := b.Space(name)
	jwt, kp := sp.MintUnlimited(t)
	nc, err := b.Connect(t, jwt, kp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n, err := space.NewNames(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := provision.Ensure(ctx, js, n, provision.Options{}); err != nil {
		t.Fatal(err)
	}
	return &Space{Broker: b, Names: n, Conn: nc, JS: js, Account: sp.Trust.DataAccountPublicKey()}
}
