package instlease

import (
	"strings"
	"testing"
)

const goodRow = `{"holder":"local.mgr","instanceId":"abcdefghijklmnopqrstuvwxyz","runtime":"pty","root":"/srv/cotal","pid":42,"since":1767225600000}`

func TestDecodeRow(t *testing.T) {
	r, err := decodeRow([]byte(goodRow))
	if err != nil || r != (Row{Holder: "local.mgr", InstanceID: "abcdefghijklmnopqrstuvwxyz", Runtime: "pty", Root: "/srv/cotal", PID: 42, Since: 1767225600000}) {
		t.Fatalf("decodeRow(good) = %+v, %v", r, err)
	}
	b, err := encodeRow(r)
	if err != nil || string(b) != goodRow {
		t.Fatalf("encodeRow = %s, %v; want upstream's field order", b, err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"fail/empty", ``, "row:"},
		{"fail/not-json", `garbage`, "row:"},
		{"fail/unknown-field", strings.Replace(goodRow, `}`, `,"ready":true}`, 1), "unknown field"},
		{"fail/trailing", goodRow + `{}`, "trailing"},
		{"fail/no-holder", strings.Replace(goodRow, `"local.mgr"`, `""`, 1), "holder"},
		{"fail/no-runtime", strings.Replace(goodRow, `"pty"`, `""`, 1), "runtime"},
		{"fail/relative-root", strings.Replace(goodRow, `"/srv/cotal"`, `"srv"`, 1), "root"},
		{"fail/unclean-root", strings.Replace(goodRow, `"/srv/cotal"`, `"/srv/../etc"`, 1), "root"},
		{"fail/zero-pid", strings.Replace(goodRow, `42`, `0`, 1), "pid"},
		{"fail/string-pid", strings.Replace(goodRow, `42`, `"42"`, 1), "row:"},
		{"fail/negative-since", strings.Replace(goodRow, `1767225600000`, `-1`, 1), "since"},
		{"fail/bad-instance", strings.Replace(goodRow, `abcdefghijklmnopqrstuvwxyz`, `ABC`, 1), "instanceId"},
		{"fail/oversize", `{"holder":"` + strings.Repeat("a", maxRowBytes) + `"}`, "bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeRow([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeRow = %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeRow: a lease row read from the broker is untrusted bytes; whatever decodes is a valid
// row that encodes and decodes back to itself.
func FuzzDecodeRow(f *testing.F) {
	f.Add([]byte(goodRow))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"holder":"h","instanceId":"abcdefghijklmnopqrstuvwxyz","runtime":"r","root":"/","pid":1,"since":0} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRow(b)
		if err != nil {
			return
		}
		if len(b) > maxRowBytes {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if err := r.validate(); err != nil {
			t.Fatalf("accepted an invalid row %+v: %v", r, err)
		}
		enc, err := encodeRow(r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeRow(enc)
		if err != nil || back != r {
			t.Fatalf("round trip of %+v = %+v, %v", r, back, err)
		}
	})
}
