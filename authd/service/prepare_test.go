package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	dsvc "github.com/cotalgo/cotal/deliveryd/service"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// managedReq is a managed-agent request of kind for m's instance at epoch 0 with proof.
func (m *msa) managedReq(kind, proof string, extra map[string]any) map[string]any {
	v := map[string]any{"v": 1, "kind": kind, "space": sp, "actor": "cli", "instanceId": m.iid, "managerLifecycleUid": m.muid,
		"requestId": "r1", "registrationProof": proof, "serveEpoch": 0, "identities": m.ids}
	for k, x := range extra {
		v[k] = x
	}
	return v
}

// jsAs connects to e's broker with a credential of profile minted for daemon kind's identity.
func (e *env) jsAs(t *testing.T, kind string, profile signerv1.Profile, p *signerv1.ProfileParams) jetstream.JetStream {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.sg.Addr, TLS: e.sg.ClientFor(t, kind, sp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: sp, Profile: profile, Params: p, NatsURL: e.url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, append(rail.NatsOptions(), nats.NoReconnect())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// startDeliveryd runs a real deliveryd on e until the test ends (or the caller closes it), and
// waits until it is ready.
func (e *env) startDeliveryd(t *testing.T) *dsvc.Service {
	t.Helper()
	cf := e.sg.ClientFor(t, "deliveryd", sp)
	cfg := &dsvc.Config{Space: sp, Brokers: []string{e.url},
		Signer:   signerclient.FileConfig{Address: e.sg.Addr, CA: cf.ServerCAFile, Cert: cf.CertFile, Key: cf.KeyFile},
		StateDir: filepath.Join(t.TempDir(), "state"), Holder: "prepare-test",
		BrokerGone: yamlx.Duration(15 * time.Second), ShutdownTimeout: yamlx.Duration(5 * time.Second)}
	d, err := dsvc.Start(ctxT(t), dsvc.Inputs{Config: cfg}, dsvc.RuntimeOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("deliveryd: %v", err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// footprint is one managed agent's broker footprint as the test reads it: the provisioner's
// view of the two consumers and the ACL row, the delivery credential's of the members bucket.
type footprint struct {
	pjs              jetstream.JetStream
	members, acl     jetstream.KeyValue
	names            space.Names
	owner, actor, id string
}

func (f *footprint) key() string { return f.owner + "." + f.actor + "." + f.id }

// put writes an open membership row of the lifecycle on ch (deliveryd's row shape).
func (f *footprint) put(t *testing.T, ch string) {
	t.Helper()
	body := fmt.Sprintf(`{"channel":%q,"owner":%q,"lifecycleUid":%q,"state":"active","joinCursor":1,"generation":1,"activated":true,"writerIdentity":"test","updatedAt":1}`,
		ch, f.owner, f.id)
	if _, err := f.members.Put(ctxT(t), ch+"/"+f.key(), []byte(body)); err != nil {
		t.Fatal(err)
	}
}

// present reports which of the footprint's slots exist: "dm", "dlv", "acl" and "member:<ch>"
// for each of channels.
func (f *footprint) present(t *testing.T, channels ...string) []string {
	t.Helper()
	var out []string
	dm, _ := provision.DMDurable(f.names, f.owner, f.actor, f.id, 0)
	dlv, _ := provision.DlvDurable(f.names, f.owner, f.actor, f.id)
	for _, c := range []struct{ name, stream, durable string }{{"dm", f.names.DMStream(), dm.Durable}, {"dlv", f.names.DLVStream(), dlv.Durable}} {
		_, err := f.pjs.Consumer(ctxT(t), c.stream, c.durable)
		switch {
		case err == nil:
			out = append(out, c.name)
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			t.Fatalf("consumer %s: %v", c.durable, err)
		}
	}
	has := func(kv jetstream.KeyValue, key string) bool {
		_, err := kv.Get(ctxT(t), key)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("read %s: %v", key, err)
		}
		return err == nil
	}
	if has(f.acl, f.key()) {
		out = append(out, "acl")
	}
	for _, ch := range channels {
		if has(f.members, ch+"/"+f.key()) {
			out = append(out, "member:"+ch)
		}
	}
	return out
}

// newManagedAgent grants owner.actor a managed row (parent owner.cli, reading general and team.*),
// provisions its durables and ACL row, and activates its lifecycle.
func (m *msa) newManagedAgent(t *testing.T, actor string) (*footprint, ledger.Row) {
	t.Helper()
	h := m.h
	row := ledger.Row{Ver: ledger.Version, Owner: h.owner, Actor: actor, Scope: []string{}, AllowSubscribe: []string{"general", "team.*"},
		AllowPublish: []string{"general"}, Parent: h.owner + ".cli", TokenHash: ledger.HashActorToken("token-of-" + actor), LifecycleUID: newUID(t),
		GrantedAt: time.Now().UnixMilli()}
	if err := h.led.Put(ledger.Managed, row); err != nil {
		t.Fatal(err)
	}
	mc, err := signerclient.Dial(signerclient.Config{Addr: h.e.sg.Addr, TLS: h.e.sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if _, err := provision.RunProvisionAgent(ctxT(t), provision.Config{Signer: mc, Space: sp, NatsURL: h.e.url},
		provision.Agent{Owner: h.owner, Actor: actor, LifecycleUID: row.LifecycleUID, AllowSubscribe: row.AllowSubscribe}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if _, err := h.s.ActivateManagedLifecycle(ctxT(t), h.owner, actor, row.LifecycleUID); err != nil {
		t.Fatalf("activate: %v", err)
	}
	names, _ := space.NewNames(sp)
	pjs := h.e.jsAs(t, "managerd", signerv1.Profile_PROFILE_PROVISIONER, nil)
	djs := h.e.jsAs(t, "deliveryd", signerv1.Profile_PROFILE_DELIVERY, nil)
	f := &footprint{pjs: pjs, names: names, owner: h.owner, actor: actor, id: row.LifecycleUID}
	if f.members, err = djs.KeyValue(ctxT(t), "cotal_members_"+sp); err != nil {
		t.Fatal(err)
	}
	if f.acl, err = pjs.KeyValue(ctxT(t), "cotal_acl_"+sp); err != nil {
		t.Fatal(err)
	}
	return f, row
}

// prepareAnswer is a prepare-retirement's answer: the reply and, on 200, the decoded body.
func (m *msa) prepare(t *testing.T, proof string, f *footprint) (reply, *managerauthority.PrepareRetirementAnswer) {
	t.Helper()
	target := managerauthority.Target{Owner: f.owner, Actor: f.actor, LifecycleUID: f.id}
	r := post(t, m.pub, "", envelope(t, m.token(t, idpSub), m.managedReq(managerauthority.KindPrepareRetirement, proof,
		map[string]any{"target": target, "opId": must(lifecycle.ManagedRetirementOpID(f.id))})))
	if r.status != http.StatusOK {
		return r, nil
	}
	var ans managerauthority.PrepareRetirementAnswer
	if err := json.Unmarshal(r.body, &ans); err != nil {
		t.Fatalf("answer %s: %v", r.body, err)
	}
	if !ans.Prepared || ans.Target != target || ans.Owner != f.owner || ans.Actor != "cli" || ans.InstanceID != m.iid ||
		ans.Kind != managerauthority.KindPrepareRetirement || ans.OpID != must(lifecycle.ManagedRetirementOpID(f.id)) {
		t.Fatalf("answer %s", r.body)
	}
	return r, &ans
}

// sameCleanup fails unless got's counts are want's (Deleted by value, nil meaning unknown).
func sameCleanup(t *testing.T, got, want managerauthority.Cleanup) {
	t.Helper()
	g, w := got, want
	if (g.Deleted == nil) != (w.Deleted == nil) || (g.Deleted != nil && *g.Deleted != *w.Deleted) ||
		(g.Consumers.Deleted == nil) != (w.Consumers.Deleted == nil) || (g.Consumers.Deleted != nil && *g.Consumers.Deleted != *w.Consumers.Deleted) {
		t.Fatalf("deleted %v/%v, want %v/%v", ptr(g.Deleted), ptr(g.Consumers.Deleted), ptr(w.Deleted), ptr(w.Consumers.Deleted))
	}
	g.Deleted, w.Deleted, g.Consumers.Deleted, w.Consumers.Deleted = nil, nil, nil, nil
	slices.Sort(g.Channels)
	slices.Sort(w.Channels)
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("cleanup\n got %s\nwant %s", gb, wb)
	}
}

func ptr(p *int) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func intp(n int) *int { return &n }

// grantSupervisor re-grants m's cli row with supervise, reading general and team.* (the
// managed agents' parent).
func (m *msa) grantSupervisor(t *testing.T) {
	t.Helper()
	r := ledger.Row{Ver: ledger.Version, Owner: m.h.owner, Actor: "cli", Scope: []string{"supervise"}, AllowSubscribe: []string{"general", "team.*"},
		AllowPublish: []string{"general"}, LifecycleUID: newUID(t), GrantedAt: time.Now().UnixMilli()}
	if err := m.h.led.Put(ledger.Interactive, r); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareRetirement is issue 25 item 4's prepare-retirement writer through authd's real
// service, a real signerd, the embedded broker and a real deliveryd: it fences the ACL row, reads
// deliveryd's inventory, removes the footprint (the grant's concrete channels ∪ the inventory's)
// and then revokes the managed grant; the head is untouched; with deliveryd down it removes what
// the grant names, keeps the grant and answers unavailable, and a replay once deliveryd is back
// completes; a repeat is a no-op with zero counts.
func TestPrepareRetirement(t *testing.T) {
	m := newMSA(t)
	h := m.h
	m.grantSupervisor(t)
	proof := m.register(t)
	d := h.e.startDeliveryd(t)
	st := h.e.lifecycleStore(t)

	headOf := func(t *testing.T, f *footprint) lifecycle.Head {
		t.Helper()
		hd, _, found, err := st.Head(ctxT(t), f.owner, f.actor)
		if err != nil || !found {
			t.Fatalf("head found %v err %v", found, err)
		}
		return hd
	}
	grantAt := func(t *testing.T, f *footprint) bool {
		t.Helper()
		row, kind, err := h.led.Get(f.owner, f.actor)
		if errors.Is(err, ledger.ErrNoRow) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return kind == ledger.Managed && row.LifecycleUID == f.id
	}

	t.Run("ok/prepare removes consumers, ACL, member rows (one only the inventory found) and revokes the grant", func(t *testing.T) {
		f, _ := m.newManagedAgent(t, "bob")
		f.put(t, "general")      // the grant names it
		f.put(t, "team.backend") // only a wildcard grants it: only deliveryd's inventory finds it
		if got := f.present(t, "general", "team.backend"); !slices.Equal(got, []string{"dm", "dlv", "acl", "member:general", "member:team.backend"}) {
			t.Fatalf("before: %v", got)
		}
		before := headOf(t, f)
		r, ans := m.prepare(t, proof, f)
		want(t, r, http.StatusOK, "")
		if !ans.Revoked {
			t.Fatalf("answer %s: not revoked", r.body)
		}
		sameCleanup(t, ans.Cleanup, managerauthority.Cleanup{Examined: 5, Acknowledged: 2, Deleted: intp(5),
			Consumers: managerauthority.ConsumerCounts{Examined: 2, Acknowledged: 2, Deleted: intp(2)},
			ACL:       managerauthority.KVCounts{Examined: 1, Deleted: 1},
			Members:   managerauthority.KVCounts{Examined: 2, Deleted: 2}, Channels: []string{"general", "team.backend"}})
		if got := f.present(t, "general", "team.backend"); len(got) != 0 {
			t.Fatalf("left behind: %v", got)
		}
		if grantAt(t, f) {
			t.Fatal("the managed grant is not revoked")
		}
		if after := headOf(t, f); after != before || after.State != lifecycle.HeadActive || after.LifecycleUID != f.id {
			t.Fatalf("head %+v, was %+v", after, before)
		}

		t.Run("ok/a repeat is a no-op with zero counts", func(t *testing.T) {
			r, ans := m.prepare(t, proof, f)
			want(t, r, http.StatusOK, "")
			if ans.Revoked {
				t.Fatalf("answer %s", r.body)
			}
			sameCleanup(t, ans.Cleanup, managerauthority.Cleanup{Deleted: intp(0), Consumers: managerauthority.ConsumerCounts{Deleted: intp(0)}, Channels: []string{}})
		})
	})

	t.Run("fail/a stale proof releases nothing", func(t *testing.T) {
		f, _ := m.newManagedAgent(t, "carol")
		r, _ := m.prepare(t, "sha256:"+strings.Repeat("c", 64), f)
		want(t, r, http.StatusForbidden, "permission-denied")
		if got := f.present(t); !slices.Equal(got, []string{"dm", "dlv", "acl"}) || !grantAt(t, f) {
			t.Fatalf("after a refused prepare: %v, grant %v", got, grantAt(t, f))
		}
	})

	t.Run("fail/deliveryd down: the grant's rows are removed, the grant kept, unavailable; a replay completes", func(t *testing.T) {
		f, _ := m.newManagedAgent(t, "dave")
		f.put(t, "general")
		f.put(t, "team.backend")
		if err := d.Close(ctxT(t)); err != nil {
			t.Fatalf("stop deliveryd: %v", err)
		}
		r, _ := m.prepare(t, proof, f)
		want(t, r, http.StatusServiceUnavailable, "unavailable")
		if !strings.Contains(r.Error, "inventory") || !strings.Contains(r.Error, "kept") {
			t.Fatalf("refusal %q", r.Error)
		}
		if got := f.present(t, "general", "team.backend"); !slices.Equal(got, []string{"member:team.backend"}) {
			t.Fatalf("after the failed prepare: %v, want only the row the grant does not name", got)
		}
		if !grantAt(t, f) {
			t.Fatal("the grant was revoked although the inventory was unread")
		}
		if hd := headOf(t, f); hd.State != lifecycle.HeadActive || hd.LifecycleUID != f.id {
			t.Fatalf("head %+v", hd)
		}

		h.e.startDeliveryd(t) // returns once it serves: its delivery-admin responder is bound
		r, ans := m.prepare(t, proof, f)
		want(t, r, http.StatusOK, "")
		if !ans.Revoked {
			t.Fatalf("answer %s", r.body)
		}
		sameCleanup(t, ans.Cleanup, managerauthority.Cleanup{Examined: 5, Absent: 4, Deleted: intp(1),
			Consumers: managerauthority.ConsumerCounts{Examined: 2, Absent: 2, Deleted: intp(0)},
			ACL:       managerauthority.KVCounts{Examined: 1, Absent: 1},
			Members:   managerauthority.KVCounts{Examined: 2, Absent: 1, Deleted: 1}, Channels: []string{"general", "team.backend"}})
		if got := f.present(t, "general", "team.backend"); len(got) != 0 || grantAt(t, f) {
			t.Fatalf("after the replay: %v, grant %v", got, grantAt(t, f))
		}
	})
}

// verify posts body to the loopback face's verify-enrollment door with capHex ("" sends none).
func verify(t *testing.T, base, capHex string, body []byte, mut func(*http.Request)) reply {
	t.Helper()
	hr, err := http.NewRequest(http.MethodPost, base+exchange.VerifyEnrollmentPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if capHex != "" {
		hr.Header.Set("Authorization", "Bearer "+capHex)
	}
	if mut != nil {
		mut(hr)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, body: b}
	if resp.StatusCode != http.StatusOK {
		_ = json.Unmarshal(b, &r)
	}
	return r
}

// TestVerifyEnrollmentDoor: POST /manager-service-authority/verify-enrollment on the loopback
// face decides each of the four managed-agent kinds and writes nothing; each of the retire
// door's guards refuses; the public face has no such route.
func TestVerifyEnrollmentDoor(t *testing.T) {
	m := newMSA(t)
	h := m.h
	m.grantSupervisor(t)
	proof := m.register(t)
	f, _ := m.newManagedAgent(t, "bob")
	st := h.e.lifecycleStore(t)
	target := managerauthority.Target{Owner: h.owner, Actor: "bob", LifecycleUID: f.id}
	opID := must(lifecycle.ManagedRetirementOpID(f.id))
	body := func(owner string, req any) []byte {
		b, err := json.Marshal(map[string]any{"owner": owner, "request": req})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	enroll := m.managedReq(managerauthority.KindEnrollment, proof, map[string]any{"target": map[string]any{"actor": "erin", "tokenHash": strings.Repeat("a", 64)}})
	prep := m.managedReq(managerauthority.KindPrepareRetirement, proof, map[string]any{"target": target, "opId": opID})
	create := m.managedReq(managerauthority.KindRuntimeCreate, proof, map[string]any{"target": target})
	status := m.managedReq(managerauthority.KindRuntimeStatus, proof, map[string]any{"target": target})

	// snapshot is everything a decision could write: the ledger, the manager gate, the target's
	// head and its broker footprint.
	snapshot := func(t *testing.T) string {
		t.Helper()
		rows, err := h.led.List()
		if err != nil {
			t.Fatal(err)
		}
		g, grev, _, err := st.EndpointGate(ctxT(t), lifecycle.ManagerEndpoint, m.iid)
		if err != nil {
			t.Fatal(err)
		}
		hd, hrev, _, err := st.Head(ctxT(t), h.owner, "bob")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal([]any{rows, g, grev, hd, hrev, f.present(t)})
		return string(b)
	}
	before := snapshot(t)

	type decision struct {
		Authorized bool                     `json:"authorized"`
		Owner      string                   `json:"owner"`
		Actor      string                   `json:"actor"`
		InstanceID string                   `json:"instanceId"`
		ServeEpoch *uint64                  `json:"serveEpoch"`
		Target     *managerauthority.Target `json:"target"`
	}
	for _, tc := range []struct {
		name string
		req  any
		rt   bool
	}{{"ok/enrollment", enroll, false}, {"ok/prepare-retirement", prep, false}, {"ok/runtime create", create, true}, {"ok/runtime status", status, true}} {
		t.Run(tc.name+" is decided", func(t *testing.T) {
			r := verify(t, h.s.URL(), h.cap, body(h.owner, tc.req), nil)
			want(t, r, http.StatusOK, "")
			var d decision
			if err := json.Unmarshal(r.body, &d); err != nil {
				t.Fatal(err)
			}
			if d.Owner != h.owner || d.Actor != "cli" || d.InstanceID != m.iid {
				t.Fatalf("decision %s", r.body)
			}
			if tc.rt && (d.Authorized || d.ServeEpoch != nil || d.Target == nil || *d.Target != target) {
				t.Fatalf("runtime decision %s", r.body)
			}
			if !tc.rt && (!d.Authorized || d.ServeEpoch == nil || *d.ServeEpoch != 0 || d.Target != nil) {
				t.Fatalf("decision %s", r.body)
			}
		})
	}
	t.Run("ok/nothing was written", func(t *testing.T) {
		if after := snapshot(t); after != before {
			t.Fatalf("the decisions wrote:\nbefore %s\nafter  %s", before, after)
		}
		if !slices.Equal(f.present(t), []string{"dm", "dlv", "acl"}) {
			t.Fatalf("footprint %v", f.present(t))
		}
	})

	wrong := m.managedReq(managerauthority.KindEnrollment, "sha256:"+strings.Repeat("b", 64), map[string]any{"target": enroll["target"]})
	stale := m.managedReq(managerauthority.KindRuntimeStatus, proof, map[string]any{"target": target})
	stale["serveEpoch"] = 1
	foreign := m.managedReq(managerauthority.KindPrepareRetirement, proof, map[string]any{"target": managerauthority.Target{Owner: "u_bbbbbbbbbbbbbbbbbbbbbbbbbb", Actor: "bob", LifecycleUID: f.id}, "opId": opID})
	authReq := m.req(managerauthority.OpPrepare)
	providerRef := m.managedReq(managerauthority.KindRuntimeCreate, proof, map[string]any{"target": target, "providerRef": "p"})
	for _, tc := range []struct {
		name   string
		body   []byte
		mut    func(*http.Request)
		capHex string
		status int
		code   string
	}{
		{"fail/GET", body(h.owner, enroll), func(r *http.Request) { r.Method = http.MethodGet }, h.cap, http.StatusMethodNotAllowed, ""},
		{"fail/an Origin header", body(h.owner, enroll), func(r *http.Request) { r.Header.Set("Origin", "https://evil.example") }, h.cap, http.StatusForbidden, ""},
		{"fail/not JSON", body(h.owner, enroll), func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, h.cap, http.StatusUnsupportedMediaType, ""},
		{"fail/no cap", body(h.owner, enroll), nil, "", http.StatusUnauthorized, ""},
		{"fail/a wrong cap", body(h.owner, enroll), nil, strings.Repeat("0", 64), http.StatusUnauthorized, ""},
		{"fail/oversize", append([]byte(`{"owner":"`+strings.Repeat("a", 64<<10)), `"}`...), nil, h.cap, http.StatusRequestEntityTooLarge, ""},
		{"fail/an unknown field", []byte(`{"owner":"` + h.owner + `","request":{},"idpToken":"x"}`), nil, h.cap, http.StatusBadRequest, ""},
		{"fail/trailing data", append(body(h.owner, enroll), []byte(`{}`)...), nil, h.cap, http.StatusBadRequest, ""},
		{"fail/no request", []byte(`{"owner":"` + h.owner + `"}`), nil, h.cap, http.StatusBadRequest, "bad-request"},
		{"fail/a platform owner", body("p_acme", enroll), nil, h.cap, http.StatusBadRequest, "bad-request"},
		{"fail/the authority kind", body(h.owner, authReq), nil, h.cap, http.StatusBadRequest, "bad-request"},
		{"fail/a runtime request naming a provider reference", body(h.owner, providerRef), nil, h.cap, http.StatusBadRequest, "bad-request"},
		{"fail/a wrong registration proof", body(h.owner, wrong), nil, h.cap, http.StatusForbidden, "permission-denied"},
		{"fail/a stale serve epoch", body(h.owner, stale), nil, h.cap, http.StatusConflict, "conflict"},
		{"fail/another owner's target", body(h.owner, foreign), nil, h.cap, http.StatusForbidden, "permission-denied"},
		{"fail/an owner without the supervise row", body("u_cccccccccccccccccccccccccc", enroll), nil, h.cap, http.StatusForbidden, "permission-denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := verify(t, h.s.URL(), tc.capHex, tc.body, tc.mut)
			want(t, r, tc.status, tc.code)
			if r.Error == "" {
				t.Fatalf("refusal without a sentence: %s", r.body)
			}
		})
	}
	t.Run("fail/the public face has no such route", func(t *testing.T) {
		r := verify(t, m.pub, "", body(h.owner, enroll), nil)
		want(t, r, http.StatusNotFound, "")
		r = verify(t, m.pub, h.cap, body(h.owner, enroll), nil)
		want(t, r, http.StatusNotFound, "")
	})
	t.Run("ok/still nothing written", func(t *testing.T) {
		if after := snapshot(t); after != before {
			t.Fatalf("the refusals wrote:\nbefore %s\nafter  %s", before, after)
		}
	})
}
