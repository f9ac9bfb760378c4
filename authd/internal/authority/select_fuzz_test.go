package authority

import (
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
