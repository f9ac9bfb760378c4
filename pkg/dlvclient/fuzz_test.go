package dlvclient

import (
	"errors"
	"testing"
)

// FuzzDecodeFrame: a DLV body is untrusted bytes. DecodeFrame never panics, refuses with
// ErrBadFrame only, and what it accepts re-encodes to a frame it accepts again with the same id.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"channel":"general","msg":{"id":"m1","text":"hi"}}`,
		`{"version":1,"channel":"team.backend","msg":{}}`,
		`{"version":2,"channel":"general","msg":{}}`,
		`{"version":1,"channel":"general","msg":[1]}`,
		`{"version":1,"channel":"general","msg":{"id":7}}`,
		`{"version":1,"channel":"gen>","msg":{}}`,
		`{"version":1,"channel":"general","msg":{},"x":1}`,
		`{"version":1,"channel":"general","msg":{}} {}`,
		`null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, id, err := DecodeFrame(body)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("refusal %v does not match ErrBadFrame", err)
			}
			return
		}
		again, err := EncodeFrame(fr.Channel, fr.Msg)
		if err != nil {
			t.Fatalf("accepted frame does not re-encode: %v", err)
		}
		if _, id2, err := DecodeFrame(again); err != nil || id2 != id {
			t.Fatalf("re-encoded frame: id %q vs %q, err %v", id2, id, err)
		}
	})
}
