package audit

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func decodeLine(t *testing.T, line []byte) Record {
	t.Helper()
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("decode %q: %v", line, err)
	}
	return r
}

// replaceIn returns lines with line k (1-based) changed by edit.
func replaceIn(lines [][]byte, k int, edit func(string) string) [][]byte {
	out := slices.Clone(lines)
	out[k-1] = []byte(edit(string(lines[k-1])))
	return out
}

func TestVerifyOK(t *testing.T) {
	a := writeChain(t, "r1", 7)
	b := writeChain(t, "r2", 5)
	interleaved := [][]byte{}
	for i := range max(len(a), len(b)) {
		if i < len(a) {
			interleaved = append(interleaved, a[i])
		}
		if i < len(b) {
			interleaved = append(interleaved, b[i])
		}
	}
	tests := []struct {
		name  string
		data  []byte
		lines int
		heads map[string]uint64
	}{
		{"ok/empty-file", nil, 0, map[string]uint64{}},
		{"ok/one-replica", join(a), 7, map[string]uint64{"r1": 7}},
		{"ok/two-replicas-concatenated", append(join(b), join(a)...), 12, map[string]uint64{"r1": 7, "r2": 5}},
		{"ok/two-replicas-interleaved", join(interleaved), 12, map[string]uint64{"r1": 7, "r2": 5}},
		// Tail truncation is undetectable without an anchor; the head shows it.
		{"ok/tail-truncated-is-shorter-chain", join(a[:4]), 4, map[string]uint64{"r1": 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := Verify(bytes.NewReader(tc.data))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if sum.Lines != tc.lines {
				t.Fatalf("Lines = %d, want %d", sum.Lines, tc.lines)
			}
			got := map[string]uint64{}
			for i, h := range sum.Chains {
				got[h.Replica] = h.Seq
				if i > 0 && sum.Chains[i-1].Replica >= h.Replica {
					t.Fatalf("chains not sorted: %v", sum.Chains)
				}
			}
			if len(got) != len(tc.heads) {
				t.Fatalf("chains %v, want %v", got, tc.heads)
			}
			for r, seq := range tc.heads {
				if got[r] != seq {
					t.Fatalf("replica %s head seq %d, want %d", r, got[r], seq)
				}
			}
		})
	}
}

func TestVerifyBreaks(t *testing.T) {
	lines := writeChain(t, "r1", 8)
	other := writeChain(t, "r2", 3)
	const k = 4 // the line tampered with, 1-based
	field := func(name, from, to string) func(string) string {
		return func(s string) string {
			key := `"` + name + `":` + from
			if !strings.Contains(s, key) {
				t.Fatalf("line has no %s", key)
			}
			return strings.Replace(s, key, `"`+name+`":`+to, 1)
		}
	}
	r := decodeLine(t, lines[k-1])
	tests := []struct {
		name   string
		data   [][]byte
		line   int
		reason string
	}{
		{"fail/tampered-line/subject", replaceIn(lines, k, field("subject", `"UC`, `"UD`)), k, "hash does not match"},
		{"fail/tampered-line/decision", replaceIn(lines, k, field("decision", `"granted"`, `"denied"`)), k, "hash does not match"},
		{"fail/tampered-line/seq", replaceIn(lines, k, field("seq", "4", "9")), k, "hash does not match"},
		{"fail/tampered-line/caller", replaceIn(lines, k, field("caller", `"spiffe`, `"SPIFFE`)), k, "hash does not match"},
		{"fail/tampered-line/time", replaceIn(lines, k, field("time", `"2026-03-01`, `"2026-03-02`)), k, "hash does not match"},
		{"fail/tampered-line/hash", replaceIn(lines, k, field("hash", `"`+r.Hash[:1], `"`+string(r.Hash[0]^1))), k, ""},
		{"fail/tampered-line/prev", replaceIn(lines, k, field("prev", `"`+r.Prev[:1], `"`+string(r.Prev[0]^1))), k, ""},
		{"fail/tampered-line/whitespace", replaceIn(lines, k, func(s string) string { return strings.Replace(s, `,"rpc"`, `, "rpc"`, 1) }), k, "canonical"},
		{"fail/tampered-line/key-case", replaceIn(lines, k, func(s string) string { return strings.Replace(s, `"rpc"`, `"RPC"`, 1) }), k, "canonical"},
		{"fail/tampered-line/escaped-char", replaceIn(lines, k, func(s string) string { return strings.Replace(s, `"Mint"`, `"\u004dint"`, 1) }), k, "canonical"},
		{"fail/tampered-line/upper-hex", replaceIn(lines, k, func(s string) string { return strings.Replace(s, r.Hash, strings.ToUpper(r.Hash), 1) }), k, "hex"},
		{"fail/tampered-line/unknown-field", replaceIn(lines, k, func(s string) string { return strings.Replace(s, `{"time"`, `{"jwt":"x","time"`, 1) }), k, "unknown field"},
		{"fail/tampered-line/trailing-bytes", replaceIn(lines, k, func(s string) string { return strings.Replace(s, "}\n", "} {}\n", 1) }), k, "canonical"},
		{"fail/deleted-line", slices.Delete(slices.Clone(lines), k-1, k), k, "missing"},
		{"fail/deleted-first-line", lines[1:], 1, "starts at seq 2"},
		{"fail/reordered", func() [][]byte {
			out := slices.Clone(lines)
			out[k-1], out[k] = out[k], out[k-1]
			return out
		}(), k, "missing or out of order"},
		{"fail/duplicated-line", slices.Insert(slices.Clone(lines), k, lines[k-1]), k + 1, "duplicated"},
		{"fail/bad-json", replaceIn(lines, k, func(string) string { return "{not json\n" }), k, "invalid JSON"},
		{"fail/bad-json/truncated-object", replaceIn(lines, k, func(s string) string { return s[:len(s)/2] + "\n" }), k, ""},
		{"fail/bad-json/wrong-type", replaceIn(lines, k, field("seq", "4", `"4"`)), k, "wrong type"},
		{"fail/empty-line", slices.Insert(slices.Clone(lines), k-1, []byte("\n")), k, "empty line"},
		{"fail/unterminated-final-line", append(slices.Clone(lines[:k-1]), bytes.TrimSuffix(lines[k-1], []byte("\n"))), k, "no newline"},
		{"fail/long-line", slices.Insert(slices.Clone(lines), k-1, append(bytes.Repeat([]byte("x"), MaxLineBytes+1), '\n')), k, "longer than"},
		// A line spliced in from another replica's chain at its seq still
		// breaks: it is not that chain's first line.
		{"fail/foreign-line-spliced", slices.Insert(slices.Clone(lines), k-1, other[1]), k, "starts at seq 2"},
		// A valid replica id swapped in breaks the hash.
		{"fail/replica-renamed", replaceIn(lines, k, field("replica", `"r1"`, `"r2"`)), k, "hash does not match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := Verify(bytes.NewReader(join(tc.data)))
			be := wantBreak(t, err, tc.line)
			if !strings.Contains(be.Reason, tc.reason) {
				t.Fatalf("reason %q does not contain %q", be.Reason, tc.reason)
			}
			if sum.Lines != tc.line-1 {
				t.Fatalf("summary covers %d lines, want %d", sum.Lines, tc.line-1)
			}
		})
	}
}

// TestVerifyAnyByteFlip flips every byte of one line in several ways; each
// must be reported at that line.
func TestVerifyAnyByteFlip(t *testing.T) {
	lines := writeChain(t, "r1", 5)
	const k = 3
	for _, mask := range []byte{0x01, 0x20, 0x80} {
		for i := range lines[k-1] {
			mod := slices.Clone(lines)
			mod[k-1] = slices.Clone(lines[k-1])
			mod[k-1][i] ^= mask
			_, err := Verify(bytes.NewReader(join(mod)))
			var be *BreakError
			if !asBreak(err, &be) || be.Line != k {
				t.Fatalf("flip 0x%02x at byte %d of line %d: got %v, want break at line %d", mask, i, k, err, k)
			}
		}
	}
}

func asBreak(err error, be **BreakError) bool {
	b, ok := err.(*BreakError)
	*be = b
	return ok
}

func TestBreakErrorDoesNotEchoContent(t *testing.T) {
	lines := writeChain(t, "r1", 2)
	secret := "eyJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVQUJDIn0.c2ln"
	for _, edit := range []func(string) string{
		func(s string) string { return strings.Replace(s, `"decision":"granted"`, `"decision":"`+secret+`"`, 1) },
		func(s string) string { return strings.Replace(s, `{"time"`, `{"`+secret+`":1,"time"`, 1) },
		func(s string) string { return strings.Replace(s, `"time":"`, `"time":"`+secret, 1) },
	} {
		_, err := Verify(bytes.NewReader(join(replaceIn(lines, 2, edit))))
		wantBreak(t, err, 2)
		if strings.Contains(err.Error(), "eyJ") {
			t.Fatalf("error echoes line content: %v", err)
		}
	}
}
