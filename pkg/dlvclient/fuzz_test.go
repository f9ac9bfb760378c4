package dlvclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
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

// FuzzEncodeFrame: the trusted reader frames every copy with EncodeFrame, which checks the
// channel and the msg rather than decoding the frame it built. It must refuse exactly what
// DecodeFrame would refuse of the marshalled frame, and what it returns must be that frame.
func FuzzEncodeFrame(f *testing.F) {
	for _, s := range [][2]string{
		{"general", `{"id":"m1","text":"hi"}`},
		{"team.backend", ` { "id" : "m2" } `},
		{"general", `{"ID":7}`},
		{"general", `{"id":"a","Id":"b"}`},
		{"general", `{"text":"<&>\u2028"}`},
		{"general", `[1]`},
		{"general", `{"id":7}`},
		{"gen>", `{}`},
		{"general", `{} {}`},
		{"general", `{"id":"` + strings.Repeat("x", MaxIDBytes+1) + `"}`},
		{"general", ``},
	} {
		f.Add(s[0], []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, channel string, msg []byte) {
		got, err := EncodeFrame(channel, msg)
		want, wantErr := json.Marshal(Frame{Version: FrameVersion, Channel: channel, Msg: msg})
		if wantErr == nil {
			_, _, wantErr = DecodeFrame(want)
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("EncodeFrame(%q, %q) error %v, the whole-frame check %v", channel, msg, err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("refusal %v does not match ErrBadFrame", err)
			}
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeFrame(%q, %q) = %q, want %q", channel, msg, got, want)
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

// FuzzDecodeInventoryReply: an inventory reply is untrusted bytes. DecodeInventoryReply never
// panics, refuses with ErrBadReply or a *RefusedError only, and what it returns (alone, or with
// ErrIncomplete when complete is false) names the asked lifecycle with distinct concrete
// channels.
func FuzzDecodeInventoryReply(f *testing.F) {
	const uid = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	head := `{"ok":true,"data":{"owner":"local","actor":"a1","lifecycleUid":"` + uid + `",`
	for _, s := range []string{
		head + `"channels":["general","team.backend"],"complete":true}}`,
		head + `"channels":[],"complete":false}}`,
		head + `"channels":["team.>"],"complete":true}}`,
		head + `"channels":["a","a"],"complete":true}}`,
		head + `"channels":null,"complete":true}}`,
		`{"ok":false,"error":"local.authd may ask only lifecycleMemberships"}`,
		`{"ok":false}`, `{"ok":true}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		inv, err := DecodeInventoryReply(body, "local", "a1", uid)
		if err != nil && !errors.Is(err, ErrIncomplete) {
			var re *RefusedError
			if !errors.Is(err, ErrBadReply) && !errors.As(err, &re) {
				t.Fatalf("refusal %v is neither ErrBadReply nor a RefusedError", err)
			}
			return
		}
		if inv.Owner != "local" || inv.Actor != "a1" || inv.LifecycleUID != uid || inv.Complete != (err == nil) {
			t.Fatalf("accepted %+v with %v", inv, err)
		}
		seen := map[string]bool{}
		for _, ch := range inv.Channels {
			if space.ValidateChannel(ch) != nil || seen[ch] {
				t.Fatalf("accepted channel %q in %+v", ch, inv)
			}
			seen[ch] = true
		}
	})
}

// FuzzDecodeGap: a gap marker's header and body are untrusted bytes. DecodeGap never panics,
// refuses with ErrBadGap only, and what it accepts re-encodes (EncodeGap) to the same header and a
// body it accepts with the same count; an accepted body is never a delivery frame, so a client
// that predates the marker terminates it.
func FuzzDecodeGap(f *testing.F) {
	for _, s := range [][2]string{
		{"3", `{"version":1,"gap":3}`},
		{"18446744073709551615", `{"version":1,"gap":18446744073709551615}`},
		{"03", `{"version":1,"gap":3}`},
		{"+3", `{"version":1,"gap":3}`},
		{"0", `{"version":1,"gap":0}`},
		{"3", `{"version":1,"gap":4}`},
		{"3", `{"version":2,"gap":3}`},
		{"3", `{"version":1}`},
		{"3", `{"version":1,"gap":3,"channel":"general"}`},
		{"3", `{"version":1,"gap":3} {}`},
		{"3", `{"version":1,"gap":-3}`},
		{"3", `{"version":1,"gap":3.0}`},
		{"", ``},
	} {
		f.Add(s[0], []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		n, err := DecodeGap(header, body)
		if err != nil {
			if !errors.Is(err, ErrBadGap) {
				t.Fatalf("refusal %v does not match ErrBadGap", err)
			}
			return
		}
		if n == 0 {
			t.Fatal("accepted a zero count")
		}
		again, h, err := EncodeGap(n)
		if err != nil || h != header {
			t.Fatalf("accepted marker re-encodes to header %q (was %q): %v", h, header, err)
		}
		if n2, err := DecodeGap(h, again); err != nil || n2 != n {
			t.Fatalf("re-encoded marker: %d vs %d, err %v", n2, n, err)
		}
		if _, _, err := DecodeFrame(body); err == nil {
			t.Fatalf("an accepted marker body decodes as a frame: %q", body)
		}
	})
}
