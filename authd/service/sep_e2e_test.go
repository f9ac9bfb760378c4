package service_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// sepDoor is a client of a running authd's loopback /service-endpoint-authority door with
// service_endpoints on: the human env (its IdP, its cap) with the owner's interactive cli row an
// idp proof needs, and the door's GET answer.
type sepDoor struct {
	h    *human
	info *serviceaccess.Info
}

// newSepDoor starts authd on a fresh env with service_endpoints on, writes the owner's cli row
// and reads GET.
func newSepDoor(t testing.TB) *sepDoor {
	t.Helper()
	h := newHumanEnv(t, newEnv(t), true, func(c *config.Config) *config.Config { c.ServiceEndpoints = true; return c })
	uid, err := admin.NewLifecycleUID()
	if err != nil {
		t.Fatal(err)
	}
	cli := ledger.Row{Ver: ledger.Version, Owner: h.owner, Actor: "cli", Scope: []string{}, AllowSubscribe: []string{"general"},
		AllowPublish: []string{"general"}, LifecycleUID: uid, GrantedAt: time.Now().UnixMilli()}
	if err := h.led.Put(ledger.Interactive, cli); err != nil {
		t.Fatal(err)
	}
	status, body := send(t, http.MethodGet, h.s.URL()+serviceaccess.Path, nil, nil)
	info, err := serviceaccess.ParseInfo(body)
	if status != http.StatusOK || err != nil {
		t.Fatalf("GET = %d %s: %v", status, body, err)
	}
	return &sepDoor{h: h, info: info}
}

// idpProof is an idp proof of the owner (a fresh IdP token).
func (d *sepDoor) idpProof(t testing.TB) serviceaccess.Proof {
	return serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: d.h.idp.Token(t, d.h.idp.Claims(idpSub, time.Now(), time.Hour), nil)}
}

// envelope is req (with the door's account and space) and proof as the door takes them.
func (d *sepDoor) envelope(req serviceaccess.Request, proof serviceaccess.Proof) []byte {
	req.Account, req.Space = d.info.Account, sp
	b, _ := json.Marshal(serviceaccess.Envelope{Request: req, Proof: proof})
	return b
}

// post sends req with proof (the cap for an operator proof) and fails t unless the answer parses
// as kind with status want and echoes req's requestId.
func (d *sepDoor) post(t testing.TB, req serviceaccess.Request, proof serviceaccess.Proof, want int, kind serviceaccess.AnswerKind) *serviceaccess.Answer {
	t.Helper()
	hdr := map[string]string{"Content-Type": "application/json"}
	if proof.Kind == serviceaccess.ProofOperator {
		hdr["Authorization"] = "Bearer " + d.h.cap
	}
	status, body := send(t, http.MethodPost, d.h.s.URL()+serviceaccess.Path, d.envelope(req, proof), hdr)
	ans, err := serviceaccess.ParseAnswer(body)
	if err != nil || status != want || ans.Kind != kind || (req.Kind != serviceaccess.KindStatus && ans.RequestID != req.RequestID) {
		t.Fatalf("%s with %s = %d %s (%v), want %d %s", req.Kind, proof.Kind, status, body, err, want, kind)
	}
	return ans
}

// sepActivated is one instance taken through the seed's sequence up to its first credential.
type sepActivated struct {
	endpoint, instance string
	registered         *serviceaccess.Answer
	cred               *serviceaccess.Answer
}

// activate runs the seed's sequence for a fresh instance of endpoint (a one-closure contract
// rooted at it): register (idp) -> approval-required; name-bind (operator, the cap); decide
// approve (idp, the owner); the same register again -> registered; activate (idp) -> credential
// with both tokens, the access bearer living at most 60 s.
func (d *sepDoor) activate(t testing.TB, endpoint string) *sepActivated {
	t.Helper()
	manifest, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: endpoint, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	contract := &serviceaccess.Contract{Closures: []string{digest}, Artifacts: []serviceaccess.Artifact{{Digest: digest, Bytes: manifest}}}
	iidb := make([]byte, 16)
	_, _ = rand.Read(iidb)
	instance := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(iidb))

	register := serviceaccess.Request{Kind: serviceaccess.KindRegister, RequestID: "register-0001", Endpoint: endpoint, Instance: instance, Contract: contract}
	proposed := d.post(t, register, d.idpProof(t), http.StatusAccepted, serviceaccess.AnswerApprovalRequired)
	d.post(t, serviceaccess.Request{Kind: serviceaccess.KindNameBind, RequestID: "bind-0001", Endpoint: endpoint, Owner: d.h.owner},
		serviceaccess.Proof{Kind: serviceaccess.ProofOperator}, http.StatusOK, serviceaccess.AnswerBound)
	d.post(t, serviceaccess.Request{Kind: serviceaccess.KindDecide, RequestID: "decide-0001", Endpoint: endpoint, Instance: instance,
		Proposal: proposed.Proposal, Contract: contract, Decision: serviceaccess.DecisionApprove}, d.idpProof(t), http.StatusOK, serviceaccess.AnswerDecided)
	registered := d.post(t, register, d.idpProof(t), http.StatusOK, serviceaccess.AnswerRegistered)
	activate := serviceaccess.Request{Kind: serviceaccess.KindActivate, RequestID: "activate-0001", Endpoint: endpoint, Instance: instance, Witness: registered.Witness}
	cred := d.post(t, activate, d.idpProof(t), http.StatusOK, serviceaccess.AnswerCredential)
	if cred.Access == nil || cred.Renewal == nil || cred.Access.Exp-time.Now().Unix() > 60 {
		t.Fatalf("credential %+v", cred)
	}
	return &sepActivated{endpoint: endpoint, instance: instance, registered: registered, cred: cred}
}

// TestServiceEndpointSequence: the seed's sequence through authd's loopback door and the real
// lifecycle authority: register (idp) -> approval-required; name-bind (operator, the cap);
// decide approve (idp, the owner); the same register again -> registered with its witness and
// snapshot; activate (idp) -> credential; renew (the renewal proof) -> credential; ready (the
// access bearer) -> ready; status (the access bearer) of its own instance.
func TestServiceEndpointSequence(t *testing.T) {
	d := newSepDoor(t)
	a := d.activate(t, "svc.echo")
	endpoint, instance, cred := a.endpoint, a.instance, a.cred
	snap, err := serviceaccess.ParseSnapshot(a.registered.Snapshot)
	if err != nil || snap.Owner != d.h.owner || snap.Account != d.info.Account || snap.Instance != instance {
		t.Fatalf("snapshot %s: %v", a.registered.Snapshot, err)
	}
	witness := a.registered.Witness
	renew := serviceaccess.Request{Kind: serviceaccess.KindRenew, RequestID: "renew-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	renewed := d.post(t, renew, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: cred.Renewal.Token}, http.StatusOK, serviceaccess.AnswerCredential)
	ready := serviceaccess.Request{Kind: serviceaccess.KindReady, RequestID: "ready-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	d.post(t, ready, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}, http.StatusOK, serviceaccess.AnswerReady)
	st := d.post(t, serviceaccess.Request{Kind: serviceaccess.KindStatus, Endpoint: endpoint, Instance: instance, Target: &serviceaccess.Target{Kind: serviceaccess.TargetInstance}},
		serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}, http.StatusOK, serviceaccess.AnswerStatus)
	if st.Instance == nil || st.Instance.Witness != witness {
		t.Fatalf("status %+v", st.Instance)
	}
	// No token kind passes as another at the door: the renewal proof is not an access bearer.
	b := d.envelope(ready, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: cred.Renewal.Token})
	if status, body := send(t, http.MethodPost, d.h.s.URL()+serviceaccess.Path, b, map[string]string{"Content-Type": "application/json"}); status != http.StatusUnauthorized {
		t.Fatalf("a renewal proof as the access bearer = %d %s", status, body)
	}
}
