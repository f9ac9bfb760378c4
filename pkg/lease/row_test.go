package lease

import "testing"

// FuzzDecodeRow: a row read from the broker is untrusted bytes.
func FuzzDecodeRow(f *testing.F) {
	f.Add([]byte(`{"holder":"a","incarnation":"b","since":"2026-01-01T00:00:00Z","ready":true}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRow(b)
		if err == nil && (r.Holder == "" || r.Incarnation == "") {
			t.Fatalf("accepted a row without holder or incarnation: %+v", r)
		}
	})
}
