package authority

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/lifecycle"
)

// doorRig is the activate door over real HTTP on a rig's authority.
type doorRig struct {
	*rig
	url      string
	cap      string
	notReady atomic.Bool
}

func newDoorRig(t *testing.T) *doorRig {
	t.Helper()
	d := &doorRig{rig: newRig(t), cap: strings.Repeat("ab", 32)}
	door, err := NewActivateDoor(d.a, d.cap, func() error {
		if d.notReady.Load() {
			return errors.New("starting")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(door)
	t.Cleanup(srv.Close)
	d.url = srv.URL
	return d
}

type doorAnswer struct {
	status int
	body   map[string]any
	raw    string
}

// post sends body with the door's headers, edited by hdr ("" deletes a header).
func (d *doorRig) post(t *testing.T, method, body string, hdr map[string]string) doorAnswer {
	t.Helper()
	req, err := http.NewRequest(method, d.url+"/managed-lifecycle/activate", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+d.cap)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := doorAnswer{status: resp.StatusCode, raw: string(raw)}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		t.Fatalf("answer %d %q is not JSON: %v", resp.StatusCode, raw, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	return a
}

func (d *doorRig) body(t *testing.T, account, actor, uid string) string {
	t.Helper()
	b, err := json.Marshal(map[string]string{"accountPublicKey": account, "owner": testOwner, "actor": actor, "lifecycleUid": uid})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestActivateDoorGuards: every guard and selection refusal answers not-executed and reads and
// writes nothing.
func TestActivateDoorGuards(t *testing.T) {
	d := newDoorRig(t)
	okBody := d.body(t, d.sp.Account, "guarded", uidN(1))
	other, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _ := other.PublicKey()
	for _, tc := range []struct {
		name   string
		method string
		body   string
		hdr    map[string]string
		status int
		setup  func()
	}{
		{name: "fail/get", method: http.MethodGet, body: okBody, hdr: map[string]string{"Origin": "https://x"}, status: 405},
		{name: "fail/origin", body: okBody, hdr: map[string]string{"Origin": "https://x", "Content-Type": "text/plain"}, status: 403},
		{name: "fail/content-type", body: okBody, hdr: map[string]string{"Content-Type": "text/plain", "Authorization": ""}, status: 415},
		{name: "fail/no-cap", body: okBody, hdr: map[string]string{"Authorization": ""}, status: 401},
		{name: "fail/wrong-cap", body: okBody, hdr: map[string]string{"Authorization": "Bearer " + strings.Repeat("cd", 32)}, status: 401},
		{name: "fail/too-large", body: `{"owner":"` + strings.Repeat("a", MaxDoorBody) + `"}`, status: 413},
		{name: "fail/unknown-field", body: strings.TrimSuffix(okBody, "}") + `,"extra":"x"}`, status: 400},
		{name: "fail/missing-field", body: `{"owner":"` + testOwner + `","actor":"a","lifecycleUid":"` + uidN(1) + `"}`, status: 400},
		{name: "fail/non-string", body: `{"accountPublicKey":1,"owner":"` + testOwner + `","actor":"a","lifecycleUid":"` + uidN(1) + `"}`, status: 400},
		{name: "fail/platform-owner", body: strings.Replace(okBody, testOwner, "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", 1), status: 400},
		{name: "fail/bad-actor", body: d.body(t, d.sp.Account, "a.b", uidN(1)), status: 400},
		{name: "fail/bad-uid", body: d.body(t, d.sp.Account, "guarded", "UPPER"), status: 400},
		{name: "fail/malformed-account", body: d.body(t, "Anot-a-key", "guarded", uidN(1)), status: 400},
		{name: "fail/another-account", body: d.body(t, otherPub, "guarded", uidN(1)), status: 403},
		{name: "fail/not-ready", body: okBody, status: 503, setup: func() { d.notReady.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
				defer d.notReady.Store(false)
			}
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			reads, writes := d.s.Reads(), d.s.Writes()
			a := d.post(t, method, tc.body, tc.hdr)
			if a.status != tc.status || a.body["outcome"] != "not-executed" || a.body["error"] == "" {
				t.Fatalf("answer %d %s, want %d not-executed", a.status, a.raw, tc.status)
			}
			if d.s.Reads() != reads || d.s.Writes() != writes {
				t.Fatalf("a refused request touched the store (%d reads, %d writes)", d.s.Reads()-reads, d.s.Writes()-writes)
			}
		})
	}
}

// TestActivateDoorRows: every answer of the door's table over real HTTP.
func TestActivateDoorRows(t *testing.T) {
	d := newDoorRig(t)
	acct := d.sp.Account
	t.Run("ok/activated", func(t *testing.T) {
		a := d.post(t, http.MethodPost, d.body(t, acct, "fresh", uidN(1)), nil)
		want := `{"accountPublicKey":"` + acct + `","owner":"` + testOwner + `","actor":"fresh","lifecycleUid":"` + uidN(1) + `","activated":true}` + "\n"
		if a.status != 200 || a.raw != want {
			t.Fatalf("answer %d %s, want 200 %s", a.status, a.raw, want)
		}
		g, _, _, _ := d.s.Gate(t.Context(), uidN(1))
		if g.State != lifecycle.GateOpen {
			t.Fatalf("gate %+v after a 200", g)
		}
	})
	t.Run("ok/already-active", func(t *testing.T) {
		a := d.post(t, http.MethodPost, d.body(t, acct, "fresh", uidN(1)), nil)
		if a.status != 200 || a.body["activated"] != true || a.body["alreadyActive"] != true {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
	t.Run("fail/active-elsewhere-409", func(t *testing.T) {
		a := d.post(t, http.MethodPost, d.body(t, acct, "fresh", uidN(2)), nil)
		if a.status != 409 || a.body["code"] != "already-exists" || a.body["outcome"] != "not-executed" || a.body["retirementBegun"] != nil {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
	t.Run("fail/foreign-reservation-409", func(t *testing.T) {
		d.putReservation(t, uidN(3), lifecycle.Reservation{Owner: testOwner, Actor: "else", MintedBy: "x"})
		a := d.post(t, http.MethodPost, d.body(t, acct, "taker", uidN(3)), nil)
		if a.status != 409 || a.body["code"] != "conflict" || a.body["outcome"] != "not-executed" {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
	for _, tc := range []struct {
		name  string
		uid   string
		setup func(t *testing.T, actor, uid string)
		code  string
	}{
		{"fail/retiring-409-retirement-begun", uidN(4), func(t *testing.T, actor, uid string) {
			d.putHead(t, lifecycle.Head{Owner: testOwner, Actor: actor, LifecycleUID: uid, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetiring, Op: retireOp(t, uid)})
		}, "failed-precondition"},
		{"fail/frozen-by-retirement-409-retirement-begun", uidN(5), func(t *testing.T, actor, uid string) {
			d.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateFrozen, Generation: 1, Op: retireOp(t, uid)})
		}, "failed-precondition"},
		{"fail/retired-409-retirement-begun", uidN(6), func(t *testing.T, actor, uid string) {
			d.putGate(t, lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateRetired, Generation: 1, Op: retireOp(t, uid)})
		}, "permission-denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			actor := "r" + tc.uid[len(tc.uid)-4:]
			tc.setup(t, actor, tc.uid)
			w := d.s.Writes()
			a := d.post(t, http.MethodPost, d.body(t, acct, actor, tc.uid), nil)
			if a.status != 409 || a.body["code"] != tc.code || a.body["retirementBegun"] != true || a.body["outcome"] != "not-executed" {
				t.Fatalf("answer %d %s", a.status, a.raw)
			}
			if d.s.Writes() != w {
				t.Fatal("a refused activation wrote")
			}
		})
	}
	t.Run("fail/plane-not-held-503", func(t *testing.T) {
		d.lost.Store(true)
		defer d.lost.Store(false)
		a := d.post(t, http.MethodPost, d.body(t, acct, "fenced", uidN(7)), nil)
		if a.status != 503 || a.body["code"] != "unavailable" || a.body["outcome"] != "not-executed" || a.body["activated"] != nil {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
	t.Run("fail/plane-lost-mid-saga-503-unknown", func(t *testing.T) {
		checks := 0
		d.setOnHeld(func() {
			if checks++; checks == 3 {
				d.lost.Store(true)
			}
		})
		defer func() { d.setOnHeld(nil); d.lost.Store(false) }()
		a := d.post(t, http.MethodPost, d.body(t, acct, "halfway", uidN(8)), nil)
		if a.status != 503 || a.body["code"] != "unavailable" || a.body["outcome"] != "unknown" {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
	t.Run("ok/retry-finishes", func(t *testing.T) {
		a := d.post(t, http.MethodPost, d.body(t, acct, "halfway", uidN(8)), nil)
		if a.status != 200 || a.body["activated"] != true || a.body["alreadyActive"] != nil {
			t.Fatalf("answer %d %s", a.status, a.raw)
		}
	})
}

// TestRefusalAnswerNonNative: a failure that is not the authority's own is 500 "unknown".
func TestRefusalAnswerNonNative(t *testing.T) {
	status, body := refusalAnswer(ActivateResult{Outcome: OutcomeNotExecuted}, errors.New("boom"))
	b, _ := json.Marshal(body)
	if status != 500 || !bytes.Contains(b, []byte(`"outcome":"unknown"`)) || bytes.Contains(b, []byte("activated")) {
		t.Fatalf("non-native failure = %d %s", status, b)
	}
}
