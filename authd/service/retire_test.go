package service_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// retireCall posts the retire door of h's authd for owner.actor at uid.
func (h *human) retireCall(t *testing.T, actor, uid string) (int, string) {
	t.Helper()
	body := `{"owner":"` + h.owner + `","actor":"` + actor + `","lifecycleUid":"` + uid + `"}`
	req, _ := http.NewRequest(http.MethodPost, h.s.URL()+exchange.ManagedRetirePath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.s.Cap())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(bytes.TrimSpace(got))
}

// TestManagedRetirement is issue 23 items 5 and 6 end to end through the real daemon (its
// auth-plane credential, its callout, its loopback face): the door refuses while the managed
// grant is still at the uid; once it is revoked the door runs the barrier, which freezes the
// gate at once (the live agent's bearer no longer connects and no new bearer is issued) but
// holds containment while the agent's connection is live, and finishes only after the broker
// dropped it at its bearer's expiry; a repeat answers alreadyRetired; the old uid never
// activates again, and the alias activates at a fresh uid.
func TestManagedRetirement(t *testing.T) {
	h := newHuman(t)
	ctx := ctxT(t)
	st := h.e.lifecycleStore(t)
	row, tok := h.managed(t, "worker")
	agent, err := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "worker", Owner: h.owner, ActorToken: tok, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	live, err := h.connect(t, agent)
	if err != nil {
		t.Fatalf("managed agent connect: %v", err)
	}

	if code, body := h.retireCall(t, "worker", row.LifecycleUID); code != http.StatusConflict || !strings.Contains(body, "revoke it first") {
		t.Fatalf("door with the grant held = %d %s, want 409", code, body)
	}
	if err := h.led.Revoke(ledger.Managed, h.owner, "worker"); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
	}
	door := make(chan answer, 1)
	go func() {
		code, body := h.retireCall(t, "worker", row.LifecycleUID)
		door <- answer{code, body}
	}()
	testkit.Eventually(t, 20*time.Second, func() error {
		hd, _, _, err := st.Head(ctx, h.owner, "worker")
		if err != nil {
			return err
		}
		if hd.State != lifecycle.HeadRetiring {
			return errors.New("head not retiring yet")
		}
		return nil
	})
	g, _, _, err := st.Gate(ctx, row.LifecycleUID)
	if err != nil || g.State != lifecycle.GateFrozen {
		t.Fatalf("gate %+v, %v; want frozen", g, err)
	}
	// Frozen: the cached bearer connects no more.
	if c, err := h.connect(t, agent); err == nil {
		c.nc.Close()
		t.Fatal("a retiring lifecycle's bearer connected")
	}

	var got answer
	select {
	case got = <-door:
	case <-time.After(60 * time.Second):
		t.Fatal("the door did not answer after the agent's bearer expired")
	}
	select {
	case <-live.closed:
	default:
		t.Fatalf("the door answered %d %s while the agent was still connected", got.code, got.body)
	}
	if want := `{"retired":true,"lifecycleUid":"` + row.LifecycleUID + `"}`; got.code != 200 || got.body != want {
		t.Fatalf("door = %d %s, want 200 %s", got.code, got.body, want)
	}
	hd, _, _, err := st.Head(ctx, h.owner, "worker")
	if err != nil || hd.State != lifecycle.HeadRetired || hd.LifecycleUID != row.LifecycleUID {
		t.Fatalf("head %+v, %v", hd, err)
	}
	if g, _, _, err := st.Gate(ctx, row.LifecycleUID); err != nil || g.State != lifecycle.GateRetired {
		t.Fatalf("gate %+v, %v", g, err)
	}
	if code, body := h.retireCall(t, "worker", row.LifecycleUID); code != 200 || body != `{"retired":true,"lifecycleUid":"`+row.LifecycleUID+`","alreadyRetired":true}` {
		t.Fatalf("repeat = %d %s", code, body)
	}

	// The old uid never activates again; a fresh grant at a new uid does.
	_, err = h.s.ActivateManagedLifecycle(ctx, h.owner, "worker", row.LifecycleUID)
	var le *service.LifecycleError
	if !errors.As(err, &le) || !le.RetirementBegun() {
		t.Fatalf("ActivateManagedLifecycle of the retired uid = %v, want retirement begun", err)
	}
	row2, tok2 := h.managed(t, "worker")
	fresh, err := authclient.New(authclient.Config{URL: h.s.URL(), Cap: h.cap, Actor: "worker", Owner: h.owner, ActorToken: tok2})
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.connect(t, fresh)
	if err != nil {
		t.Fatalf("the fresh lifecycle's agent: %v", err)
	}
	c.nc.Close()
	hd, _, _, err = st.Head(ctx, h.owner, "worker")
	if err != nil || hd.State != lifecycle.HeadActive || hd.LifecycleUID != row2.LifecycleUID || row2.LifecycleUID == row.LifecycleUID {
		t.Fatalf("head after the fresh activation %+v, %v", hd, err)
	}
}
