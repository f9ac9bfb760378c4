package audit

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Head is the end of one replica's chain: what an operator anchors outside the
// host to make later truncation or rewriting detectable.
type Head struct {
	// Replica names the chain.
	Replica string
	// Seq is the seq of the last line, which is also the chain's line count;
	// 0 for an empty chain.
	Seq uint64
	// Hash is the hex hash of the last line; GenesisHash(Replica) for an
	// empty chain.
	Hash string
	// Time is the last line's time; zero for an empty chain.
	Time time.Time
}

// Summary is what Verify found: the number of lines and the head of every
// chain, sorted by replica. When Verify fails it covers the lines before the
// broken one.
type Summary struct {
	Lines int
	// Bytes is the length of those lines, newlines included: where a torn
	// final line starts.
	Bytes  int64
	Chains []Head
	// Starts[i] is where this file picks Chains[i] up: seq 0 and the
	// genesis hash for a chain that begins here, or the last seq and hash of
	// the rotated file it continues (its first line is a continuation line,
	// see ContinueRPC). A multi-file check (VerifyFiles) links the files
	// through these.
	Starts []Head
}

// BreakError reports the first line (1-based) at which a file stops being a
// valid set of audit chains, and why. For a deleted or reordered line, Line
// is where the gap or swap is seen: the first line of that chain after it.
type BreakError struct {
	Line   int
	Reason string
	// Torn is set when the only fault is a final line without a newline: a
	// write that never completed, so never acknowledged (see Repair).
	Torn bool
}

func (e *BreakError) Error() string {
	return fmt.Sprintf("audit: chain broken at line %d: %s", e.Line, e.Reason)
}

// Verify reads an audit file and checks every line's form and hash and every
// replica's seq and prev links. It returns a *BreakError for the first broken
// line and a wrapped read error if r fails. A file may hold one replica's
// chain or several interleaved; each chain must start at seq 1 from its
// genesis hash, or with a continuation line (the file follows a rotated one;
// Summary.Starts says from where, VerifyFiles checks the link). Truncation of a chain's tail is not detectable here (see the
// package doc); compare the returned heads with an external anchor.
func Verify(r io.Reader) (Summary, error) {
	br := bufio.NewReaderSize(r, MaxLineBytes+1)
	chains := map[string]*chain{}
	var sum Summary
	summary := func() Summary {
		names := slices.Sorted(maps.Keys(chains))
		sum.Chains, sum.Starts = sum.Chains[:0], sum.Starts[:0]
		for _, name := range names {
			sum.Chains = append(sum.Chains, chains[name].head)
			sum.Starts = append(sum.Starts, chains[name].start)
		}
		return sum
	}
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			line = line[:len(line)-1]
		case errors.Is(err, bufio.ErrBufferFull):
			return summary(), &BreakError{Line: n, Reason: fmt.Sprintf("line longer than %d bytes", MaxLineBytes)}
		case errors.Is(err, io.EOF):
			if len(line) == 0 {
				return summary(), nil
			}
			return summary(), &BreakError{Line: n, Reason: "final line has no newline (torn write or truncated file)", Torn: true}
		default:
			return summary(), fmt.Errorf("audit: read line %d: %w", n, err)
		}
		if reason := checkLine(line, chains); reason != "" {
			return summary(), &BreakError{Line: n, Reason: reason}
		}
		sum.Lines = n
		sum.Bytes += int64(len(line)) + 1
	}
}

// chain is one replica's chain as Verify has read it so far.
type chain struct {
	start, head Head
}

// checkLine verifies one line against the chains seen so far and advances
// its chain. It returns "" when the line is good, else why it is not.
func checkLine(line []byte, chains map[string]*chain) string {
	if len(line) == 0 {
		return "empty line"
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return "not a record: " + decodeReason(err)
	}
	// Equality with the canonical encoding rejects everything JSON would let
	// through unchanged in meaning: whitespace, key order or case, escapes,
	// duplicate keys, trailing bytes.
	if !bytes.Equal(encode(nil, &r), line) {
		return "not in canonical form (line altered)"
	}
	if checkReplica(r.Replica) != nil {
		return "replica is not a valid replica id"
	}
	if !r.Decision.Valid() {
		return "decision is neither granted nor denied"
	}
	prev, ok := decodeHash(r.Prev)
	if !ok {
		return "prev is not 64 lower-case hex digits"
	}
	if _, ok := decodeHash(r.Hash); !ok {
		return "hash is not 64 lower-case hex digits"
	}
	want := r.Hash
	r.Hash = ""
	got := chainHash(prev, encode(nil, &r))
	if hex.EncodeToString(got[:]) != want {
		return "hash does not match the line's content (line altered)"
	}
	continues := isContinuation(&r)
	c := chains[r.Replica]
	if c == nil {
		switch {
		case r.Seq == 0:
			return fmt.Sprintf("replica %q's chain starts at seq 0, want 1", r.Replica)
		case r.Seq > 1 && !continues:
			return fmt.Sprintf("replica %q's chain starts at seq %d, want 1 (lines missing before it)", r.Replica, r.Seq)
		case r.Seq == 1 && continues:
			return fmt.Sprintf("replica %q: a continuation line at seq 1 continues nothing", r.Replica)
		case r.Seq == 1 && r.Prev != GenesisHash(r.Replica):
			return fmt.Sprintf("replica %q's first line does not link to its genesis hash", r.Replica)
		}
		// A continuation line's prev and seq-1 are the rotated file's last
		// line; VerifyFiles checks them against that file.
		c = &chain{start: Head{Replica: r.Replica, Seq: r.Seq - 1, Hash: r.Prev}, head: Head{Replica: r.Replica}}
		chains[r.Replica] = c
	} else {
		h := &c.head
		switch {
		case continues:
			return fmt.Sprintf("replica %q: continuation line at seq %d is not the first line of its chain in this file", r.Replica, r.Seq)
		case r.Seq == 0 || r.Seq <= h.Seq:
			return fmt.Sprintf("replica %q: seq %d after seq %d (line duplicated or out of order)", r.Replica, r.Seq, h.Seq)
		case r.Seq != h.Seq+1:
			return fmt.Sprintf("replica %q: seq %d after seq %d (line missing or out of order)", r.Replica, r.Seq, h.Seq)
		case r.Prev != h.Hash:
			return fmt.Sprintf("replica %q: prev does not link to seq %d (line replaced)", r.Replica, h.Seq)
		}
	}
	c.head.Seq, c.head.Hash, c.head.Time = r.Seq, want, r.Time
	return ""
}

// decodeReason describes a decoding failure without echoing the line's
// content: a tampered file could hold anything, a credential included.
func decodeReason(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("invalid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s has the wrong type", typ.Field)
	case strings.Contains(err.Error(), "unknown field"):
		return "unknown field"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "truncated JSON"
	default:
		return "invalid value"
	}
}

// decodeHash parses a lower-case hex SHA-256; upper case is refused so each
// hash has one spelling.
func decodeHash(s string) ([32]byte, bool) {
	var out [32]byte
	if len(s) != 2*len(out) || strings.ToLower(s) != s {
		return out, false
	}
	if _, err := hex.Decode(out[:], []byte(s)); err != nil {
		return out, false
	}
	return out, true
}
