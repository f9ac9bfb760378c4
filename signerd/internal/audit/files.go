package audit

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SequenceError reports audit files that do not form one sequence: a gap
// between two files (a file is missing), files out of order, a file that does
// not link to the one before it, or a rotated file whose name does not match
// its first line.
type SequenceError struct {
	// File is the file at which the sequence breaks.
	File   string
	Reason string
}

func (e *SequenceError) Error() string {
	return fmt.Sprintf("audit: %s: %s", e.File, e.Reason)
}

// FilesOptions adjusts VerifyFiles.
type FilesOptions struct {
	// Partial accepts a first file that continues a chain from files not
	// given (archived elsewhere); the summary's Starts show where it picks
	// the chain up, for comparison with an anchor. Without it that is a
	// missing file.
	Partial bool
}

// fileSum is one file's Verify result.
type fileSum struct {
	path string
	sum  Summary
}

// VerifyFiles verifies paths as one sequence in the order given: each file
// on its own (as Verify; the error names the file and wraps *BreakError),
// then each chain across files. A chain that continues in a file must pick up
// exactly where the previous file holding it ended (seq and hash); a rotated
// file's name (RotatedName) must carry the seq of its first line. It returns a
// *SequenceError for a gap (lines, so a file, missing between two files),
// files out of order, a file that does not link to the previous one, a chain
// restarted at seq 1, or (unless opts.Partial) a first file that continues
// earlier files not given. The summary's Chains are the heads after the last
// file and its Starts where the first file holding each chain picks it up.
func VerifyFiles(paths []string, opts FilesOptions) (Summary, error) {
	files := make([]fileSum, 0, len(paths))
	var total Summary
	for _, p := range paths {
		sum, err := verifyPath(p)
		if err != nil {
			return total, err
		}
		if err := checkRotatedName(p, sum); err != nil {
			return total, err
		}
		files = append(files, fileSum{path: p, sum: sum})
		total.Lines += sum.Lines
		total.Bytes += sum.Bytes
	}
	// Every chain as the files so far leave it, and the file that last
	// advanced it.
	heads := map[string]Head{}
	starts := map[string]Head{}
	last := map[string]string{}
	for i, f := range files {
		for k, head := range f.sum.Chains {
			start := f.sum.Starts[k]
			r := head.Replica
			prev, seen := heads[r]
			if reason := link(files[i+1:], r, seen, prev, last[r], start); reason != "" {
				return total, &SequenceError{File: f.path, Reason: reason}
			}
			if !seen {
				if start.Seq > 0 && !opts.Partial {
					return total, &SequenceError{File: f.path, Reason: fmt.Sprintf(
						"continues replica %q's chain from seq %d, but no file before it holds that chain: the file(s) with seq 1..%d are missing",
						r, start.Seq, start.Seq)}
				}
				starts[r] = start
			}
			heads[r], last[r] = head, f.path
		}
	}
	for _, r := range slices.Sorted(maps.Keys(heads)) {
		total.Chains = append(total.Chains, heads[r])
		total.Starts = append(total.Starts, starts[r])
	}
	return total, nil
}

// link checks that a file picking replica r's chain up at start follows on
// from prev, the head left by file prevFile (seen is false when no earlier
// file held the chain). later are the files given after it, used to tell a
// reordering from a missing file. It returns "" when the file links.
func link(later []fileSum, r string, seen bool, prev Head, prevFile string, start Head) string {
	// find names the first later file holding r's chain for which match
	// holds, given that file's start and head for the chain.
	find := func(match func(start, head Head) bool) string {
		for _, f := range later {
			for k, c := range f.sum.Chains {
				if c.Replica == r && match(f.sum.Starts[k], c) {
					return f.path
				}
			}
		}
		return ""
	}
	same := func(a, b Head) bool { return a.Seq == b.Seq && a.Hash == b.Hash }
	switch {
	case !seen && start.Seq == 0:
		return ""
	case !seen:
		if f := find(func(_, h Head) bool { return same(h, start) }); f != "" {
			return fmt.Sprintf("files out of order: it continues replica %q's chain from seq %d, where %s (given after it) ends", r, start.Seq, f)
		}
		return "" // a first file continuing archived ones; the caller decides
	case start.Seq == 0:
		return fmt.Sprintf("starts replica %q's chain again at seq 1 after %s reached seq %d (files out of order, or two chains under one replica id)", r, prevFile, prev.Seq)
	case start.Seq == prev.Seq && start.Hash == prev.Hash:
		return ""
	case start.Seq == prev.Seq:
		return fmt.Sprintf("does not link to the last line of %s (replica %q, seq %d): a file was replaced or rewritten", prevFile, r, prev.Seq)
	case start.Seq > prev.Seq:
		if f := find(func(s, _ Head) bool { return same(s, prev) }); f != "" {
			return fmt.Sprintf("files out of order: %s (given after it) continues replica %q's chain from %s's end at seq %d, so it comes first", f, r, prevFile, prev.Seq)
		}
		return fmt.Sprintf("gap after %s: it ends replica %q's chain at seq %d and this file continues from seq %d, so lines %d..%d are missing (a file is missing)",
			prevFile, r, prev.Seq, start.Seq, prev.Seq+1, start.Seq)
	default:
		return fmt.Sprintf("files out of order: it continues replica %q's chain from seq %d, but %s already reached seq %d", r, start.Seq, prevFile, prev.Seq)
	}
}

// verifyPath runs Verify on the file at path; the error names the file.
func verifyPath(path string) (Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return Summary{}, fmt.Errorf("audit: %w", err)
	}
	defer func() { _ = f.Close() }()
	sum, err := Verify(f)
	if err != nil {
		return sum, fmt.Errorf("audit: %s: %w", path, err)
	}
	return sum, nil
}

// checkRotatedName refuses a rotated file (named base.<20 digits>) whose
// chain does not start at the seq its name carries: renamed files would
// otherwise sort into the wrong order unnoticed.
func checkRotatedName(path string, sum Summary) error {
	name := filepath.Base(path)
	dot := strings.LastIndexByte(name, '.')
	if dot < 0 || len(sum.Chains) != 1 {
		return nil
	}
	seq, ok := rotatedSeq(name[:dot], name)
	if !ok {
		return nil
	}
	if first := sum.Starts[0].Seq + 1; first != seq {
		return &SequenceError{File: path, Reason: fmt.Sprintf("named for seq %d but its first line is seq %d (renamed, so out of order)", seq, first)}
	}
	return nil
}
