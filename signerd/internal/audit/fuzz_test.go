package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzVerify feeds arbitrary file bytes to Verify: it must never panic, a
// break must point at a line that exists, and a pass must account for every
// line.
func FuzzVerify(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join("testdata", "chain.golden"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	f.Add(golden[:len(golden)-1])
	f.Add(append(bytes.Clone(golden), golden...))
	f.Add([]byte(nil))
	f.Add([]byte("\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte("null\n"))
	f.Add([]byte(`{"time":"2026-03-01T12:00:00Z","replica":"r1","seq":1}` + "\n"))
	f.Add(bytes.Repeat([]byte("x"), MaxLineBytes+2))
	f.Fuzz(func(t *testing.T, data []byte) {
		sum, err := Verify(bytes.NewReader(data))
		lines := bytes.Count(data, []byte("\n"))
		if err != nil {
			var be *BreakError
			if !errors.As(err, &be) {
				t.Fatalf("non-break error from an in-memory reader: %v", err)
			}
			if be.Line < 1 || be.Line > lines+1 || sum.Lines != be.Line-1 {
				t.Fatalf("break at line %d, summary %d lines, file has %d newlines", be.Line, sum.Lines, lines)
			}
			return
		}
		if sum.Lines != lines || (len(data) > 0 && data[len(data)-1] != '\n') {
			t.Fatalf("passed with %d lines for %d newlines", sum.Lines, lines)
		}
		var total uint64
		for _, h := range sum.Chains {
			total += h.Seq
		}
		if total != uint64(lines) {
			t.Fatalf("chains hold %d lines, file has %d", total, lines)
		}
	})
}
