package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rotatedSet appends sizes[i] lines to file i of a fresh log, rotating after
// each file but the last, and returns the rotated files and the current
// file, oldest first. clock picks the log's clock (nil: stepClock).
func rotatedSet(t *testing.T, clock func() time.Time, sizes ...int) []string {
	t.Helper()
	path := logPath(t)
	if clock == nil {
		clock = stepClock()
	}
	l := openLog(t, Config{Path: path, Now: clock}, noSync)
	n := 0
	for i, size := range sizes {
		for range size {
			if err := l.Append(context.Background(), sample(n)); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if i < len(sizes)-1 {
			if err := l.Rotate(context.Background()); err != nil {
				t.Fatalf("Rotate: %v", err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rotated, err := Rotated(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rotated) != len(sizes)-1 {
		t.Fatalf("rotated files %v, want %d", rotated, len(sizes)-1)
	}
	return append(rotated, path)
}

// TestRotateOnRequest (issue 7 deliverable 5): Rotate renames the current
// file to its first seq and starts a new one whose continuation line links
// to the old file's last line.
func TestRotateOnRequest(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path}, noSync)
	if err := l.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, _ := Rotated(path); len(r) != 0 {
		t.Fatalf("an empty file was rotated: %v", r)
	}
	for i := range 3 {
		if err := l.Append(context.Background(), sample(i)); err != nil {
			t.Fatal(err)
		}
	}
	old := l.Head()
	if err := l.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Nothing new since: a second request does not make an empty file.
	if err := l.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(context.Background(), sample(3)); err != nil {
		t.Fatal(err)
	}
	rotated, err := Rotated(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{path + ".00000000000000000001"}; !slices.Equal(rotated, want) {
		t.Fatalf("rotated files %v, want %v", rotated, want)
	}
	wantPrivate(t, rotated[0], join(readLines(t, rotated[0])))
	if got := seqs(t, readLines(t, rotated[0])); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("rotated file seqs %v, want 1..3", got)
	}
	cur := readLines(t, path)
	first := decodeLine(t, cur[0])
	if first.RPC != ContinueRPC || first.Caller != ContinueCaller || first.Reason != reasonRequest ||
		first.Seq != old.Seq+1 || first.Prev != old.Hash {
		t.Fatalf("first line of the new file %+v does not continue %+v", first, old)
	}
	if got := seqs(t, cur); !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("current file seqs %v, want 4, 5", got)
	}
	sum, err := VerifyFiles(append(rotated, path), FilesOptions{})
	if err != nil {
		t.Fatalf("VerifyFiles: %v", err)
	}
	if sum.Lines != 5 || sum.Chains[0] != l.Head() || sum.Starts[0].Seq != 0 {
		t.Fatalf("summary %+v, want 5 lines from genesis to the log's head", sum)
	}
	// Alone, the current file verifies and says what it continues.
	alone, err := Verify(bytes.NewReader(join(cur)))
	if err != nil || alone.Starts[0] != (Head{Replica: "r1", Seq: old.Seq, Hash: old.Hash}) {
		t.Fatalf("current file alone: %+v, %v; want it to start after %+v", alone, err, old)
	}
}

// TestRotateBySize: a line that would take the file past MaxBytes goes to a
// new file; every file stays within the limit and the set verifies, also
// after reopening.
func TestRotateBySize(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path, MaxBytes: MinMaxBytes}, noSync)
	const n = 400
	for i := range n {
		if err := l.Append(context.Background(), sample(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, Config{Path: path, MaxBytes: MinMaxBytes}, noSync)
	for i := range n {
		if err := l.Append(context.Background(), sample(n+i)); err != nil {
			t.Fatal(err)
		}
	}
	head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rotated, err := Rotated(path)
	if err != nil {
		t.Fatal(err)
	}
	files := append(rotated, path)
	if len(files) < 4 {
		t.Fatalf("%d files for %d lines of ~%d bytes at %d bytes a file", len(files), 2*n, len(readLines(t, path)[0]), MinMaxBytes)
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > MinMaxBytes || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %d bytes, mode %v; want at most %d, 0600", f, fi.Size(), fi.Mode().Perm(), MinMaxBytes)
		}
	}
	sum, err := VerifyFiles(files, FilesOptions{})
	if err != nil {
		t.Fatalf("VerifyFiles: %v", err)
	}
	if sum.Chains[0] != head || sum.Lines != int(head.Seq) || head.Seq != uint64(2*n+len(rotated)) {
		t.Fatalf("summary %+v, head %+v: want %d decisions and %d continuation lines", sum, head, 2*n, len(rotated))
	}
}

// TestRotationResumes: a crash between the rename and the new file's first
// line leaves no (or an empty) current file; New continues the chain from the
// newest rotated file instead of starting it again at genesis.
func TestRotationResumes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(t *testing.T, path string)
	}{
		{"ok/no-current-file", func(*testing.T, string) {}},
		{"ok/torn-continuation-line", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(`{"time":"2026`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := rotatedSet(t, nil, 3, 2)
			path := files[1]
			if err := os.Rename(path, RotatedName(path, 4)); err != nil {
				t.Fatal(err)
			}
			tc.after(t, path)
			l := openLog(t, Config{Path: path}, noSync)
			if h := l.Head(); h.Seq != 6 {
				t.Fatalf("head %+v, want seq 6 (the newest rotated file's last line)", h)
			}
			if err := l.Append(context.Background(), sample(9)); err != nil {
				t.Fatal(err)
			}
			if first := decodeLine(t, readLines(t, path)[0]); first.RPC != ContinueRPC || first.Reason != reasonResumed || first.Seq != 7 {
				t.Fatalf("first line %+v, want a continuation at seq 7", first)
			}
			rotated, _ := Rotated(path)
			if _, err := VerifyFiles(append(rotated, path), FilesOptions{}); err != nil {
				t.Fatalf("VerifyFiles: %v", err)
			}
		})
	}
}

// TestRotationNeverOverwrites: a file already at the rotated name is kept and
// the log breaks (fail closed) rather than replace it.
func TestRotationNeverOverwrites(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path}, noSync)
	if err := l.Append(context.Background(), sample(0)); err != nil {
		t.Fatal(err)
	}
	squatter := RotatedName(path, 1)
	if err := os.WriteFile(squatter, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Rotate(context.Background()); !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), squatter) {
		t.Fatalf("Rotate onto an existing file = %v, want ErrBroken naming %s", err, squatter)
	}
	select {
	case <-l.Failed():
	default:
		t.Fatal("Failed not closed after a failed rotation")
	}
	wantPrivate(t, squatter, []byte("keep me\n"))
}

// TestVerifyFiles (issue 7 deliverable 5): the files of a rotated chain, in
// order, verify as one; a gap, a reordering, a missing file, a replaced file
// and a renamed file are each named.
func TestVerifyFiles(t *testing.T) {
	f := rotatedSet(t, nil, 3, 4, 4, 4) // seqs 1-3 | 4-8 | 9-13 | 14-18
	other := rotatedSet(t, func() func() time.Time {
		c := stepClock()
		return func() time.Time { return c().Add(time.Hour) }
	}(), 3, 4, 4, 4) // the same seqs, other hashes
	renamed := filepath.Join(filepath.Dir(f[0]), filepath.Base(RotatedName(f[3], 99)))
	copyFile(t, f[1], renamed)
	tampered := filepath.Join(t.TempDir(), "tampered")
	lines := readLines(t, f[2])
	if err := os.WriteFile(tampered, join(replaceIn(lines, 2, func(s string) string { return strings.Replace(s, "agent", "admin", 1) })), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   []string
		partial bool
		at      string   // the file named, "" for success
		want    []string // in the reason
	}{
		{"ok/in-order", f, false, "", nil},
		{"ok/partial-accepts-archived-start", f[1:], true, "", nil},
		{"fail/missing-middle-file", []string{f[0], f[2], f[3]}, false, f[2], []string{"gap after " + f[0], "lines 4..8 are missing", "file is missing"}},
		{"fail/missing-first-file", f[1:], false, f[1], []string{"seq 1..3 are missing"}},
		{"fail/reordered", []string{f[0], f[2], f[1], f[3]}, false, f[2], []string{"out of order", f[1]}},
		{"fail/reordered-first", []string{f[1], f[0], f[2], f[3]}, false, f[1], []string{"out of order", f[0]}},
		{"fail/given-twice", []string{f[0], f[1], f[1], f[2], f[3]}, false, f[1], []string{"out of order", "already reached seq 8"}},
		{"fail/restarted-chain", []string{f[0], f[1], other[0]}, false, other[0], []string{"again at seq 1"}},
		{"fail/replaced-file", []string{f[0], other[1], f[2]}, false, other[1], []string{"does not link", f[0]}},
		{"fail/renamed-file", []string{f[0], renamed}, false, renamed, []string{"named for seq 99", "first line is seq 4"}},
		{"fail/tampered-line", []string{f[0], f[1], tampered}, false, tampered, []string{"line 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := VerifyFiles(tc.files, FilesOptions{Partial: tc.partial})
			if tc.at == "" {
				if err != nil {
					t.Fatalf("VerifyFiles: %v", err)
				}
				if sum.Chains[0].Seq != 18 || sum.Starts[0].Seq != uint64(18-sum.Lines) {
					t.Fatalf("summary %+v: want head seq 18 and a start matching the lines given", sum)
				}
				return
			}
			if err == nil {
				t.Fatal("VerifyFiles accepted the files")
			}
			var se *SequenceError
			var be *BreakError
			switch {
			case errors.As(err, &se) && se.File != tc.at:
				t.Fatalf("error at %s, want %s: %v", se.File, tc.at, err)
			case se == nil && !errors.As(err, &be):
				t.Fatalf("error %v is neither a SequenceError nor a BreakError", err)
			}
			for _, w := range append(tc.want, tc.at) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRotateUnderLoad (issue 26): with appends in flight from many goroutines, rotations by size
// and on request, every fsync is of the file still at the path (never of one renamed away), a
// file's fsyncs end before the next file's begin, the last fsync of each file covered all of its
// bytes (a rotated file's lines were made durable before the rename), and the files verify as
// one chain holding every line.
func TestRotateUnderLoad(t *testing.T) {
	path := logPath(t)
	type syncRec struct {
		ino       uint64
		size      int64
		atPathIno uint64
	}
	var mu sync.Mutex
	var recs []syncRec
	syncFn := func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		var atPath uint64 // 0: no file at the path (mid-rotation)
		if at, err := os.Stat(path); err == nil {
			atPath = ino(at)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		mu.Lock()
		recs = append(recs, syncRec{ino(fi), fi.Size(), atPath})
		mu.Unlock()
		return nil
	}
	l := openLog(t, Config{Path: path, MaxBytes: MinMaxBytes}, syncFn)
	const workers, each = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers*each+3)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				errs <- l.Append(context.Background(), sample(w*each+i))
			}
		})
	}
	for range 3 {
		errs <- l.Rotate(context.Background())
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rotated, err := Rotated(path)
	if err != nil {
		t.Fatal(err)
	}
	files := append(rotated, path)
	if len(files) < 3 {
		t.Fatalf("%d files, want at least 3 (rotations by size and on request)", len(files))
	}
	sum, err := VerifyFiles(files, FilesOptions{})
	if err != nil {
		t.Fatalf("VerifyFiles: %v", err)
	}
	decisions := 0
	for _, f := range files {
		for _, ln := range readLines(t, f) {
			if decodeLine(t, ln).RPC != ContinueRPC {
				decisions++
			}
		}
	}
	if decisions != workers*each || sum.Chains[0].Seq != uint64(sum.Lines) {
		t.Fatalf("%d decisions in %d lines ending at seq %d, want %d decisions on one chain", decisions, sum.Lines, sum.Chains[0].Seq, workers*each)
	}
	mu.Lock()
	defer mu.Unlock()
	order := map[uint64]int{} // inode -> position in files
	for i, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		order[ino(fi)] = i
		var last *syncRec
		for k := range recs {
			if recs[k].ino == ino(fi) {
				last = &recs[k]
			}
		}
		if last == nil || last.size != fi.Size() {
			t.Fatalf("%s (%d bytes): last fsync %+v, want one that covered every byte", f, fi.Size(), last)
		}
	}
	pos := 0
	for _, r := range recs {
		if r.ino != r.atPathIno {
			t.Fatalf("an fsync of inode %d while inode %d was at the path: a file renamed away", r.ino, r.atPathIno)
		}
		p, ok := order[r.ino]
		if !ok || p < pos {
			t.Fatalf("fsync of inode %d (file %d) after file %d's: fsyncs went back to an earlier file", r.ino, p, pos)
		}
		pos = p
	}
}

func ino(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }
