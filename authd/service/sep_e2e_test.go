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
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// sepEnv is authd with service_endpoints on (the human fixture: real signerd, the embedded
// broker in operator mode, a pinned fake IdP), the owner's current interactive cli row (the
// row an idp proof needs), and the authority's GET answer.
type sepEnv struct {
	h    *human
	info *serviceaccess.Info
}

// newSepEnv starts it; with, if set, edits Start's inputs and options (a clock, say).
func newSepEnv(t testing.TB, with func(*service.Inputs, *service.RuntimeOptions)) *sepEnv {
	t.Helper()
	if with == nil {
		with = func(*service.Inputs, *service.RuntimeOptions) {}
	}
	h := newHumanWith(t, newEnv(t), true, func(c *config.Config) *config.Config { c.ServiceEndpoints = true; return c }, with)
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
	return &sepEnv{h: h, info: info}
}

// idpProof is the owner's signed-in login: a fresh IdP token for alice.
func (s *sepEnv) idpProof(t testing.TB) serviceaccess.Proof {
	return serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: s.idpToken(t)}
}

func (s *sepEnv) idpToken(t testing.TB) string {
	return s.h.idp.Token(t, s.h.idp.Claims(idpSub, time.Now(), time.Hour), nil)
}

// sepCall sends req (its account and space filled in) under proof, nil meaning the owner's
// signed-in login, and returns the answer bound to it; anything else fails the test.
type sepCall func(t testing.TB, req serviceaccess.Request, proof *serviceaccess.Proof) *serviceaccess.Answer

// raw is a sepCall in plain HTTP to the loopback face (with the cap for an operator proof): the
// answer must parse, travel with its own HTTP status and echo the requestId.
func (s *sepEnv) raw(t testing.TB, req serviceaccess.Request, proof *serviceaccess.Proof) *serviceaccess.Answer {
	t.Helper()
	if proof == nil {
		p := s.idpProof(t)
		proof = &p
	}
	req.Account, req.Space = s.info.Account, sp
	b, _ := json.Marshal(serviceaccess.Envelope{Request: req, Proof: *proof})
	hdr := map[string]string{"Content-Type": "application/json"}
	if proof.Kind == serviceaccess.ProofOperator {
		hdr["Authorization"] = "Bearer " + s.h.cap
	}
	status, body := send(t, http.MethodPost, s.h.s.URL()+serviceaccess.Path, b, hdr)
	ans, err := serviceaccess.ParseAnswer(body)
	if err != nil || status != ans.HTTPStatus() || (req.Kind != serviceaccess.KindStatus && ans.RequestID != req.RequestID) {
		t.Fatalf("%s with %s = %d %s (%v)", req.Kind, proof.Kind, status, body, err)
	}
	return ans
}

// wantKind fails the test unless ans is of kind.
func wantKind(t testing.TB, ans *serviceaccess.Answer, kind serviceaccess.AnswerKind) *serviceaccess.Answer {
	t.Helper()
	if ans.Kind != kind {
		t.Fatalf("%s answer %s (code %q, reason %q), want %s", ans.RequestID, ans.Kind, ans.Code, ans.Reason, kind)
	}
	return ans
}

// echoContract is a contract of one closure: endpoint's manifest (no members) as its own
// artifact.
func echoContract(endpoint string) *serviceaccess.Contract {
	manifest, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: endpoint, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	return &serviceaccess.Contract{Closures: []string{digest}, Artifacts: []serviceaccess.Artifact{{Digest: digest, Bytes: manifest}}}
}

// newInstanceID is a fresh instance id.
func newInstanceID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// approve runs the seed's sequence up to registered through call, for owner: register (the
// signed-in login) -> approval-required; name-bind (operator) -> bound; decide approve (the
// owner's login; approvalSeconds 0 is the default) -> decided; the same register again ->
// registered. It returns the registered and the decided answers.
func approve(t testing.TB, call sepCall, owner, endpoint, instance string, contract *serviceaccess.Contract, approvalSeconds int64) (registered, decided *serviceaccess.Answer) {
	t.Helper()
	register := serviceaccess.Request{Kind: serviceaccess.KindRegister, RequestID: "register-0001", Endpoint: endpoint, Instance: instance, Contract: contract}
	proposed := wantKind(t, call(t, register, nil), serviceaccess.AnswerApprovalRequired)
	wantKind(t, call(t, serviceaccess.Request{Kind: serviceaccess.KindNameBind, RequestID: "bind-0001", Endpoint: endpoint, Owner: owner},
		&serviceaccess.Proof{Kind: serviceaccess.ProofOperator}), serviceaccess.AnswerBound)
	decided = wantKind(t, call(t, serviceaccess.Request{Kind: serviceaccess.KindDecide, RequestID: "decide-0001", Endpoint: endpoint, Instance: instance,
		Proposal: proposed.Proposal, Contract: contract, Decision: serviceaccess.DecisionApprove, ApprovalSeconds: approvalSeconds}, nil), serviceaccess.AnswerDecided)
	registered = wantKind(t, call(t, register, nil), serviceaccess.AnswerRegistered)
	return registered, decided
}

// TestServiceEndpointSequence: the seed's sequence through authd's loopback door and the real
// lifecycle authority: register (idp) -> approval-required; name-bind (operator, the cap);
// decide approve (idp, the owner); the same register again -> registered with its witness and
// snapshot; activate (idp) -> credential; renew (the renewal proof) -> credential; ready (the
// access bearer) -> ready; status (the access bearer) of its own instance.
func TestServiceEndpointSequence(t *testing.T) {
	s := newSepEnv(t, nil)
	const endpoint = "svc.echo"
	contract := echoContract(endpoint)
	instance := newInstanceID()
	registered, _ := approve(t, s.raw, s.h.owner, endpoint, instance, contract, 0)
	snap, err := serviceaccess.ParseSnapshot(registered.Snapshot)
	if err != nil || snap.Owner != s.h.owner || snap.Account != s.info.Account || snap.Instance != instance {
		t.Fatalf("snapshot %s: %v", registered.Snapshot, err)
	}
	witness := registered.Witness
	activate := serviceaccess.Request{Kind: serviceaccess.KindActivate, RequestID: "activate-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	cred := wantKind(t, s.raw(t, activate, nil), serviceaccess.AnswerCredential)
	if cred.Access == nil || cred.Renewal == nil || cred.Access.Exp-time.Now().Unix() > 60 {
		t.Fatalf("credential %+v", cred)
	}
	renew := serviceaccess.Request{Kind: serviceaccess.KindRenew, RequestID: "renew-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	renewed := wantKind(t, s.raw(t, renew, &serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: cred.Renewal.Token}), serviceaccess.AnswerCredential)
	ready := serviceaccess.Request{Kind: serviceaccess.KindReady, RequestID: "ready-0001", Endpoint: endpoint, Instance: instance, Witness: witness}
	wantKind(t, s.raw(t, ready, &serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}), serviceaccess.AnswerReady)
	st := wantKind(t, s.raw(t, serviceaccess.Request{Kind: serviceaccess.KindStatus, Endpoint: endpoint, Instance: instance, Target: &serviceaccess.Target{Kind: serviceaccess.TargetInstance}},
		&serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: renewed.Access.Token}), serviceaccess.AnswerStatus)
	if st.Instance == nil || st.Instance.Witness != witness {
		t.Fatalf("status %+v", st.Instance)
	}
	// No token kind passes as another at the door: the renewal proof is not an access bearer.
	b, _ := json.Marshal(serviceaccess.Envelope{Request: func() serviceaccess.Request {
		r := ready
		r.Account, r.Space = s.info.Account, sp
		return r
	}(), Proof: serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: cred.Renewal.Token}})
	if status, body := send(t, http.MethodPost, s.h.s.URL()+serviceaccess.Path, b, map[string]string{"Content-Type": "application/json"}); status != http.StatusUnauthorized {
		t.Fatalf("a renewal proof as the access bearer = %d %s", status, body)
	}
}
