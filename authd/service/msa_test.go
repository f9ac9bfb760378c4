package service_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/authd/service"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// msa is a running authd (real signerd, embedded broker, fake IdP) with its public face on, the
// IdP's owner holding an interactive row cli with supervise, and one remote manager instance's
// caller-side identity: the instance id, the manager's lifecycle uid and five user nkeys.
type msa struct {
	h       *human
	logs    *testkit.SyncBuffer
	pub     string // the public face's base URL
	account string
	iid     string
	muid    string
	kps     [5]nkeys.KeyPair
	ids     managerauthority.Identities
}

func newMSA(t *testing.T) *msa { return newMSAFace(t, true) }

// newMSAFace is newMSA with the public face on or off (pub "" then).
func newMSAFace(t *testing.T, public bool) *msa {
	t.Helper()
	logs := &testkit.SyncBuffer{}
	h := newHumanWith(t, newEnv(t), true, func(c *config.Config) *config.Config {
		if public {
			c.PublicListen, c.PublicURL = "127.0.0.1:0", "https://auth.example/t"
		}
		return c
	}, func(_ *service.Inputs, o *service.RuntimeOptions) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	m := &msa{h: h, logs: logs}
	if public {
		m.pub = "http://" + publicAddr(t, logs)
	}
	resp, err := h.api.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: sp})
	if err != nil {
		t.Fatal(err)
	}
	m.account = resp.GetAccountPublicKey()
	m.grant(t, h.owner, "cli", "supervise")
	m.iid, m.muid = newUID(t), newUID(t)
	var pubs [5]string
	for i := range m.kps {
		if m.kps[i], err = nkeys.CreateUser(); err != nil {
			t.Fatal(err)
		}
		pubs[i], _ = m.kps[i].PublicKey()
	}
	m.ids = managerauthority.Identities{Supervisor: managerauthority.Identity{ID: pubs[0]}, Executor: managerauthority.Identity{ID: pubs[1]},
		Serve: managerauthority.Identity{ID: pubs[2]}, GoalWriter: managerauthority.Identity{ID: pubs[3]}, SessionLedger: managerauthority.Identity{ID: pubs[4]}}
	return m
}

func newUID(t *testing.T) string {
	t.Helper()
	u, err := admin.NewLifecycleUID()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// grant writes an interactive row owner.actor with scope.
func (m *msa) grant(t *testing.T, owner, actor string, scope ...string) {
	t.Helper()
	r := ledger.Row{Ver: ledger.Version, Owner: owner, Actor: actor, Scope: scope, AllowSubscribe: []string{"general"},
		AllowPublish: []string{"general"}, LifecycleUID: newUID(t), GrantedAt: time.Now().UnixMilli()}
	if err := m.h.led.Put(ledger.Interactive, r); err != nil {
		t.Fatal(err)
	}
}

// token is an IdP token of subject sub.
func (m *msa) token(t *testing.T, sub string) string {
	return m.h.idp.Token(t, m.h.idp.Claims(sub, time.Now(), time.Hour), nil)
}

// req is a manager-service-authority request of op for the instance.
func (m *msa) req(op managerauthority.Operation) managerauthority.Request {
	return managerauthority.Request{V: 1, Kind: managerauthority.KindAuthority, Operation: op, Space: sp, Actor: "cli",
		InstanceID: m.iid, ManagerLifecycleUID: m.muid, RequestID: "req-" + string(op), Identities: m.ids}
}

// reply is an answer: the status, the raw body and, for a refusal, its error and code.
type reply struct {
	status int
	body   []byte
	Error  string `json:"error"`
	Code   string `json:"code"`
}

// post sends body to base's /manager-service-authority with capability capHex ("" sends none).
func post(t *testing.T, base, capHex string, body []byte) reply {
	t.Helper()
	hr, err := http.NewRequest(http.MethodPost, base+managerauthority.Path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if capHex != "" {
		hr.Header.Set("Authorization", "Bearer "+capHex)
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

// envelope marshals {idpToken, request}.
func envelope(t *testing.T, token string, req any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"idpToken": token, "request": req})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// call posts req with sub's IdP token on the public face (loopback false) or the loopback face
// with its cap, and decodes a 200 into Material.
func (m *msa) call(t *testing.T, loopback bool, sub string, req any) (reply, *managerauthority.Material) {
	t.Helper()
	base, capHex := m.pub, ""
	if loopback {
		base, capHex = m.h.s.URL(), m.h.cap
	}
	r := post(t, base, capHex, envelope(t, m.token(t, sub), req))
	if r.status != http.StatusOK {
		return r, nil
	}
	var mat managerauthority.Material
	if err := json.Unmarshal(r.body, &mat); err != nil {
		t.Fatalf("material %s: %v", r.body, err)
	}
	return r, &mat
}

func want(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status || (code != "" && r.Code != code) {
		t.Fatalf("answer %d %s, want %d %s", r.status, r.body, status, code)
	}
}

// userClaims decodes a credential and checks it was issued to pub.
func userClaims(t *testing.T, c *managerauthority.Credential, pub string) *jwt.UserClaims {
	t.Helper()
	if c == nil || c.JWT == "" {
		t.Fatal("no credential")
	}
	uc, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Subject != pub || uc.Expires != c.Exp {
		t.Fatalf("credential sub %s exp %d, want %s %d", uc.Subject, uc.Expires, pub, c.Exp)
	}
	return uc
}

// connect connects the broker with jwtStr and kp, collecting async errors on errs.
func (m *msa) connect(t *testing.T, jwtStr string, kp nkeys.KeyPair) (*nats.Conn, chan error) {
	t.Helper()
	pub, _ := kp.PublicKey()
	errs := make(chan error, 16)
	nc, err := nats.Connect(m.h.e.url, nats.UserJWT(func() (string, error) { return jwtStr, nil }, kp.Sign),
		nats.CustomInboxPrefix("_INBOX_"+pub), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// refused publishes subject on nc and waits for the broker's permissions violation.
func refused(t *testing.T, nc *nats.Conn, errs chan error, subject string) {
	t.Helper()
	if err := nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation") || !strings.Contains(err.Error(), subject) {
			t.Fatalf("broker error %v, want a publish violation on %s", err, subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no permissions violation for %s", subject)
	}
}

// TestManagerServiceAuthority is issue 25 items 2 and 3 through authd's real service: prepare on
// the public face mints a remote-manager credential that connects and holds only its own lease;
// activate (loopback, with the cap) registers the serve principal and answers the epoch, the
// account and the current registration proof; renew and retire pass the one current-registration
// check; every refusal has its status and code.
func TestManagerServiceAuthority(t *testing.T) {
	m := newMSA(t)
	h := m.h
	serve := must(lifecycle.ServePrincipal(h.owner, m.iid))
	names, _ := space.NewNames(sp)
	supPub := m.ids.Supervisor.ID

	var activation string
	var supJWT string
	t.Run("ok/prepare mints the remote-manager credential and answers the activation proof", func(t *testing.T) {
		r, mat := m.call(t, false, idpSub, m.req(managerauthority.OpPrepare))
		want(t, r, http.StatusOK, "")
		uc := userClaims(t, mat.Credentials.Supervisor, supPub)
		if !slices.Contains(uc.Tags, "profile:remote-manager") || !slices.Contains(uc.Tags, "principal:"+h.owner+".manager_"+m.iid) {
			t.Fatalf("tags %v", uc.Tags)
		}
		if exp := time.Unix(uc.Expires, 0).Sub(time.Unix(uc.IssuedAt, 0)); exp != 24*time.Hour {
			t.Fatalf("lifetime %v, want 24h", exp)
		}
		req := m.req(managerauthority.OpPrepare)
		activation = must(managerauthority.ActivationProof(sp, h.owner, &req))
		if mat.NextRegistrationProof != activation || mat.Owner != h.owner || mat.Actor != "cli" || mat.InstanceID != m.iid ||
			mat.LifecycleUID != m.muid || mat.Actors.Serve != "manager_serve_"+m.iid || mat.ExpiresAt != uc.Expires || mat.Credentials.RetirementRequester != nil {
			t.Fatalf("material %+v", mat)
		}
		supJWT = mat.Credentials.Supervisor.JWT
	})

	t.Run("ok/the credential connects and takes its instance lease", func(t *testing.T) {
		nc, _ := m.connect(t, supJWT, m.kps[0])
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctxT(t), must(names.Bucket(space.Manager)))
		if err != nil {
			t.Fatal(err)
		}
		row, err := lifecycle.EncodeManagerLease(lifecycle.ManagerLease{Holder: serve, InstanceID: m.iid, Runtime: "pty", Root: "/srv/m", PID: 7, Since: time.Now().UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctxT(t), must(space.ManagerLeaseKey(m.iid)), row); err != nil {
			t.Fatalf("create lease: %v", err)
		}
	})
	t.Run("fail/the credential is refused what a remote manager must not do", func(t *testing.T) {
		nc, errs := m.connect(t, supJWT, m.kps[0])
		for _, subj := range []string{
			must(names.KV(space.Manager, must(space.ManagerLeaseKey(newUID(t))))),
			must(names.KV(space.Manager, space.ManagerRenewalKey)),
			must(names.CtlDeliveryAdmin(h.owner, "manager_"+m.iid)),
			must(names.RegisterManager(h.owner, "manager_"+m.iid, "nonce1234")),
		} {
			refused(t, nc, errs, subj)
		}
	})

	t.Run("fail/activate with another proof", func(t *testing.T) {
		req := m.req(managerauthority.OpActivate)
		req.RegistrationProof = "sha256:" + strings.Repeat("0", 64)
		r, _ := m.call(t, true, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/activate without the cap on the loopback face", func(t *testing.T) {
		req := m.req(managerauthority.OpActivate)
		req.RegistrationProof = activation
		want(t, post(t, h.s.URL(), "", envelope(t, m.token(t, idpSub), req)), http.StatusUnauthorized, "unauthenticated")
	})

	var proof0 string
	t.Run("ok/activate registers the serve principal and answers the current proof", func(t *testing.T) {
		req := m.req(managerauthority.OpActivate)
		req.RegistrationProof = activation
		r, mat := m.call(t, true, idpSub, req)
		want(t, r, http.StatusOK, "")
		if mat.ProcessEpoch == nil || *mat.ProcessEpoch != 0 || mat.AccountPublicKey != m.account || !lifecycle.IsProof(mat.NextRegistrationProof) ||
			mat.NextRegistrationProof == activation || mat.Credentials.Supervisor != nil {
			t.Fatalf("material %s", r.body)
		}
		if strings.Contains(string(r.body), activation) {
			t.Fatal("the activate answer carries the activation proof")
		}
		g, _, found, err := h.e.lifecycleStore(t).EndpointGate(ctxT(t), lifecycle.ManagerEndpoint, m.iid)
		if err != nil || !found || g.State != lifecycle.GateOpen || g.Principal != serve || g.ProcessEpoch != 0 {
			t.Fatalf("gate %+v found %v err %v", g, found, err)
		}
		if mat.RegistrationRevision == nil || *mat.RegistrationRevision == 0 || *mat.RegistrationRevision != g.RegistrationRevision {
			t.Fatalf("registrationRevision %v, want the gate's %d", mat.RegistrationRevision, g.RegistrationRevision)
		}
		proof0 = mat.NextRegistrationProof
	})

	renew := func(epoch uint64, proof string) managerauthority.Request {
		req := m.req(managerauthority.OpRenew)
		req.ProcessEpoch, req.RegistrationProof = &epoch, proof
		return req
	}
	t.Run("ok/renew mints a fresh credential under the current registration", func(t *testing.T) {
		r, mat := m.call(t, false, idpSub, renew(0, proof0))
		want(t, r, http.StatusOK, "")
		uc := userClaims(t, mat.Credentials.Supervisor, supPub)
		if !slices.Contains(uc.Tags, "profile:remote-manager") || mat.RegistrationProof != proof0 || *mat.ProcessEpoch != 0 {
			t.Fatalf("material %s", r.body)
		}
	})
	t.Run("fail/renew with a wrong proof", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, renew(0, "sha256:"+strings.Repeat("a", 64)))
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/renew with the activation proof", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, renew(0, activation))
		want(t, r, http.StatusForbidden, "permission-denied")
	})

	target := managerauthority.Target{Owner: h.owner, Actor: "bob", LifecycleUID: newUID(t)}
	managed := func(kind, proof string, extra map[string]any) map[string]any {
		v := map[string]any{"v": 1, "kind": kind, "space": sp, "actor": "cli", "instanceId": m.iid, "managerLifecycleUid": m.muid,
			"requestId": "r1", "registrationProof": proof, "serveEpoch": 0, "identities": m.ids}
		for k, x := range extra {
			v[k] = x
		}
		return v
	}
	enroll := map[string]any{"target": map[string]any{"actor": "bob", "tokenHash": strings.Repeat("a", 64), "allowSubscribe": []string{"general"}}}
	t.Run("ok/an authorized enrollment is served", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, managed(managerauthority.KindEnrollment, proof0, enroll))
		want(t, r, http.StatusOK, "")
		var e managerauthority.Enrollment
		if err := json.Unmarshal(r.body, &e); err != nil || e.Owner != h.owner || e.Actor != "bob" || space.ValidateUID(e.LifecycleUID) != nil {
			t.Fatalf("enrollment %s: %v", r.body, err)
		}
	})
	t.Run("fail/an enrollment with a wrong proof is permission-denied", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, managed(managerauthority.KindEnrollment, "sha256:"+strings.Repeat("b", 64), enroll))
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("ok/an authorized prepare-retirement of a target without a grant is a no-op", func(t *testing.T) {
		r, _ := m.call(t, true, idpSub, managed(managerauthority.KindPrepareRetirement, proof0, map[string]any{"target": target,
			"opId": must(lifecycle.ManagedRetirementOpID(target.LifecycleUID))}))
		want(t, r, http.StatusOK, "")
		var ans managerauthority.PrepareRetirementAnswer
		if err := json.Unmarshal(r.body, &ans); err != nil || !ans.Prepared || ans.Revoked || ans.Target != target || ans.Cleanup.Examined != 0 {
			t.Fatalf("answer %s (%v)", r.body, err)
		}
	})
	opID := must(lifecycle.ManagedRetirementOpID(target.LifecycleUID))
	requester, _ := nkeys.CreateUser()
	requesterPub, _ := requester.PublicKey()
	retire := func(epoch uint64, proof string, tg managerauthority.Target, op string) managerauthority.Request {
		req := m.req(managerauthority.OpRetire)
		req.RegistrationProof = proof
		req.Retirement = &managerauthority.Retirement{ID: requesterPub, Target: tg, OpID: op, ServeEpoch: epoch}
		return req
	}
	t.Run("ok/retire mints the retirement requester for the target", func(t *testing.T) {
		r, mat := m.call(t, false, idpSub, retire(0, proof0, target, opID))
		want(t, r, http.StatusOK, "")
		uc := userClaims(t, mat.Credentials.RetirementRequester, requesterPub)
		rail := must(names.RetireLifecycleCaller(space.RetireRail{TargetOwner: h.owner, TargetActor: "bob", TargetUID: target.LifecycleUID,
			CallerOwner: h.owner, CallerActor: "manager_serve_" + m.iid, CallerUID: m.muid}))
		if !slices.Contains(uc.Tags, "profile:retirement-requester") || !slices.Contains(uc.Pub.Allow, rail) ||
			mat.Retirement == nil || *mat.Retirement != *retire(0, proof0, target, opID).Retirement || mat.Credentials.Supervisor != nil {
			t.Fatalf("material %s, pub %v (want %s)", r.body, uc.Pub.Allow, rail)
		}
	})
	t.Run("fail/retire another owner's target", func(t *testing.T) {
		other := target
		other.Owner = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
		r, _ := m.call(t, false, idpSub, retire(0, proof0, other, opID))
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/retire under another opId", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, retire(0, proof0, target, must(lifecycle.InteractiveRetirementOpID(target.LifecycleUID))))
		want(t, r, http.StatusForbidden, "permission-denied")
	})

	t.Run("ok/a second activate commits the next epoch", func(t *testing.T) {
		req := m.req(managerauthority.OpActivate)
		req.RegistrationProof = activation
		r, mat := m.call(t, true, idpSub, req)
		want(t, r, http.StatusOK, "")
		if *mat.ProcessEpoch != 1 || mat.NextRegistrationProof == proof0 {
			t.Fatalf("material %s", r.body)
		}
	})
	t.Run("fail/renew at the stale epoch is conflict", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, renew(0, proof0))
		want(t, r, http.StatusConflict, "conflict")
	})
	t.Run("fail/retire at the stale epoch is conflict", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, retire(0, proof0, target, opID))
		want(t, r, http.StatusConflict, "conflict")
	})
	t.Run("fail/renew at the current epoch with the stale proof", func(t *testing.T) {
		r, _ := m.call(t, false, idpSub, renew(1, proof0))
		want(t, r, http.StatusForbidden, "permission-denied")
	})

	t.Run("fail/a spawn and admin row does not supervise", func(t *testing.T) {
		m.grant(t, h.owner, "ops", "spawn", "admin")
		req := m.req(managerauthority.OpPrepare)
		req.Actor = "ops"
		r, _ := m.call(t, false, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
		if !strings.Contains(r.Error, "supervise") {
			t.Fatalf("refusal %q does not name supervise", r.Error)
		}
	})
	t.Run("fail/a spawn-only row does not supervise", func(t *testing.T) {
		m.grant(t, h.owner, "spawner", "spawn")
		req := m.req(managerauthority.OpPrepare)
		req.Actor = "spawner"
		r, _ := m.call(t, false, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/no row", func(t *testing.T) {
		req := m.req(managerauthority.OpPrepare)
		req.Actor = "nobody"
		r, _ := m.call(t, false, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/another owner cannot take the instance", func(t *testing.T) {
		resp, err := h.api.DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: sp, IdpIssuer: h.idp.URL, Subject: "bob-subject"})
		if err != nil {
			t.Fatal(err)
		}
		m.grant(t, resp.GetOwner(), "cli", "supervise")
		r, _ := m.call(t, false, "bob-subject", m.req(managerauthority.OpPrepare))
		want(t, r, http.StatusForbidden, "permission-denied")
		r, _ = m.call(t, false, "bob-subject", renew(1, proof0))
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/another space", func(t *testing.T) {
		req := m.req(managerauthority.OpPrepare)
		req.Space = "beta"
		r, _ := m.call(t, false, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
	})
	t.Run("fail/another account", func(t *testing.T) {
		req := renew(1, proof0)
		req.AccountPublicKey = "A" + strings.Repeat("B", 55)
		r, _ := m.call(t, false, idpSub, req)
		want(t, r, http.StatusForbidden, "permission-denied")
	})
}

// TestManagerServiceAuthorityWire: the door's guards and the 501 kinds, on both faces.
func TestManagerServiceAuthorityWire(t *testing.T) {
	m := newMSA(t)
	h := m.h
	tok := m.token(t, idpSub)
	prep := m.req(managerauthority.OpPrepare)
	raw := func(req any) []byte { return envelope(t, tok, req) }
	asMap := func(mut func(map[string]any)) map[string]any {
		b, _ := json.Marshal(prep)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		mut(v)
		return v
	}
	managed := func(kind string, extra map[string]any) map[string]any {
		v := map[string]any{"v": 1, "kind": kind, "space": sp, "actor": "cli", "instanceId": m.iid, "managerLifecycleUid": m.muid,
			"requestId": "r1", "registrationProof": "sha256:" + strings.Repeat("0", 64), "serveEpoch": 0, "identities": m.ids}
		for k, x := range extra {
			v[k] = x
		}
		return v
	}
	target := map[string]any{"owner": h.owner, "actor": "bob", "lifecycleUid": newUID(t)}
	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		code   string
	}{
		{"fail/oversize", append([]byte(`{"idpToken":"`+strings.Repeat("a", managerauthority.MaxBodyBytes)), `"}`...), http.StatusRequestEntityTooLarge, "too-large"},
		{"fail/unknown envelope field", []byte(`{"idpToken":"x","request":{},"extra":1}`), http.StatusBadRequest, "bad-request"},
		{"fail/unknown request field", raw(asMap(func(v map[string]any) { v["contractArtifacts"] = []any{} })), http.StatusBadRequest, "bad-request"},
		{"fail/re-cased request field", raw(asMap(func(v map[string]any) { v["InstanceId"] = v["instanceId"]; delete(v, "instanceId") })), http.StatusBadRequest, "bad-request"},
		{"fail/duplicate field", []byte(`{"idpToken":"x","idpToken":"y","request":{}}`), http.StatusBadRequest, "bad-request"},
		{"fail/prepare with a proof", raw(asMap(func(v map[string]any) { v["registrationProof"] = "sha256:" + strings.Repeat("0", 64) })), http.StatusBadRequest, "bad-request"},
		{"fail/unknown operation", raw(asMap(func(v map[string]any) { v["operation"] = "steal" })), http.StatusBadRequest, "bad-request"},
		{"fail/runtime request naming a provider reference", raw(managed(managerauthority.KindRuntimeCreate, map[string]any{"target": target, "providerRef": "p"})), http.StatusBadRequest, "bad-request"},
		{"fail/runtime target naming a handle", raw(managed(managerauthority.KindRuntimeStatus, map[string]any{"target": map[string]any{"owner": h.owner, "actor": "bob", "lifecycleUid": newUID(t), "handle": "h"}})), http.StatusBadRequest, "bad-request"},
		{"fail/bad idp token", envelope(t, "not-a-jwt", prep), http.StatusUnauthorized, "unauthenticated"},
		{"fail/session is 501", raw(asMap(func(v map[string]any) { v["operation"] = "session"; v["session"] = map[string]any{"id": "x"} })), http.StatusNotImplemented, "unimplemented"},
		{"fail/standing bundle is 501", raw(asMap(func(v map[string]any) { v["operation"] = "renewStandingBundle" })), http.StatusNotImplemented, "unimplemented"},
		{"fail/run driver is 501", raw(asMap(func(v map[string]any) { v["operation"] = "renewRunDriver" })), http.StatusNotImplemented, "unimplemented"},
		{"fail/retained validation is 501", raw(managed(managerauthority.KindRetainedValidation, nil)), http.StatusNotImplemented, "unimplemented"},
		{"fail/goal index scan is 501", raw(managed(managerauthority.KindGoalIndexScan, nil)), http.StatusNotImplemented, "unimplemented"},
		{"fail/admin authorization is 501", raw(managed(managerauthority.KindAdminAuthorization, nil)), http.StatusNotImplemented, "unimplemented"},
		{"fail/delegated execution is 501", raw(managed(managerauthority.KindDelegatedExecution, nil)), http.StatusNotImplemented, "unimplemented"},
		{"fail/runtime create is 501", raw(managed(managerauthority.KindRuntimeCreate, map[string]any{"target": target})), http.StatusNotImplemented, "unimplemented"},
		{"fail/runtime status is 501", raw(managed(managerauthority.KindRuntimeStatus, map[string]any{"target": target})), http.StatusNotImplemented, "unimplemented"},
		// The managed-agent kinds are decided first (an unregistered instance is
		// failed-precondition).
		{"fail/enrollment of an unregistered instance", raw(managed(managerauthority.KindEnrollment, map[string]any{"target": map[string]any{"actor": "bob", "tokenHash": strings.Repeat("a", 64)}})), http.StatusPreconditionFailed, "failed-precondition"},
		{"fail/prepare-retirement of an unregistered instance", raw(managed(managerauthority.KindPrepareRetirement, map[string]any{"target": target, "opId": must(lifecycle.ManagedRetirementOpID(target["lifecycleUid"].(string)))})), http.StatusPreconditionFailed, "failed-precondition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, post(t, m.pub, "", tc.body), tc.status, tc.code)
			want(t, post(t, h.s.URL(), h.cap, tc.body), tc.status, tc.code)
		})
	}
	t.Run("fail/an Origin header", func(t *testing.T) {
		hr, _ := http.NewRequest(http.MethodPost, m.pub+managerauthority.Path, bytes.NewReader(raw(prep)))
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("Origin", "https://evil.example")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("fail/GET", func(t *testing.T) {
		if code, _ := get(t, http.MethodGet, m.pub+managerauthority.Path); code != http.StatusMethodNotAllowed {
			t.Fatalf("status %d", code)
		}
	})
	t.Run("ok/the discovery bundle's managerAuthorityUrl resolves to the door", func(t *testing.T) {
		code, body := get(t, http.MethodGet, m.pub+"/.well-known/cotal-mesh")
		var b struct {
			UserAuth struct {
				Endpoints struct {
					URL                 string `json:"url"`
					ManagerAuthorityURL string `json:"managerAuthorityUrl"`
				} `json:"endpoints"`
			} `json:"userAuth"`
		}
		if err := json.Unmarshal([]byte(body), &b); code != http.StatusOK || err != nil {
			t.Fatalf("well-known %d %s", code, body)
		}
		path, ok := strings.CutPrefix(b.UserAuth.Endpoints.ManagerAuthorityURL, b.UserAuth.Endpoints.URL)
		if !ok || path != managerauthority.Path {
			t.Fatalf("managerAuthorityUrl %q under %q", b.UserAuth.Endpoints.ManagerAuthorityURL, b.UserAuth.Endpoints.URL)
		}
		// The proxy strips the public URL's base: the path reaches the face's door.
		r, mat := m.call(t, false, idpSub, prep)
		want(t, r, http.StatusOK, "")
		if mat.Credentials.Supervisor == nil {
			t.Fatalf("material %s", r.body)
		}
	})
	t.Run("ok/the loopback-only doors are 404 on the public face", func(t *testing.T) {
		for _, p := range []string{"/managed-lifecycle/activate", "/managed-lifecycle/retire", "/manager-service-authority/verify-enrollment"} {
			if code, body := get(t, http.MethodPost, m.pub+p); code != http.StatusNotFound {
				t.Fatalf("public %s = %d %s", p, code, body)
			}
		}
	})
}

// TestManagerServiceAuthorityFailureWindow: wrong caps and IdP proofs that do not verify count in
// the face's 30-a-minute failure window, as do refusals of a verified identity: the 31st is 429.
func TestManagerServiceAuthorityFailureWindow(t *testing.T) {
	m := newMSA(t)
	h := m.h
	body := envelope(t, m.token(t, idpSub), m.req(managerauthority.OpPrepare))
	t.Run("fail/wrong caps on the loopback face", func(t *testing.T) {
		bad := strings.Repeat("0", 64)
		for i := 0; i < 30; i++ {
			want(t, post(t, h.s.URL(), bad, body), http.StatusUnauthorized, "unauthenticated")
		}
		want(t, post(t, h.s.URL(), bad, body), http.StatusTooManyRequests, "rate-limited")
		// The right cap is still served: a budget spent by wrong caps never refuses it.
		r := post(t, h.s.URL(), h.cap, body)
		want(t, r, http.StatusOK, "")
	})
	t.Run("fail/idp proofs that do not verify on the public face", func(t *testing.T) {
		badTok := envelope(t, "eyJhbGciOiJub25lIn0.e30.", m.req(managerauthority.OpPrepare))
		for i := 0; i < 30; i++ {
			want(t, post(t, m.pub, "", badTok), http.StatusUnauthorized, "unauthenticated")
		}
		want(t, post(t, m.pub, "", badTok), http.StatusTooManyRequests, "rate-limited")
	})
	t.Run("fail/a verified identity's refusals", func(t *testing.T) {
		req := m.req(managerauthority.OpPrepare)
		req.Actor = "nobody"
		for i := 0; i < 30; i++ {
			r, _ := m.call(t, true, "carol-subject", req)
			want(t, r, http.StatusForbidden, "permission-denied")
		}
		r, _ := m.call(t, true, "carol-subject", req)
		want(t, r, http.StatusTooManyRequests, "rate-limited")
	})
}
