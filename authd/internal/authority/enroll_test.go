package authority

import (
	"slices"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/managerauthority"
)

// TestClampLists: the requested lists' defaults and their clamp to the supervising row.
func TestClampLists(t *testing.T) {
	parent := ledger.Row{Owner: "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", Actor: "cli", Scope: []string{"supervise", "spawn", "role:worker"},
		AllowSubscribe: []string{"general", "team.*"}, AllowPublish: []string{"general"}}
	for _, tc := range []struct {
		name                           string
		t                              managerauthority.EnrollmentTarget
		scope, sub, allowSub, allowPub []string
	}{
		{"ok/defaults", managerauthority.EnrollmentTarget{}, nil, []string{"general"}, []string{"general"}, []string{"general"}},
		{"ok/allow lists default to subscribe", managerauthority.EnrollmentTarget{Subscribe: []string{"general", "team.x"}},
			nil, []string{"general", "team.x"}, []string{"general", "team.x"}, []string{"general"}},
		{"ok/within the parent's reach", managerauthority.EnrollmentTarget{Subscribe: []string{"team.a"}, AllowSubscribe: []string{"team.>"}, AllowPublish: []string{"general"}},
			nil, []string{"team.a"}, []string{"team.>"}, []string{"general"}},
		{"fail/beyond the parent is dropped", managerauthority.EnrollmentTarget{Capabilities: []string{"spawn", "admin", "spawn"},
			Subscribe: []string{"general", "ops.x"}, AllowSubscribe: []string{"ops.>", "general", "general"}, AllowPublish: []string{"team.x"}},
			[]string{"spawn"}, []string{"general"}, []string{"general"}, []string{}},
		{"fail/nothing within leaves empty lists", managerauthority.EnrollmentTarget{Subscribe: []string{"ops.x"}},
			nil, []string{}, []string{}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := clampLists(parent, tc.t)
			if !slices.Equal(l.scope, tc.scope) || !slices.Equal(l.subscribe, tc.sub) || !slices.Equal(l.allowSubscribe, tc.allowSub) ||
				!slices.Equal(l.allowPublish, tc.allowPub) {
				t.Fatalf("clamp %+v, want scope %v sub %v allowSub %v allowPub %v", l, tc.scope, tc.sub, tc.allowSub, tc.allowPub)
			}
			row := ledger.Row{Scope: l.scope, AllowSubscribe: l.allowSubscribe, AllowPublish: l.allowPublish}
			if !within(parent, row) {
				t.Fatalf("a clamped row %+v is not within its parent", row)
			}
		})
	}
	t.Run("fail/within refuses a role, a word or a channel the parent lacks", func(t *testing.T) {
		for _, row := range []ledger.Row{{Role: "reviewer"}, {Scope: []string{"admin"}}, {AllowSubscribe: []string{"ops.x"}}, {AllowPublish: []string{"team.x"}}} {
			if within(parent, row) {
				t.Fatalf("row %+v is within", row)
			}
		}
		if !within(parent, ledger.Row{Role: "worker"}) {
			t.Fatal("a delegated role is not within")
		}
	})
}
