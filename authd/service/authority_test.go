package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/authclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// lifecycleStore reads the lifecycle rows as authd does: a Store on an auth-plane connection
// of its own (planeConn).
func (e *env) lifecycleStore(t *testing.T) *authority.Store {
	t.Helper()
	nc, _, _ := e.planeConn(t)
	n, _ := space.NewNames(sp)
	st, err := authority.NewStore(nc, n, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// managed writes a managed row for h's owner and returns it with its actor token.
func (h *human) managed(t *testing.T, actor string) (ledger.Row, string) {
	t.Helper()
	tok, hash, err := ledger.NewActorToken()
	if err != nil {
		t.Fatal(err)
	}
	uid, err := admin.NewLifecycleUID()
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Row{Ver: ledger.Version, Owner: h.owner, Actor: actor, Scope: []string{}, AllowSubscribe: []string{"general"},
		AllowPublish: []string{"general"}, TokenHash: hash, LifecycleUID: uid, GrantedAt: time.Now().UnixMilli()}
	if err := h.led.Put(ledger.Managed, r); err != nil {
		t.Fatal(err)
	}
	return r, tok
}

// TestManagedAgentActivation is issue 23 item 4 end to end through the real daemon: a managed
// agent's exchange activates its lifecycle (head active at epoch 1, gate open at generation 1)
// and its bearer connects through the callout, which reads the open gate; a lifecycle whose gate
// a retirement froze gets no bearer, and its live bearer connects no more; the activate door and
// its in-process twin answer the seed's table.
func TestManagedAgentActivation(t *testing.T) {
	h := newHuman(t)
	ctx := ctxT(t)
	st := h.e.lifecycleStore(t)
	row, tok := h.managed(t, "worker")
	agent, err := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "worker", Owner: h.owner, ActorToken: tok})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ok/exchange-activates-and-connects", func(t *testing.T) {
		c, err := h.connect(t, agent)
		if err != nil {
			t.Fatalf("managed agent connect: %v", err)
		}
		c.nc.Close()
		hd, _, ok, err := st.Head(ctx, h.owner, "worker")
		if err != nil || !ok || hd.State != lifecycle.HeadActive || hd.LifecycleUID != row.LifecycleUID || hd.ProcessEpoch != 1 ||
			hd.ManagerInstance != "auth-service:"+sp {
			t.Fatalf("head %+v found %v err %v", hd, ok, err)
		}
		g, _, ok, err := st.Gate(ctx, row.LifecycleUID)
		if err != nil || !ok || g.State != lifecycle.GateOpen || g.Generation != 1 {
			t.Fatalf("gate %+v found %v err %v", g, ok, err)
		}
	})
	t.Run("ok/in-process-twin-already-active", func(t *testing.T) {
		res, err := h.s.ActivateManagedLifecycle(ctx, h.owner, "worker", row.LifecycleUID)
		if err != nil || !res.AlreadyActive {
			t.Fatalf("ActivateManagedLifecycle = %+v, %v", res, err)
		}
	})
	t.Run("fail/in-process-twin-active-elsewhere", func(t *testing.T) {
		other, _ := admin.NewLifecycleUID()
		_, err := h.s.ActivateManagedLifecycle(ctx, h.owner, "worker", other)
		var le *service.LifecycleError
		if !errors.As(err, &le) || le.Code != service.LifecycleAlreadyExists {
			t.Fatalf("ActivateManagedLifecycle elsewhere = %v, want already-exists", err)
		}
	})
	t.Run("ok/door", func(t *testing.T) {
		gs, err := h.api.GetSpace(ctx, &signerv1.GetSpaceRequest{Space: sp})
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := admin.NewLifecycleUID()
		body, _ := json.Marshal(map[string]string{"accountPublicKey": gs.GetAccountPublicKey(), "owner": h.owner, "actor": "hosted", "lifecycleUid": uid})
		for i, want := range []string{
			`{"accountPublicKey":"` + gs.GetAccountPublicKey() + `","owner":"` + h.owner + `","actor":"hosted","lifecycleUid":"` + uid + `","activated":true}`,
			`{"accountPublicKey":"` + gs.GetAccountPublicKey() + `","owner":"` + h.owner + `","actor":"hosted","lifecycleUid":"` + uid + `","activated":true,"alreadyActive":true}`,
		} {
			req, _ := http.NewRequest(http.MethodPost, h.s.URL()+exchange.ManagedActivatePath, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+h.s.Cap())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(bytes.TrimSpace(got)) != want {
				t.Fatalf("door call %d = %d %s, want 200 %s", i, resp.StatusCode, got, want)
			}
		}
	})
	t.Run("fail/retirement-frozen-gate", func(t *testing.T) {
		row2, tok2 := h.managed(t, "doomed")
		res, err := h.s.ActivateManagedLifecycle(ctx, h.owner, "doomed", row2.LifecycleUID)
		if err != nil || res.AlreadyActive {
			t.Fatalf("ActivateManagedLifecycle = %+v, %v", res, err)
		}
		a2, err := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "doomed", Owner: h.owner, ActorToken: tok2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a2.Bearer(ctx); err != nil {
			t.Fatalf("exchange while open: %v", err)
		}
		opID, _ := lifecycle.ManagedRetirementOpID(row2.LifecycleUID)
		frozen, _ := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: row2.LifecycleUID, State: lifecycle.GateFrozen, Generation: 1,
			Op: &lifecycle.Op{OpID: opID, Kind: lifecycle.OpRetirement}})
		key, _ := lifecycle.GateKey(row2.LifecycleUID)
		if _, err := st.Update(ctx, space.Auth, key, frozen, res.GateRevision); err != nil {
			t.Fatal(err)
		}
		// The cached bearer is still live; the callout reads the frozen gate and refuses it.
		if c, err := h.connect(t, a2); err == nil {
			c.nc.Close()
			t.Fatal("a frozen lifecycle's bearer connected")
		}
		fresh, _ := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "doomed", Owner: h.owner, ActorToken: tok2})
		_, err = fresh.Bearer(ctx)
		if err == nil {
			t.Fatal("a frozen lifecycle was exchanged for a bearer")
		}
		_, err = h.s.ActivateManagedLifecycle(ctx, h.owner, "doomed", row2.LifecycleUID)
		var le *service.LifecycleError
		if !errors.As(err, &le) || !le.RetirementBegun() {
			t.Fatalf("ActivateManagedLifecycle of a frozen lifecycle = %v, want retirement begun", err)
		}
	})
	t.Run("fail/twin-refuses-after-close", func(t *testing.T) {
		closeNow(h.s)
		_, err := h.s.ActivateManagedLifecycle(context.Background(), h.owner, "worker", row.LifecycleUID)
		var le *service.LifecycleError
		if !errors.As(err, &le) || le.Code != service.LifecycleUnavailable {
			t.Fatalf("ActivateManagedLifecycle after Close = %v, want unavailable", err)
		}
	})
}
