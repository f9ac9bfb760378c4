package jsjson

import "testing"

// TestAppendString pins JSON.stringify's output (node -e 'console.log(JSON.stringify(s))').
func TestAppendString(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"\b\t\n\f\r", `"\b\t\n\f\r"`},
		{"\x00\x01\x1f", `"\u0000\u0001\u001f"`},
		{"<>&\x7f", "\"<>&\x7f\""},
		{"\u2028\u2029é", "\"\u2028\u2029é\""},
	} {
		if got := string(AppendString(nil, tt.in)); got != tt.want {
			t.Errorf("AppendString(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
