package lifecycle

import (
	"strings"
	"testing"
)

const (
	goodRegisterRequest = `{"v":1,"instanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb"}`
	goodRegisterOK      = `{"v":1,"ok":true,"result":{"instanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb","processEpoch":0,"registrationRevision":7,"generation":1}}`
	goodRegisterRefusal = `{"v":1,"ok":false,"code":"permission-denied","error":"lease.x is held by o.b, not o.a"}`
)

func TestRegisterManagerWire(t *testing.T) {
	iid := strings.Repeat("b", 26)
	if b, err := EncodeRegisterManagerRequest(iid); err != nil || string(b) != goodRegisterRequest {
		t.Fatalf("EncodeRegisterManagerRequest = %s, %v", b, err)
	}
	if r, err := DecodeRegisterManagerRequest([]byte(goodRegisterRequest)); err != nil || r.InstanceID != iid {
		t.Fatalf("DecodeRegisterManagerRequest = %+v, %v", r, err)
	}
	ok := RegisterManagerReply{OK: true, Result: RegisterManagerResult{InstanceID: iid, RegistrationRevision: 7, Generation: 1}}
	if b, err := EncodeRegisterManagerReply(ok); err != nil || string(b) != goodRegisterOK {
		t.Fatalf("EncodeRegisterManagerReply(ok) = %s, %v", b, err)
	}
	if r, err := DecodeRegisterManagerReply([]byte(goodRegisterOK)); err != nil || r != ok {
		t.Fatalf("DecodeRegisterManagerReply(ok) = %+v, %v", r, err)
	}
	no := RegisterManagerReply{Code: "permission-denied", Error: "lease.x is held by o.b, not o.a"}
	if b, err := EncodeRegisterManagerReply(no); err != nil || string(b) != goodRegisterRefusal {
		t.Fatalf("EncodeRegisterManagerReply(refusal) = %s, %v", b, err)
	}
	if r, err := DecodeRegisterManagerReply([]byte(goodRegisterRefusal)); err != nil || r != no {
		t.Fatalf("DecodeRegisterManagerReply(refusal) = %+v, %v", r, err)
	}
	long := RegisterManagerReply{Code: "conflict", Error: strings.Repeat("é", maxRailTextBytes)}
	b, err := EncodeRegisterManagerReply(long)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := DecodeRegisterManagerReply(b); err != nil || len(r.Error) > maxRailTextBytes || !strings.HasPrefix(long.Error, r.Error) {
		t.Fatalf("a long refusal is not clipped on a rune boundary: %d bytes, %v", len(r.Error), err)
	}
	for _, bad := range []RegisterManagerReply{
		{OK: true, Result: RegisterManagerResult{InstanceID: iid}},
		{OK: true, Result: RegisterManagerResult{InstanceID: "x", RegistrationRevision: 1}},
		{Code: "Bad Code"},
		{},
	} {
		if b, err := EncodeRegisterManagerReply(bad); err == nil {
			t.Fatalf("encoded %+v as %s", bad, b)
		}
	}
	if b, err := EncodeRegisterManagerRequest("x.y"); err == nil {
		t.Fatalf("encoded a bad instance id: %s", b)
	}
	for _, in := range []string{
		``, `[]`, `{}`, `{"v":1}`, `{"instanceId":"` + iid + `"}`, `{"v":2,"instanceId":"` + iid + `"}`,
		`{"v":1,"instanceId":null}`, `{"v":1,"instanceId":"` + iid + `","from":"o.a"}`,
		goodRegisterRequest + `{}`, `{"v":1,"instanceId":"BAD"}`, `{"v":"1","instanceId":"` + iid + `"}`,
		`{"v":1,"instanceId":"` + strings.Repeat("b", MaxRailBodyBytes) + `"}`,
	} {
		if r, err := DecodeRegisterManagerRequest([]byte(in)); err == nil {
			t.Fatalf("DecodeRegisterManagerRequest(%q) = %+v", in, r)
		}
	}
	for _, in := range []string{
		``, `{}`, `{"v":1}`, `{"v":1,"ok":true}`, `{"ok":true,"result":{}}`,
		strings.Replace(goodRegisterOK, `"generation":1`, `"generation":null`, 1),
		strings.Replace(goodRegisterOK, `,"generation":1`, ``, 1),
		strings.Replace(goodRegisterOK, `"registrationRevision":7`, `"registrationRevision":0`, 1),
		strings.Replace(goodRegisterOK, `"processEpoch":0`, `"processEpoch":9007199254740992`, 1),
		strings.Replace(goodRegisterOK, `}}`, `},"code":"x"}`, 1),
		strings.Replace(goodRegisterOK, `}}`, `,"proof":"sha256:00"}}`, 1),
		strings.Replace(goodRegisterRefusal, `"ok":false`, `"ok":true`, 1),
		strings.Replace(goodRegisterRefusal, `"permission-denied"`, `"PERMISSION"`, 1),
		strings.Replace(goodRegisterRefusal, `,"error":"lease.x is held by o.b, not o.a"`, ``, 1),
		`{"v":1,"ok":false,"code":"conflict","error":"` + strings.Repeat("x", maxRailTextBytes+1) + `"}`,
		goodRegisterOK + ` x`,
	} {
		if r, err := DecodeRegisterManagerReply([]byte(in)); err == nil {
			t.Fatalf("DecodeRegisterManagerReply(%q) = %+v", in, r)
		}
	}
}
