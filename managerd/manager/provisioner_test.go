package manager

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cotalgo/cotal/pkg/provision"
)

// TestMemberChannels: an agent's teardown names the concrete channels of its read lists,
// subscribe first, without repeats; patterns name no row and are skipped; past
// provision.MaxMemberChannels the list is cut and says so.
func TestMemberChannels(t *testing.T) {
	many := make([]string, provision.MaxMemberChannels+2)
	for i := range many {
		many[i] = fmt.Sprintf("c%03d", i)
	}
	for _, tc := range []struct {
		name                string
		subscribe, allowSub []string
		want                []string
		truncated           bool
	}{
		{"ok/none", nil, nil, nil, false},
		{"ok/subscribe then allow, once each", []string{"general"}, []string{"team.backend", "general"}, []string{"general", "team.backend"}, false},
		{"ok/patterns skipped", []string{"team.a"}, []string{"team.>", "proj.*", "ops"}, []string{"team.a", "ops"}, false},
		{"ok/cut at the maximum", many[:2], many, many[:provision.MaxMemberChannels], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, truncated := memberChannels(tc.subscribe, tc.allowSub)
			if !slices.Equal(got, tc.want) || truncated != tc.truncated {
				t.Fatalf("got %v (truncated %v), want %v (truncated %v)", got, truncated, tc.want, tc.truncated)
			}
		})
	}
}
