package authority

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

const testSpace = "s2420"

// provisioned is a broker with the space provisioned by provision.Ensure and an unlimited
// connection (the profile's own reach is proven in pkg/profiles).
func provisioned(t *testing.T) (*Store, jetstream.JetStream, *nats.Conn) {
	t.Helper()
	nc, js, n := authoritytest.Provisioned(t, testSpace)
	s, err := NewStore(nc, n, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return s, js, nc
}

func TestStoreRoundTrip(t *testing.T) {
	s, js, _ := provisioned(t)
	ctx := context.Background()
	uid := strings.Repeat("c", 26)
	key, _ := lifecycle.GateKey(uid)
	if _, _, ok, err := s.Gate(ctx, uid); ok || err != nil {
		t.Fatalf("unwritten gate: found=%v err=%v", ok, err)
	}
	born, _ := lifecycle.BornGate(uid)
	b, _ := lifecycle.EncodeGate(born)
	rev, err := s.Create(ctx, space.Auth, key, b)
	if err != nil || rev == 0 {
		t.Fatalf("Create = %d, %v", rev, err)
	}
	if _, err := s.Create(ctx, space.Auth, key, b); !errors.Is(err, ErrConflict) {
		t.Fatalf("second Create = %v, want ErrConflict", err)
	}
	g, grev, ok, err := s.Gate(ctx, uid)
	if err != nil || !ok || grev != rev || g.State != lifecycle.GateFrozen {
		t.Fatalf("Gate = %+v rev %d found %v err %v", g, grev, ok, err)
	}
	open := lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateOpen, Generation: 1}
	ob, err := lifecycle.EncodeGate(open)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, space.Auth, key, ob, rev+100); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale Update = %v, want ErrConflict", err)
	}
	rev2, err := s.Update(ctx, space.Auth, key, ob, rev)
	if err != nil || rev2 <= rev {
		t.Fatalf("Update = %d, %v", rev2, err)
	}
	if g, _, _, _ := s.Gate(ctx, uid); g.State != lifecycle.GateOpen || g.Generation != 1 {
		t.Fatalf("after Update: %+v", g)
	}

	// A delete marker, a TTL'd write and a garbled value are corruption, never absence.
	kv, err := js.KeyValue(ctx, "cotal_auth_"+s.Names().Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := s.Gate(ctx, uid); ok || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("deleted gate: found=%v err=%v, want ErrCorrupt", ok, err)
	}
	uid2 := strings.Repeat("d", 26)
	key2, _ := lifecycle.GateKey(uid2)
	if _, err := kv.Create(ctx, key2, []byte(`{"lifecycleUid":"`+uid2+`","state":"open","generation":1}`), jetstream.KeyTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Gate(ctx, uid2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("TTL'd gate: err=%v, want ErrCorrupt", err)
	}
	uid3 := strings.Repeat("e", 26)
	key3, _ := lifecycle.GateKey(uid3)
	if _, err := s.Create(ctx, space.Auth, key3, []byte(`{"state":"open"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Gate(ctx, uid3); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbled gate: err=%v, want ErrCorrupt", err)
	}
	if s.Reads() == 0 || s.Writes() == 0 {
		t.Fatalf("counters: reads %d writes %d", s.Reads(), s.Writes())
	}
	if _, err := s.Create(ctx, space.Manager, "lease.x", []byte("{}")); err == nil {
		t.Fatal("a write to the manager bucket was sent")
	}
}

func TestStoreUnavailable(t *testing.T) {
	s, _, nc := provisioned(t)
	nc.Close()
	_, _, _, err := s.Head(context.Background(), "u_"+strings.Repeat("a", 26), "cli")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("closed connection: %v, want ErrUnavailable", err)
	}
}
