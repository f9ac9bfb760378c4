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

// TestServiceEndpointSequence: the seed's sequence through authd's loopback door and the real
// lifecycle authority: register (idp) -> approval-required; name-bind (operator, the cap);
// decide approve (idp, the owner); the same register again -> registered with its witness and
// snapshot; activate (idp) -> credential; renew (the renewal proof) -> credential; ready (the
// access bearer) -> ready; status (the access bearer) of its own instance.
func TestServiceEndpointSequence(t *testing.T) {
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
	idpProof := func() serviceaccess.Proof {
		return serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: h.idp.Token(t, h.idp.Claims(idpSub, time.Now(), time.Hour), nil)}
	}
	post := func(req serviceaccess.Request, proof serviceaccess.Proof, want int, kind serviceaccess.AnswerKind) *serviceaccess.Answer {
		t.Helper()
		req.Account, req.Space = info.Account, sp
		b, _ := json.Marshal(serviceaccess.Envelope{Request: req, Proof: proof})
		hdr := map[string]string{"Content-Type": "application/json"}
		if proof.Kind == serviceaccess.ProofOperator {
			hdr["Authorization"] = "Bearer " + h.cap
		}
		status, body := send(t, http.MethodPost, h.s.URL()+serviceaccess.Path, b, hdr)
		ans, err := serviceaccess.ParseAnswer(body)
		if err != nil || status != want || ans.Kind != kind || (req.Kind != serviceaccess.KindStatus && ans.RequestID != req.RequestID) {
			t.Fatalf("%s with %s = %d %s (%v), want %d %s", req.Kind, proof.Kind, status, body, err, want, kind)
		}
		return ans
	}
	const endpoint = "svc.echo"
	manifest, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: endpoint, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	contract := &serviceaccess.Contract{Closures: []string{digest}, Artifacts: []serviceaccess.Artifact{{Digest: digest, Bytes: manifest}}}
	iidb := make([]byte, 16)
	_, _ = rand.Read(iidb)
	instance := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(iidb))

	register := serviceaccess.Request{Kind: serviceaccess.KindRegister, RequestID: "register-0001", Endpoint: endpoint, Instance: instance, Contract: contract}
	proposed := post(register, idpProof(), http.StatusAccepted, serviceaccess.AnswerApprovalRequired)
	post(serviceaccess.Request{Kind: serviceaccess.KindNameBind, RequestID: "bind-0001", Endpoint: endpoint, Owner: h.owner},
		serviceaccess.Proof{Kind: serviceaccess.ProofOperator}, http.StatusOK, serviceaccess.AnswerBound)
	post(serviceaccess.Request{Kind: serviceaccess.KindDecide, RequestID: "decide-0001", Endpoint: endpoint, Instance: instance,
		Proposal: proposed.Proposal, Contract: contract, Decision: serviceaccess.DecisionApprove}, idpProof(), http.StatusOK, serviceaccess.AnswerDecided)
	registered := post(register, idpProof(), http.StatusOK, serviceaccess.AnswerRegistered)
	snap, err := serviceaccess.ParseSnapshot(registered.Snapshot)
	if err != nil || snap.Owner != h.owner || snap.Account != info.Account || snap.Instance != instance {
		t.Fatalf("snapshot %s: %v", registered.Snapshot, err)
	}
	witness := registered.Witness
	activate := serviceaccess.Request{Kind: serviceaccess.KindActivate, RequestID: "activate-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	cred := post(activate, idpProof(), http.StatusOK, serviceaccess.AnswerCredential)
	if cred.Access == nil || cred.Renewal == nil || cred.Access.Exp-time.Now().Unix() > 60 {
		t.Fatalf("credential %+v", cred)
	}
	renew := serviceaccess.Request{Kind: serviceaccess.KindRenew, RequestID: "renew-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	renewed := post(renew, serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: cred.Renewal.Token}, http.StatusOK, serviceaccess.AnswerCredential)
	ready := serviceaccess.Request{Kind: serviceaccess.KindReady, RequestID: "ready-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	post(ready, serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}, http.StatusOK, serviceaccess.AnswerReady)
	st := post(serviceaccess.Request{Kind: serviceaccess.KindStatus, Endpoint: endpoint, Instance: instance, Target: &serviceaccess.Target{Kind: serviceaccess.TargetInstance}},
		serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}, http.StatusOK, serviceaccess.AnswerStatus)
	if st.Instance == nil || st.Instance.Witness != witness {
		t.Fatalf("status %+v", st.Instance)
	}
	// No token kind passes as another at the door: the renewal proof is not an access bearer.
	b, _ := json.Marshal(serviceaccess.Envelope{Request: func() serviceaccess.Request {
		r := ready
		r.Account, r.Space = info.Account, sp
		return r
	}(), Proof: serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: cred.Renewal.Token}})
	if status, body := send(t, http.MethodPost, h.s.URL()+serviceaccess.Path, b, map[string]string{"Content-Type": "application/json"}); status != http.StatusUnauthorized {
		t.Fatalf("a renewal proof as the access bearer = %d %s", status, body)
	}
}
