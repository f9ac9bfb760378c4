package exchange_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// TestAgentArmActivates: the agent arm activates the managed row's lifecycle before signing,
// adopts an active one without writing, and refuses a lifecycle it cannot activate (409) or an
// authority it cannot reach (503) with no bearer; a refused token reads no lifecycle row.
func TestAgentArmActivates(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	owner := e.owner("spawner")
	row, tok := e.spawn(owner, "agent1")

	t.Run("ok/first-exchange-activates", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok})
		if a.status != http.StatusOK {
			t.Fatalf("agent exchange = %d %s", a.status, a.body)
		}
		if b := e.verifyBearer(a.json(t)["token"].(string)); b.Act.LifecycleUID != row.LifecycleUID {
			t.Fatalf("bearer uid %q, want %q", b.Act.LifecycleUID, row.LifecycleUID)
		}
		h, _, ok, err := e.store.Head(ctx, owner, "agent1")
		if err != nil || !ok || h.State != lifecycle.HeadActive || h.LifecycleUID != row.LifecycleUID || h.ProcessEpoch != 1 {
			t.Fatalf("head %+v found %v err %v", h, ok, err)
		}
		g, _, ok, err := e.store.Gate(ctx, row.LifecycleUID)
		if err != nil || !ok || g.State != lifecycle.GateOpen || g.Generation != 1 {
			t.Fatalf("gate %+v found %v err %v", g, ok, err)
		}
	})
	t.Run("ok/later-exchange-writes-nothing", func(t *testing.T) {
		w := e.store.Writes()
		if a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok}); a.status != http.StatusOK {
			t.Fatalf("agent exchange = %d %s", a.status, a.body)
		}
		if d := e.store.Writes() - w; d != 0 {
			t.Fatalf("an exchange of an active lifecycle wrote %d rows", d)
		}
	})
	t.Run("fail/wrong-token-reads-nothing", func(t *testing.T) {
		r := e.store.Reads()
		_, other := e.spawn(owner, "agent9")
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": other})
		if a.status != http.StatusUnauthorized || a.errorText(t) != exchange.AgentRefusal {
			t.Fatalf("wrong token = %d %s", a.status, a.body)
		}
		if d := e.store.Reads() - r; d != 0 {
			t.Fatalf("a refused token read %d lifecycle rows", d)
		}
	})
	t.Run("fail/active-at-another-uid-409", func(t *testing.T) {
		_, tok2 := e.spawn(owner, "agent2")
		if _, err := e.auth.Activate(ctx, owner, "agent2", newUID(t)); err != nil {
			t.Fatal(err)
		}
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent2", "actorToken": tok2})
		if a.status != http.StatusConflict || a.json(t)["token"] != nil {
			t.Fatalf("exchange = %d %s, want 409", a.status, a.body)
		}
	})
	t.Run("fail/retirement-begun-409", func(t *testing.T) {
		r3, tok3 := e.spawn(owner, "agent3")
		res, err := e.auth.Activate(ctx, owner, "agent3", r3.LifecycleUID)
		if err != nil {
			t.Fatal(err)
		}
		opID, _ := lifecycle.ManagedRetirementOpID(r3.LifecycleUID)
		frozen, err := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: r3.LifecycleUID, State: lifecycle.GateFrozen, Generation: 1,
			Op: &lifecycle.Op{OpID: opID, Kind: lifecycle.OpRetirement}})
		if err != nil {
			t.Fatal(err)
		}
		key, _ := lifecycle.GateKey(r3.LifecycleUID)
		if _, err := e.store.Update(ctx, space.Auth, key, frozen, res.GateRevision); err != nil {
			t.Fatal(err)
		}
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent3", "actorToken": tok3})
		if a.status != http.StatusConflict || a.json(t)["token"] != nil {
			t.Fatalf("exchange = %d %s, want 409", a.status, a.body)
		}
	})
	t.Run("fail/authority-unavailable-503", func(t *testing.T) {
		_, tok4 := e.spawn(owner, "agent4")
		e.held.Store(false)
		defer e.held.Store(true)
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent4", "actorToken": tok4})
		if a.status != http.StatusServiceUnavailable || a.json(t)["token"] != nil {
			t.Fatalf("exchange = %d %s, want 503", a.status, a.body)
		}
	})
}

// TestAgentArmWithoutActivator: no lifecycle authority, no agent bearer.
func TestAgentArmWithoutActivator(t *testing.T) {
	e := newEnv(t, envOpts{noActivator: true})
	owner := e.owner("spawner")
	_, tok := e.spawn(owner, "agent1")
	a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok})
	if a.status != http.StatusServiceUnavailable || a.json(t)["token"] != nil {
		t.Fatalf("exchange = %d %s, want 503", a.status, a.body)
	}
	if _, _, ok, _ := e.store.Head(context.Background(), owner, "agent1"); ok {
		t.Fatal("a head was written without an activator")
	}
}

// TestLifecycleRoutes: the lifecycle doors reach Config.Lifecycle ahead of the face's Origin
// guard (so the door answers 405 before 403), and are 404 without one.
func TestLifecycleRoutes(t *testing.T) {
	withDoor := newEnv(t, envOpts{lifecycle: func(e *env) http.Handler {
		door, err := authority.NewActivateDoor(e.auth, e.cap, nil)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(exchange.ManagedActivatePath, door)
		return mux
	}})
	bare := newEnv(t, envOpts{})
	owner := withDoor.owner("host")
	body, _ := json.Marshal(map[string]string{"accountPublicKey": withDoor.account, "owner": owner, "actor": "hosted", "lifecycleUid": newUID(t)})

	for _, tc := range []struct {
		name   string
		e      *env
		method string
		path   string
		hdr    map[string]string
		status int
	}{
		{"fail/door-get-with-origin-405", withDoor, http.MethodGet, exchange.ManagedActivatePath, map[string]string{"Origin": "https://x"}, 405},
		{"fail/door-origin-403", withDoor, http.MethodPost, exchange.ManagedActivatePath, map[string]string{"Origin": "https://x"}, 403},
		{"fail/door-no-cap-401", withDoor, http.MethodPost, exchange.ManagedActivatePath, map[string]string{"Authorization": ""}, 401},
		{"ok/door-activates", withDoor, http.MethodPost, exchange.ManagedActivatePath, nil, 200},
		{"fail/retire-unrouted-404", withDoor, http.MethodPost, exchange.ManagedRetirePath, nil, 404},
		{"fail/no-lifecycle-activate-404", bare, http.MethodPost, exchange.ManagedActivatePath, nil, 404},
		{"fail/no-lifecycle-retire-404", bare, http.MethodPost, exchange.ManagedRetirePath, nil, 404},
		{"fail/exchange-origin-403", withDoor, http.MethodPost, "/exchange", map[string]string{"Origin": "https://x"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.e.do(tc.method, tc.path, body, tc.hdr)
			if a.status != tc.status {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, a.status, a.body, tc.status)
			}
			if tc.status == 200 && a.json(t)["activated"] != true {
				t.Fatalf("door answer %s", a.body)
			}
			if tc.path == exchange.ManagedActivatePath && tc.status != 200 && tc.status != 404 && a.json(t)["outcome"] != "not-executed" {
				t.Fatalf("door refusal %s without outcome not-executed", a.body)
			}
		})
	}
}
