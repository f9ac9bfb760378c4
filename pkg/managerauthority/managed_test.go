package managerauthority

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

func testEnrollment(t testing.TB) Enrollment {
	return Enrollment{Owner: "u_o", Actor: "bob", LifecycleUID: "0123456789abcdef0123456789", SentinelCreds: testkit.SentinelCreds(t, true),
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		AgentBearerExchangeURL: "https://auth.example/t"}
}

// TestDecodeManagedAnswers: a client's closed decode of the enrollment and prepare-retirement
// answers.
func TestDecodeManagedAnswers(t *testing.T) {
	good, _ := json.Marshal(testEnrollment(t))
	t.Run("ok/enrollment", func(t *testing.T) {
		e, err := DecodeEnrollmentAnswer(good)
		if err != nil || e.Actor != "bob" || e.AgentBearerExchangeURL != "https://auth.example/t" || len(e.Subscribe) != 1 {
			t.Fatalf("enrollment %+v err %v", e, err)
		}
		s, err := SentinelJWT(e.SentinelCreds)
		if err != nil || !strings.HasPrefix(s, "eyJ") {
			t.Fatalf("sentinel err %v", err)
		}
	})
	notBearer, _ := json.Marshal(func() Enrollment { e := testEnrollment(t); e.SentinelCreds = testkit.SentinelCreds(t, false); return e }())
	noSentinel, _ := json.Marshal(func() Enrollment { e := testEnrollment(t); e.SentinelCreds = ""; return e }())
	for name, b := range map[string]string{
		"unknown field":       strings.Replace(string(good), `"owner"`, `"creds":"x","owner"`, 1),
		"trailing data":       string(good) + "{}",
		"bad uid":             strings.Replace(string(good), "0123456789abcdef0123456789", "../x", 1),
		"bad owner":           strings.Replace(string(good), `"u_o"`, `"u o"`, 1),
		"bad channel":         strings.Replace(string(good), `"subscribe":["general"]`, `"subscribe":["a b"]`, 1),
		"wildcard subscribe":  strings.Replace(string(good), `"subscribe":["general"]`, `"subscribe":["*"]`, 1),
		"url with a query":    strings.Replace(string(good), "https://auth.example/t", "https://auth.example/t?x=1", 1),
		"url not http":        strings.Replace(string(good), "https://auth.example/t", "file:///etc", 1),
		"no sentinel":         string(noSentinel),
		"sentinel not bearer": string(notBearer),
		"not an object":       `[]`,
		"too large":           `{"owner":"` + strings.Repeat("x", MaxAnswerBytes) + `"}`,
	} {
		t.Run("fail/enrollment "+name, func(t *testing.T) {
			if e, err := DecodeEnrollmentAnswer([]byte(b)); err == nil {
				t.Fatalf("accepted (actor %s uid %s)", e.Actor, e.LifecycleUID)
			}
		})
	}
	prep, _ := json.Marshal(PrepareRetirementAnswer{V: 1, Kind: KindPrepareRetirement, Space: "alpha", Owner: "u_o", Actor: "cli",
		InstanceID: "i", RequestID: "r", Target: Target{Owner: "u_o", Actor: "bob", LifecycleUID: "0123456789abcdef0123456789"},
		OpID: strings.Repeat("a", 26), Prepared: true})
	t.Run("ok/prepare-retirement", func(t *testing.T) {
		a, err := DecodePrepareRetirementAnswer(prep)
		if err != nil || !a.Prepared || a.Target.Actor != "bob" || a.OpID != strings.Repeat("a", 26) {
			t.Fatalf("answer %+v err %v", a, err)
		}
	})
	for name, b := range map[string]string{
		"unknown field": strings.Replace(string(prep), `"v":1`, `"v":1,"x":1`, 1),
		"wrong kind":    strings.Replace(string(prep), KindPrepareRetirement, KindEnrollment, 1),
		"bad target":    strings.Replace(string(prep), `"actor":"bob"`, `"actor":"b.b"`, 1),
	} {
		t.Run("fail/prepare-retirement "+name, func(t *testing.T) {
			if a, err := DecodePrepareRetirementAnswer([]byte(b)); err == nil {
				t.Fatalf("accepted %+v", a)
			}
		})
	}
}

// FuzzDecodeManagedAnswer: the managed-agent answer decoders never panic, and what they accept
// re-encodes to something they accept again.
func FuzzDecodeManagedAnswer(f *testing.F) {
	good, _ := json.Marshal(testEnrollment(f))
	f.Add(good)
	f.Add([]byte(`{"v":1,"kind":"manager-managed-agent-prepare-retirement","target":{"owner":"u_o","actor":"a","lifecycleUid":"u"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := DecodeEnrollmentAnswer(b); err == nil {
			again, _ := json.Marshal(e)
			if _, err := DecodeEnrollmentAnswer(again); err != nil {
				t.Fatalf("accepted, then refused its own encoding: %v", err)
			}
		}
		if a, err := DecodePrepareRetirementAnswer(b); err == nil {
			again, _ := json.Marshal(a)
			if _, err := DecodePrepareRetirementAnswer(again); err != nil {
				t.Fatalf("accepted, then refused its own encoding: %v", err)
			}
		}
	})
}
