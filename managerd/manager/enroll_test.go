package manager

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestBindEnrollment: a remote managerd binds an enrollment answer to what it asked: its owner,
// the actor, each effective list within the asked one, a bearer sentinel, an http(s) exchange
// URL; and the actor token it sends is only a SHA-256.
func TestBindEnrollment(t *testing.T) {
	m := newManager(Inputs{Config: &Config{Owner: "u_o", AgentOwner: "u_o"}}, RuntimeOptions{})
	req := &managerauthority.EnrollmentRequest{Target: managerauthority.EnrollmentTarget{Actor: "a1",
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general", "team.>"}, AllowPublish: []string{"general"}}}
	good := func() *managerauthority.Enrollment {
		return &managerauthority.Enrollment{Owner: "u_o", Actor: "a1", LifecycleUID: "0123456789abcdefghijklmnop",
			SentinelCreds: testkit.SentinelCreds(t, true), Subscribe: []string{"general"}, AllowSubscribe: []string{"general"},
			AllowPublish: []string{"general"}, AgentBearerExchangeURL: "https://auth.example/t"}
	}
	t.Run("ok/a clamped answer binds", func(t *testing.T) {
		s, err := m.bindEnrollment(req, good())
		if err != nil || !strings.HasPrefix(s, "eyJ") {
			t.Fatalf("bind: %v", err)
		}
	})
	t.Run("ok/the token leaves only as its SHA-256", func(t *testing.T) {
		tok, hash, err := newActorToken()
		if err != nil || len(tok) != 43 || len(hash) != 64 || strings.Contains(hash, tok) {
			t.Fatalf("token %d chars, hash %q, err %v", len(tok), hash, err)
		}
	})
	for name, edit := range map[string]func(*managerauthority.Enrollment){
		"another owner":                 func(e *managerauthority.Enrollment) { e.Owner = "u_p" },
		"another actor":                 func(e *managerauthority.Enrollment) { e.Actor = "a2" },
		"a bad uid":                     func(e *managerauthority.Enrollment) { e.LifecycleUID = "../x" },
		"a channel that was not asked":  func(e *managerauthority.Enrollment) { e.AllowPublish = []string{"general", "secret"} },
		"a wider pattern":               func(e *managerauthority.Enrollment) { e.AllowSubscribe = []string{">"} },
		"a sentinel that is not bearer": func(e *managerauthority.Enrollment) { e.SentinelCreds = testkit.SentinelCreds(t, false) },
		"a file exchange URL":           func(e *managerauthority.Enrollment) { e.AgentBearerExchangeURL = "file:///x" },
	} {
		t.Run("fail/"+name, func(t *testing.T) {
			e := good()
			edit(e)
			if _, err := m.bindEnrollment(req, e); err == nil {
				t.Fatal("bound")
			}
		})
	}
}
