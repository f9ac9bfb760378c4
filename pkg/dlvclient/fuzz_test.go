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

// FuzzDecodeJoinReply: a control reply is untrusted bytes. DecodeJoinReply never panics, refuses
// with ErrBadReply or a *RefusedError only, and what it accepts names the asked lifecycle with a
// generation of at least 1.
func FuzzDecodeJoinReply(f *testing.F) {
	const uid = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	for _, s := range []string{
		`{"ok":true,"data":{"durable":true,"generation":1,"lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}}`,
		`{"ok":true,"data":{"durable":false,"generation":2,"lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa","reason":"evicted"}}`,
		`{"ok":true,"data":{"durable":true,"generation":1,"lifecycleUid":"other"}}`,
		`{"ok":true,"data":{"durable":true,"generation":0,"lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}}`,
		`{"ok":false,"error":"channel \"x\" is not within your read ACL"}`,
		`{"ok":false}`, `{"ok":"yes"}`, `{"ok":true}`, `{"ok":true,"data":[1]}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, err := DecodeJoinReply(body, uid)
		if err != nil {
			var re *RefusedError
			if !errors.Is(err, ErrBadReply) && !errors.As(err, &re) {
				t.Fatalf("refusal %v is neither ErrBadReply nor a RefusedError", err)
			}
			if re != nil && (re.Message == "" || len(re.Message) > 303) {
				t.Fatalf("refusal message of %d bytes", len(re.Message))
			}
			return
		}
		if res.LifecycleUID != uid || res.Generation == 0 {
			t.Fatalf("accepted %+v", res)
		}
	})
}
