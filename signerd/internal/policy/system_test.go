package policy

import (
	"strings"
	"testing"
)

// TestSystemProfilesOnlyForDeliveryd: a policy granting a $SYS profile to anything but a
// deliveryd identity does not load.
func TestSystemProfilesOnlyForDeliveryd(t *testing.T) {
	doc := func(id, profile string) string {
		return "version: 1\ncallers:\n  - id: " + id + "\n    rpcs: [Mint]\n    spaces: [\"{space}\"]\n    rate: {per_second: 1, burst: 1}\n    profiles:\n      " + profile + ": {ttl_max: 5m}\n"
	}
	for _, p := range []string{"membership-observer", "connection-evictor"} {
		t.Run("ok/deliveryd/"+p, func(t *testing.T) {
			if _, err := Parse([]byte(doc("spiffe://cotal.local/deliveryd/{space}", p))); err != nil {
				t.Fatal(err)
			}
		})
		for _, id := range []string{"spiffe://cotal.local/managerd/{space}", "spiffe://cotal.local/*/{space}", "spiffe://cotal.local/x/deliveryd/{space}"} {
			t.Run("fail/"+id+"/"+p, func(t *testing.T) {
				_, err := Parse([]byte(doc(id, p)))
				if err == nil || !strings.Contains(err.Error(), "system-account profile") {
					t.Fatalf("Parse: %v, want a system-account refusal", err)
				}
			})
		}
	}
}
