package exchange

import (
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzDecodeRequest feeds arbitrary bodies to the /exchange request decoder: nothing may panic,
// and an accepted request names exactly one arm, no ttl under 1, and a managerInstanceId only as
// an instance id with view manager-caller.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"idpToken":"a.b.c","actor":"alice","ttlSec":60,"view":"admin"}`))
	f.Add([]byte(`{"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"a1","actorToken":"s"}`))
	f.Add([]byte(`{"idpToken":"x","actorToken":"y"}`))
	f.Add([]byte(`{"idpToken":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"idpToken":"t","actor":"cli","view":"manager-caller","managerInstanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb"}`))
	f.Add([]byte(`{"actorToken":"t","actor":"a","view":"admin","managerInstanceId":"b"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeRequest(body)
		if err != nil {
			return
		}
		if (req.IdPToken == nil) == (req.ActorToken == nil) {
			t.Fatalf("accepted %q with idpToken %v actorToken %v", body, req.IdPToken != nil, req.ActorToken != nil)
		}
		if req.TTLSec != nil && *req.TTLSec < 1 {
			t.Fatalf("accepted ttlSec %d", *req.TTLSec)
		}
		if req.IdPToken != nil && req.Owner != "" {
			t.Fatalf("accepted a human request with an owner")
		}
		if req.ManagerInstanceID != nil && (req.View != "manager-caller" || space.ValidateUID(*req.ManagerInstanceID) != nil) {
			t.Fatalf("accepted managerInstanceId %q with view %q", *req.ManagerInstanceID, req.View)
		}
	})
}
