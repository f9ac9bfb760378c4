package lifecycle

import (
	"reflect"
	"strings"
	"testing"
)

// The managed retirement opId of uid a×26 (the acceptance vector) and a manager instance.
const (
	rrUID = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	rrOp  = "b5beb5e4f583874a2f0947bbbd"
	rrIID = "bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func TestRetireLifecycleWire(t *testing.T) {
	req := RetireLifecycleRequest{OpID: rrOp, ServeEndpoint: ManagerEndpoint, ServeInstanceID: rrIID, ServeEpoch: 7}
	b, err := EncodeRetireLifecycleRequest(req)
	if want := `{"v":1,"opId":"` + rrOp + `","serveEndpoint":"manager","serveInstanceId":"` + rrIID + `","serveEpoch":7}`; err != nil || string(b) != want {
		t.Fatalf("request = %s, %v; want %s", b, err, want)
	}
	if got, err := DecodeRetireLifecycleRequest(b); err != nil || got != req {
		t.Fatalf("decode = %+v, %v", got, err)
	}
	ok := RetireLifecycleReply{OK: true, Result: RetireLifecycleResult{LifecycleUID: rrUID, OpID: rrOp}}
	b, err = EncodeRetireLifecycleReply(ok)
	if want := `{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `","evictedPrincipals":[]}}`; err != nil || string(b) != want {
		t.Fatalf("reply = %s, %v; want %s", b, err, want)
	}
	ok.Result.EvictedPrincipals = []string{"u_x.probe"}
	b, _ = EncodeRetireLifecycleReply(ok)
	if got, err := DecodeRetireLifecycleReply(b); err != nil || !reflect.DeepEqual(got, ok) {
		t.Fatalf("decode %s = %+v, %v", b, got, err)
	}
	no := RetireLifecycleReply{Code: "permission-denied", Error: "opId is not the managed retirement"}
	b, _ = EncodeRetireLifecycleReply(no)
	if got, err := DecodeRetireLifecycleReply(b); err != nil || !reflect.DeepEqual(got, no) ||
		string(b) != `{"v":1,"ok":false,"code":"permission-denied","error":"opId is not the managed retirement"}` {
		t.Fatalf("refusal %s = %+v, %v", b, got, err)
	}

	good := `{"v":1,"opId":"` + rrOp + `","serveEndpoint":"manager","serveInstanceId":"` + rrIID + `","serveEpoch":7}`
	for name, in := range map[string]string{
		"v2":          strings.Replace(good, `"v":1`, `"v":2`, 1),
		"no-epoch":    strings.Replace(good, `,"serveEpoch":7`, ``, 1),
		"negative":    strings.Replace(good, `"serveEpoch":7`, `"serveEpoch":-1`, 1),
		"float":       strings.Replace(good, `"serveEpoch":7`, `"serveEpoch":7.5`, 1),
		"too-big":     strings.Replace(good, `"serveEpoch":7`, `"serveEpoch":9007199254740992`, 1),
		"unknown":     strings.Replace(good, `}`, `,"x":1}`, 1),
		"twice":       strings.Replace(good, `}`, `,"opId":"`+rrOp+`"}`, 1),
		"bad-op":      strings.Replace(good, rrOp, "B5BEB5", 1),
		"bad-ep":      strings.Replace(good, `"manager"`, `"Man ager"`, 1),
		"trailing":    good + `{}`,
		"array":       `[]`,
		"null-fields": `{"v":1,"opId":null,"serveEndpoint":"manager","serveInstanceId":"` + rrIID + `","serveEpoch":7}`,
		"oversized":   `{"v":1,"opId":"` + strings.Repeat("a", MaxRailBodyBytes) + `"}`,
	} {
		if _, err := DecodeRetireLifecycleRequest([]byte(in)); err == nil {
			t.Errorf("request %s accepted", name)
		}
	}
	for name, in := range map[string]string{
		"foreign-op":  `{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrIID + `","evictedPrincipals":[]}}`,
		"not-retired": `{"v":1,"ok":true,"result":{"retired":false,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `","evictedPrincipals":[]}}`,
		"no-evicted":  `{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `"}}`,
		"both":        `{"v":1,"ok":false,"code":"conflict","error":"x","result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `","evictedPrincipals":[]}}`,
		"bad-code":    `{"v":1,"ok":false,"code":"Conflict","error":"x"}`,
		"bad-evicted": `{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `","evictedPrincipals":["noprincipal"]}}`,
	} {
		if _, err := DecodeRetireLifecycleReply([]byte(in)); err == nil {
			t.Errorf("reply %s accepted", name)
		}
	}
}

// FuzzDecodeRetireLifecycleRequest: authd reads a rail body from any holder of the rail's
// publish grant. What decodes is in grammar and re-encodes to a body that decodes the same.
func FuzzDecodeRetireLifecycleRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"opId":"` + rrOp + `","serveEndpoint":"manager","serveInstanceId":"` + rrIID + `","serveEpoch":0}`))
	f.Add([]byte(`{"v":1,"opId":"` + rrOp + `","serveEndpoint":"a.b","serveInstanceId":"` + rrIID + `","serveEpoch":1,"v":1}`))
	f.Add([]byte(`{"v":1.0,"serveEpoch":9007199254740991}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRetireLifecycleRequest(b)
		if err != nil {
			return
		}
		if len(b) > MaxRailBodyBytes || r.check() != nil {
			t.Fatalf("accepted %+v", r)
		}
		re, err := EncodeRetireLifecycleRequest(r)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := DecodeRetireLifecycleRequest(re); err != nil || back != r {
			t.Fatalf("round trip %s: %+v, %v", re, back, err)
		}
	})
}

// FuzzDecodeRetireLifecycleReply: the requester reads the answer from the broker; what decodes
// is in grammar and re-encodes to an answer that decodes the same.
func FuzzDecodeRetireLifecycleReply(f *testing.F) {
	f.Add([]byte(`{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + rrUID + `","opId":"` + rrOp + `","evictedPrincipals":["u_x.probe"]}}`))
	f.Add([]byte(`{"v":1,"ok":false,"code":"expired","error":"serve epoch 2 is not the current 3"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRetireLifecycleReply(b)
		if err != nil {
			return
		}
		re, err := EncodeRetireLifecycleReply(r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		back, err := DecodeRetireLifecycleReply(re)
		if err != nil || !reflect.DeepEqual(back, r) {
			t.Fatalf("round trip %s: %+v, %v", re, back, err)
		}
	})
}
