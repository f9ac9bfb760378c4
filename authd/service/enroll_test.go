package service_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/authclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// register runs the remote manager's start against m's authd: prepare, the instance lease taken
// with the supervisor credential, activate (loopback, with the cap). It returns the current
// registration proof at serve epoch 0.
func (m *msa) register(t *testing.T) string {
	t.Helper()
	h := m.h
	r, mat := m.call(t, true, idpSub, m.req(managerauthority.OpPrepare))
	want(t, r, http.StatusOK, "")
	nc, _ := m.connect(t, mat.Credentials.Supervisor.JWT, m.kps[0])
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names, _ := space.NewNames(sp)
	kv, err := js.KeyValue(ctxT(t), must(names.Bucket(space.Manager)))
	if err != nil {
		t.Fatal(err)
	}
	row, err := lifecycle.EncodeManagerLease(lifecycle.ManagerLease{Holder: must(lifecycle.ServePrincipal(h.owner, m.iid)), InstanceID: m.iid,
		Runtime: "pty", Root: "/srv/m", PID: 7, Since: time.Now().UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctxT(t), must(space.ManagerLeaseKey(m.iid)), row); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	req := m.req(managerauthority.OpActivate)
	req.RegistrationProof = mat.NextRegistrationProof
	r, mat = m.call(t, true, idpSub, req)
	want(t, r, http.StatusOK, "")
	return mat.NextRegistrationProof
}

// enrollReq is an enrollment request of the registered instance for target.
func (m *msa) enrollReq(proof string, target map[string]any) map[string]any {
	return map[string]any{"v": 1, "kind": managerauthority.KindEnrollment, "space": sp, "actor": "cli", "instanceId": m.iid,
		"managerLifecycleUid": m.muid, "requestId": "enroll-1", "registrationProof": proof, "serveEpoch": 0, "identities": m.ids,
		"target": target}
}

// enroll posts an enrollment (public face when there is one, else loopback) and decodes a 200.
func (m *msa) enroll(t *testing.T, proof string, target map[string]any) (reply, *managerauthority.Enrollment) {
	t.Helper()
	r, _ := m.call(t, m.pub == "", idpSub, m.enrollReq(proof, target))
	if r.status != http.StatusOK {
		return r, nil
	}
	var e managerauthority.Enrollment
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("enrollment %s: %v", r.body, err)
	}
	return r, &e
}

// provisionerJS is a JetStream context on a one-shot provisioner credential (managerd's signer
// identity): it reads consumers, the ACL rows and creates a role queue.
func (m *msa) provisionerJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	e := m.h.e
	c, err := signerclient.Dial(signerclient.Config{Addr: e.sg.Addr, TLS: e.sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: sp, Profile: signerv1.Profile_PROFILE_PROVISIONER, NatsURL: e.url})
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

// enrolledFootprint reports which of uid's dm_ and dlv_ durables and ACL row exist on the broker.
func enrolledFootprint(t *testing.T, js jetstream.JetStream, owner, actor, uid string) (dm, dlv, acl bool) {
	t.Helper()
	n, _ := space.NewNames(sp)
	exists := func(stream, name string) bool {
		_, err := js.Consumer(ctxT(t), stream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return false
		}
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		return true
	}
	dm = exists(n.DMStream(), must(n.DMConsumer(owner, actor, uid)))
	dlv = exists(n.DLVStream(), must(n.DlvConsumer(owner, actor, uid)))
	kv, err := js.KeyValue(ctxT(t), must(n.Bucket(space.ACL)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(ctxT(t), must(space.ACLKey(owner, actor, uid)))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		t.Fatalf("acl row: %v", err)
	default:
		acl = true
	}
	return dm, dlv, acl
}

// reservedFor lists the uids the lifecycle store reserves for owner.actor.
func (m *msa) reservedFor(t *testing.T, owner, actor string) []string {
	t.Helper()
	st := m.h.e.lifecycleStore(t)
	keys, err := st.Keys(ctxT(t), space.Records, "uid.")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		uid := strings.TrimPrefix(k, "uid.")
		r, _, found, err := st.Reservation(ctxT(t), uid)
		if err != nil || !found {
			t.Fatalf("reservation %s: found %v err %v", uid, found, err)
		}
		if r.Owner == owner && r.Actor == actor {
			out = append(out, uid)
		}
	}
	return out
}

// TestManagedAgentEnrollment is issue 25 item 4's enrollment writer through authd's real service
// (real signerd, embedded broker, fake IdP): the managed row, the reserved uid, the durables and
// ACL row on the broker, the answer; a replay, another digest, clamped lists, a role beyond the
// supervising row, a provisioning failure; and the enrolled agent exchanging its actor token at
// the answered public base and connecting through the callout with the answered sentinel.
func TestManagedAgentEnrollment(t *testing.T) {
	m := newMSA(t)
	h := m.h
	// The supervising row: supervise, spawn, the role worker; reads general and team.*, writes general.
	if err := h.led.Put(ledger.Interactive, ledger.Row{Ver: ledger.Version, Owner: h.owner, Actor: "cli",
		Scope: []string{"supervise", "spawn", "role:worker"}, AllowSubscribe: []string{"general", "team.*"}, AllowPublish: []string{"general"},
		LifecycleUID: newUID(t), GrantedAt: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	proof := m.register(t)
	js := m.provisionerJS(t)
	gs, err := h.api.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: sp})
	if err != nil {
		t.Fatal(err)
	}
	tok, hash, err := ledger.NewActorToken()
	if err != nil {
		t.Fatal(err)
	}
	bob := map[string]any{"actor": "bob", "tokenHash": hash, "label": "reviewer bot", "subscribe": []string{"general"}}

	var got *managerauthority.Enrollment
	t.Run("ok/enroll writes the row, reserves the uid, provisions the durables and answers the coordinate", func(t *testing.T) {
		r, e := m.enroll(t, proof, bob)
		want(t, r, http.StatusOK, "")
		got = e
		if e.Owner != h.owner || e.Actor != "bob" || space.ValidateUID(e.LifecycleUID) != nil || e.AgentBearerExchangeURL != h.s.PublicURL() ||
			e.AgentBearerExchangeURL != "https://auth.example/t" || !slices.Equal(e.Subscribe, []string{"general"}) ||
			!slices.Equal(e.AllowSubscribe, []string{"general"}) || !slices.Equal(e.AllowPublish, []string{"general"}) {
			t.Fatalf("enrollment %s", r.body)
		}
		sentinel, err := jwt.ParseDecoratedJWT([]byte(e.SentinelCreds))
		if err != nil || sentinel != gs.GetSentinelJwt() {
			t.Fatalf("sentinel creds hold %v (err %v), not GetSpace's sentinel", sentinel != "", err)
		}
		if kp, err := jwt.ParseDecoratedUserNKey([]byte(e.SentinelCreds)); err != nil || kp == nil {
			t.Fatalf("sentinel creds seed: %v", err)
		}
		row, kind, err := h.led.Get(h.owner, "bob")
		if err != nil || kind != ledger.Managed || row.Parent != h.owner+".cli" || row.TokenHash != hash || row.LifecycleUID != e.LifecycleUID ||
			row.Label != "reviewer bot" || !slices.Equal(row.AllowSubscribe, []string{"general"}) || len(row.Scope) != 0 {
			t.Fatalf("row %+v kind %s err %v", row, kind, err)
		}
		res, _, found, err := h.e.lifecycleStore(t).Reservation(ctxT(t), e.LifecycleUID)
		if err != nil || !found || res.Owner != h.owner || res.Actor != "bob" || res.MintedBy != "auth-service:"+sp {
			t.Fatalf("reservation %+v found %v err %v", res, found, err)
		}
		if dm, dlv, acl := enrolledFootprint(t, js, h.owner, "bob", e.LifecycleUID); !dm || !dlv || !acl {
			t.Fatalf("footprint dm %v dlv %v acl %v", dm, dlv, acl)
		}
	})
	if got == nil {
		t.FailNow()
	}
	t.Run("ok/the same digest answers the same uid", func(t *testing.T) {
		r, e := m.enroll(t, proof, bob)
		want(t, r, http.StatusOK, "")
		if e.LifecycleUID != got.LifecycleUID || !slices.Equal(e.AllowSubscribe, got.AllowSubscribe) {
			t.Fatalf("replay %s, want uid %s", r.body, got.LifecycleUID)
		}
		if uids := m.reservedFor(t, h.owner, "bob"); len(uids) != 1 || uids[0] != got.LifecycleUID {
			t.Fatalf("reservations of bob %v", uids)
		}
	})
	t.Run("ok/concurrent enrollments of one alias are serialized: one uid", func(t *testing.T) {
		const n = 4
		type res struct {
			status int
			uid    string
		}
		out := make(chan res, n)
		for range n {
			go func() {
				var got res // sent even if a helper's t.Fatal ends the goroutine early
				defer func() { out <- got }()
				r, e := m.enroll(t, proof, map[string]any{"actor": "hank", "tokenHash": strings.Repeat("9", 64)})
				got.status = r.status
				if e != nil {
					got.uid = e.LifecycleUID
				}
			}()
		}
		var uids []string
		for range n {
			r := <-out
			if r.status != http.StatusOK {
				t.Fatalf("status %d", r.status)
			}
			uids = append(uids, r.uid)
		}
		if distinct := slices.Compact(slices.Sorted(slices.Values(uids))); len(distinct) != 1 || distinct[0] == "" {
			t.Fatalf("uids %v", uids)
		}
		if got := m.reservedFor(t, h.owner, "hank"); len(got) != 1 || got[0] != uids[0] {
			t.Fatalf("reservations of hank %v, answered %v", got, uids)
		}
	})
	t.Run("fail/another digest for the alias is conflict", func(t *testing.T) {
		other := map[string]any{"actor": "bob", "tokenHash": strings.Repeat("c", 64)}
		r, _ := m.enroll(t, proof, other)
		want(t, r, http.StatusConflict, "conflict")
		row, _, err := h.led.Get(h.owner, "bob")
		if err != nil || row.TokenHash != hash || row.LifecycleUID != got.LifecycleUID {
			t.Fatalf("row %+v err %v", row, err)
		}
	})
	t.Run("fail/an interactive alias is conflict", func(t *testing.T) {
		r, _ := m.enroll(t, proof, map[string]any{"actor": "cli", "tokenHash": strings.Repeat("d", 64)})
		want(t, r, http.StatusConflict, "conflict")
	})
	t.Run("ok/lists beyond the supervising row are clamped to it", func(t *testing.T) {
		r, e := m.enroll(t, proof, map[string]any{"actor": "dave", "tokenHash": strings.Repeat("e", 64),
			"capabilities": []string{"spawn", "admin"}, "subscribe": []string{"general", "ops.x"},
			"allowSubscribe": []string{"general", "team.x", "ops.x", "ops.>"}, "allowPublish": []string{"general", "team.x"}})
		want(t, r, http.StatusOK, "")
		if !slices.Equal(e.Subscribe, []string{"general"}) || !slices.Equal(e.AllowSubscribe, []string{"general", "team.x"}) ||
			!slices.Equal(e.AllowPublish, []string{"general"}) {
			t.Fatalf("enrollment %s", r.body)
		}
		row, _, err := h.led.Get(h.owner, "dave")
		if err != nil || !slices.Equal(row.Scope, []string{"spawn"}) || !slices.Equal(row.AllowSubscribe, e.AllowSubscribe) ||
			!slices.Equal(row.AllowPublish, e.AllowPublish) {
			t.Fatalf("row %+v err %v", row, err)
		}
	})
	t.Run("fail/a role the supervising row does not delegate is permission-denied", func(t *testing.T) {
		r, _ := m.enroll(t, proof, map[string]any{"actor": "erin", "tokenHash": strings.Repeat("f", 64), "role": "reviewer"})
		want(t, r, http.StatusForbidden, "permission-denied")
		if _, _, err := h.led.Get(h.owner, "erin"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("row of erin: %v", err)
		}
		// Refused before anything was written: no uid reserved, no head.
		if uids := m.reservedFor(t, h.owner, "erin"); len(uids) != 0 {
			t.Fatalf("reservations of erin %v", uids)
		}
		if _, _, found, err := h.e.lifecycleStore(t).Head(ctxT(t), h.owner, "erin"); err != nil || found {
			t.Fatalf("head of erin found %v err %v", found, err)
		}
	})
	t.Run("fail/a provisioning failure leaves no row and no durables", func(t *testing.T) {
		// A real fault: the role queue svc_worker exists in another shape, so provisioning
		// refuses (provision.ErrConflict).
		n, _ := space.NewNames(sp)
		cfg, err := provision.RoleQueue(n, "worker")
		if err != nil {
			t.Fatal(err)
		}
		cfg.AckWait = 7 * time.Second
		if _, err := js.CreateConsumer(ctxT(t), n.TaskStream(), cfg); err != nil {
			t.Fatal(err)
		}
		r, _ := m.enroll(t, proof, map[string]any{"actor": "frank", "tokenHash": strings.Repeat("1", 64), "role": "worker"})
		want(t, r, http.StatusPreconditionFailed, "failed-precondition")
		if _, _, err := h.led.Get(h.owner, "frank"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("row of frank: %v", err)
		}
		uids := m.reservedFor(t, h.owner, "frank")
		if len(uids) != 1 {
			t.Fatalf("reservations of frank %v", uids)
		}
		if dm, dlv, acl := enrolledFootprint(t, js, h.owner, "frank", uids[0]); dm || dlv || acl {
			t.Fatalf("footprint left: dm %v dlv %v acl %v", dm, dlv, acl)
		}
		// The enrollment had activated the lifecycle; its undo retired it, so the alias is free.
		if head, _, found, err := h.e.lifecycleStore(t).Head(ctxT(t), h.owner, "frank"); err != nil || !found ||
			head.State != lifecycle.HeadRetired || head.LifecycleUID != uids[0] {
			t.Fatalf("head of frank %+v found %v err %v, want retired at %s", head, found, err, uids[0])
		}
		// The undo ran: the row revoked and the lifecycle deprovisioned, both without error.
		undone := false
		for _, l := range strings.Split(m.logs.String(), "\n") {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) != nil || line["msg"] != "enroll: undone" {
				continue
			}
			if line["actor"] != "frank" || line["uid"] != uids[0] || line["undo_err"] != nil {
				t.Fatalf("undo line %s", l)
			}
			undone = true
		}
		if !undone {
			t.Fatal("no undo logged")
		}
	})
	t.Run("fail/a wrong registration proof writes nothing", func(t *testing.T) {
		r, _ := m.enroll(t, "sha256:"+strings.Repeat("0", 64), map[string]any{"actor": "gina", "tokenHash": strings.Repeat("2", 64)})
		want(t, r, http.StatusForbidden, "permission-denied")
		if uids := m.reservedFor(t, h.owner, "gina"); len(uids) != 0 {
			t.Fatalf("reservations of gina %v", uids)
		}
	})
	t.Run("ok/the agent exchanges at the public base and connects through the callout", func(t *testing.T) {
		// m.pub is what the proxy publishes at got.AgentBearerExchangeURL.
		c, err := authclient.New(authclient.Config{URL: m.pub, Owner: h.owner, Actor: "bob", ActorToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		sentinel, err := jwt.ParseDecoratedJWT([]byte(got.SentinelCreds))
		if err != nil {
			t.Fatal(err)
		}
		opts, err := c.NatsOptions(sentinel)
		if err != nil {
			t.Fatalf("exchange: %v", err)
		}
		nc, err := nats.Connect(h.e.url, append(opts, nats.NoReconnect())...)
		if err != nil {
			t.Fatalf("connect through the callout: %v", err)
		}
		defer nc.Close()
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		head, _, found, err := h.e.lifecycleStore(t).Head(ctxT(t), h.owner, "bob")
		if err != nil || !found || head.State != lifecycle.HeadActive || head.LifecycleUID != got.LifecycleUID {
			t.Fatalf("head %+v found %v err %v", head, found, err)
		}
	})
	t.Run("fail/an enrollment while the alias is active at its uid with another digest is conflict", func(t *testing.T) {
		r, _ := m.enroll(t, proof, map[string]any{"actor": "bob", "tokenHash": strings.Repeat("3", 64)})
		want(t, r, http.StatusConflict, "conflict")
	})
}

// TestManagedAgentEnrollmentNoPublicFace: an authd without a public face refuses enrollment
// (failed-precondition) once the request is authorized, and writes nothing.
func TestManagedAgentEnrollmentNoPublicFace(t *testing.T) {
	m := newMSAFace(t, false)
	h := m.h
	if h.s.PublicURL() != "" {
		t.Fatalf("public url %q", h.s.PublicURL())
	}
	proof := m.register(t)
	t.Run("fail/no public face is failed-precondition", func(t *testing.T) {
		r, _ := m.enroll(t, proof, map[string]any{"actor": "bob", "tokenHash": strings.Repeat("a", 64)})
		want(t, r, http.StatusPreconditionFailed, "failed-precondition")
		if !strings.Contains(r.Error, "public") {
			t.Fatalf("refusal %q does not name the public face", r.Error)
		}
		if _, _, err := h.led.Get(h.owner, "bob"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("row of bob: %v", err)
		}
		if uids := m.reservedFor(t, h.owner, "bob"); len(uids) != 0 {
			t.Fatalf("reservations of bob %v", uids)
		}
	})
}
