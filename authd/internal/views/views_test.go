package views

import (
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/profiles"
)

func TestProfile(t *testing.T) {
	for _, tc := range []struct {
		view    string
		profile profiles.Name
		scope   string
		ok      bool
	}{
		{"admin", profiles.Admin, "admin", true},
		// No profile in pkg/profiles: refused at the exchange and at the callout.
		{"purger", "", "", false},
		{"channel-purger", "", "", false},
		{"channel-writer", "", "", false},
		{"transfer-writer", "", "", false},
		{"deployer", "", "", false},
		{"manager-service", "", "", false},
		{"manager-caller", "", "", false},
		{"session-caller", "", "", false},
		// Not views at all.
		{"", "", "", false},
		{"agent", "", "", false},
		{"Admin", "", "", false},
		{"observer", "", "", false},
	} {
		name := "fail/" + tc.view
		if tc.ok {
			name = "ok/" + tc.view
		}
		t.Run(name, func(t *testing.T) {
			p, scope, ok := Profile(tc.view)
			if p != tc.profile || scope != tc.scope || ok != tc.ok {
				t.Fatalf("Profile(%q) = %q, %q, %v; want %q, %q, %v", tc.view, p, scope, ok, tc.profile, tc.scope, tc.ok)
			}
			if ok {
				if _, err := profiles.Parse(string(p)); err != nil {
					t.Fatalf("view maps to a profile the matrix does not have: %v", err)
				}
			}
		})
	}
}

func TestEnum(t *testing.T) {
	want := []string{"admin", "channel-purger", "channel-writer", "deployer", "manager-caller", "manager-service", "purger", "session-caller", "transfer-writer"}
	got := All()
	if len(got) != len(want) {
		t.Fatalf("All = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || !Known(want[i]) {
			t.Fatalf("All = %v, want %v", got, want)
		}
	}
	for _, v := range []string{"", "agent", "ADMIN", "admin ", "observer"} {
		if Known(v) {
			t.Errorf("Known(%q) = true", v)
		}
		if _, ok := RequiredScope(v); ok {
			t.Errorf("RequiredScope(%q) ok", v)
		}
	}
	for v, s := range map[string]string{"admin": "admin", "purger": "admin", "channel-purger": "admin", "channel-writer": "admin",
		"transfer-writer": "admin", "deployer": "spawn", "manager-service": "supervise", "manager-caller": "", "session-caller": ""} {
		if got, ok := RequiredScope(v); !ok || got != s {
			t.Errorf("RequiredScope(%q) = %q, %v; want %q", v, got, ok, s)
		}
	}
}

func TestMaxTTL(t *testing.T) {
	if MaxTTL("transfer-writer") != 300*time.Second || MaxTTL("") != 900*time.Second || MaxTTL("admin") != 900*time.Second {
		t.Fatal("MaxTTL caps differ from upstream's 900 s / 300 s")
	}
}
