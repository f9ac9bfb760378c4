package exchange

import "testing"

// FuzzDecodeRequest feeds arbitrary bodies to the /exchange request decoder: nothing may panic,
// and an accepted request names exactly one arm and no ttl under 1.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"idpToken":"a.b.c","actor":"alice","ttlSec":60,"view":"admin"}`))
	f.Add([]byte(`{"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"a1","actorToken":"s"}`))
	f.Add([]byte(`{"idpToken":"x","actorToken":"y"}`))
	f.Add([]byte(`{"idpToken":null}`))
	f.Add([]byte(`[]`))
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
	})
}
