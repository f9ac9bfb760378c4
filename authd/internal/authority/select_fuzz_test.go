package authority

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzDecodeManagerIdentity: whatever manager-identity.json holds, an accepted identity names a
// valid space and instance id.
func FuzzDecodeManagerIdentity(f *testing.F) {
	f.Add([]byte(`{"v":1,"space":"s2420","instanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb"}`))
	f.Add([]byte(`{"v":1,"space":"s2420","instanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb"} x`))
	f.Add([]byte(`{"V":1,"Space":"s","instanceid":"b","v":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := DecodeManagerIdentity(b)
		if err != nil {
			return
		}
		if space.ValidateName(id.Space) != nil || space.ValidateUID(id.InstanceID) != nil {
			t.Fatalf("accepted %+v", id)
		}
	})
}

// FuzzDecodeLeaseFacts: an accepted lease row has an <owner>.<actor> holder and registration
// integers within 2^53-1.
func FuzzDecodeLeaseFacts(f *testing.F) {
	iid := strings.Repeat("b", 26)
	f.Add([]byte(`{"holder":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa.manager_serve_` + iid + `","instanceId":"` + iid + `","runtime":"pty","root":"/w","pid":1,"since":2,"processEpoch":0,"registrationRevision":7}`))
	f.Add([]byte(`{"holder":"a.b","instanceId":"` + iid + `","processEpoch":9007199254740993}`))
	f.Add([]byte(`{"holder":null,"instanceId":"` + iid + `"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeLeaseFacts(iid, b)
		if err != nil {
			return
		}
		o, a, ok := strings.Cut(l.Holder, ".")
		if _, err := space.PrincipalKey(o, a); !ok || err != nil {
			t.Fatalf("accepted holder %q", l.Holder)
		}
		for _, n := range []*uint64{l.ProcessEpoch, l.RegistrationRevision} {
			if n != nil && *n > 1<<53-1 {
				t.Fatalf("accepted %d", *n)
			}
		}
	})
}
