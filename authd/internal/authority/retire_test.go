package authority

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
)

var doorCap = "Bearer " + strings.Repeat("ab", 32)

// doorPost sends body to h as a well-formed loopback call and returns the status and body.
func doorPost(t *testing.T, h http.Handler, method, body string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(method, "/managed-lifecycle/retire", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", doorCap)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, strings.TrimSpace(string(b))
}

func coordJSON(owner, actor, uid string) string {
	return `{"owner":"` + owner + `","actor":"` + actor + `","lifecycleUid":"` + uid + `"}`
}

// managedRow grants owner.actor as a managed agent at uid.
func managedRow(t *testing.T, l *ledger.Ledger, owner, actor, uid string) {
	t.Helper()
	_, hash, err := ledger.NewActorToken()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Get(owner, "alice"); errors.Is(err, ledger.ErrNoRow) {
		if err := l.Put(ledger.Interactive, ledger.Row{Ver: 1, Owner: owner, Actor: "alice", Scope: []string{"spawn"}, AllowSubscribe: []string{}, AllowPublish: []string{},
			LifecycleUID: strings.Repeat("f", 26), GrantedAt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Put(ledger.Managed, ledger.Row{Ver: 1, Owner: owner, Actor: actor, Scope: []string{}, AllowSubscribe: []string{}, AllowPublish: []string{},
		Parent: owner + ".alice", TokenHash: hash, LifecycleUID: uid, GrantedAt: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestRetireDoor: the door's guards, its checks before the head table, and every row of the
// table with its exact body.
func TestRetireDoor(t *testing.T) {
	s, _, _ := provisioned(t)
	a := testAuthority(t, s, nil)
	h := a.RetireDoor([]byte(doorCap))
	op2, _ := lifecycle.ManagedRetirementOpID(tUID2)
	owner2 := "u_" + strings.Repeat("b", 26)
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T)
		method string
		body   string
		status int
		want   string // the exact body, or a substring of a refusal
	}{
		{name: "fail/get", method: http.MethodGet, body: coordJSON(tOwner, tActor, tUID), status: 405},
		{name: "fail/unknown-field", body: `{"owner":"` + tOwner + `","actor":"probe","lifecycleUid":"` + tUID + `","x":"y"}`, status: 400},
		{name: "fail/platform-owner", body: coordJSON("p_"+strings.Repeat("a", 26), tActor, tUID), status: 400},
		{name: "fail/uid-grammar", body: coordJSON(tOwner, tActor, "C"), status: 400},
		{name: "ok/absent-not-started", body: coordJSON(tOwner, tActor, tUID), status: 200,
			want: `{"retired":false,"lifecycleUid":"` + tUID + `","notStarted":true}`},
		{name: "fail/managed-grant-still-at-the-uid", setup: func(t *testing.T) { managedRow(t, a.cfg.Ledger, tOwner, "held", tUID) },
			body: coordJSON(tOwner, "held", tUID), status: 409, want: "revoke it first"},
		{name: "ok/managed-grant-at-another-uid-ignored", setup: func(t *testing.T) { managedRow(t, a.cfg.Ledger, tOwner, "moved", tUID2) },
			body: coordJSON(tOwner, "moved", tUID), status: 200, want: `{"retired":false,"lifecycleUid":"` + tUID + `","notStarted":true}`},
		{name: "fail/active-at-another-uid", setup: func(t *testing.T) {
			putHead(t, s, lifecycle.Head{Owner: owner2, Actor: "a1", LifecycleUID: tUID2, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadActive})
		}, body: coordJSON(owner2, "a1", tUID), status: 409, want: "active at lifecycle"},
		{name: "fail/retiring-at-another-uid", setup: func(t *testing.T) {
			putHead(t, s, lifecycle.Head{Owner: owner2, Actor: "a2", LifecycleUID: tUID2, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetiring,
				Op: &lifecycle.Op{OpID: op2, Kind: lifecycle.OpRetirement}})
		}, body: coordJSON(owner2, "a2", tUID), status: 409, want: "retiring at lifecycle"},
		{name: "ok/retired-at-another-uid-not-started", setup: func(t *testing.T) {
			putHead(t, s, lifecycle.Head{Owner: owner2, Actor: "a3", LifecycleUID: tUID2, ManagerInstance: "m", ProcessEpoch: 1, State: lifecycle.HeadRetired})
		}, body: coordJSON(owner2, "a3", tUID), status: 200, want: `{"retired":false,"lifecycleUid":"` + tUID + `","notStarted":true}`},
		{name: "ok/active-at-the-uid-retires", setup: func(t *testing.T) { activate(t, s, tOwner, tActor, tUID) },
			body: coordJSON(tOwner, tActor, tUID), status: 200, want: `{"retired":true,"lifecycleUid":"` + tUID + `"}`},
		{name: "ok/retired-at-the-uid", body: coordJSON(tOwner, tActor, tUID), status: 200,
			want: `{"retired":true,"lifecycleUid":"` + tUID + `","alreadyRetired":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(t)
			}
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			status, body := doorPost(t, h, method, tc.body)
			if status != tc.status {
				t.Fatalf("status %d (%s), want %d", status, body, tc.status)
			}
			if tc.status == 200 && body != tc.want || tc.status != 200 && !strings.Contains(body, tc.want) {
				t.Fatalf("body %s, want %s", body, tc.want)
			}
		})
	}
	retiredAt(t, s, tOwner, tActor, tUID)

	t.Run("fail/fenced-503", func(t *testing.T) {
		fenced := testAuthority(t, s, func(c *Config) { c.Held = func() error { return errors.New("fenced") } })
		r := s.Reads()
		status, body := doorPost(t, fenced.RetireDoor([]byte(doorCap)), http.MethodPost, coordJSON(tOwner, tActor, tUID))
		if status != 503 || !strings.Contains(body, `"code":"unavailable"`) || s.Reads() != r {
			t.Fatalf("fenced door: %d %s, %d reads", status, body, s.Reads()-r)
		}
	})
	t.Run("fail/store-unavailable-503", func(t *testing.T) {
		s2, _, nc2 := provisioned(t)
		down := testAuthority(t, s2, nil)
		nc2.Close()
		status, body := doorPost(t, down.RetireDoor([]byte(doorCap)), http.MethodPost, coordJSON(tOwner, tActor, tUID))
		if status != 503 || strings.Contains(body, "nats:") {
			t.Fatalf("store down: %d %s (the cause goes to the log, not the caller)", status, body)
		}
	})
}
