package space

import (
	"errors"
	"strings"
	"testing"
)

func TestToken(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"ok/plain", "demo", "demo"},
		{"ok/keeps dash and underscore", "a-b_C9", "a-b_C9"},
		{"ok/space becomes underscore", "my space", "my_space"},
		{"ok/dot and wildcards become underscore", "a.b*c>d", "a_b_c_d"},
		{"ok/trims ascii whitespace", " \t demo \n", "demo"},
		{"ok/trims nbsp and bom like js", "\u00a0\ufeffdemo\u3000", "demo"},
		{"ok/does not trim NEL like js", "\u0085demo", "_demo"},
		{"ok/bmp rune is one underscore", "caf\u00e9", "caf_"},
		{"ok/astral rune is two underscores like utf16", "a\U0001F600b", "a__b"},
		{"ok/empty becomes underscore", "", "_"},
		{"ok/whitespace only becomes underscore", "   ", "_"},
		{"ok/invalid utf8 byte is one underscore", "a\xffb", "a_b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Token(tc.in); got != tc.want {
				t.Fatalf("Token(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSegment(t *testing.T) {
	if got, want := Segment("demo space"), "space.64656d6f207370616365"; got != want {
		t.Fatalf("Segment = %q, want %q", got, want)
	}
	if Segment("a b") == Segment("a_b") {
		t.Fatal("Segment must distinguish names whose tokens collide")
	}
}

func TestValidateName(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"ok/ascii", "demo", true},
		{"ok/interior space", "my space", true},
		{"ok/unicode", "caf\u00e9 \U0001F600", true},
		{"ok/max length", strings.Repeat("a", MaxNameLen), true},
		{"fail/empty", "", false},
		{"fail/too long", strings.Repeat("a", MaxNameLen+1), false},
		{"fail/invalid utf8", "a\xffb", false},
		{"fail/leading space", " demo", false},
		{"fail/trailing newline", "demo\n", false},
		{"fail/trailing bom", "demo\ufeff", false},
		{"fail/control char", "de\x01mo", false},
		{"fail/del", "de\x7fmo", false},
		{"fail/c1 control", "de\u0085mo", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName(tc.in)
			checkErr(t, err, tc.ok, KindSpace, tc.in)
		})
	}
}

// checkErr asserts err is nil when ok, else a *NameError of kind naming value.
func checkErr(t *testing.T, err error, ok bool, kind, value string) {
	t.Helper()
	if ok {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var ne *NameError
	if !errors.As(err, &ne) {
		t.Fatalf("got %v (%T), want *NameError", err, err)
	}
	if ne.Kind != kind || ne.Value != value || ne.Reason == "" {
		t.Fatalf("NameError = %+v, want kind %q value %q and a reason", ne, kind, value)
	}
}

func TestValidators(t *testing.T) {
	uid26 := strings.Repeat("a", 26)
	tests := []struct {
		name string
		fn   func(string) error
		kind string
		in   string
		ok   bool
	}{
		{"ok/owner", ValidateOwner, KindOwner, "local", true},
		{"ok/owner upper and digits", ValidateOwner, KindOwner, "UABC_12", true},
		{"ok/owner max", ValidateOwner, KindOwner, strings.Repeat("x", MaxIdentLen), true},
		{"fail/owner empty", ValidateOwner, KindOwner, "", false},
		{"fail/owner dash", ValidateOwner, KindOwner, "a-b", false},
		{"fail/owner dot", ValidateOwner, KindOwner, "a.b", false},
		{"fail/owner star", ValidateOwner, KindOwner, "*", false},
		{"fail/owner gt", ValidateOwner, KindOwner, ">", false},
		{"fail/owner space", ValidateOwner, KindOwner, "a b", false},
		{"fail/owner unicode", ValidateOwner, KindOwner, "caf\u00e9", false},
		{"fail/owner too long", ValidateOwner, KindOwner, strings.Repeat("x", MaxIdentLen+1), false},
		{"ok/actor", ValidateActor, KindActor, "bob_2", true},
		{"fail/actor empty", ValidateActor, KindActor, "", false},
		{"fail/actor dash", ValidateActor, KindActor, "b-ob", false},
		{"ok/derived owner", ValidateDerivedOwner, KindDerivedOwner, "u_" + strings.Repeat("a2", 13), true},
		{"fail/derived owner upper", ValidateDerivedOwner, KindDerivedOwner, "u_" + strings.Repeat("A", 26), false},
		{"fail/derived owner digit 8", ValidateDerivedOwner, KindDerivedOwner, "u_" + strings.Repeat("8", 26), false},
		{"fail/derived owner short", ValidateDerivedOwner, KindDerivedOwner, "u_abc", false},
		{"fail/derived owner prefix", ValidateDerivedOwner, KindDerivedOwner, "v_" + strings.Repeat("a", 26), false},
		{"fail/derived owner nkey", ValidateDerivedOwner, KindDerivedOwner, "U" + strings.Repeat("A", 55), false},
		{"ok/uid 26", ValidateUID, KindUID, uid26, true},
		{"ok/uid 32", ValidateUID, KindUID, strings.Repeat("0", 32), true},
		{"fail/uid 25", ValidateUID, KindUID, strings.Repeat("a", 25), false},
		{"fail/uid 33", ValidateUID, KindUID, strings.Repeat("a", 33), false},
		{"fail/uid upper", ValidateUID, KindUID, strings.Repeat("A", 26), false},
		{"fail/uid dash", ValidateUID, KindUID, strings.Repeat("a", 25) + "-", false},
		{"ok/channel", ValidateChannel, KindChannel, "general", true},
		{"ok/channel dotted", ValidateChannel, KindChannel, "team.back-end_2", true},
		{"ok/channel max", ValidateChannel, KindChannel, strings.Repeat("c", MaxChannelLen), true},
		{"fail/channel empty", ValidateChannel, KindChannel, "", false},
		{"fail/channel star", ValidateChannel, KindChannel, "team.*", false},
		{"fail/channel gt", ValidateChannel, KindChannel, "team.>", false},
		{"fail/channel bare gt", ValidateChannel, KindChannel, ">", false},
		{"fail/channel leading dot", ValidateChannel, KindChannel, ".team", false},
		{"fail/channel trailing dot", ValidateChannel, KindChannel, "team.", false},
		{"fail/channel double dot", ValidateChannel, KindChannel, "a..b", false},
		{"fail/channel space", ValidateChannel, KindChannel, "a b", false},
		{"fail/channel slash", ValidateChannel, KindChannel, "foo/bar", false},
		{"fail/channel too long", ValidateChannel, KindChannel, strings.Repeat("c", MaxChannelLen+1), false},
		{"ok/role", ValidateRole, KindRole, "code-review_2", true},
		{"fail/role empty", ValidateRole, KindRole, "", false},
		{"fail/role dot", ValidateRole, KindRole, "a.b", false},
		{"fail/role star", ValidateRole, KindRole, "*", false},
		{"ok/nonce 8", ValidateInboxNonce, KindInboxNonce, "abcd-_12", true},
		{"ok/nonce nkey", ValidateInboxNonce, KindInboxNonce, "U" + strings.Repeat("A", 55), true},
		{"ok/nonce 120", ValidateInboxNonce, KindInboxNonce, strings.Repeat("n", 120), true},
		{"fail/nonce 7", ValidateInboxNonce, KindInboxNonce, "abcdefg", false},
		{"fail/nonce 121", ValidateInboxNonce, KindInboxNonce, strings.Repeat("n", 121), false},
		{"fail/nonce gt", ValidateInboxNonce, KindInboxNonce, ">>>>>>>>", false},
		{"fail/nonce dot", ValidateInboxNonce, KindInboxNonce, "abcd.efgh", false},
		{"ok/kv key", ValidateKVKey, KindKVKey, "team.backend/local.bob.aaaa", true},
		{"ok/kv key equals", ValidateKVKey, KindKVKey, "=defaults", true},
		{"fail/kv key empty", ValidateKVKey, KindKVKey, "", false},
		{"fail/kv key star", ValidateKVKey, KindKVKey, "lease.*", false},
		{"fail/kv key empty token", ValidateKVKey, KindKVKey, "a..b", false},
		{"fail/kv key space", ValidateKVKey, KindKVKey, "a b", false},
		{"ok/filter", ValidateFilter, KindFilter, "cotal.t.chat.*.*.general", true},
		{"ok/filter gt last", ValidateFilter, KindFilter, "a.>", true},
		{"fail/filter gt middle", ValidateFilter, KindFilter, "a.>.b", false},
		{"fail/filter partial star", ValidateFilter, KindFilter, "a.b*", false},
		{"fail/filter empty token", ValidateFilter, KindFilter, "a..b", false},
		{"fail/filter tab", ValidateFilter, KindFilter, "a.\tb", false},
		{"fail/filter non ascii", ValidateFilter, KindFilter, "a.\u00e9", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkErr(t, tc.fn(tc.in), tc.ok, tc.kind, tc.in)
		})
	}
}

func TestNameErrorClipsValue(t *testing.T) {
	err := ValidateOwner(strings.Repeat("-", 1000))
	if err == nil || len(err.Error()) > 200 {
		t.Fatalf("error not clipped: %d bytes", len(err.Error()))
	}
}
