package lease

import (
	"encoding/json"
	"strings"
	"testing"
)

// fullRow is a row as authd writes it since issue 22: the holder names its instance, the user
// key of its claim connection and that connection's name.
const fullRow = `{"holder":"authd host pid 42","incarnation":"b","since":"2026-01-01T00:00:00Z","ready":true,` +
	`"instance":"i_abcdefghijklmnopqrstuvwxyz","user":"UCEHH4MFDD6UXDPV52I4RFFLYHEO4RCQW44YHHNMHUUSCXGUPAY54DOA","conn":"authd-plane"}`

// FuzzDecodeRow: a row read from the broker is untrusted bytes. Whatever decodes is bounded,
// names its holder and incarnation, and encodes and decodes back to itself.
func FuzzDecodeRow(f *testing.F) {
	f.Add([]byte(`{"holder":"a","incarnation":"b","since":"2026-01-01T00:00:00Z","ready":true}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(fullRow))
	f.Add([]byte(strings.Replace(fullRow, `"user":"UCEHH4MFDD6UXDPV52I4RFFLYHEO4RCQW44YHHNMHUUSCXGUPAY54DOA"`, `"user":7`, 1)))
	f.Add([]byte(strings.Replace(fullRow, `"conn":"authd-plane"`, `"conn":"authd-plane","more":[1,2]`, 1)))
	f.Add([]byte(fullRow[:len(fullRow)/2]))
	f.Add([]byte(`{"holder":"a","incarnation":"b","since":"2026-01-01T00:00:00+23:59","instance":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRow(b)
		if err != nil {
			return
		}
		if r.Holder == "" || r.Incarnation == "" {
			t.Fatalf("accepted a row without holder or incarnation: %+v", r)
		}
		if len(b) > maxRowBytes {
			t.Fatalf("accepted %d bytes", len(b))
		}
		enc, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("an accepted row does not encode: %+v: %v", r, err)
		}
		if len(enc) > maxRowBytes {
			// Escaping may grow a row past the bound (a string of '<' triples in size); such a
			// row was never written by a holder, so only the decode side is checked.
			return
		}
		back, err := decodeRow(enc)
		if err != nil || !back.Since.Equal(r.Since) {
			t.Fatalf("round trip of %+v = %+v, %v", r, back, err)
		}
		back.Since = r.Since
		if back != r {
			t.Fatalf("round trip of %+v = %+v", r, back)
		}
	})
}
