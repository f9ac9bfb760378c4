package serviceaccess_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

const (
	testReqID    = "req-0001_abc"
	testProposal = "p_abcdefghijklmnopqrstuvwxyz"
)

func contractJSON(t testing.TB) string {
	t.Helper()
	b, err := json.Marshal(contractOf(manifestJSON(testEP)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// envelopes are one valid envelope per request kind and proof kind the parser knows.
func envelopes(t testing.TB) map[string]string {
	base := `"account":"` + testAccount + `","space":"` + testSpace + `"`
	ids := base + `,"requestId":"` + testReqID + `"`
	inst := `"endpoint":"` + testEP + `","instance":"` + testIID + `"`
	idp := `{"kind":"idp","token":"aaa.bbb.ccc"}`
	c := contractJSON(t)
	env := func(req, proof string) string { return `{"request":` + req + `,"proof":` + proof + `}` }
	return map[string]string{
		"register":              env(`{"kind":"register",`+ids+`,`+inst+`,"contract":`+c+`}`, idp),
		"register expected":     env(`{"kind":"register",`+ids+`,`+inst+`,"contract":`+c+`,"expected":{"state":"registered","witness":"`+testWitness+`"}}`, idp),
		"activate":              env(`{"kind":"activate",`+ids+`,`+inst+`,"witness":"`+testWitness+`"}`, `{"kind":"renewal","token":"a-b.c_d.e"}`),
		"renew":                 env(`{"kind":"renew",`+ids+`,`+inst+`,"witness":"`+testWitness+`"}`, `{"kind":"renewal","token":"a.b.c"}`),
		"ready":                 env(`{"kind":"ready",`+ids+`,`+inst+`,"witness":"`+testWitness+`"}`, `{"kind":"access","token":"a.b.c"}`),
		"status instance":       env(`{"kind":"status",`+base+`,`+inst+`,"target":{"kind":"instance"}}`, `{"kind":"operator"}`),
		"status operation":      env(`{"kind":"status",`+base+`,`+inst+`,"target":{"kind":"operation","operation":"register","requestId":"`+testReqID+`"}}`, idp),
		"name-bind":             env(`{"kind":"name-bind",`+ids+`,"endpoint":"`+testEP+`","owner":"`+testOwner+`"}`, `{"kind":"operator"}`),
		"decide approve":        env(`{"kind":"decide",`+ids+`,`+inst+`,"proposal":"`+testProposal+`","contract":`+c+`,"decision":"approve","approvalSeconds":31536000}`, idp),
		"decide approve no ttl": env(`{"kind":"decide",`+ids+`,`+inst+`,"proposal":"`+testProposal+`","contract":`+c+`,"decision":"approve"}`, idp),
		"decide refuse":         env(`{"kind":"decide",`+ids+`,`+inst+`,"proposal":"`+testProposal+`","contract":`+c+`,"decision":"refuse"}`, idp),
		"decide revoke":         env(`{"kind":"decide",`+ids+`,`+inst+`,"proposal":"`+testProposal+`","contract":`+c+`,"decision":"revoke"}`, idp),
	}
}

func TestParseEnvelopeOK(t *testing.T) {
	for name, body := range envelopes(t) {
		t.Run("ok/"+name, func(t *testing.T) {
			e, err := serviceaccess.ParseEnvelope([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			r := e.Request
			if r.Account != testAccount || r.Space != testSpace || !serviceaccess.ValidKind(r.Kind) {
				t.Fatalf("request %+v", r)
			}
			if (r.Kind == serviceaccess.KindStatus) != (r.RequestID == "") {
				t.Fatalf("requestId %q for %s", r.RequestID, r.Kind)
			}
			// The parsed request re-encodes to the body's request, key for key.
			var in struct{ Request map[string]any }
			if err := json.Unmarshal([]byte(body), &in); err != nil {
				t.Fatal(err)
			}
			out, _ := json.Marshal(r)
			var back map[string]any
			_ = json.Unmarshal(out, &back)
			a, _ := json.Marshal(in.Request)
			b, _ := json.Marshal(back)
			if string(a) != string(b) {
				t.Fatalf("request read as\n%s\nwant\n%s", b, a)
			}
		})
	}
	t.Run("ok/register fields", func(t *testing.T) {
		e, err := serviceaccess.ParseEnvelope([]byte(envelopes(t)["register expected"]))
		if err != nil {
			t.Fatal(err)
		}
		r := e.Request
		if r.Kind != serviceaccess.KindRegister || r.RequestID != testReqID || r.Endpoint != testEP || r.Instance != testIID ||
			r.Expected == nil || r.Expected.Witness != testWitness || r.Contract == nil || len(r.Contract.Closures) != 1 ||
			string(r.Contract.Artifacts[0].Bytes) != manifestJSON(testEP) || e.Proof.Kind != serviceaccess.ProofIDP || e.Proof.Token != "aaa.bbb.ccc" {
			t.Fatalf("envelope %+v", e)
		}
	})
	t.Run("ok/status operation target", func(t *testing.T) {
		e, err := serviceaccess.ParseEnvelope([]byte(envelopes(t)["status operation"]))
		if err != nil {
			t.Fatal(err)
		}
		if tg := e.Request.Target; tg == nil || tg.Kind != serviceaccess.TargetOperation || tg.Operation != serviceaccess.KindRegister || tg.RequestID != testReqID {
			t.Fatalf("target %+v", tg)
		}
	})
}

func TestParseEnvelopeFail(t *testing.T) {
	envs := envelopes(t)
	reg := envs["register"]
	ready := envs["ready"]
	st := envs["status operation"]
	dec := envs["decide approve"]
	nb := envs["name-bind"]
	r := strings.Replace
	cases := []struct{ name, body, field string }{
		{"fail/empty", ``, "body"},
		{"fail/null", `null`, "body"},
		{"fail/array", `[]`, "body"},
		{"fail/trailing data", reg + ` {}`, "body"},
		{"fail/trailing garbage", reg + `x`, "body"},
		{"fail/unknown top key", r(reg, `{"request"`, `{"extra":1,"request"`, 1), ""},
		{"fail/re-cased top key", r(reg, `"request"`, `"Request"`, 1), ""},
		{"fail/duplicate top key", r(reg, `"proof":`, `"proof":{"kind":"operator"},"proof":`, 1), ""},
		{"fail/no proof", r(reg, `,"proof":{"kind":"idp","token":"aaa.bbb.ccc"}`, ``, 1), "proof"},
		{"fail/request null", `{"request":null,"proof":{"kind":"operator"}}`, "request"},
		{"fail/request kind missing", r(reg, `"kind":"register",`, ``, 1), "request.kind"},
		{"fail/request kind unknown", r(reg, `"kind":"register"`, `"kind":"deregister"`, 1), "request.kind"},
		{"fail/request kind re-cased", r(reg, `"kind":"register"`, `"kind":"Register"`, 1), "request.kind"},
		{"fail/request re-cased key", r(reg, `"endpoint"`, `"Endpoint"`, 1), "request"},
		{"fail/request duplicate key", r(reg, `"endpoint":`, `"endpoint":"x","endpoint":`, 1), "request"},
		{"fail/request field of another kind", r(reg, `"endpoint":`, `"witness":"`+testWitness+`","endpoint":`, 1), "request"},
		{"fail/register missing contract", r(r(reg, `"contract":`, `"x":`, 1), `,"x":`+contractJSON(t), ``, 1), "request.contract"},
		{"fail/ready missing witness", r(ready, `,"witness":"`+testWitness+`"`, ``, 1), "request.witness"},
		{"fail/missing requestId", r(ready, `"requestId":"`+testReqID+`",`, ``, 1), "request.requestId"},
		{"fail/status with requestId", r(st, `"kind":"status",`, `"kind":"status","requestId":"`+testReqID+`",`, 1), "request"},
		{"fail/account user key", r(reg, testAccount, "U"+testAccount[1:], 1), "request.account"},
		{"fail/account null", r(reg, `"`+testAccount+`"`, `null`, 1), "request.account"},
		{"fail/space empty", r(reg, `"space":"`+testSpace+`"`, `"space":""`, 1), "request.space"},
		{"fail/space number", r(reg, `"space":"`+testSpace+`"`, `"space":1`, 1), "request.space"},
		{"fail/requestId short", r(reg, testReqID, "abc", 1), "request.requestId"},
		{"fail/requestId bad char", r(reg, testReqID, "abcd.efgh", 1), "request.requestId"},
		{"fail/endpoint", r(reg, `"endpoint":"`+testEP+`"`, `"endpoint":"Billing"`, 1), "request.endpoint"},
		{"fail/instance", r(reg, testIID, "ABC", 1), "request.instance"},
		{"fail/witness", r(ready, testWitness, "w_abc", 1), "request.witness"},
		{"fail/owner not derived", r(nb, testOwner, "alice", 1), "request.owner"},
		{"fail/proposal", r(dec, testProposal, "p_x", 1), "request.proposal"},
		{"fail/contract for another endpoint", r(reg, `"endpoint":"`+testEP+`"`, `"endpoint":"ledger"`, 1), "contract"},
		{"fail/contract unknown key", r(reg, `"closures"`, `"x":1,"closures"`, 1), "request.contract"},
		{"fail/contract null", r(r(reg, `"contract":`, `"contract":null,"x":`, 1), `,"x":`+contractJSON(t), ``, 1), "request.contract"},
		{"fail/contract bytes with a newline", r(reg, `"bytes":"`, `"bytes":"\n`, 1), "bytes"},
		{"fail/contract bytes url alphabet", r(reg, `"bytes":"ey`, `"bytes":"_-`, 1), "bytes"},
		{"fail/contract bytes unpadded", r(reg, `"bytes":"`, `"bytes":"QQ`, 1), "bytes"},
		{"fail/contract artifact re-cased", r(reg, `"digest"`, `"Digest"`, 1), "artifacts[0]"},
		{"fail/expected other state", r(envs["register expected"], `"state":"registered"`, `"state":"active"`, 1), "request.expected.state"},
		{"fail/expected no witness", r(envs["register expected"], `,"witness":"`+testWitness+`"`, ``, 1), "request.expected.witness"},
		{"fail/expected extra", r(envs["register expected"], `"state":"registered"`, `"state":"registered","generation":1`, 1), "request.expected"},
		{"fail/expected null", r(r(envs["register expected"], `"expected":{"state":"registered","witness":"`+testWitness+`"}`, `"expected":null`, 1), `x`, `x`, 1), "request.expected"},
		{"fail/target operation without operation", r(st, `"operation":"register",`, ``, 1), "request.target.operation"},
		{"fail/target operation status", r(st, `"operation":"register"`, `"operation":"status"`, 1), "request.target.operation"},
		{"fail/target operation unknown", r(st, `"operation":"register"`, `"operation":"deregister"`, 1), "request.target.operation"},
		{"fail/target operation no requestId", r(st, `,"requestId":"`+testReqID+`"}}`, `}}`, 1), "request.target.requestId"},
		{"fail/target instance with requestId", r(envs["status instance"], `{"kind":"instance"}`, `{"kind":"instance","requestId":"`+testReqID+`"}`, 1), "request.target"},
		{"fail/target kind other", r(envs["status instance"], `{"kind":"instance"}`, `{"kind":"owner"}`, 1), "request.target.kind"},
		{"fail/target missing", r(envs["status instance"], `,"target":{"kind":"instance"}`, ``, 1), "request.target"},
		{"fail/decision other", r(dec, `"decision":"approve"`, `"decision":"maybe"`, 1), "request.decision"},
		{"fail/approvalSeconds 0", r(dec, `31536000`, `0`, 1), "request.approvalSeconds"},
		{"fail/approvalSeconds over a year", r(dec, `31536000`, `31536001`, 1), "request.approvalSeconds"},
		{"fail/approvalSeconds negative", r(dec, `31536000`, `-1`, 1), "request.approvalSeconds"},
		{"fail/approvalSeconds fraction", r(dec, `31536000`, `1.5`, 1), "request.approvalSeconds"},
		{"fail/approvalSeconds string", r(dec, `31536000`, `"60"`, 1), "request.approvalSeconds"},
		{"fail/approvalSeconds on a revoke", r(dec, `"approve"`, `"revoke"`, 1), "request.approvalSeconds"},
		{"fail/proof kind unknown", r(reg, `{"kind":"idp","token"`, `{"kind":"cap","token"`, 1), "proof.kind"},
		{"fail/proof null", r(reg, `{"kind":"idp","token":"aaa.bbb.ccc"}`, `null`, 1), "proof"},
		{"fail/proof idp without token", r(reg, `{"kind":"idp","token":"aaa.bbb.ccc"}`, `{"kind":"idp"}`, 1), "proof.token"},
		{"fail/proof token empty", r(reg, `"token":"aaa.bbb.ccc"`, `"token":""`, 1), "proof.token"},
		{"fail/proof token null", r(reg, `"token":"aaa.bbb.ccc"`, `"token":null`, 1), "proof.token"},
		{"fail/proof token with space", r(reg, `"token":"aaa.bbb.ccc"`, `"token":"aaa bbb"`, 1), "proof.token"},
		{"fail/proof token too long", r(reg, `"token":"aaa.bbb.ccc"`, `"token":"`+strings.Repeat("a", serviceaccess.MaxTokenBytes+1)+`"`, 1), "proof.token"},
		{"fail/operator proof with token", r(nb, `{"kind":"operator"}`, `{"kind":"operator","token":"a.b.c"}`, 1), "proof.token"},
		{"fail/proof extra key", r(reg, `"token":"aaa.bbb.ccc"`, `"token":"aaa.bbb.ccc","cap":"x"`, 1), "proof"},
		{"fail/too large", `{"request":{},"proof":{},"pad":"` + strings.Repeat("a", serviceaccess.MaxEnvelopeBytes) + `"}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := serviceaccess.ParseEnvelope([]byte(tc.body))
			var pe *serviceaccess.Error
			if e != nil || !errors.As(err, &pe) {
				t.Fatalf("envelope %+v, err %v: want an *Error", e, err)
			}
			if !strings.Contains(pe.Field, tc.field) {
				t.Fatalf("field %q (%v), want it to name %q", pe.Field, err, tc.field)
			}
			if strings.Contains(err.Error(), "aaa.bbb.ccc") {
				t.Fatalf("the error holds the token: %v", err)
			}
		})
	}
	t.Run("fail/operation target without operation is refused, the old selector", func(t *testing.T) {
		old := r(st, `"operation":"register",`, ``, 1)
		if !strings.Contains(old, `"target":{"kind":"operation","requestId":"`+testReqID+`"}`) {
			t.Fatalf("the body is not the old selector: %s", old)
		}
		if _, err := serviceaccess.ParseEnvelope([]byte(old)); err == nil {
			t.Fatal("parsed")
		}
	})
}

func TestBodyDigest(t *testing.T) {
	envs := envelopes(t)
	a, err := serviceaccess.ParseEnvelope([]byte(envs["register"]))
	if err != nil {
		t.Fatal(err)
	}
	d1, err := serviceaccess.BodyDigest(&a.Request)
	if err != nil || !strings.HasPrefix(d1, "sha256:") || len(d1) != 71 {
		t.Fatalf("digest %q, %v", d1, err)
	}
	t.Run("ok/proof is not part of it", func(t *testing.T) {
		b, _ := serviceaccess.ParseEnvelope([]byte(strings.Replace(envs["register"], `"aaa.bbb.ccc"`, `"x.y.z"`, 1)))
		if d, _ := serviceaccess.BodyDigest(&b.Request); d != d1 {
			t.Fatalf("digest %s, want %s", d, d1)
		}
	})
	t.Run("ok/key order is not part of it", func(t *testing.T) {
		re := strings.Replace(envs["register"], `"kind":"register","account":"`+testAccount+`"`, `"account":"`+testAccount+`","kind":"register"`, 1)
		b, err := serviceaccess.ParseEnvelope([]byte(re))
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := serviceaccess.BodyDigest(&b.Request); d != d1 {
			t.Fatalf("digest %s, want %s", d, d1)
		}
	})
	t.Run("ok/a changed body changes it", func(t *testing.T) {
		b, _ := serviceaccess.ParseEnvelope([]byte(envs["register expected"]))
		if d, _ := serviceaccess.BodyDigest(&b.Request); d == d1 {
			t.Fatal("same digest for another body")
		}
	})
	t.Run("ok/canonical request bytes", func(t *testing.T) {
		r := serviceaccess.Request{Kind: serviceaccess.KindRenew, Account: testAccount, Space: "a&b", RequestID: testReqID,
			Endpoint: "ep", Instance: testIID, Witness: testWitness}
		want := `{"account":"` + testAccount + `","endpoint":"ep","instance":"` + testIID + `","kind":"renew","requestId":"` + testReqID +
			`","space":"a&b","witness":"` + testWitness + `"}`
		if d, _ := serviceaccess.BodyDigest(&r); d != serviceaccess.Digest([]byte(want)) {
			t.Fatalf("digest %s is not the digest of %s", d, want)
		}
	})
}

func registeredAnswer(t testing.TB) (string, string) {
	t.Helper()
	snap, err := smallSnapshot().Canonical()
	if err != nil {
		t.Fatal(err)
	}
	w := serviceaccess.WitnessOf(snap)
	return `{"kind":"registered","requestId":"` + testReqID + `","witness":"` + w + `","generation":3,"snapshot":` + string(snap) + `}`, w
}

func answers(t testing.TB) map[string]string {
	reg, _ := registeredAnswer(t)
	return map[string]string{
		"approval-required": `{"kind":"approval-required","requestId":"` + testReqID + `","proposal":"` + testProposal + `","expiresAt":1800604800}`,
		"registered":        reg,
		"credential":        `{"kind":"credential","requestId":"` + testReqID + `","witness":"` + testWitness + `","root":"` + testRoot + `","access":{"token":"a.b.c","exp":1800000060},"renewal":{"token":"d.e.f","exp":1800086400},"approvalExpiresAt":1830000000}`,
		"credential bare":   `{"kind":"credential","requestId":"` + testReqID + `","witness":"` + testWitness + `","root":"` + testRoot + `","access":{"token":"a.b.c","exp":1800000060},"approvalExpiresAt":1830000000}`,
		"ready":             `{"kind":"ready","requestId":"` + testReqID + `","witness":"` + testWitness + `"}`,
		"status instance":   `{"kind":"status","instance":{"state":"active","witness":"` + testWitness + `","generation":2,"approvalExpiresAt":1830000000}}`,
		"status absent":     `{"kind":"status","instance":{"state":"absent"}}`,
		"status proposed":   `{"kind":"status","instance":{"state":"proposed","proposal":"` + testProposal + `"}}`,
		"status operation":  `{"kind":"status","operation":{"operation":"register","requestId":"` + testReqID + `","outcome":"approval-required"}}`,
		"status unbound":    `{"kind":"status","operation":{"operation":"renew","requestId":"` + testReqID + `"}}`,
		"bound":             `{"kind":"bound","requestId":"` + testReqID + `","endpoint":"` + testEP + `","owner":"` + testOwner + `"}`,
		"decided":           `{"kind":"decided","requestId":"` + testReqID + `","proposal":"` + testProposal + `","approvalExpiresAt":1830000000,"decision":"approve"}`,
		"decided revoke":    `{"kind":"decided","requestId":"` + testReqID + `","proposal":"` + testProposal + `","decision":"revoke"}`,
		"conflict":          `{"kind":"conflict","requestId":"` + testReqID + `","witness":"` + testWitness + `","reason":"overtaken"}`,
		"conflict bare":     `{"kind":"conflict","requestId":"` + testReqID + `","reason":"body-changed"}`,
		"conflict message":  `{"kind":"conflict","requestId":"` + testReqID + `","reason":"body-changed","message":"The requestId is bound to another body."}`,
		"unavailable":       `{"kind":"unavailable","requestId":"` + testReqID + `","message":"The authority is unavailable; replay the same request."}`,
		"unavailable bare":  `{"kind":"unavailable","message":"unavailable"}`,
		"denied":            `{"kind":"denied","requestId":"` + testReqID + `","code":"failed-precondition","reason":"proposal-refused","message":"The proposal was refused."}`,
		"denied bare":       `{"kind":"denied","code":"bad-request","reason":"malformed","message":"The body does not parse."}`,
	}
}

func TestParseAnswer(t *testing.T) {
	status := map[string]int{"approval-required": 202, "registered": 200, "credential": 200, "credential bare": 200, "ready": 200,
		"status instance": 200, "status absent": 200, "status proposed": 200, "status operation": 200, "status unbound": 200,
		"bound": 200, "decided": 200, "decided revoke": 200, "conflict": 409, "conflict bare": 409, "conflict message": 409, "unavailable": 503,
		"unavailable bare": 503, "denied": 412, "denied bare": 400}
	for name, body := range answers(t) {
		t.Run("ok/"+name, func(t *testing.T) {
			a, err := serviceaccess.ParseAnswer([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got := a.HTTPStatus(); got != status[name] {
				t.Fatalf("HTTPStatus %d, want %d", got, status[name])
			}
			out, err := a.Marshal()
			if err != nil || string(out) != body {
				t.Fatalf("marshal\n%s\nwant\n%s (%v)", out, body, err)
			}
		})
	}
	reg, w := registeredAnswer(t)
	t.Run("ok/registered snapshot verbatim", func(t *testing.T) {
		a, err := serviceaccess.ParseAnswer([]byte(reg))
		if err != nil {
			t.Fatal(err)
		}
		snap, _ := smallSnapshot().Canonical()
		if string(a.Snapshot) != string(snap) || a.Witness != w || a.Generation != 3 {
			t.Fatalf("answer %+v", a)
		}
		// json.Marshal would escape the space's '&' and '<' and break the witness; Marshal does not.
		def, _ := json.Marshal(a)
		if strings.Contains(string(def), "acme & <co>") {
			t.Fatal("json.Marshal kept HTML characters; the Marshal test below proves nothing")
		}
		if _, err := serviceaccess.ParseAnswer(def); err == nil {
			t.Fatal("an HTML-escaped snapshot parsed")
		}
	})
	as := answers(t)
	r := strings.Replace
	cases := []struct{ name, body, field string }{
		{"fail/not an object", `"x"`, "answer"},
		{"fail/trailing", as["ready"] + `{}`, "answer"},
		{"fail/kind unknown", `{"kind":"ok"}`, "answer.kind"},
		{"fail/kind missing", `{"requestId":"` + testReqID + `"}`, "answer.kind"},
		{"fail/duplicate key", r(as["ready"], `"witness"`, `"witness":"`+testWitness+`","witness"`, 1), "answer"},
		{"fail/re-cased key", r(as["ready"], `"witness"`, `"Witness"`, 1), "answer"},
		{"fail/field of another kind", r(as["ready"], `}`, `,"root":"`+testRoot+`"}`, 1), "answer"},
		{"fail/missing requestId", r(as["ready"], `"requestId":"`+testReqID+`",`, ``, 1), "answer.requestId"},
		{"fail/requestId null", r(as["ready"], `"`+testReqID+`"`, `null`, 1), "answer.requestId"},
		{"fail/witness bad", r(as["ready"], testWitness, "w_x", 1), "answer.witness"},
		{"fail/expiresAt 0", r(as["approval-required"], `1800604800`, `0`, 1), "answer.expiresAt"},
		{"fail/expiresAt above 2^53", r(as["approval-required"], `1800604800`, `9007199254740992`, 1), "answer.expiresAt"},
		{"fail/snapshot of another witness", r(reg, w, testWitness, 1), "answer.snapshot"},
		{"fail/snapshot of another generation", r(reg, `"generation":3,`, `"generation":4,`, 1), "answer.snapshot"},
		{"fail/snapshot spaced", r(reg, `"snapshot":{"account"`, `"snapshot":{ "account"`, 1), "snapshot"},
		{"fail/snapshot null", r(reg, reg[strings.Index(reg, `"snapshot":`):len(reg)-1], `"snapshot":null`, 1), "snapshot"},
		{"fail/credential without access", r(as["credential"], `"access":{"token":"a.b.c","exp":1800000060},`, ``, 1), "answer.access"},
		{"fail/credential access extra", r(as["credential"], `"exp":1800000060`, `"exp":1800000060,"kid":"k"`, 1), "answer.access"},
		{"fail/credential token with space", r(as["credential"], `"a.b.c"`, `"a b"`, 1), "answer.access.token"},
		{"fail/credential root bad", r(as["credential"], testRoot, "r_x", 1), "answer.root"},
		{"fail/status both", r(as["status operation"], `}}`, `},"instance":{"state":"absent"}}`, 1), "answer"},
		{"fail/status neither", `{"kind":"status"}`, "answer"},
		{"fail/status state unknown", r(as["status absent"], `"absent"`, `"gone"`, 1), "answer.instance.state"},
		{"fail/status operation status", r(as["status operation"], `"operation":"register"`, `"operation":"status"`, 1), "answer.operation.operation"},
		{"fail/status outcome unknown", r(as["status operation"], `"approval-required"`, `"maybe"`, 1), "answer.operation.outcome"},
		{"fail/bound owner", r(as["bound"], testOwner, "bob", 1), "answer.owner"},
		{"fail/decided decision", r(as["decided"], `"approve"`, `"yes"`, 1), "answer.decision"},
		{"fail/conflict reason unknown", r(as["conflict"], `"overtaken"`, `"other"`, 1), "answer.reason"},
		{"fail/denied code unknown", r(as["denied"], `"failed-precondition"`, `"teapot"`, 1), "answer.code"},
		{"fail/denied reason", r(as["denied"], `"proposal-refused"`, `"Proposal Refused"`, 1), "answer.reason"},
		{"fail/denied without reason", r(as["denied"], `"reason":"proposal-refused",`, ``, 1), "answer.reason"},
		{"fail/message empty", r(as["unavailable"], `"The authority is unavailable; replay the same request."`, `""`, 1), "answer.message"},
		{"fail/message control", r(as["unavailable"], `unavailable;`, `unavailable\n`, 1), "answer.message"},
		{"fail/message too long", r(as["unavailable"], `unavailable;`, strings.Repeat("x", 1025), 1), "answer.message"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := serviceaccess.ParseAnswer([]byte(tc.body))
			var pe *serviceaccess.Error
			if a != nil || !errors.As(err, &pe) {
				t.Fatalf("answer %+v, err %v: want an *Error", a, err)
			}
			if !strings.Contains(pe.Field, tc.field) {
				t.Fatalf("field %q (%v), want it to name %q", pe.Field, err, tc.field)
			}
		})
	}
}

func TestHTTPStatus(t *testing.T) {
	for code, want := range map[string]int{
		serviceaccess.CodeBadRequest: 400, serviceaccess.CodeUnauthenticated: 401, serviceaccess.CodePermissionDenied: 403,
		serviceaccess.CodeNotFound: 404, serviceaccess.CodeFailedPrecondition: 412, serviceaccess.CodeTooLarge: 413,
		serviceaccess.CodeUnsupportedMedia: 415, serviceaccess.CodeRateLimited: 429, "unknown": 403,
	} {
		if got := (&serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, Code: code}).HTTPStatus(); got != want {
			t.Errorf("denied %s: %d, want %d", code, got, want)
		}
	}
	for kind, want := range map[serviceaccess.AnswerKind]int{
		serviceaccess.AnswerApprovalRequired: 202, serviceaccess.AnswerRegistered: 200, serviceaccess.AnswerCredential: 200,
		serviceaccess.AnswerReady: 200, serviceaccess.AnswerStatus: 200, serviceaccess.AnswerBound: 200,
		serviceaccess.AnswerDecided: 200, serviceaccess.AnswerConflict: http.StatusConflict,
		serviceaccess.AnswerUnavailable: 503, "other": 500,
	} {
		if got := (&serviceaccess.Answer{Kind: kind}).HTTPStatus(); got != want {
			t.Errorf("%s: %d, want %d", kind, got, want)
		}
	}
	if got := (*serviceaccess.Answer)(nil).HTTPStatus(); got != 500 {
		t.Errorf("nil: %d", got)
	}
}

func infoJSON(keys ...ed25519.PublicKey) string {
	var ks []string
	for _, k := range keys {
		x := base64.RawURLEncoding.EncodeToString(k)
		ks = append(ks, `{"kty":"OKP","crv":"Ed25519","x":"`+x+`","kid":"`+serviceaccess.Thumbprint(x)+`","alg":"EdDSA","use":"sig"}`)
	}
	return `{"v":1,"account":"` + testAccount + `","space":"` + testSpace + `","issuer":"urn:cotal:service-access:` + testSpace +
		`","keys":[` + strings.Join(ks, ",") + `]}`
}

func TestParseInfo(t *testing.T) {
	s := newSigner(t, "x")
	pub := s.priv.Public().(ed25519.PublicKey)
	pub2 := newSigner(t, "y").priv.Public().(ed25519.PublicKey)
	body := infoJSON(pub, pub2)
	t.Run("ok/two keys, and they verify a token", func(t *testing.T) {
		in, err := serviceaccess.ParseInfo([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if in.Account != testAccount || in.Space != testSpace || in.Issuer != serviceaccess.Issuer(testSpace) || len(in.Keys) != 2 {
			t.Fatalf("info %+v", in)
		}
		ks, err := serviceaccess.KeysOf(in)
		if err != nil {
			t.Fatal(err)
		}
		kid := in.Keys[0].Kid
		signed := &signer{kid: kid, priv: s.priv}
		v := &serviceaccess.Validator{Space: in.Space, Keys: ks, Now: func() time.Time { return testNow }}
		if _, err := v.Access(context.Background(), signed.sign(t, serviceaccess.TypAccess, claimsMap(serviceaccess.TypAccess))); err != nil {
			t.Fatal(err)
		}
		if _, err := ks.Key(context.Background(), "nope"); !errors.Is(err, serviceaccess.ErrUnknownKey) {
			t.Fatalf("unknown kid: %v", err)
		}
	})
	x := base64.RawURLEncoding.EncodeToString(pub)
	r := strings.Replace
	for _, tc := range []struct{ name, body, field string }{
		{"fail/v 2", r(body, `"v":1`, `"v":2`, 1), "info.v"},
		{"fail/unknown key", r(body, `"v":1`, `"v":1,"x":1`, 1), "info"},
		{"fail/re-cased key", r(body, `"issuer"`, `"Issuer"`, 1), "info"},
		{"fail/account", r(body, testAccount, "nope", 1), "info.account"},
		{"fail/issuer other space", r(body, `service-access:`+testSpace, `service-access:other`, 1), "info.issuer"},
		{"fail/user issuer", r(body, `urn:cotal:service-access:`, `urn:cotal:auth:`, 1), "info.issuer"},
		{"fail/no keys", infoJSON(), "info.keys"},
		{"fail/keys null", r(infoJSON(), `[]`, `null`, 1), "info.keys"},
		{"fail/kid not thumbprint", r(body, serviceaccess.Thumbprint(x), "kid-1", 1), "info.keys[0].kid"},
		{"fail/key twice", infoJSON(pub, pub), "info.keys[1].kid"},
		{"fail/key alg", r(body, `"alg":"EdDSA"`, `"alg":"ES256"`, 1), "info.keys[0]"},
		{"fail/key extra field", r(body, `"use":"sig"`, `"use":"sig","d":"secret"`, 1), "info.keys[0]"},
		{"fail/x short", r(body, x, x[:20], 1), "info.keys[0].x"},
		{"fail/trailing", body + "x", "info"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := serviceaccess.ParseInfo([]byte(tc.body))
			var pe *serviceaccess.Error
			if in != nil || !errors.As(err, &pe) {
				t.Fatalf("info %+v, err %v: want an *Error", in, err)
			}
			if !strings.Contains(pe.Field, tc.field) {
				t.Fatalf("field %q (%v), want it to name %q", pe.Field, err, tc.field)
			}
		})
	}
	t.Run("fail/KeysOf a bad key", func(t *testing.T) {
		if _, err := serviceaccess.KeysOf(&serviceaccess.Info{Keys: []serviceaccess.JWK{{Kty: "OKP", Crv: "Ed25519", X: x, Kid: "k", Alg: "EdDSA", Use: "sig"}}}); err == nil {
			t.Fatal("accepted")
		}
		if _, err := serviceaccess.KeysOf(&serviceaccess.Info{}); err == nil {
			t.Fatal("accepted no keys")
		}
	})
}
