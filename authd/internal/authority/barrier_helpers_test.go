package authority

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// The lifecycle the retirement tests retire: the acceptance vectors' owner and uid.
var (
	tOwner = "u_" + strings.Repeat("a", 26)
	tUID   = strings.Repeat("c", 26)
	tUID2  = strings.Repeat("d", 26)
)

const tActor = "probe"

// testAuthority is an Authority on s with a fresh ledger, a fresh account, a held plane, a plane
// context ended at cleanup and a fast containment pace; edit changes the Config first.
func testAuthority(t *testing.T, s *Store, edit func(*Config)) *Authority {
	t.Helper()
	led, err := ledger.Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	acct, _ := akp.PublicKey()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := Config{Store: s, Ledger: led, Space: s.Names().Name(), Account: acct, Held: func() error { return nil }, Context: ctx}
	if edit != nil {
		edit(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.containPoll, a.sweepSettle = 50*time.Millisecond, 50*time.Millisecond
	return a
}

// activate writes what a finished activation leaves at uid: the reservation, the gate open at
// generation 1 and the head active at epoch 1, written directly so the retirement tests do not
// depend on Activate.
func activate(t *testing.T, s *Store, owner, actor, uid string) {
	t.Helper()
	ctx := context.Background()
	res, _ := lifecycle.EncodeReservation(lifecycle.Reservation{Owner: owner, Actor: actor, MintedBy: "auth-service:" + testSpace})
	gate, _ := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateOpen, Generation: 1})
	rk, _ := lifecycle.UIDKey(uid)
	gk, _ := lifecycle.GateKey(uid)
	if _, err := s.Create(ctx, space.Records, rk, res); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, space.Auth, gk, gate); err != nil {
		t.Fatal(err)
	}
	putHead(t, s, lifecycle.Head{Owner: owner, Actor: actor, LifecycleUID: uid, ManagerInstance: "auth-service:" + testSpace, ProcessEpoch: 1, State: lifecycle.HeadActive})
}

// activating writes what an activation stopped before its reopen leaves at uid: the gate still
// frozen by its activation (an op foreign to the retirement) under an active head.
func activating(t *testing.T, s *Store, owner, actor, uid string) {
	t.Helper()
	born, _ := lifecycle.BornGate(uid)
	b, _ := lifecycle.EncodeGate(born)
	gk, _ := lifecycle.GateKey(uid)
	if _, err := s.Create(context.Background(), space.Auth, gk, b); err != nil {
		t.Fatal(err)
	}
	putHead(t, s, lifecycle.Head{Owner: owner, Actor: actor, LifecycleUID: uid, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadActive})
}

// putHead writes h over whatever head its alias has.
func putHead(t *testing.T, s *Store, h lifecycle.Head) {
	t.Helper()
	ctx := context.Background()
	b, err := lifecycle.EncodeHead(h)
	if err != nil {
		t.Fatal(err)
	}
	hk, _ := lifecycle.HeadKey(h.Owner, h.Actor)
	_, rev, found, err := s.Head(ctx, h.Owner, h.Actor)
	if err != nil {
		t.Fatal(err)
	}
	if found {
		_, err = s.Update(ctx, space.Records, hk, b, rev)
	} else {
		_, err = s.Create(ctx, space.Records, hk, b)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// rows is the state of a retirement: what each row says and its revision (0: absent).
type rows struct {
	stage                lifecycle.Stage
	gate                 lifecycle.Gate
	head                 lifecycle.Head
	frontier             lifecycle.Frontier
	stageRev, gateRev    uint64
	headRev, frontierRev uint64
}

func readRows(t *testing.T, s *Store, owner, actor, uid string) rows {
	t.Helper()
	ctx := context.Background()
	op, _ := lifecycle.ManagedRetirementOpID(uid)
	var r rows
	var err error
	if r.stage, r.stageRev, _, err = s.Stage(ctx, op); err != nil {
		t.Fatal(err)
	}
	if r.gate, r.gateRev, _, err = s.Gate(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if r.head, r.headRev, _, err = s.Head(ctx, owner, actor); err != nil {
		t.Fatal(err)
	}
	if r.frontier, r.frontierRev, _, err = s.Frontier(ctx, uid); err != nil {
		t.Fatal(err)
	}
	return r
}

// retiredAt checks the terminal state of the retirement of owner.actor at uid.
func retiredAt(t *testing.T, s *Store, owner, actor, uid string) rows {
	t.Helper()
	r := readRows(t, s, owner, actor, uid)
	op, _ := lifecycle.ManagedRetirementOpID(uid)
	if r.stageRev == 0 || r.stage.Owner != owner || r.stage.Actor != actor || r.stage.LifecycleUID != uid || r.stage.FromGeneration != 1 {
		t.Fatalf("stage %+v at %d", r.stage, r.stageRev)
	}
	if r.gate.State != lifecycle.GateRetired || !retiredBy(r.gate.Op, op) || r.gate.Generation != 1 {
		t.Fatalf("gate %+v, want retired by %s at generation 1", r.gate, op)
	}
	if r.head.State != lifecycle.HeadRetired || r.head.LifecycleUID != uid || r.head.Op != nil || r.head.ProcessEpoch != 1 {
		t.Fatalf("head %+v, want retired at %s", r.head, uid)
	}
	if r.frontierRev == 0 || r.frontier.OpID != op || len(r.frontier.Streams) != 1 || r.frontier.Streams[0].Stream != mustStream(t, s, space.Records) {
		t.Fatalf("frontier %+v", r.frontier)
	}
	return r
}

func mustStream(t *testing.T, s *Store, kind space.BucketKind) string {
	t.Helper()
	n, err := s.Names().BucketStream(kind)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// provisionedBroker is provisioned with its broker (for agent connections, a second connection
// or a child process).
func provisionedBroker(t *testing.T) (*testkit.Broker, *Store, jetstream.JetStream, *nats.Conn) {
	t.Helper()
	sp := authoritytest.Provisioned(t, testSpace)
	s, err := NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return sp.Broker, s, sp.JS, sp.Conn
}
