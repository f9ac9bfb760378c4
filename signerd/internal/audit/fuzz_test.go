package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	// A rotated file's successor: a continuation line, then a decision.
	cont := Record{Time: base, Replica: "r1", Seq: 4, Caller: ContinueCaller, RPC: ContinueRPC, Decision: Granted, Reason: reasonRequest}
	line1, sum := seal(genesis("x"), &cont)
	next := Record{Time: base, Replica: "r1", Seq: 5, Caller: "c", RPC: "Mint", Decision: Granted}
	line2, _ := seal(sum, &next)
	f.Add(append(line1, line2...))
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
			// A torn line is the unterminated rest after the summary's
			// bytes, and what precedes it verifies on its own.
			if be.Torn {
				if sum.Bytes > int64(len(data)) || bytes.IndexByte(data[sum.Bytes:], '\n') >= 0 || be.Line != lines+1 {
					t.Fatalf("torn at line %d with %d of %d bytes whole", be.Line, sum.Bytes, len(data))
				}
				again, err := Verify(bytes.NewReader(data[:sum.Bytes]))
				if err != nil || again.Lines != sum.Lines {
					t.Fatalf("whole lines before a torn one do not verify: %v", err)
				}
			}
			return
		}
		if sum.Lines != lines || (len(data) > 0 && data[len(data)-1] != '\n') {
			t.Fatalf("passed with %d lines for %d newlines", sum.Lines, lines)
		}
		var total uint64
		for i, h := range sum.Chains {
			total += h.Seq - sum.Starts[i].Seq
		}
		if total != uint64(lines) {
			t.Fatalf("chains hold %d lines, file has %d", total, lines)
		}
	})
}

// FuzzRedact checks redaction by structure: a JWT or seed set in any text is
// always redacted, caller and space never are, and a value is redacted only
// when it could hold one (two dots for a JWT, 58 characters for a seed, a PEM
// armour line).
func FuzzRedact(f *testing.F) {
	f.Add("heyJude", "x", "y")
	f.Add("spiffe://cotal.local/managerd/heyJude", "eyJ", ".")
	f.Add(testJWT, "", "")
	f.Add(testSeed, "a", "b")
	f.Add("eyJhbGciOiJub25lIn0.e30.", "", "")
	f.Add(strings.Repeat("S", 70), "-----BEGIN ", "PRIVATE KEY-----")
	f.Fuzz(func(t *testing.T, s, before, after string) {
		if looksSecret(s) {
			hasShape := strings.Count(s, ".") >= 2 || len(s) >= seedChars && strings.Contains(s, "S") ||
				strings.Contains(s, "PRIVATE KEY-----")
			if !hasShape {
				t.Fatalf("%q redacted without the shape of a credential", s)
			}
		}
		for _, secret := range []string{testJWT, testSeed} {
			// Separated from the text around it by a byte outside both
			// alphabets, a credential is found wherever it sits.
			v := before + " " + secret + " " + after
			if !looksSecret(v) {
				t.Fatalf("%q not redacted", v)
			}
			// clean measures its window after invalid UTF-8 became U+FFFD (one byte, three
			// after): the credential lies in it when the text before does, so measured.
			if len(strings.ToValidUTF8(before, "\uFFFD")) < MaxFieldBytes-len(secret)-2 && clean(v) != Redacted {
				t.Fatalf("clean(%q) = %q, want %s", v, clean(v), Redacted)
			}
		}
		r := Record{Caller: s, Space: before + s + after}
		want := Record{Caller: bound(strings.ToValidUTF8(r.Caller, "\uFFFD")), Space: bound(strings.ToValidUTF8(r.Space, "\uFFFD"))}
		sanitize(&r)
		if r.Caller != want.Caller || r.Space != want.Space {
			t.Fatalf("sanitize changed caller %q or space %q beyond UTF-8 and length", r.Caller, r.Space)
		}
	})
}
