// Package testkit gives tests real parts: an embedded nats-server in operator (JWT) mode with
// JetStream, listening on 127.0.0.1, whose spaces are provisioned through pkg/trust exactly as
// signerd init provisions them; user minting from pkg/profiles; TCP connections that capture the
// broker's asynchronous permission errors; and Eventually for polling without sleeps.
//
// It is for tests only. It holds every seed of its broker in memory and mints users directly;
// production minting is signerd's, and no daemon may import this package.
package testkit

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/trust"
)

// BrokerName is the name of the broker StartBroker creates (its operator is cotal-testkit).
const BrokerName = "testkit"

// Broker is a running embedded broker and the trust material behind it.
type Broker struct {
	// URL is the client URL, nats://127.0.0.1:<port>.
	URL string
	// Server is the embedded server.
	Server *server.Server
	// Trust is the broker's public trust root.
	Trust *trust.Broker
	// Operator is the operator's secret material (tests that re-issue accounts need it).
	Operator *trust.OperatorIdentity

	spaces map[string]*Space

	mu   sync.Mutex
	errs map[*nats.Conn][]error // async errors per connection; guarded by mu
}

// Space is one provisioned space of a Broker.
type Space struct {
	// Name is the space name given to StartBroker.
	Name string
	// Trust is the space's public facts.
	Trust *trust.Space
	// Identity is the space's account identity seeds.
	Identity *trust.SpaceIdentity
	// Signing is the signing material signerd would hold.
	Signing *trust.SpaceSigning
	// Callout is the callout-service user key registered in the AUTH account's auth_users.
	Callout nkeys.KeyPair

	broker *Broker
}

// StartBroker starts an embedded nats-server in operator mode with JetStream in t.TempDir(), on
// 127.0.0.1 and a random port, with one data account and one callout account per space name
// (each with a fresh callout user key registered as its auth user). It fails t on any error and
// shuts the server down and wipes the seeds at cleanup.
func StartBroker(t testing.TB, spaces ...string) *Broker {
	t.Helper()
	tb, op, err := trust.NewBroker(BrokerName)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	t.Cleanup(op.Wipe)
	b := &Broker{Trust: tb, Operator: op, spaces: map[string]*Space{}, errs: map[*nats.Conn][]error{}}
	cfg := trust.ServerConfig{Host: "127.0.0.1", Port: -1, StoreDir: t.TempDir(), Broker: tb}
	for _, name := range spaces {
		if _, dup := b.spaces[name]; dup {
			t.Fatalf("testkit: space %q given twice", name)
		}
		ckp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatalf("testkit: %v", err)
		}
		t.Cleanup(ckp.Wipe)
		cpub, err := ckp.PublicKey()
		if err != nil {
			t.Fatalf("testkit: %v", err)
		}
		sp, id, sg, err := trust.NewSpace(tb, op, name, []string{cpub})
		if err != nil {
			t.Fatalf("testkit: space %q: %v", name, err)
		}
		t.Cleanup(id.Wipe)
		t.Cleanup(sg.Wipe)
		b.spaces[name] = &Space{Name: name, Trust: sp, Identity: id, Signing: sg, Callout: ckp, broker: b}
		cfg.Spaces = append(cfg.Spaces, sp)
	}
	opts, err := trust.ServerOptions(cfg)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	opts.NoLog = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testkit: new server: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("testkit: broker not ready for connections within 10s")
	}
	b.Server, b.URL = s, s.ClientURL()
	return b
}

// Space returns the provisioned space name. It panics for a name not given to StartBroker,
// which is a bug in the test.
func (b *Broker) Space(name string) *Space {
	sp, ok := b.spaces[name]
	if !ok {
		panic(fmt.Sprintf("testkit: space %q was not started", name))
	}
	return sp
}
