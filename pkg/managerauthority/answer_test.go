package managerauthority

import (
	"encoding/json"
	"strings"
	"testing"
)

func testMaterial() Material {
	epoch, rev := uint64(3), uint64(9)
	return Material{V: 1, Kind: KindAuthority, Operation: OpActivate, Space: "alpha", Owner: "u_o", Actor: "cli",
		InstanceID: "i", LifecycleUID: "u", RequestID: "r", ProcessEpoch: &epoch, RegistrationRevision: &rev,
		NextRegistrationProof: "sha256:" + strings.Repeat("a", 64), Credentials: Credentials{Supervisor: &Credential{JWT: "j", Exp: 5}}}
}

// TestDecodeAnswers: a client's closed decode of the door's answers.
func TestDecodeAnswers(t *testing.T) {
	good, _ := json.Marshal(testMaterial())
	t.Run("ok/material", func(t *testing.T) {
		m, err := DecodeMaterial(good)
		if err != nil || *m.ProcessEpoch != 3 || *m.RegistrationRevision != 9 || m.Credentials.Supervisor.JWT != "j" {
			t.Fatalf("material %+v err %v", m, err)
		}
	})
	t.Run("ok/refusal", func(t *testing.T) {
		r, err := DecodeRefusal(409, []byte(`{"error":"stale","code":"conflict"}`))
		if err != nil || r.Status != 409 || r.Code != "conflict" || r.Msg != "stale" {
			t.Fatalf("refusal %+v err %v", r, err)
		}
		if !strings.Contains(r.Error(), "409 conflict") {
			t.Fatalf("text %q", r.Error())
		}
	})
	for name, b := range map[string]string{
		"unknown field":    strings.Replace(string(good), `"v":1`, `"v":1,"extra":1`, 1),
		"trailing data":    string(good) + "{}",
		"wrong kind":       strings.Replace(string(good), KindAuthority, KindEnrollment, 1),
		"wrong v":          strings.Replace(string(good), `"v":1`, `"v":2`, 1),
		"empty credential": strings.Replace(string(good), `"jwt":"j"`, `"jwt":""`, 1),
		"not an object":    `[]`,
		"too large":        `{"v":1,"kind":"` + strings.Repeat("x", MaxAnswerBytes) + `"}`,
	} {
		t.Run("fail/material "+name, func(t *testing.T) {
			if m, err := DecodeMaterial([]byte(b)); err == nil {
				t.Fatalf("accepted %+v", m)
			}
		})
	}
	for name, b := range map[string]string{
		"no code":       `{"error":"x"}`,
		"unknown field": `{"error":"x","code":"c","jwt":"j"}`,
		"not JSON":      `<html>`,
	} {
		t.Run("fail/refusal "+name, func(t *testing.T) {
			if r, err := DecodeRefusal(500, []byte(b)); err == nil {
				t.Fatalf("accepted %+v", r)
			}
		})
	}
}

// FuzzDecodeAnswer: the client's answer decoders never panic, and what they accept re-encodes
// to something they accept again.
func FuzzDecodeAnswer(f *testing.F) {
	good, _ := json.Marshal(testMaterial())
	f.Add(good)
	f.Add([]byte(`{"error":"x","code":"c"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := DecodeMaterial(b); err == nil {
			again, _ := json.Marshal(m)
			if _, err := DecodeMaterial(again); err != nil {
				t.Fatalf("accepted, then refused its own encoding: %v", err)
			}
		}
		if r, err := DecodeRefusal(400, b); err == nil && r.Code == "" {
			t.Fatal("accepted a refusal without a code")
		}
	})
}
