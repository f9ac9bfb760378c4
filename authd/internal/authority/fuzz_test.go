package authority

import (
	"encoding/json"
	"testing"

	"github.com/cotalgo/cotal/pkg/lifecycle"
)

// FuzzActivateBody: the activate door's body decoder and grammar check (lifecycle.DecodeObject,
// then activateRequest.check) never panic, and a body they accept holds four valid fields that
// survive a re-encoding unchanged.
func FuzzActivateBody(f *testing.F) {
	f.Add([]byte(`{"accountPublicKey":"ABJHLOVMPA4CI6R5KLNGOB4GSLNIY7IOUPAJC4YFNDLQVIOBYQGUWVLA","owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"cli","lifecycleUid":"cccccccccccccccccccccccccc"}`))
	f.Add([]byte(`{"accountPublicKey":"","owner":"","actor":"","lifecycleUid":""}`))
	f.Add([]byte(`{"owner":1}`))
	f.Add([]byte(`{"accountPublicKey":"A","owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"cli","lifecycleUid":"cccccccccccccccccccccccccc","x":""}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req activateRequest
		if lifecycle.DecodeObject(body, &req) != nil || req.check() != nil {
			return
		}
		if req.AccountPublicKey == "" || req.Owner == "" || req.Actor == "" || req.LifecycleUID == "" {
			t.Fatalf("accepted an empty field: %+v", req)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var again activateRequest
		if err := lifecycle.DecodeObject(b, &again); err != nil || again != req {
			t.Fatalf("re-decoded %+v (%v), want %+v", again, err, req)
		}
	})
}
