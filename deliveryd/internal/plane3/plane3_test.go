package plane3

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

func u64(v uint64) *uint64 { return &v }

func TestEligible(t *testing.T) {
	tests := []struct {
		name string
		m    Member
		seq  uint64
		want bool
	}{
		{"fail/at the join cursor", Member{JoinCursor: 5}, 5, false},
		{"ok/after the join cursor, open", Member{JoinCursor: 5}, 6, true},
		{"ok/at the leave cursor", Member{JoinCursor: 5, LeaveCursor: u64(9)}, 9, true},
		{"fail/after the leave cursor", Member{JoinCursor: 5, LeaveCursor: u64(9)}, 10, false},
		{"ok/not yet activated still routes", Member{JoinCursor: 1, Activated: false}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.m.Eligible(tt.seq); got != tt.want {
				t.Fatalf("Eligible(%d) = %v", tt.seq, got)
			}
		})
	}
}

// TestDepart: a departed lifecycle's row becomes a tombstone with an empty interval, keeping its
// generation and join cursor; a row already closed so is not written again.
func TestDepart(t *testing.T) {
	tests := []struct {
		name  string
		m     Member
		write bool
	}{
		{"ok/an open row is closed at its join cursor", Member{State: StateActive, JoinCursor: 5, Generation: 3, Activated: true}, true},
		{"ok/a tombstone with a later leave cursor is closed to nothing", Member{State: StateTombstone, JoinCursor: 5, LeaveCursor: u64(9), Generation: 2}, true},
		{"ok/an open row at sequence 0 is closed", Member{State: StateActive, Generation: 1}, true},
		{"fail/a row already closed so is not written again", Member{State: StateTombstone, JoinCursor: 5, LeaveCursor: u64(5), Generation: 2}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, write := tt.m.Depart("w", 42)
			if write != tt.write {
				t.Fatalf("write = %v, want %v", write, tt.write)
			}
			if got.State != StateTombstone || got.LeaveCursor == nil || *got.LeaveCursor != tt.m.JoinCursor ||
				got.JoinCursor != tt.m.JoinCursor || got.Generation != tt.m.Generation || got.Activated != tt.m.Activated {
				t.Fatalf("Depart(%+v) = %+v", tt.m, got)
			}
			for seq := uint64(0); seq < 20; seq++ {
				if got.Eligible(seq) {
					t.Fatalf("the departed row is still eligible for %d", seq)
				}
			}
			if write && (got.WriterIdentity != "w" || got.UpdatedAt != 42) {
				t.Fatalf("writer %q at %d", got.WriterIdentity, got.UpdatedAt)
			}
		})
	}
}

func TestAllows(t *testing.T) {
	tests := []struct {
		name    string
		allow   []string
		channel string
		want    bool
	}{
		{"ok/concrete", []string{"general"}, "general", true},
		{"fail/empty row reads nothing", []string{}, "general", false},
		{"fail/prefix is not a match", []string{"gen"}, "general", false},
		{"ok/star matches one token", []string{"team.*"}, "team.backend", true},
		{"fail/star matches only one token", []string{"team.*"}, "team.backend.x", false},
		{"ok/tail matches more", []string{"team.>"}, "team.backend.x", true},
		{"fail/tail needs one token", []string{"team.>"}, "team", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (ACL{AllowSubscribe: tt.allow}).Allows(tt.channel); got != tt.want {
				t.Fatalf("Allows(%q) = %v", tt.channel, got)
			}
		})
	}
}

func TestParseSubjects(t *testing.T) {
	n, _ := space.NewNames("alpha")
	tests := []struct {
		name, subject string
		ok            bool
	}{
		{"ok/local owner", "cotal.alpha.chat.local.a1.general", true},
		{"ok/derived owner and dotted channel", "cotal.alpha.chat.u_abcdefghijklmnopqrstuvwxyz.a1.team.backend", true},
		{"fail/owner that is not a principal", "cotal.alpha.chat.o1.a1.general", false},
		{"fail/other space", "cotal.beta.chat.local.a1.general", false},
		{"fail/no channel", "cotal.alpha.chat.local.a1", false},
		{"fail/dm", "cotal.alpha.inst.local.a1.local.a2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, _, ok := ParseChat(n, tt.subject); ok != tt.ok {
				t.Fatalf("ParseChat(%s) ok = %v", tt.subject, ok)
			}
		})
	}
	for _, tt := range []struct {
		subject string
		ok      bool
	}{
		{"cotal.alpha.dinbox.local.a1.abcdefghijklmnopqrstuvwxyz", true},
		{"cotal.alpha.dinbox.local.a1", false},
		{"cotal.alpha.dinbox.local.a1.short", false},
		{"cotal.alpha.dinbox.local.a1.abcdefghijklmnopqrstuvwxyz.x", false},
	} {
		if _, ok := ParseDinbox(n, tt.subject); ok != tt.ok {
			t.Fatalf("ParseDinbox(%s) ok = %v", tt.subject, ok)
		}
	}
}

func TestDecodeMemberAgreesWithItsKey(t *testing.T) {
	const uid = "abcdefghijklmnopqrstuvwxyz"
	key := "general/local.a1." + uid
	good := `{"channel":"general","owner":"local.a1","lifecycleUid":"` + uid + `","joinCursor":3,"generation":2}`
	if m, lc, err := DecodeMember(key, []byte(good)); err != nil || lc.Actor != "a1" || m.Generation != 2 {
		t.Fatalf("ok/good row: %+v %+v %v", m, lc, err)
	}
	for _, bad := range []string{
		`{"channel":"other","owner":"local.a1","lifecycleUid":"` + uid + `"}`,
		`{"channel":"general","owner":"local.a2","lifecycleUid":"` + uid + `"}`,
		`not json`,
	} {
		if _, _, err := DecodeMember(key, []byte(bad)); !errors.Is(err, ErrBadRecord) {
			t.Fatalf("fail/%s: err = %v", bad, err)
		}
	}
}

// FuzzDecodeEntry: an inbox entry is bytes another connection published. The decoder never
// panics, refuses with ErrBadRecord only, and an accepted entry round-trips; DecodeEntryHead
// (what the reader decodes per entry, the msg once per pass) accepts it as the same entry.
func FuzzDecodeEntry(f *testing.F) {
	f.Add([]byte(`{"msg":{"id":"m1","from":{"id":"local.a0"}},"channel":"general","seq":3,"reason":"durable-channel","generation":1}`))
	f.Add([]byte(`{"msg":[],"channel":"general","seq":3,"reason":"live-mention"}`))
	f.Add([]byte(`{"msg":{"id":7},"channel":"general","seq":3,"reason":"live-mention"}`))
	f.Add([]byte(`{"msg":{},"channel":"a..b","seq":0,"reason":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, id, err := DecodeEntry(b)
		head, herr := DecodeEntryHead(b)
		if herr != nil && !errors.Is(herr, ErrBadRecord) {
			t.Fatalf("head refusal %v is not ErrBadRecord", herr)
		}
		if err == nil && (herr != nil || !bytes.Equal(head.Msg, e.Msg) || head.Channel != e.Channel || head.Seq != e.Seq) {
			t.Fatalf("DecodeEntryHead %+v, %v of an entry DecodeEntry accepts as %+v", head, herr, e)
		}
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("refusal %v is not ErrBadRecord", err)
			}
			return
		}
		again, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, id2, err := DecodeEntry(again); err != nil || id2 != id {
			t.Fatalf("round trip: %q vs %q, %v", id2, id, err)
		}
	})
}

// FuzzEntryEncoder: the fan-out writer encodes inbox entries with EntryEncoder, not json.Marshal.
// For any chat message the writer accepts, on any channel, sequence, reason and generation, the
// entry must be the bytes json.Marshal gives, and decode back to the same entry.
func FuzzEntryEncoder(f *testing.F) {
	f.Add([]byte(`{"id":"m1","from":{"id":"local.a0"},"text":"hi","to":"x"}`), "general", uint64(3), ReasonDurable, uint64(1))
	f.Add([]byte(` { "id" : "m2", "text" : "<&>\u2028", "n" : [1, 2.50, {"a":null}] } `), "team.backend", uint64(1), ReasonMention, uint64(0))
	f.Add([]byte(`{"id":"\ud800","channel":"other"}`), "a\"b", uint64(1<<63), "reason\x00", ^uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, channel string, seq uint64, reason string, generation uint64) {
		m, err := DecodeMessage(b)
		if err != nil {
			return
		}
		body, err := m.Normalised(channel)
		if err != nil {
			return
		}
		got := NewEntryEncoder(body, channel, seq).Encode(reason, generation)
		e := Entry{Msg: body, Channel: channel, Seq: seq, Reason: reason, Generation: generation}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("entry %q, json.Marshal %q", got, want)
		}
	})
}
