package policy

import (
	"errors"
	"strings"
	"testing"
)

// hidingHead is a policy entry that the hiding rows below reuse or disguise.
const hidingHead = `version: 1
callers:
  - id: spiffe://cotal.local/admin
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: [">"]}
`

// TestParseRefusesHidingYAML: YAML features that let the file a reviewer reads differ from the
// policy signerd enforces are refused with the line they are on. Before this check, each row
// parsed: a merge key gave the "observer" entry admin's profiles without a profiles line, an
// alias reused a list written elsewhere, and an explicit !!binary tag spelled a space name in
// base64.
func TestParseRefusesHidingYAML(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
		line            int
	}{
		{"fail/merge-key", `version: 1
callers:
  - &admin
    id: spiffe://cotal.local/admin
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: [">"]}
  - <<: *admin
    id: spiffe://cotal.local/observer
`, "anchor", 3},
		{"fail/alias", hidingHead + `  - id: spiffe://cotal.local/observer
    rpcs: [GetSpace]
    spaces: &spaces [alpha]
    rate: {per_second: 1, burst: 1}
  - id: spiffe://cotal.local/other
    rpcs: [GetSpace]
    spaces: *spaces
    rate: {per_second: 1, burst: 1}
`, "anchor", 11},
		{"fail/binary-tag", hidingHead + `  - id: spiffe://cotal.local/observer
    rpcs: [GetSpace]
    spaces: [!!binary YWxwaGE=]
    rate: {per_second: 1, burst: 1}
`, "tag", 11},
		{"fail/str-tag", strings.Replace(hidingHead, "rpcs: [Mint]", "rpcs: [!!str Mint]", 1), "tag", 4},
		{"fail/local-tag", strings.Replace(hidingHead, "spaces: [alpha]", "spaces: [!x alpha]", 1), "tag", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.src))
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, %v; want *Error", p, err)
			}
			if !strings.Contains(pe.Reason, tc.want) || pe.Line != tc.line {
				t.Fatalf("error %q at line %d, want %q at line %d", pe.Reason, pe.Line, tc.want, tc.line)
			}
		})
	}
	t.Run("ok/plain", func(t *testing.T) {
		mustParse(t, hidingHead)
	})
	t.Run("ok/quoted-ampersand-and-star", func(t *testing.T) {
		mustParse(t, strings.Replace(hidingHead, `channels: [">"]`, `channels: ["*.a", ">"]`, 1))
	})
}
