package callout

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// switchable passes Gate to the reader it currently holds: the test moves the responder from
// the live store to one whose connection is closed.
type switchable struct {
	r atomic.Pointer[authority.Store]
}

func (s *switchable) Gate(ctx context.Context, uid string) (lifecycle.Gate, uint64, bool, error) {
	return s.r.Load().Gate(ctx, uid)
}

// TestCalloutManagedGate: a managed row connects only while its lifecycle's issuance gate,
// leader-read from the auth bucket, is open; absent, frozen, retired, corrupt and unreadable
// gates refuse with one sentence; an interactive row reads no gate.
func TestCalloutManagedGate(t *testing.T) {
	sp := authoritytest.Provisioned(t, testSpace)
	store, err := authority.NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gates := &switchable{}
	gates.r.Store(store)
	e := startEnv(t, envOptions{lifecycle: gates})
	ctx := ctxT(t)
	top := t

	n := 0
	managed := func(t *testing.T, gate *lifecycle.Gate, raw []byte) string {
		t.Helper()
		n++
		r := row("worker" + strings.Repeat("x", n))
		r.LifecycleUID = strings.Repeat("0", 25) + string(rune('a'+n))
		r.TokenHash = ledger.HashActorToken("secret")
		if err := e.ledger.Put(ledger.Managed, r); err != nil {
			t.Fatal(err)
		}
		key, _ := lifecycle.GateKey(r.LifecycleUID)
		if gate != nil {
			gate.LifecycleUID = r.LifecycleUID
			b, err := lifecycle.EncodeGate(*gate)
			if err != nil {
				t.Fatal(err)
			}
			raw = b
		}
		if raw != nil {
			if _, err := store.Create(ctx, space.Auth, key, raw); err != nil {
				t.Fatal(err)
			}
		}
		tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
		return tok
	}
	op := func(kind lifecycle.OpKind, uidOf func(string) (string, error)) func(uid string) *lifecycle.Op {
		return func(uid string) *lifecycle.Op {
			id, _ := uidOf(uid)
			return &lifecycle.Op{OpID: id, Kind: kind}
		}
	}
	retirement := op(lifecycle.OpRetirement, lifecycle.ManagedRetirementOpID)
	activation := op(lifecycle.OpActivation, lifecycle.ActivationOpID)

	t.Run("ok/open-gate", func(t *testing.T) {
		tok := managed(t, &lifecycle.Gate{State: lifecycle.GateOpen, Generation: 1}, nil)
		nonce := nonceFor(t, tok)
		c, err := e.connect(t, tok, nonce)
		if err != nil {
			t.Fatalf("managed agent with an open gate: %v", err)
		}
		c.Close()
		if g := e.rec.grant(t, nonce); g.GetParams().GetLifecycleUid() == "" {
			t.Fatalf("grant %+v", g)
		}
	})
	reads := store.Reads()
	t.Run("ok/interactive-reads-no-gate", func(t *testing.T) {
		r := e.grant(t, row("laptop"))
		tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
		c, err := e.connect(t, tok, nonceFor(t, tok))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if d := store.Reads() - reads; d != 0 {
			t.Fatalf("an interactive connect read %d gate(s)", d)
		}
	})
	for _, tc := range []struct {
		name string
		gate func(t *testing.T) string
	}{
		{"fail/absent-gate", func(t *testing.T) string { return managed(t, nil, nil) }},
		{"fail/corrupt-gate", func(t *testing.T) string { return managed(t, nil, []byte(`{"state":"open"}`)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.gate(t)
			nonce := nonceFor(t, tok)
			c, err := e.connect(t, tok, nonce)
			wantDenied(t, c, err)
			if got := e.rec.refusal(nonce); got != refuseGate {
				t.Fatalf("refusal %q, want %q", got, refuseGate)
			}
		})
	}
	// Frozen and retired gates carry their op, which names the uid: built per uid.
	for _, tc := range []struct {
		name  string
		state lifecycle.GateState
		op    func(string) *lifecycle.Op
		gen   uint64
	}{
		{"fail/frozen-by-retirement", lifecycle.GateFrozen, retirement, 1},
		{"fail/retired", lifecycle.GateRetired, retirement, 1},
		{"fail/frozen-by-activation", lifecycle.GateFrozen, activation, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n++
			r := row("worker" + strings.Repeat("y", n))
			r.LifecycleUID = strings.Repeat("1", 25) + string(rune('a'+n))
			r.TokenHash = ledger.HashActorToken("secret")
			if err := e.ledger.Put(ledger.Managed, r); err != nil {
				t.Fatal(err)
			}
			b, err := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: r.LifecycleUID, State: tc.state, Generation: tc.gen, Op: tc.op(r.LifecycleUID)})
			if err != nil {
				t.Fatal(err)
			}
			key, _ := lifecycle.GateKey(r.LifecycleUID)
			if _, err := store.Create(ctx, space.Auth, key, b); err != nil {
				t.Fatal(err)
			}
			tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
			nonce := nonceFor(t, tok)
			c, err := e.connect(t, tok, nonce)
			wantDenied(t, c, err)
			if got := e.rec.refusal(nonce); got != refuseGate {
				t.Fatalf("refusal %q, want %q", got, refuseGate)
			}
		})
	}
	t.Run("fail/unreadable-gate", func(t *testing.T) {
		tok := managed(t, &lifecycle.Gate{State: lifecycle.GateOpen, Generation: 1}, nil)
		jwt, kp := sp.Broker.Space(testSpace).MintUnlimited(t)
		nc, err := sp.Broker.Connect(t, jwt, kp)
		if err != nil {
			t.Fatal(err)
		}
		dead, err := authority.NewStore(nc, sp.Names, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		gates.r.Store(dead)
		defer gates.r.Store(store)
		nonce := nonceFor(t, tok)
		c, err := e.connect(t, tok, nonce)
		wantDenied(t, c, err)
		if got := e.rec.refusal(nonce); got != refuseGate {
			t.Fatalf("refusal %q, want %q", got, refuseGate)
		}
		if !strings.Contains(logOf(top), "issuance gate unreadable") {
			t.Fatalf("no log reason; log:\n%s", logOf(top))
		}
	})
}

// TestGateClosedWithoutReader: a responder with no gate reader refuses every managed row.
func TestGateClosedWithoutReader(t *testing.T) {
	r := &Responder{}
	if why := r.gateClosed(context.Background(), strings.Repeat("a", 26)); !strings.Contains(why, "no lifecycle authority") {
		t.Fatalf("gateClosed without a reader = %q", why)
	}
}
