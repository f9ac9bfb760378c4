package authclient

import (
	"strings"
	"testing"
)

// FuzzDecodeRecord: the record decoder never panics, accepts only records that pass check, and
// its refusals never echo the renewal proof it was given.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"v":1,"account":"A","space":"acme","endpoint":"a.b","instance":"01hzz8k3q4w5e6r7t8y9u0i1o2","witness":"w_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","activateRequestId":"act_0123456789","renewRequestId":"ren_0123456789","renewal":{"token":"SECRET.tok.en","exp":42}}`))
	f.Add([]byte(`{"v":1,"renewal":{"token":"SECRET.tok.en","exp":"x"}}`))
	f.Add([]byte(`{"v":1} {}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		rec, err := decodeRecord(raw)
		if err != nil {
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("refusal %q echoes the proof", err)
			}
			return
		}
		if err := rec.check(); err != nil {
			t.Fatalf("accepted a record check refuses: %v", err)
		}
	})
}
