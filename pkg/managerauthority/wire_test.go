package managerauthority

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/lifecycle"
)

var testIDs = Identities{Supervisor: Identity{"U" + strings.Repeat("A", 55)}, Executor: Identity{"U" + strings.Repeat("B", 55)},
	Serve: Identity{"U" + strings.Repeat("C", 55)}, GoalWriter: Identity{"U" + strings.Repeat("D", 55)}, SessionLedger: Identity{"U" + strings.Repeat("E", 55)}}

const (
	testIID = "iiiiiiiiiiiiiiiiiiiiiiiiii"
	testUID = "mmmmmmmmmmmmmmmmmmmmmmmmmm"
)

func testRequest(op Operation) Request {
	return Request{V: 1, Kind: KindAuthority, Operation: op, Space: "alpha", Actor: "cli", InstanceID: testIID,
		ManagerLifecycleUID: testUID, RequestID: "req-1", Identities: testIDs}
}

func body(t *testing.T, req any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"idpToken": "tok", "request": req})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decode runs the door's whole parse: the envelope, Peek and the kind's decoder.
func decode(b []byte) error {
	env, err := DecodeEnvelope(b)
	if err != nil {
		return err
	}
	kind, op, err := Peek(env.Request)
	if err != nil {
		return err
	}
	switch {
	case Unserved(kind, op):
		return nil
	case kind == KindAuthority:
		_, err = DecodeRequest(env.Request)
	case kind == KindEnrollment:
		_, err = DecodeEnrollment(env.Request)
	case kind == KindPrepareRetirement:
		_, err = DecodePrepareRetirement(env.Request)
	default:
		_, err = DecodeRuntime(env.Request, kind)
	}
	return err
}

func TestDecode(t *testing.T) {
	proof := "sha256:" + strings.Repeat("0", 64)
	epoch := uint64(3)
	act := testRequest(OpActivate)
	act.RegistrationProof = proof
	ren := testRequest(OpRenew)
	ren.RegistrationProof, ren.ProcessEpoch = proof, &epoch
	ret := testRequest(OpRetire)
	ret.RegistrationProof = proof
	opID, _ := lifecycle.ManagedRetirementOpID(testUID)
	ret.Retirement = &Retirement{ID: "U" + strings.Repeat("F", 55), Target: Target{Owner: "o", Actor: "bob", LifecycleUID: testUID}, OpID: opID, ServeEpoch: 3}
	for _, req := range []Request{testRequest(OpPrepare), act, ren, ret} {
		t.Run("ok/"+string(req.Operation), func(t *testing.T) {
			if err := decode(body(t, req)); err != nil {
				t.Fatal(err)
			}
			env, _ := DecodeEnvelope(body(t, req))
			got, err := DecodeRequest(env.Request)
			if err != nil || got.Operation != req.Operation || got.Identities != req.Identities || got.InstanceID != testIID {
				t.Fatalf("decoded %+v, %v", got, err)
			}
		})
	}
	mut := func(req Request, f func(map[string]any)) []byte {
		b, _ := json.Marshal(req)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		f(v)
		return body(t, v)
	}
	prep := testRequest(OpPrepare)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"fail/not json", []byte(`{`), "JSON"},
		{"fail/no idpToken", []byte(`{"request":{}}`), "idpToken is required"},
		{"fail/request not an object", []byte(`{"idpToken":"t","request":[]}`), "must be an object"},
		{"fail/unknown envelope key", []byte(`{"idpToken":"t","request":{},"x":1}`), "unknown field"},
		{"fail/duplicate envelope key", []byte(`{"idpToken":"t","idpToken":"u","request":{}}`), "twice"},
		{"fail/re-cased envelope key", []byte(`{"IdpToken":"t","request":{}}`), "unknown field"},
		{"fail/v 2", mut(prep, func(v map[string]any) { v["v"] = 2 }), "v must be 1"},
		{"fail/unknown kind", mut(prep, func(v map[string]any) { v["kind"] = "x" }), "not a kind"},
		{"fail/unknown operation", mut(prep, func(v map[string]any) { v["operation"] = "x" }), "not an operation"},
		{"fail/unknown request key", mut(prep, func(v map[string]any) { v["contractArtifacts"] = []any{} }), "unknown field"},
		{"fail/re-cased request key", mut(prep, func(v map[string]any) { v["Space"] = v["space"]; delete(v, "space") }), "unknown field"},
		{"fail/nested unknown key", mut(prep, func(v map[string]any) {
			v["identities"].(map[string]any)["supervisor"].(map[string]any)["seed"] = "S"
		}), "unknown field"},
		{"fail/bad identity", mut(prep, func(v map[string]any) { v["identities"].(map[string]any)["serve"] = map[string]any{"id": "nope"} }), "identities.serve"},
		{"fail/repeated identity", mut(prep, func(v map[string]any) {
			v["identities"].(map[string]any)["serve"] = map[string]any{"id": testIDs.Supervisor.ID}
		}), "repeats"},
		{"fail/bad instance", mut(prep, func(v map[string]any) { v["instanceId"] = "X" }), "instanceId"},
		{"fail/bad space", mut(prep, func(v map[string]any) { v["space"] = "" }), "space"},
		{"fail/bad request id", mut(prep, func(v map[string]any) { v["requestId"] = "a b" }), "requestId"},
		{"fail/prepare with a proof", mut(prep, func(v map[string]any) { v["registrationProof"] = proof }), "prepare takes no"},
		{"fail/activate without a proof", mut(testRequest(OpActivate), func(map[string]any) {}), "activate requires"},
		{"fail/renew without an epoch", mut(act, func(v map[string]any) { v["operation"] = "renew" }), "renew requires"},
		{"fail/epoch above 2^53-1", mut(ren, func(v map[string]any) { v["processEpoch"] = uint64(1) << 60 }), "above"},
		{"fail/fractional epoch", mut(ren, func(v map[string]any) { v["processEpoch"] = 1.5 }), "processEpoch"},
		{"fail/retire reusing an identity", mut(ret, func(v map[string]any) { v["retirement"].(map[string]any)["id"] = testIDs.Serve.ID }), "fresh"},
		{"fail/retire bad opId", mut(ret, func(v map[string]any) { v["retirement"].(map[string]any)["opId"] = "x" }), "opId"},
		{"fail/proof shape", mut(act, func(v map[string]any) { v["registrationProof"] = "sha256:ABC" }), "registrationProof"},
		{"fail/too deep", []byte(`{"idpToken":"t","request":` + strings.Repeat(`{"v":`, 10) + "1" + strings.Repeat("}", 10) + `}`), "deeper"},
		{"fail/too large", []byte(`{"idpToken":"` + strings.Repeat("a", MaxBodyBytes) + `"}`), "bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decode(tc.b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "tok") && !strings.Contains(tc.want, "tok") {
				t.Fatalf("error %q holds the idpToken", err)
			}
		})
	}
	runtime := map[string]any{"v": 1, "kind": KindRuntimeCreate, "space": "alpha", "actor": "cli", "instanceId": testIID,
		"managerLifecycleUid": testUID, "requestId": "r", "registrationProof": proof, "serveEpoch": 0, "identities": testIDs,
		"target": map[string]any{"owner": "o", "actor": "a", "lifecycleUid": testUID}}
	t.Run("ok/runtime create", func(t *testing.T) {
		if err := decode(body(t, runtime)); err != nil {
			t.Fatal(err)
		}
	})
	for _, field := range []string{"providerRef", "handle", "name"} {
		t.Run("fail/runtime "+field, func(t *testing.T) {
			r := map[string]any{}
			for k, v := range runtime {
				r[k] = v
			}
			r[field] = "x"
			if err := decode(body(t, r)); err == nil || !strings.Contains(err.Error(), "unknown field") {
				t.Fatalf("decode = %v", err)
			}
			r = map[string]any{}
			for k, v := range runtime {
				r[k] = v
			}
			r["target"] = map[string]any{"owner": "o", "actor": "a", "lifecycleUid": testUID, field: "x"}
			if err := decode(body(t, r)); err == nil || !strings.Contains(err.Error(), "unknown field") {
				t.Fatalf("decode (target) = %v", err)
			}
		})
	}
	t.Run("ok/an unserved kind is not parsed further", func(t *testing.T) {
		if err := decode(body(t, map[string]any{"v": 1, "kind": KindGoalIndexScan, "anything": true})); err != nil {
			t.Fatal(err)
		}
	})
}

// TestActivationProof: the proof is the SHA-256 of upstream's JSON.stringify of
// {v, space, owner, instanceId, lifecycleUid, actors, identities, artifactDigests:[]}, here
// rebuilt with encoding/json over ordered structs.
func TestActivationProof(t *testing.T) {
	req := testRequest(OpPrepare)
	got, err := ActivationProof("alpha", "u_abcdefghijklmnopqrstuvwxyz", &req)
	if err != nil {
		t.Fatal(err)
	}
	actors, _ := ActorsOf(testIID)
	payload, _ := json.Marshal(struct {
		V               int        `json:"v"`
		Space           string     `json:"space"`
		Owner           string     `json:"owner"`
		InstanceID      string     `json:"instanceId"`
		LifecycleUID    string     `json:"lifecycleUid"`
		Actors          Actors     `json:"actors"`
		Identities      Identities `json:"identities"`
		ArtifactDigests []string   `json:"artifactDigests"`
	}{1, "alpha", "u_abcdefghijklmnopqrstuvwxyz", testIID, testUID, actors, testIDs, []string{}})
	sum := sha256.Sum256(payload)
	if want := "sha256:" + hex.EncodeToString(sum[:]); got != want || !lifecycle.IsProof(got) {
		t.Fatalf("proof %s, want %s (payload %s)", got, want, payload)
	}
	other := req
	other.Identities.Serve.ID = "U" + strings.Repeat("F", 55)
	if p, _ := ActivationProof("alpha", "u_abcdefghijklmnopqrstuvwxyz", &other); p == got {
		t.Fatal("the proof does not bind the identities")
	}
	if p, _ := ActivationProof("alpha", "u_bbbbbbbbbbbbbbbbbbbbbbbbbb", &req); p == got {
		t.Fatal("the proof does not bind the owner")
	}
	if _, err := ActivationProof("alpha", "bad owner", &req); err == nil {
		t.Fatal("a bad owner was accepted")
	}
}

// FuzzDecodeBody: the door's whole parse never panics, and whatever it accepts re-decodes the
// same way.
func FuzzDecodeBody(f *testing.F) {
	for _, op := range []Operation{OpPrepare, OpActivate, OpRenew, OpRetire, OpSession} {
		b, _ := json.Marshal(map[string]any{"idpToken": "t", "request": testRequest(op)})
		f.Add(b)
	}
	f.Add([]byte(`{"idpToken":"t","request":{"v":1,"kind":"manager-managed-agent-enrollment","target":{"actor":"a"}}}`))
	f.Add([]byte(`{"idpToken":"t","request":{"v":1,"kind":"manager-managed-agent-runtime-status","target":{"handle":1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := decode(b)
		if err == nil {
			if again := decode(b); again != nil {
				t.Fatalf("accepted then refused: %v", again)
			}
			env, _ := DecodeEnvelope(b)
			if env.IdPToken == "" || len(b) > MaxBodyBytes {
				t.Fatalf("accepted an envelope without a token or over the bound")
			}
		}
	})
}
