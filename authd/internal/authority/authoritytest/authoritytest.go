// Package authoritytest builds lifecycle-authority fixtures on a real broker for tests: a space
// provisioned by provision.Ensure with an unlimited connection, and a manager instance's
// registration rows (spec, endpoint gate, lease) in any state selection tells apart. It does not
// import package authority, so that package's own tests can use it.
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

// Provisioned starts a broker with spaceName provisioned by provision.Ensure and returns an
// unlimited connection to it (the profiles' own reach is proven in pkg/profiles), its JetStream
// and the space's names.
func Provisioned(t testing.TB, spaceName string) (*nats.Conn, jetstream.JetStream, space.Names) {
	t.Helper()
	b := testkit.StartBroker(t, spaceName)
	jwt, kp := b.Space(spaceName).MintUnlimited(t)
	nc, err := b.Connect(t, jwt, kp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n, err := space.NewNames(spaceName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := provision.Ensure(ctx, js, n, provision.Options{}); err != nil {
		t.Fatal(err)
	}
	return nc, js, n
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
		g.State, g.Op = lifecycle.GateFrozen, &lifecycle.Op{OpID: iid, Kind: lifecycle.OpRegistration}
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
	row := map[string]any{"holder": principal, "instanceId": iid, "runtime": "pty", "root": "/w", "pid": 42, "since": 1}
	if m.Holder != "" {
		row["holder"] = m.Holder
	}
	if !m.LeaseUnregistered {
		row["processEpoch"], row["registrationRevision"] = m.Epoch+m.LeaseEpochSkew, rev
	}
	lb, _ := json.Marshal(row)
	lkey, _ := space.ManagerLeaseKey(iid)
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
