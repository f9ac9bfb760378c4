package authority

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// These tests run the service endpoint state on a provisioned real broker and a real signerd,
// through ServiceRequest with hand-built requests and callers (the route's proof checks are the
// door's tests).

const sepEP = "svc.echo"

var (
	sepOwner  = testOwner
	sepOwner2 = "u_" + strings.Repeat("b", 26)
)

// sepRig is a service state rig: the activation rig's authority with a signer and a clock the
// test moves (real time plus an offset, so a real signerd agrees with it).
type sepRig struct {
	*rig
	off      atomic.Int64
	contract serviceaccess.Contract
	n        int
}

func newSepRig(t *testing.T) *sepRig {
	t.Helper()
	x := &sepRig{rig: newRig(t)}
	x.a.now = x.now
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{testSpace}})
	files := sg.ClientFor(t, mtls.KindAuthd, testSpace)
	c, err := signerclient.Dial(signerclient.FileConfig{Address: sg.Addr, CA: files.ServerCAFile, Cert: files.CertFile, Key: files.KeyFile}.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	x.a.cfg.Signer = c.API()
	x.contract = sepContract()
	return x
}

// sepContract is the endpoint's one-closure contract: its manifest, rooted at the endpoint.
func sepContract() serviceaccess.Contract { return sepContractOf(sepEP) }

func sepContractOf(ep string) serviceaccess.Contract {
	manifest, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: ep, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	d := digestOf(manifest)
	return serviceaccess.Contract{Closures: []string{d}, Artifacts: []serviceaccess.Artifact{{Digest: d, Bytes: manifest}}}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (x *sepRig) now() time.Time { return time.Now().Add(time.Duration(x.off.Load())) }

func (x *sepRig) advance(d time.Duration) { x.off.Add(int64(d)) }

// req is a request of kind for the rig's endpoint and instance iid.
func (x *sepRig) req(kind serviceaccess.Kind, rid, iid string) *serviceaccess.Request {
	r := &serviceaccess.Request{Kind: kind, Account: x.a.cfg.Account, Space: testSpace, RequestID: rid, Endpoint: sepEP, Instance: iid}
	switch kind {
	case serviceaccess.KindRegister:
		c := x.contract
		r.Contract = &c
	case serviceaccess.KindStatus:
		r.RequestID = ""
	}
	return r
}

func (x *sepRig) decide(iid, rid, proposal string, d serviceaccess.Decision, secs int64) *serviceaccess.Request {
	r := x.req(serviceaccess.KindDecide, rid, iid)
	r.Proposal, r.Decision, r.ApprovalSeconds = proposal, d, secs
	if d == serviceaccess.DecisionApprove {
		c := x.contract
		r.Contract = &c
	}
	return r
}

func idp(owner string) ServiceCaller {
	return ServiceCaller{Proof: serviceaccess.ProofIDP, Owner: owner}
}

var operator = ServiceCaller{Proof: serviceaccess.ProofOperator}

func renewalCaller(owner, iid, wit, root string) ServiceCaller {
	return ServiceCaller{Proof: serviceaccess.ProofRenewal, Owner: owner,
		Renewal: &serviceaccess.RenewalClaims{Sub: owner, Ep: sepEP, Iid: iid, Wit: wit, Root: root}}
}

func accessClaims(owner, iid, wit, root string) *serviceaccess.AccessClaims {
	return &serviceaccess.AccessClaims{Sub: owner, Ep: sepEP, Iid: iid, Wit: wit, Root: root, Duty: serviceaccess.DutyServe}
}

func accessCaller(owner, iid, wit, root string) ServiceCaller {
	return ServiceCaller{Proof: serviceaccess.ProofAccess, Owner: owner, Access: accessClaims(owner, iid, wit, root)}
}

func (x *sepRig) do(t *testing.T, r *serviceaccess.Request, c ServiceCaller) *serviceaccess.Answer {
	t.Helper()
	ans, err := x.a.ServiceRequest(context.Background(), r, c)
	if err != nil {
		t.Fatalf("%s %s: %v", r.Kind, r.RequestID, err)
	}
	if ans.RequestID != r.RequestID {
		t.Fatalf("%s answered requestId %q, want %q", r.Kind, ans.RequestID, r.RequestID)
	}
	// Every answer is one the wire parser accepts, unchanged.
	b, err := json.Marshal(ans)
	if err != nil {
		t.Fatal(err)
	}
	back, err := serviceaccess.ParseAnswer(b)
	if err != nil {
		t.Fatalf("%s answer %s does not parse: %v", r.Kind, ans.Kind, err)
	}
	if again, _ := json.Marshal(back); string(again) != string(b) {
		t.Fatalf("%s answer %s parses as another: %s, was %s", r.Kind, ans.Kind, again, b)
	}
	return ans
}

func wantKind(t *testing.T, ans *serviceaccess.Answer, kind serviceaccess.AnswerKind, codeOrReason string) {
	t.Helper()
	if ans.Kind != kind || (codeOrReason != "" && ans.Code != codeOrReason && ans.Reason != codeOrReason) {
		t.Fatalf("answer %s (code %q, reason %q, message %q), want %s %s", ans.Kind, ans.Code, ans.Reason, ans.Message, kind, codeOrReason)
	}
}

// iidN is a distinct instance id per n.
func iidN(n int) string { return fmt.Sprintf("i%025d", n) }

// approved runs register rid (approval-required), name-bind (once per rig) and decide approve
// for instance iid, and returns the proposal.
func (x *sepRig) approved(t *testing.T, iid, rid string) string {
	t.Helper()
	ans := x.do(t, x.req(serviceaccess.KindRegister, rid, iid), idp(sepOwner))
	wantKind(t, ans, serviceaccess.AnswerApprovalRequired, "")
	if !strings.HasPrefix(ans.Proposal, "p_") || ans.ExpiresAt != x.now().Unix()+int64(ProposalLifetime.Seconds()) && ans.ExpiresAt != x.now().Unix()-1+int64(ProposalLifetime.Seconds()) {
		t.Fatalf("approval-required %+v", ans)
	}
	nb := x.req(serviceaccess.KindNameBind, "bind-0001", "")
	nb.Instance, nb.Owner = "", sepOwner
	wantKind(t, x.do(t, nb, operator), serviceaccess.AnswerBound, "")
	x.n++
	d := x.do(t, x.decide(iid, fmt.Sprintf("decide-%s-%d", iid[:4], x.n), ans.Proposal, serviceaccess.DecisionApprove, 0), idp(sepOwner))
	wantKind(t, d, serviceaccess.AnswerDecided, "")
	return ans.Proposal
}

// registered runs approved and the replay of rid, which must answer registered at gen.
func (x *sepRig) registered(t *testing.T, iid, rid string, gen uint64) *serviceaccess.Answer {
	t.Helper()
	x.approved(t, iid, rid)
	ans := x.do(t, x.req(serviceaccess.KindRegister, rid, iid), idp(sepOwner))
	wantKind(t, ans, serviceaccess.AnswerRegistered, "")
	if ans.Generation != gen {
		t.Fatalf("registered at generation %d, want %d", ans.Generation, gen)
	}
	return ans
}

// gate reads iid's endpoint gate.
func (x *sepRig) gate(t *testing.T, iid string) lifecycle.EndpointGate {
	t.Helper()
	g, _, _, err := x.s.EndpointGate(context.Background(), sepEP, iid)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestServiceSeedSequence: register -> approval-required; name-bind; decide approve; the replay
// registers (witness of the snapshot, generation 1); activate mints capped tokens and creates
// the root expiring with the approval; renew; ready; CheckServe admits; status reads it all.
func TestServiceSeedSequence(t *testing.T) {
	x := newSepRig(t)
	ctx := context.Background()
	iid := regIID
	reg := x.req(serviceaccess.KindRegister, "reg-00001", iid)
	first := x.do(t, reg, idp(sepOwner))
	wantKind(t, first, serviceaccess.AnswerApprovalRequired, "")
	t.Run("ok/register replay before approval is the same proposal", func(t *testing.T) {
		again := x.do(t, reg, idp(sepOwner))
		if again.Kind != serviceaccess.AnswerApprovalRequired || again.Proposal != first.Proposal || again.ExpiresAt != first.ExpiresAt {
			t.Fatalf("replay = %+v, want %+v", again, first)
		}
	})
	nb := x.req(serviceaccess.KindNameBind, "bind-0001", "")
	nb.Instance, nb.Owner = "", sepOwner
	wantKind(t, x.do(t, nb, operator), serviceaccess.AnswerBound, "")
	dec := x.decide(iid, "decide-0001", first.Proposal, serviceaccess.DecisionApprove, 0)
	d := x.do(t, dec, idp(sepOwner))
	wantKind(t, d, serviceaccess.AnswerDecided, "")
	if d.ApprovalExpiresAt < x.now().Unix()+int64(DefaultApproval.Seconds())-2 || d.ApprovalExpiresAt > x.now().Unix()+int64(DefaultApproval.Seconds()) {
		t.Fatalf("approval ends %d, want now + 30 days", d.ApprovalExpiresAt)
	}
	if d2 := x.do(t, dec, idp(sepOwner)); d2.Kind != serviceaccess.AnswerDecided || d2.ApprovalExpiresAt != d.ApprovalExpiresAt {
		t.Fatalf("decide replay = %+v", d2)
	}
	art, _, found, err := x.s.ServiceArtifact(ctx, x.contract.Artifacts[0].Digest)
	if err != nil || !found || string(art.Bytes) != string(x.contract.Artifacts[0].Bytes) {
		t.Fatalf("artifact after approval: %+v found %v %v", art, found, err)
	}

	r := x.do(t, reg, idp(sepOwner))
	wantKind(t, r, serviceaccess.AnswerRegistered, "")
	canon, err := (serviceaccess.Snapshot{V: 1, Account: x.a.cfg.Account, Space: testSpace, Owner: sepOwner,
		Endpoint: sepEP, Instance: iid, Generation: 1, Contract: x.contract}).Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if r.Generation != 1 || string(r.Snapshot) != string(canon) || r.Witness != serviceaccess.WitnessOf(canon) {
		t.Fatalf("registered = %+v; want generation 1, the snapshot's bytes and witness", r)
	}
	t.Run("ok/register replay after registration is the bound outcome", func(t *testing.T) {
		again := x.do(t, reg, idp(sepOwner))
		if again.Kind != serviceaccess.AnswerRegistered || again.Witness != r.Witness || again.Generation != 1 || string(again.Snapshot) != string(r.Snapshot) {
			t.Fatalf("replay = %+v", again)
		}
		if g := x.gate(t, iid); g.State != lifecycle.GateOpen || g.Generation != 1 || g.Principal != lifecycle.ServicePrincipal(sepOwner, iid) {
			t.Fatalf("gate = %+v; want open at generation 1 for the service principal", g)
		}
	})

	act := x.req(serviceaccess.KindActivate, "act-00001", iid)
	act.Witness = r.Witness
	c := x.do(t, act, idp(sepOwner))
	wantKind(t, c, serviceaccess.AnswerCredential, "")
	now := x.now().Unix()
	if !strings.HasPrefix(c.Root, "r_") || c.Witness != r.Witness || c.ApprovalExpiresAt != d.ApprovalExpiresAt ||
		c.Access == nil || c.Access.Exp > now+60 || c.Access.Exp < now+55 || c.Renewal == nil || c.Renewal.Exp > now+86400 || c.Renewal.Exp < now+86395 {
		t.Fatalf("credential = root %q witness %q approval %d access %+v renewal %+v", c.Root, c.Witness, c.ApprovalExpiresAt, c.Access != nil, c.Renewal != nil)
	}
	root, _, found, err := x.s.ServiceRoot(ctx, sepEP, iid)
	if err != nil || !found || root.Root != c.Root || root.ExpiresAt != d.ApprovalExpiresAt || root.Witness != r.Witness {
		t.Fatalf("root row %+v found %v %v", root, found, err)
	}
	t.Run("ok/activate replay mints anew on the same root", func(t *testing.T) {
		c2 := x.do(t, act, idp(sepOwner))
		wantKind(t, c2, serviceaccess.AnswerCredential, "")
		if c2.Root != c.Root || c2.Access.Token == c.Access.Token {
			t.Fatalf("replay: root %q (want %q), same token %v", c2.Root, c.Root, c2.Access.Token == c.Access.Token)
		}
	})
	ren := x.req(serviceaccess.KindRenew, "renew-0001", iid)
	ren.Witness = r.Witness
	rc := x.do(t, ren, renewalCaller(sepOwner, iid, r.Witness, c.Root))
	wantKind(t, rc, serviceaccess.AnswerCredential, "")
	if rc.Root != c.Root || rc.Access == nil || rc.Renewal == nil {
		t.Fatalf("renew = %+v", rc)
	}
	t.Run("fail/renew with another root", func(t *testing.T) {
		other := x.req(serviceaccess.KindRenew, "renew-0002", iid)
		other.Witness = r.Witness
		wantKind(t, x.do(t, other, renewalCaller(sepOwner, iid, r.Witness, "r_"+strings.Repeat("z", 26))), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	})
	if err := x.a.CheckServe(ctx, accessClaims(sepOwner, iid, r.Witness, c.Root)); err != nil {
		t.Fatalf("CheckServe = %v", err)
	}
	t.Run("fail/CheckServe on another witness, root or owner", func(t *testing.T) {
		for _, cl := range []*serviceaccess.AccessClaims{
			accessClaims(sepOwner, iid, "w_"+strings.Repeat("z", 52), c.Root),
			accessClaims(sepOwner, iid, r.Witness, "r_"+strings.Repeat("z", 26)),
			accessClaims(sepOwner2, iid, r.Witness, c.Root),
		} {
			if err := x.a.CheckServe(ctx, cl); CodeOf(err) != CodePermissionDenied {
				t.Fatalf("CheckServe(%+v) = %v, want permission-denied", cl, err)
			}
		}
	})
	rd := x.req(serviceaccess.KindReady, "ready-0001", iid)
	rd.Witness = r.Witness
	wantKind(t, x.do(t, rd, accessCaller(sepOwner, iid, r.Witness, c.Root)), serviceaccess.AnswerReady, "")
	if again := x.do(t, rd, accessCaller(sepOwner, iid, r.Witness, c.Root)); again.Kind != serviceaccess.AnswerReady || again.Witness != r.Witness {
		t.Fatalf("ready replay = %+v", again)
	}

	st := x.req(serviceaccess.KindStatus, "", iid)
	st.Target = &serviceaccess.Target{Kind: serviceaccess.TargetInstance}
	s := x.do(t, st, idp(sepOwner))
	if s.Kind != serviceaccess.AnswerStatus || s.Instance == nil || s.Instance.State != "ready" || s.Instance.Witness != r.Witness ||
		s.Instance.Generation != 1 || s.Instance.ApprovalExpiresAt != d.ApprovalExpiresAt {
		t.Fatalf("status = %+v %+v", s, s.Instance)
	}
	st.Target = &serviceaccess.Target{Kind: serviceaccess.TargetOperation, Operation: serviceaccess.KindRegister, RequestID: "reg-00001"}
	if s := x.do(t, st, operator); s.Operation == nil || s.Operation.Outcome != serviceaccess.AnswerRegistered {
		t.Fatalf("operation status = %+v", s.Operation)
	}
	st.Target.RequestID = "reg-unbound"
	if s := x.do(t, st, accessCaller(sepOwner, iid, r.Witness, c.Root)); s.Operation == nil || s.Operation.Outcome != "" {
		t.Fatalf("unbound operation status = %+v", s.Operation)
	}
	t.Run("fail/status of another owner", func(t *testing.T) {
		st.Target = &serviceaccess.Target{Kind: serviceaccess.TargetInstance}
		wantKind(t, x.do(t, st, idp(sepOwner2)), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	})
	t.Run("fail/re-register after activation", func(t *testing.T) {
		re := x.req(serviceaccess.KindRegister, "reg-00002", iid)
		re.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	})
}

// TestServiceApprovalBounds: a short approval caps both tokens; approvalSeconds past a year is
// refused; an approval that ended refuses activate and renew.
func TestServiceApprovalBounds(t *testing.T) {
	x := newSepRig(t)
	iid := iidN(1)
	ans := x.do(t, x.req(serviceaccess.KindRegister, "reg-00001", iid), idp(sepOwner))
	nb := x.req(serviceaccess.KindNameBind, "bind-0001", "")
	nb.Instance, nb.Owner = "", sepOwner
	x.do(t, nb, operator)
	wantKind(t, x.do(t, x.decide(iid, "decide-0001", ans.Proposal, serviceaccess.DecisionApprove, int64(MaxApproval.Seconds())+1), idp(sepOwner)),
		serviceaccess.AnswerDenied, serviceaccess.CodeBadRequest)
	d := x.do(t, x.decide(iid, "decide-0002", ans.Proposal, serviceaccess.DecisionApprove, 30), idp(sepOwner))
	wantKind(t, d, serviceaccess.AnswerDecided, "")
	r := x.do(t, x.req(serviceaccess.KindRegister, "reg-00001", iid), idp(sepOwner))
	wantKind(t, r, serviceaccess.AnswerRegistered, "")
	act := x.req(serviceaccess.KindActivate, "act-00001", iid)
	act.Witness = r.Witness
	c := x.do(t, act, idp(sepOwner))
	wantKind(t, c, serviceaccess.AnswerCredential, "")
	if c.Access.Exp > d.ApprovalExpiresAt || c.Renewal.Exp > d.ApprovalExpiresAt || c.ApprovalExpiresAt != d.ApprovalExpiresAt {
		t.Fatalf("tokens end %d and %d, past the approval's end %d", c.Access.Exp, c.Renewal.Exp, d.ApprovalExpiresAt)
	}
	x.advance(31 * time.Second)
	t.Run("fail/renew after the approval ended", func(t *testing.T) {
		ren := x.req(serviceaccess.KindRenew, "renew-0001", iid)
		ren.Witness = r.Witness
		wantKind(t, x.do(t, ren, renewalCaller(sepOwner, iid, r.Witness, c.Root)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		wantKind(t, x.do(t, act, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		if err := x.a.CheckServe(context.Background(), accessClaims(sepOwner, iid, r.Witness, c.Root)); CodeOf(err) != CodePermissionDenied {
			t.Fatalf("CheckServe after the approval = %v", err)
		}
	})
}

// TestServiceRevoke: revoke ends the approval and the root: renew, activate and CheckServe
// refuse; status reads revoked; the revoke replays.
func TestServiceRevoke(t *testing.T) {
	x := newSepRig(t)
	iid := iidN(2)
	r := x.registered(t, iid, "reg-00001", 1)
	act := x.req(serviceaccess.KindActivate, "act-00001", iid)
	act.Witness = r.Witness
	c := x.do(t, act, idp(sepOwner))
	wantKind(t, c, serviceaccess.AnswerCredential, "")
	p, _, _, _ := x.s.ServiceProposal(context.Background(), sepEP, iid)
	rv := x.decide(iid, "revoke-001", p.Proposal, serviceaccess.DecisionRevoke, 0)
	wantKind(t, x.do(t, rv, idp(sepOwner2)), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	wantKind(t, x.do(t, rv, idp(sepOwner)), serviceaccess.AnswerDecided, "")
	wantKind(t, x.do(t, rv, idp(sepOwner)), serviceaccess.AnswerDecided, "")
	root, _, _, _ := x.s.ServiceRoot(context.Background(), sepEP, iid)
	if root.ExpiresAt > x.now().Unix() {
		t.Fatalf("root ends %d after the revoke", root.ExpiresAt)
	}
	ren := x.req(serviceaccess.KindRenew, "renew-0001", iid)
	ren.Witness = r.Witness
	wantKind(t, x.do(t, ren, renewalCaller(sepOwner, iid, r.Witness, c.Root)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	wantKind(t, x.do(t, act, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	if err := x.a.CheckServe(context.Background(), accessClaims(sepOwner, iid, r.Witness, c.Root)); CodeOf(err) != CodePermissionDenied {
		t.Fatalf("CheckServe after revoke = %v", err)
	}
	st := x.req(serviceaccess.KindStatus, "", iid)
	st.Target = &serviceaccess.Target{Kind: serviceaccess.TargetInstance}
	if s := x.do(t, st, operator); s.Instance == nil || s.Instance.State != "revoked" {
		t.Fatalf("status after revoke = %+v", s.Instance)
	}
}

// TestServiceRefusals: each refusal of item 4 outside the barrier.
func TestServiceRefusals(t *testing.T) {
	x := newSepRig(t)
	ctx := context.Background()
	t.Run("fail/decide before the name is bound", func(t *testing.T) {
		ans := x.do(t, x.req(serviceaccess.KindRegister, "reg-00001", iidN(10)), idp(sepOwner))
		wantKind(t, x.do(t, x.decide(iidN(10), "decide-0001", ans.Proposal, serviceaccess.DecisionApprove, 0), idp(sepOwner)),
			serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	})
	nb := x.req(serviceaccess.KindNameBind, "bind-0001", "")
	nb.Instance, nb.Owner = "", sepOwner
	wantKind(t, x.do(t, nb, operator), serviceaccess.AnswerBound, "")
	t.Run("fail/name-bind to another owner", func(t *testing.T) {
		other := x.req(serviceaccess.KindNameBind, "bind-0002", "")
		other.Instance, other.Owner = "", sepOwner2
		wantKind(t, x.do(t, other, operator), serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
		nb2 := *nb
		nb2.Owner = sepOwner2
		wantKind(t, x.do(t, &nb2, operator), serviceaccess.AnswerConflict, serviceaccess.ReasonBodyChanged)
		n, _, _, _ := x.s.ServiceName(ctx, sepEP)
		if n.Owner != sepOwner {
			t.Fatalf("name bound to %s", n.Owner)
		}
	})
	t.Run("fail/register of another owner than the name's", func(t *testing.T) {
		wantKind(t, x.do(t, x.req(serviceaccess.KindRegister, "reg-00009", iidN(11)), idp(sepOwner2)), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	})
	t.Run("ok/the name's owner replaces another owner's open proposal", func(t *testing.T) {
		const ep = "svc.two"
		c := sepContractOf(ep)
		reg := func(rid, owner string) *serviceaccess.Answer {
			r := x.req(serviceaccess.KindRegister, rid, iidN(20))
			r.Endpoint, r.Contract = ep, &c
			return x.do(t, r, idp(owner))
		}
		first := reg("reg-other-1", sepOwner2)
		wantKind(t, first, serviceaccess.AnswerApprovalRequired, "")
		wantKind(t, reg("reg-mine-01", sepOwner), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
		bind := x.req(serviceaccess.KindNameBind, "bind-two-1", "")
		bind.Endpoint, bind.Instance, bind.Owner = ep, "", sepOwner
		wantKind(t, x.do(t, bind, operator), serviceaccess.AnswerBound, "")
		mine := reg("reg-mine-02", sepOwner)
		wantKind(t, mine, serviceaccess.AnswerApprovalRequired, "")
		if mine.Proposal == first.Proposal {
			t.Fatal("the name's owner got the other owner's proposal")
		}
		wantKind(t, reg("reg-other-1", sepOwner2), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	})
	t.Run("fail/refused proposal is 412 on replay", func(t *testing.T) {
		reg := x.req(serviceaccess.KindRegister, "reg-00002", iidN(12))
		ans := x.do(t, reg, idp(sepOwner))
		wantKind(t, x.do(t, x.decide(iidN(12), "decide-0002", ans.Proposal, serviceaccess.DecisionRefuse, 0), idp(sepOwner)), serviceaccess.AnswerDecided, "")
		wantKind(t, x.do(t, reg, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		// A new requestId proposes again.
		again := x.do(t, x.req(serviceaccess.KindRegister, "reg-00003", iidN(12)), idp(sepOwner))
		if again.Kind != serviceaccess.AnswerApprovalRequired || again.Proposal == ans.Proposal {
			t.Fatalf("a new register after the refusal = %+v", again)
		}
	})
	t.Run("fail/expired proposal is 412", func(t *testing.T) {
		reg := x.req(serviceaccess.KindRegister, "reg-00004", iidN(13))
		ans := x.do(t, reg, idp(sepOwner))
		x.advance(ProposalLifetime + time.Second)
		defer x.advance(-ProposalLifetime - time.Second)
		wantKind(t, x.do(t, reg, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		wantKind(t, x.do(t, x.decide(iidN(13), "decide-0003", ans.Proposal, serviceaccess.DecisionApprove, 0), idp(sepOwner)),
			serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	})
	t.Run("fail/changed body under a bound requestId", func(t *testing.T) {
		reg := x.req(serviceaccess.KindRegister, "reg-00005", iidN(14))
		x.do(t, reg, idp(sepOwner))
		reg.Expected = &serviceaccess.Expected{State: "registered", Witness: "w_" + strings.Repeat("a", 52)}
		wantKind(t, x.do(t, reg, idp(sepOwner)), serviceaccess.AnswerConflict, serviceaccess.ReasonBodyChanged)
	})
	t.Run("fail/expected mismatch", func(t *testing.T) {
		iid := iidN(15)
		r := x.registered(t, iid, "reg-00006", 1)
		plain := x.req(serviceaccess.KindRegister, "reg-00007", iid)
		a := x.do(t, plain, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
		if a.Witness != r.Witness {
			t.Fatalf("conflict names witness %q, want the current %q", a.Witness, r.Witness)
		}
		wrong := x.req(serviceaccess.KindRegister, "reg-00008", iid)
		wrong.Expected = &serviceaccess.Expected{State: "registered", Witness: "w_" + strings.Repeat("a", 52)}
		wantKind(t, x.do(t, wrong, idp(sepOwner)), serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
		if g := x.gate(t, iid); g.Generation != 1 {
			t.Fatalf("a refused re-registration moved the gate to %d", g.Generation)
		}
	})
	t.Run("ok/pre-activation re-registration yields a new witness", func(t *testing.T) {
		iid := iidN(16)
		r := x.registered(t, iid, "reg-00010", 1)
		re := x.req(serviceaccess.KindRegister, "reg-00011", iid)
		re.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		a := x.do(t, re, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerRegistered, "")
		if a.Witness == r.Witness || a.Generation != 3 {
			t.Fatalf("re-registration = witness %q generation %d; want a new witness at 3", a.Witness, a.Generation)
		}
		act := x.req(serviceaccess.KindActivate, "act-00001", iid)
		act.Witness = r.Witness
		wantKind(t, x.do(t, act, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
	})
	t.Run("fail/65th requestId is rate-limited", func(t *testing.T) {
		iid := iidN(17)
		x.registered(t, iid, "reg-00012", 1) // binds register and decide: 2 entries
		p, _, _, _ := x.s.ServiceProposal(ctx, sepEP, iid)
		for i := 3; i <= lifecycle.MaxServiceLedgerEntries; i++ {
			wantKind(t, x.do(t, x.decide(iid, fmt.Sprintf("refuse-%04d", i), p.Proposal, serviceaccess.DecisionRefuse, 0), idp(sepOwner)),
				serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		}
		wantKind(t, x.do(t, x.decide(iid, "refuse-0065", p.Proposal, serviceaccess.DecisionRefuse, 0), idp(sepOwner)),
			serviceaccess.AnswerDenied, serviceaccess.CodeRateLimited)
		// A bound requestId still replays.
		wantKind(t, x.do(t, x.req(serviceaccess.KindRegister, "reg-00012", iid), idp(sepOwner)), serviceaccess.AnswerRegistered, "")
	})
	t.Run("fail/another space, a wrong proof", func(t *testing.T) {
		r := x.req(serviceaccess.KindRegister, "reg-00013", iidN(18))
		r.Space = "other"
		wantKind(t, x.do(t, r, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
		wantKind(t, x.do(t, x.req(serviceaccess.KindRegister, "reg-00013", iidN(18)), operator), serviceaccess.AnswerDenied, serviceaccess.CodePermissionDenied)
	})
	t.Run("fail/a corrupt row is unavailable", func(t *testing.T) {
		key, _ := lifecycle.ServiceLedgerKey(sepEP, iidN(19))
		x.put(t, space.Auth, key, []byte(`{"v":1,"garbled":true}`))
		wantKind(t, x.do(t, x.req(serviceaccess.KindRegister, "reg-00014", iidN(19)), idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
	})
}

// TestServiceRecovery: the barrier's outcomes under faults and contention: a fault at each write
// answers 503 and the replay advances the generation exactly once; a live foreign freeze is 503,
// a stale one is aborted or rolled forward; the same request in flight is 503; a lost freeze is
// overtaken or gate-moved.
func TestServiceRecovery(t *testing.T) {
	x := newSepRig(t)
	ctx := context.Background()
	n := 100
	// reRegister registers iid at generation 1 and returns a pre-activation re-registration
	// request expecting it.
	reRegister := func(t *testing.T, rid string) (*serviceaccess.Request, *serviceaccess.Answer, string) {
		t.Helper()
		n++
		iid := iidN(n)
		r := x.registered(t, iid, "reg-first", 1)
		re := x.req(serviceaccess.KindRegister, rid, iid)
		re.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		return re, r, iid
	}
	faultAt := func(point string) {
		x.a.sep.fault = func(p string) error {
			if p == point {
				return errors.New("injected")
			}
			return nil
		}
	}
	for _, point := range []string{"ledger-registering", "freeze", "spec", "reopen", "ledger-registered"} {
		t.Run("ok/fault at "+point+" then replay advances the generation once", func(t *testing.T) {
			re, _, iid := reRegister(t, "reg-again")
			faultAt(point)
			wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			x.a.sep.fault = nil
			a := x.do(t, re, idp(sepOwner))
			wantKind(t, a, serviceaccess.AnswerRegistered, "")
			if g := x.gate(t, iid); a.Generation != 3 || g.Generation != 3 || g.State != lifecycle.GateOpen || g.ProcessEpoch != 1 {
				t.Fatalf("after the replay: answer generation %d, gate %+v; want 3, open at epoch 1", a.Generation, g)
			}
			if again := x.do(t, re, idp(sepOwner)); again.Witness != a.Witness || again.Generation != 3 {
				t.Fatalf("second replay = %+v", again)
			}
		})
	}
	for _, point := range []string{"ledger-registering", "spec", "reopen", "ledger-registered"} {
		t.Run("ok/first registration: fault at "+point+" then replay", func(t *testing.T) {
			n++
			iid := iidN(n)
			x.approved(t, iid, "reg-first")
			faultAt(point)
			wantKind(t, x.do(t, x.req(serviceaccess.KindRegister, "reg-first", iid), idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			x.a.sep.fault = nil
			a := x.do(t, x.req(serviceaccess.KindRegister, "reg-first", iid), idp(sepOwner))
			wantKind(t, a, serviceaccess.AnswerRegistered, "")
			if g := x.gate(t, iid); a.Generation != 1 || g.Generation != 1 {
				t.Fatalf("answer generation %d, gate %+v; want 1", a.Generation, g)
			}
		})
	}
	t.Run("fail/foreign live freeze is 503; stale is aborted", func(t *testing.T) {
		re, r, iid := reRegister(t, "reg-stuck")
		faultAt("spec") // frozen, spec not written
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		x.a.sep.fault = nil
		other := x.req(serviceaccess.KindRegister, "reg-other", iid)
		other.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		wantKind(t, x.do(t, other, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		if g := x.gate(t, iid); g.State != lifecycle.GateFrozen {
			t.Fatalf("the live freeze was touched: %+v", g)
		}
		x.advance(StaleFreeze + 2*time.Second)
		a := x.do(t, other, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerRegistered, "")
		// freeze 2, abort 3, freeze 4, reopen 5.
		if g := x.gate(t, iid); a.Generation != 5 || g.Generation != 5 || g.ProcessEpoch != 1 {
			t.Fatalf("after aborting the stale freeze: answer %d, gate %+v", a.Generation, g)
		}
		// The aborted request's replay: its expected witness is no longer current.
		b := x.do(t, re, idp(sepOwner))
		wantKind(t, b, serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
		if b.Witness != a.Witness {
			t.Fatalf("conflict names %q, want the current %q", b.Witness, a.Witness)
		}
	})
	t.Run("ok/stale freeze with its spec written is rolled forward", func(t *testing.T) {
		re, r, iid := reRegister(t, "reg-stuck")
		faultAt("reopen") // frozen, spec written
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		x.a.sep.fault = nil
		x.advance(StaleFreeze + 2*time.Second)
		other := x.req(serviceaccess.KindRegister, "reg-other", iid)
		other.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		wantKind(t, x.do(t, other, idp(sepOwner)), serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
		a := x.do(t, re, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerRegistered, "")
		if g := x.gate(t, iid); a.Generation != 3 || g.Generation != 3 || g.State != lifecycle.GateOpen {
			t.Fatalf("rolled forward: answer %d, gate %+v; want 3", a.Generation, g)
		}
	})
	t.Run("ok/stale own freeze is adopted by its replay", func(t *testing.T) {
		re, _, iid := reRegister(t, "reg-stuck")
		faultAt("spec")
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		x.a.sep.fault = nil
		x.advance(StaleFreeze + 2*time.Second)
		a := x.do(t, re, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerRegistered, "")
		if g := x.gate(t, iid); a.Generation != 3 || g.Generation != 3 {
			t.Fatalf("adopted: answer %d, gate %+v; want 3", a.Generation, g)
		}
	})
	t.Run("fail/same request in flight is 503", func(t *testing.T) {
		re, _, _ := reRegister(t, "reg-flight")
		entered, release := make(chan struct{}), make(chan struct{})
		x.a.sep.fault = func(p string) error {
			if p == "freeze" {
				close(entered)
				<-release
			}
			return nil
		}
		done := make(chan *serviceaccess.Answer, 1)
		go func() {
			a, _ := x.a.ServiceRequest(ctx, re, idp(sepOwner))
			done <- a
		}()
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the first invocation never reached its freeze")
		}
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		close(release)
		select {
		case a := <-done:
			wantKind(t, a, serviceaccess.AnswerRegistered, "")
		case <-time.After(10 * time.Second):
			t.Fatal("the first invocation did not finish")
		}
		x.a.sep.fault = nil
	})
	lost := func(t *testing.T, move func(g lifecycle.EndpointGate) lifecycle.EndpointGate, reason string) (*serviceaccess.Request, string) {
		re, r, iid := reRegister(t, "reg-lost")
		gkey, _ := lifecycle.EndpointGateKey(sepEP, iid)
		x.a.sep.fault = func(p string) error {
			if p == "freeze" {
				x.a.sep.fault = nil
				g, rev, _, err := x.s.EndpointGate(ctx, sepEP, iid)
				if err != nil {
					return err
				}
				b, _ := lifecycle.EncodeEndpointGate(move(g))
				_, err = x.s.Update(ctx, space.Auth, gkey, b, rev)
				return err
			}
			return nil
		}
		a := x.do(t, re, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerConflict, reason)
		if a.Witness != r.Witness {
			t.Fatalf("conflict names %q, want %q", a.Witness, r.Witness)
		}
		return re, iid
	}
	t.Run("fail/lost freeze to a moved gate is gate-moved, and its replay registers", func(t *testing.T) {
		re, iid := lost(t, func(g lifecycle.EndpointGate) lifecycle.EndpointGate { g.Generation += 2; return g }, serviceaccess.ReasonGateMoved)
		a := x.do(t, re, idp(sepOwner))
		wantKind(t, a, serviceaccess.AnswerRegistered, "")
		if g := x.gate(t, iid); a.Generation != 5 || g.Generation != 5 || g.ProcessEpoch != 1 {
			t.Fatalf("the replay after gate-moved: answer %d, gate %+v; want 5 at epoch 1", a.Generation, g)
		}
	})
	t.Run("fail/lost freeze to a registration is overtaken", func(t *testing.T) {
		lost(t, func(g lifecycle.EndpointGate) lifecycle.EndpointGate {
			op, _ := lifecycle.RegistrationOpID(sepEP, g.Principal[len(g.Principal)-26:], g.ProcessEpoch)
			g.State, g.Generation, g.Op = lifecycle.GateFrozen, g.Generation+1, &lifecycle.Op{OpID: op, Kind: lifecycle.OpRegistration}
			return g
		}, serviceaccess.ReasonOvertaken)
	})
}

// TestServiceWriteFaults: a fault at each write outside the barrier answers 503 and writes
// nothing further; the replay of the same request finishes it (name-bind, propose, ledger bind,
// artifact, decide, root, revoke's root end).
func TestServiceWriteFaults(t *testing.T) {
	x := newSepRig(t)
	ctx := context.Background()
	faultOnce := func(point string) {
		x.a.sep.fault = func(p string) error {
			if p == point {
				x.a.sep.fault = nil
				return errors.New("injected")
			}
			return nil
		}
	}
	t.Run("ok/name-bind", func(t *testing.T) {
		nb := x.req(serviceaccess.KindNameBind, "bind-0001", "")
		nb.Instance, nb.Owner = "", sepOwner
		faultOnce("name-bind")
		wantKind(t, x.do(t, nb, operator), serviceaccess.AnswerUnavailable, "")
		wantKind(t, x.do(t, nb, operator), serviceaccess.AnswerBound, "")
	})
	for i, point := range []string{"propose", "ledger-bind"} {
		t.Run("ok/register "+point, func(t *testing.T) {
			iid := iidN(300 + i)
			reg := x.req(serviceaccess.KindRegister, "reg-00001", iid)
			faultOnce(point)
			wantKind(t, x.do(t, reg, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			a := x.do(t, reg, idp(sepOwner))
			wantKind(t, a, serviceaccess.AnswerApprovalRequired, "")
			p, _, found, err := x.s.ServiceProposal(ctx, sepEP, iid)
			if err != nil || !found || p.Proposal != a.Proposal || p.RequestID != "reg-00001" {
				t.Fatalf("proposal %+v found %v %v; want %s", p, found, err, a.Proposal)
			}
		})
	}
	for i, point := range []string{"artifact", "decide"} {
		t.Run("ok/decide "+point, func(t *testing.T) {
			iid := iidN(310 + i)
			ans := x.do(t, x.req(serviceaccess.KindRegister, "reg-00001", iid), idp(sepOwner))
			dec := x.decide(iid, "decide-0001", ans.Proposal, serviceaccess.DecisionApprove, 0)
			if point == "artifact" {
				// The artifact row is shared by digest; give this instance its own.
				m, _ := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: sepEP, Kind: "endpoint"},
					Members: []serviceaccess.Member{{URN: sepEP + ".x", Kind: "type"}}})
				x.contract = serviceaccess.Contract{Closures: []string{digestOf(m)}, Artifacts: []serviceaccess.Artifact{{Digest: digestOf(m), Bytes: m}}}
				defer func() { x.contract = sepContract() }()
				ans = x.do(t, x.req(serviceaccess.KindRegister, "reg-00002", iid), idp(sepOwner))
				dec = x.decide(iid, "decide-0001", ans.Proposal, serviceaccess.DecisionApprove, 0)
			}
			faultOnce(point)
			wantKind(t, x.do(t, dec, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			d := x.do(t, dec, idp(sepOwner))
			wantKind(t, d, serviceaccess.AnswerDecided, "")
			p, _, _, _ := x.s.ServiceProposal(ctx, sepEP, iid)
			if p.State != lifecycle.ProposalApproved || p.ApprovalExpiresAt != d.ApprovalExpiresAt {
				t.Fatalf("proposal %+v after the replay; want approved until %d", p, d.ApprovalExpiresAt)
			}
			if _, _, found, err := x.s.ServiceArtifact(ctx, x.contract.Artifacts[0].Digest); err != nil || !found {
				t.Fatalf("artifact found %v, %v", found, err)
			}
		})
	}
	t.Run("ok/activate root then revoke root-end", func(t *testing.T) {
		iid := iidN(320)
		r := x.registered(t, iid, "reg-00001", 1)
		act := x.req(serviceaccess.KindActivate, "act-00001", iid)
		act.Witness = r.Witness
		faultOnce("root")
		wantKind(t, x.do(t, act, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		if _, _, found, _ := x.s.ServiceRoot(ctx, sepEP, iid); found {
			t.Fatal("a root was written past the fault")
		}
		c := x.do(t, act, idp(sepOwner))
		wantKind(t, c, serviceaccess.AnswerCredential, "")
		p, _, _, _ := x.s.ServiceProposal(ctx, sepEP, iid)
		rv := x.decide(iid, "revoke-001", p.Proposal, serviceaccess.DecisionRevoke, 0)
		faultOnce("root-end")
		wantKind(t, x.do(t, rv, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
		if root, _, _, _ := x.s.ServiceRoot(ctx, sepEP, iid); root.ExpiresAt <= x.now().Unix() {
			t.Fatal("the root ended past the fault")
		}
		wantKind(t, x.do(t, rv, idp(sepOwner)), serviceaccess.AnswerDecided, "")
		if root, _, _, _ := x.s.ServiceRoot(ctx, sepEP, iid); root.ExpiresAt > x.now().Unix() || root.Root != c.Root {
			t.Fatalf("root after the replayed revoke: %+v", root)
		}
	})
	t.Run("fail/an artifact over its bound is too-large", func(t *testing.T) {
		big := make([]byte, lifecycle.MaxServiceArtifactBytes+1)
		c := serviceaccess.Contract{Closures: []string{digestOf(big)}, Artifacts: []serviceaccess.Artifact{{Digest: digestOf(big), Bytes: big}}}
		r := x.req(serviceaccess.KindRegister, "reg-00001", iidN(330))
		r.Contract = &c
		wantKind(t, x.do(t, r, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeTooLarge)
	})
}

// TestServiceBarrierEdges: a first activate landing between a re-registration's read and its
// freeze undoes the freeze (412, the gate open at its epoch); a fault in a stale freeze's
// recovery answers 503 and the next register recovers it.
func TestServiceBarrierEdges(t *testing.T) {
	x := newSepRig(t)
	ctx := context.Background()
	t.Run("fail/activate racing a re-registration", func(t *testing.T) {
		iid := iidN(400)
		r := x.registered(t, iid, "reg-00001", 1)
		re := x.req(serviceaccess.KindRegister, "reg-00002", iid)
		re.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
		act := x.req(serviceaccess.KindActivate, "act-00001", iid)
		act.Witness = r.Witness
		x.a.sep.fault = func(p string) error {
			if p == "freeze" {
				x.a.sep.fault = nil
				if a, _ := x.a.ServiceRequest(ctx, act, idp(sepOwner)); a.Kind != serviceaccess.AnswerCredential {
					return fmt.Errorf("the racing activate answered %s %s", a.Kind, a.Code)
				}
			}
			return nil
		}
		wantKind(t, x.do(t, re, idp(sepOwner)), serviceaccess.AnswerDenied, serviceaccess.CodeFailedPrecondition)
		if g := x.gate(t, iid); g.State != lifecycle.GateOpen || g.ProcessEpoch != 0 || g.Generation != 3 {
			t.Fatalf("gate after the undone freeze = %+v; want open at epoch 0, generation 3", g)
		}
		if err := x.a.CheckServe(ctx, accessClaims(sepOwner, iid, r.Witness, mustRoot(t, x, iid))); err != nil {
			t.Fatalf("the activated registration no longer serves: %v", err)
		}
	})
	for _, point := range []string{"abort", "roll-forward"} {
		t.Run("ok/fault in the stale freeze's "+point, func(t *testing.T) {
			iid := iidN(410)
			if point == "roll-forward" {
				iid = iidN(411)
			}
			r := x.registered(t, iid, "reg-00001", 1)
			stuck := x.req(serviceaccess.KindRegister, "reg-stuck", iid)
			stuck.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
			crash := "spec"
			if point == "roll-forward" {
				crash = "reopen"
			}
			x.a.sep.fault = func(p string) error {
				if p == crash {
					return errors.New("injected")
				}
				return nil
			}
			wantKind(t, x.do(t, stuck, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			x.advance(StaleFreeze + 2*time.Second)
			x.a.sep.fault = func(p string) error {
				if p == point {
					return errors.New("injected")
				}
				return nil
			}
			other := x.req(serviceaccess.KindRegister, "reg-other", iid)
			other.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
			wantKind(t, x.do(t, other, idp(sepOwner)), serviceaccess.AnswerUnavailable, "")
			if g := x.gate(t, iid); g.State != lifecycle.GateFrozen {
				t.Fatalf("gate after the failed recovery = %+v; want still frozen", g)
			}
			x.a.sep.fault = nil
			a := x.do(t, other, idp(sepOwner))
			if point == "abort" {
				wantKind(t, a, serviceaccess.AnswerRegistered, "")
				if a.Generation != 5 {
					t.Fatalf("after the abort the other registered at %d, want 5", a.Generation)
				}
			} else {
				wantKind(t, a, serviceaccess.AnswerConflict, serviceaccess.ReasonExpected)
				if g := x.gate(t, iid); g.State != lifecycle.GateOpen || g.Generation != 3 || g.ProcessEpoch != 1 {
					t.Fatalf("rolled forward gate = %+v", g)
				}
			}
		})
	}
}

func mustRoot(t *testing.T, x *sepRig, iid string) string {
	t.Helper()
	r, _, found, err := x.s.ServiceRoot(context.Background(), sepEP, iid)
	if err != nil || !found {
		t.Fatalf("root: found %v, %v", found, err)
	}
	return r.Root
}
