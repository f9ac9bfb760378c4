package provision_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/provision"
)

func TestACLRow(t *testing.T) {
	t.Run("ok/encode is what deliveryd decodes", func(t *testing.T) {
		b, err := provision.ACL{AllowSubscribe: []string{"general", "team.>"}, Revision: 3, UpdatedAt: 1700000000000}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != `{"allowSubscribe":["general","team.>"],"revision":3,"updatedAt":1700000000000}` {
			t.Fatalf("encoded %s", b)
		}
		a, ok := provision.DecodeACL(b)
		if !ok || !slices.Equal(a.AllowSubscribe, []string{"general", "team.>"}) || a.Revision != 3 || a.UpdatedAt != 1700000000000 {
			t.Fatalf("decoded %+v %v", a, ok)
		}
		if !a.Allows("team.backend") || a.Allows("other") {
			t.Fatal("Allows")
		}
	})
	t.Run("ok/an empty grant is written as [] and reads as a row", func(t *testing.T) {
		b, err := provision.ACL{Revision: 1}.Encode()
		if err != nil || !strings.Contains(string(b), `"allowSubscribe":[]`) {
			t.Fatalf("encoded %s (%v)", b, err)
		}
		if a, ok := provision.DecodeACL(b); !ok || len(a.AllowSubscribe) != 0 {
			t.Fatalf("decoded %+v %v", a, ok)
		}
	})
	t.Run("fail/encode refuses a channel that is not a pattern", func(t *testing.T) {
		if _, err := (provision.ACL{AllowSubscribe: []string{"a b"}}).Encode(); err == nil {
			t.Fatal("no error")
		}
	})
	for _, tc := range []struct{ name, body string }{
		{"fail/not JSON", `allow all`},
		{"fail/no allowSubscribe", `{"revision":1}`},
		{"fail/null allowSubscribe", `{"allowSubscribe":null}`},
		{"fail/allowSubscribe not strings", `{"allowSubscribe":[1]}`},
		{"fail/too large", `{"allowSubscribe":["` + strings.Repeat("a", provision.MaxACLBytes) + `"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a, ok := provision.DecodeACL([]byte(tc.body)); ok {
				t.Fatalf("decoded %+v", a)
			}
		})
	}
}

// FuzzDecodeACL: an ACL row is bytes in a bucket other parties may write. DecodeACL never panics,
// and a row it accepts re-encodes to a row that decodes to the same grant.
func FuzzDecodeACL(f *testing.F) {
	f.Add([]byte(`{"allowSubscribe":["general"],"revision":1,"updatedAt":1}`))
	f.Add([]byte(`{"allowSubscribe":[]}`))
	f.Add([]byte(`{"allowSubscribe":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ok := provision.DecodeACL(b)
		if !ok {
			return
		}
		out, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		again, ok := provision.DecodeACL(out)
		if !ok || !slices.Equal(again.AllowSubscribe, a.AllowSubscribe) && len(a.AllowSubscribe) != 0 {
			t.Fatalf("%s decoded, re-encoded as %s, decoded as %+v %v", b, out, again, ok)
		}
	})
}
