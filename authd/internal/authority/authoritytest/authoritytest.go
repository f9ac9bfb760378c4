// Package authoritytest gives the tests of the lifecycle authority and of its consumers (the
// callout's gate read, the exchange's activation, manager selection) a space provisioned by
// provision.Ensure on a real embedded broker, with an unlimited data-account connection to build
// an authority.Store on, and a manager instance's registration rows (spec, endpoint gate, lease) in
// any state selection tells apart. The profiles' own reach (auth-plane's grants on the lifecycle
// keys) is proven in pkg/profiles, never with this connection.
//
// It does not import package authority, so that package's internal tests can use it too.
package authoritytest

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lifecycle"
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

// Manager says how WriteManager writes one manager instance; the zero value of every field but
// Owner is a live instance at process epoch 0.
type Manager struct {
	// Owner is the gate principal's owner (the principal is <Owner>.manager_serve_<iid>).
	Owner string
	// Epoch is the gate's processEpoch.
	Epoch uint64
	// Frozen leaves the gate frozen by a registration.
	Frozen bool
	// SpecEpochSkew is added to the spec's processEpoch.
	SpecEpochSkew uint64
	// StaleSpec rewrites the spec after the gate recorded its revision.
	StaleSpec bool
	// Holder is the lease holder when not the gate principal.
	Holder string
	// NoLease writes no lease row.
	NoLease bool
	// LeaseUnregistered writes a lease row without processEpoch and registrationRevision.
	LeaseUnregistered bool
	// LeaseEpochSkew is added to the lease's processEpoch.
	LeaseEpochSkew uint64
}

// Principal is the gate principal WriteManager writes for owner's instance iid.
func Principal(owner, iid string) string { return owner + ".manager_serve_" + iid }

// WriteManager writes iid's spec svc.manager.<iid> (records), its endpoint gate
// epgate.manager.<iid> (auth), recording the spec's revision, and its lease lease.<iid>
// (manager bucket), as m says, each with a create.
func WriteManager(t testing.TB, js jetstream.JetStream, n space.Names, iid string, m Manager) {
	t.Helper()
	ctx := context.Background()
	kv := func(kind space.BucketKind) jetstream.KeyValue {
		bucket, err := n.Bucket(kind)
		if err != nil {
			t.Fatal(err)
		}
		h, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	principal := Principal(m.Owner, iid)
	sb, err := lifecycle.EncodeSpec(lifecycle.Spec{Endpoint: lifecycle.ManagerEndpoint, InstanceID: iid, Principal: principal, ProcessEpoch: m.Epoch + m.SpecEpochSkew})
	if err != nil {
		t.Fatal(err)
	}
	skey, _ := lifecycle.SpecKey(lifecycle.ManagerEndpoint, iid)
	records := kv(space.Records)
	rev, err := records.Create(ctx, skey, sb)
	if err != nil {
		t.Fatal(err)
	}
	if m.StaleSpec {
		if _, err := records.Update(ctx, skey, sb, rev); err != nil {
			t.Fatal(err)
		}
	}
	g := lifecycle.EndpointGate{State: lifecycle.GateOpen, Principal: principal, ProcessEpoch: m.Epoch, RegistrationRevision: rev, Generation: 1}
	if m.Frozen {
		op, err := lifecycle.RegistrationOpID(lifecycle.ManagerEndpoint, iid, m.Epoch)
		if err != nil {
			t.Fatal(err)
		}
		g.State, g.Op = lifecycle.GateFrozen, &lifecycle.Op{OpID: op, Kind: lifecycle.OpRegistration}
	}
	gb, err := lifecycle.EncodeEndpointGate(g)
	if err != nil {
		t.Fatal(err)
	}
	gkey, _ := lifecycle.EndpointGateKey(lifecycle.ManagerEndpoint, iid)
	if _, err := kv(space.Auth).Create(ctx, gkey, gb); err != nil {
		t.Fatal(err)
	}
	if m.NoLease {
		return
	}
	row := lifecycle.ManagerLease{Holder: principal, InstanceID: iid, Runtime: "pty", Root: "/w", PID: 42, Since: 1}
	if m.Holder != "" {
		row.Holder = m.Holder
	}
	if !m.LeaseUnregistered {
		row.ProcessEpoch, row.RegistrationRevision = m.Epoch+m.LeaseEpochSkew, rev
	}
	lb, err := lifecycle.EncodeManagerLease(row)
	if err != nil {
		t.Fatal(err)
	}
	lkey, _ := lifecycle.LeaseKey(iid)
	if _, err := kv(space.Manager).Create(ctx, lkey, lb); err != nil {
		t.Fatal(err)
	}
}

// WriteLocalIdentity writes, at path, the manager-identity.json of a managerd of spaceName
// holding instance iid, as managerd does (mode 0600).
func WriteLocalIdentity(t testing.TB, path, spaceName, iid string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"v": 1, "space": spaceName, "instanceId": iid})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
