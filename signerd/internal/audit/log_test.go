package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestAppendAndVerify(t *testing.T) {
	const workers, each = 16, 25
	path := logPath(t)
	var batches, lines atomic.Int64
	l := openLog(t, Config{Path: path, OnBatch: func(n int) { batches.Add(1); lines.Add(int64(n)) }}, (*os.File).Sync)
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				errs <- l.Append(context.Background(), sample(w*each+i))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("append: %v", err)
		}
	}
	head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sum, err := Verify(f)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	const n = workers * each
	if sum.Lines != n || len(sum.Chains) != 1 || sum.Chains[0] != head || head.Seq != n {
		t.Fatalf("summary %+v, head %+v: want %d lines on one chain ending at the log's head", sum, head, n)
	}
	got := seqs(t, readLines(t, path))
	for i, s := range got {
		if s != uint64(i+1) {
			t.Fatalf("line %d has seq %d: seq is not contiguous in file order", i+1, s)
		}
	}
	if lines.Load() != n || batches.Load() < 1 || batches.Load() > n {
		t.Fatalf("OnBatch saw %d lines in %d batches, want %d lines", lines.Load(), batches.Load(), n)
	}
	t.Logf("%d lines in %d fsyncs", n, batches.Load())
}

// gatedSync is an fsync hook whose calls block until released, one gate per
// call, and may fail chosen calls.
type gatedSync struct {
	calls   atomic.Int32
	entered chan int        // receives each call's number as it starts
	gates   []chan struct{} // call i waits on gates[i-1] if present
	opened  []sync.Once
	fail    map[int]error
	synced  atomic.Int32    // number of the last call that returned
	ended   <-chan struct{} // the test's end: every gate opens, so a failed test's Close does not hang
}

func newGatedSync(t *testing.T, gates int, fail map[int]error) *gatedSync {
	g := &gatedSync{entered: make(chan int, 64), fail: fail, opened: make([]sync.Once, gates), ended: t.Context().Done()}
	for range gates {
		g.gates = append(g.gates, make(chan struct{}))
	}
	return g
}

// release lets fsync call n run.
func (g *gatedSync) release(n int) { g.opened[n-1].Do(func() { close(g.gates[n-1]) }) }

func (g *gatedSync) sync(f *os.File) error {
	n := int(g.calls.Add(1))
	g.entered <- n
	if n <= len(g.gates) {
		select {
		case <-g.gates[n-1]:
		case <-g.ended:
		}
	}
	defer g.synced.Store(int32(n))
	if err := g.fail[n]; err != nil {
		return err
	}
	return f.Sync()
}

func (g *gatedSync) waitEntered(t *testing.T, want int) {
	t.Helper()
	select {
	case n := <-g.entered:
		if n != want {
			t.Fatalf("fsync call %d started, want %d", n, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("fsync call %d never started", want)
	}
}

// appendResult is what an Append returned and the last fsync call that had completed when it did.
type appendResult struct {
	err        error
	syncedCall int32
}

// appendAsync runs Append(sample(i)) and sends its result.
func appendAsync(l *Log, g *gatedSync, i int, out chan<- appendResult) {
	go func() {
		err := l.Append(context.Background(), sample(i))
		out <- appendResult{err, g.synced.Load()}
	}()
}

// notYet fails t if ch already holds a result.
func notYet(t *testing.T, ch <-chan appendResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned (%v) before the fsync that covers it", what, r.err)
	default:
	}
}

// writeTap is an IO.Write hook that writes through and reports the seqs each write carried.
type writeTap struct {
	writes chan []uint64
	fail   map[int]error // write call n fails (nothing written) with fail[n]
	calls  atomic.Int32
}

func newWriteTap(fail map[int]error) *writeTap {
	return &writeTap{writes: make(chan []uint64, 1024), fail: fail}
}

func (w *writeTap) write(f *os.File, b []byte) (int, error) {
	n := int(w.calls.Add(1))
	if err := w.fail[n]; err != nil {
		return 0, err
	}
	var got []uint64
	for _, ln := range bytes.SplitAfter(b, []byte("\n")) {
		if len(ln) == 0 {
			continue
		}
		var r struct{ Seq uint64 }
		if err := json.Unmarshal(ln, &r); err != nil {
			return 0, err
		}
		got = append(got, r.Seq)
	}
	k, err := f.Write(b)
	w.writes <- got
	return k, err
}

func TestAppendReturnsOnlyAfterFsync(t *testing.T) {
	path := logPath(t)
	g := newGatedSync(t, 1, nil)
	l := openLog(t, Config{Path: path}, g.sync)
	type result struct {
		err        error
		syncedCall int32
	}
	res := make(chan result, 1)
	go func() {
		err := l.Append(context.Background(), sample(0))
		res <- result{err, g.synced.Load()}
	}()
	g.waitEntered(t, 1)
	// The line was written before the fsync started ...
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"seq":1,`)) {
		t.Fatalf("line not written before fsync: %q", data)
	}
	// ... but Append has not returned and the head is not advanced.
	select {
	case r := <-res:
		t.Fatalf("Append returned (%v) while its fsync was still running", r.err)
	default:
	}
	if h := l.Head(); h.Seq != 0 {
		t.Fatalf("head seq %d before fsync, want 0", h.Seq)
	}
	g.release(1)
	r := recv(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.syncedCall != 1 {
		t.Fatalf("Append returned before fsync call 1 completed (last completed: %d)", r.syncedCall)
	}
	if h := l.Head(); h.Seq != 1 || h.Hash != decodeLine(t, readLines(t, path)[0]).Hash {
		t.Fatalf("head %+v after fsync, want seq 1 with the line's hash", h)
	}
}

// TestAppendWrittenReturnsBeforeFsync: AppendWritten returns once its line is in the file, with
// no fsync yet and the head not advanced; the next durable Append's fsync covers both lines (one
// fsync, not two), and that Append waits for it.
func TestAppendWrittenReturnsBeforeFsync(t *testing.T) {
	path := logPath(t)
	g := newGatedSync(t, 1, nil)
	l := openLog(t, Config{Path: path, WrittenSyncDelay: time.Hour}, g.sync)
	if err := l.AppendWritten(context.Background(), sample(0)); err != nil {
		t.Fatalf("AppendWritten: %v", err)
	}
	if n := g.calls.Load(); n != 0 {
		t.Fatalf("%d fsyncs started for a line that only had to be written", n)
	}
	if data, err := os.ReadFile(path); err != nil || !bytes.Contains(data, []byte(`"seq":1,`)) {
		t.Fatalf("line not in the file when AppendWritten returned: %q, %v", data, err)
	}
	if h := l.Head(); h.Seq != 0 {
		t.Fatalf("head seq %d before any fsync, want 0", h.Seq)
	}

	durable := make(chan error, 1)
	go func() { durable <- l.Append(context.Background(), sample(1)) }()
	g.waitEntered(t, 1)
	select {
	case err := <-durable:
		t.Fatalf("Append returned (%v) while its fsync was still running", err)
	default:
	}
	g.release(1)
	if err := recv(t, durable); err != nil {
		t.Fatal(err)
	}
	if h := l.Head(); h.Seq != 2 {
		t.Fatalf("head seq %d after the durable line's fsync, want 2 (it covers the written line)", h.Seq)
	}
	if n := g.calls.Load(); n != 1 {
		t.Fatalf("%d fsyncs for one written and one durable line, want 1", n)
	}
}

// TestAppendWrittenSyncedAlone: a written line that no durable line follows is fsynced by the
// writer after WrittenSyncDelay, before a rotation renames its file, and at Close.
func TestAppendWrittenSyncedAlone(t *testing.T) {
	t.Run("ok/after-the-delay", func(t *testing.T) {
		g := newGatedSync(t, 0, nil)
		l := openLog(t, Config{Path: logPath(t), WrittenSyncDelay: time.Millisecond}, g.sync)
		if err := l.AppendWritten(context.Background(), sample(0)); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the written line to become durable", func() bool { return l.Head().Seq == 1 })
		if n := g.calls.Load(); n != 1 {
			t.Fatalf("%d fsyncs, want 1", n)
		}
	})
	t.Run("ok/before-a-rotation", func(t *testing.T) {
		path := logPath(t)
		var inodes []uint64
		sync := func(f *os.File) error {
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			inodes = append(inodes, fi.Sys().(*syscall.Stat_t).Ino) // fsyncs never overlap, and l.mu orders them
			return f.Sync()
		}
		l := openLog(t, Config{Path: path, WrittenSyncDelay: time.Hour}, sync)
		before, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.AppendWritten(context.Background(), sample(0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Rotate(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(inodes) == 0 || inodes[0] != before.Sys().(*syscall.Stat_t).Ino {
			t.Fatalf("fsynced inodes %v: the first is not the rotated file's %d", inodes, before.Sys().(*syscall.Stat_t).Ino)
		}
	})
	t.Run("ok/at-close", func(t *testing.T) {
		g := newGatedSync(t, 0, nil)
		l := openLog(t, Config{Path: logPath(t), WrittenSyncDelay: time.Hour}, g.sync)
		if err := l.AppendWritten(context.Background(), sample(0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if n := g.calls.Load(); n != 1 {
			t.Fatalf("%d fsyncs at Close for a written line, want 1", n)
		}
		if h := l.Head(); h.Seq != 1 {
			t.Fatalf("head seq %d after Close, want 1", h.Seq)
		}
	})
}

// TestAppendWrittenThenFailedSync: a failed fsync after an AppendWritten line was answered fails
// the durable waiter whose fsync it was, breaks the log and does not block on the answered waiter.
func TestAppendWrittenThenFailedSync(t *testing.T) {
	path := logPath(t)
	diskErr := errors.New("injected: EIO")
	g := newGatedSync(t, 1, map[int]error{1: diskErr})
	l := openLog(t, Config{Path: path, WrittenSyncDelay: time.Hour}, g.sync)
	if err := l.AppendWritten(context.Background(), sample(0)); err != nil {
		t.Fatalf("AppendWritten: %v", err)
	}
	durable := make(chan error, 1)
	go func() { durable <- l.Append(context.Background(), sample(1)) }()
	g.waitEntered(t, 1)
	g.release(1)
	if err := recv(t, durable); !errors.Is(err, ErrBroken) || !errors.Is(err, diskErr) {
		t.Fatalf("durable append behind a failed fsync: %v, want ErrBroken wrapping it", err)
	}
	if err := l.AppendWritten(context.Background(), sample(2)); !errors.Is(err, ErrBroken) {
		t.Fatalf("AppendWritten after the failure: %v, want ErrBroken", err)
	}
	if err := l.Close(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Close = %v, want ErrBroken", err)
	}
}

// TestGroupCommit: lines appended while an fsync runs are written at once (in writes of at most
// MaxBatch lines), not held behind it, and the next fsync covers all of them: one fsync for
// everything written since the running one began.
func TestGroupCommit(t *testing.T) {
	tests := []struct {
		name     string
		maxBatch int
		queued   int
	}{
		{"ok/lines-written-during-an-fsync-share-the-next", 0, 10},
		{"ok/max-batch-caps-a-write-not-an-fsync", 4, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := logPath(t)
			g := newGatedSync(t, 1, nil)
			w := newWriteTap(nil)
			var mu sync.Mutex
			var sizes []int
			l := openLog(t, Config{Path: path, MaxBatch: tc.maxBatch, IO: IO{Write: w.write}, OnBatch: func(n int) {
				mu.Lock()
				sizes = append(sizes, n)
				mu.Unlock()
			}}, g.sync)
			res := make(chan appendResult, tc.queued+1)
			appendAsync(l, g, 0, res)
			g.waitEntered(t, 1)
			for i := range tc.queued {
				appendAsync(l, g, i+1, res)
			}
			// Every line is written while fsync 1 is still blocked.
			eventually(t, "the lines to be written behind the blocked fsync", func() bool { return unsynced(l) == tc.queued })
			if n := g.synced.Load(); n != 0 {
				t.Fatalf("fsync call %d completed while gated", n)
			}
			g.release(1)
			for range tc.queued + 1 {
				if r := recv(t, res); r.err != nil {
					t.Fatal(r.err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			close(w.writes)
			var written []uint64
			limit := cmpOr(tc.maxBatch, defaultMaxBatch)
			for seqs := range w.writes {
				if len(seqs) == 0 || len(seqs) > limit {
					t.Fatalf("a write of %d lines, want 1 to %d", len(seqs), limit)
				}
				written = append(written, seqs...)
			}
			if want := seqRange(1, tc.queued+1); !slices.Equal(written, want) {
				t.Fatalf("written seqs %v, want %v in order", written, want)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []int{1, tc.queued}; !slices.Equal(sizes, want) {
				t.Fatalf("fsync batch sizes %v, want %v", sizes, want)
			}
			if got := g.calls.Load(); got != 2 {
				t.Fatalf("%d fsyncs, want 2", got)
			}
			if _, err := Verify(bytes.NewReader(join(readLines(t, path)))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWriteOverlapsFsync (issue 26): with fsync 1 blocked, a new Append's line is written (the
// write hook sees it) before fsync 1 ends; that Append is not answered by fsync 1, which began
// before its write, but only when fsync 2 (blocked too) completes.
func TestWriteOverlapsFsync(t *testing.T) {
	path := logPath(t)
	g := newGatedSync(t, 2, nil)
	w := newWriteTap(nil)
	l := openLog(t, Config{Path: path, IO: IO{Write: w.write}}, g.sync)
	first, second := make(chan appendResult, 1), make(chan appendResult, 1)
	appendAsync(l, g, 0, first)
	if got := recv(t, w.writes); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("first write carried seqs %v, want [1]", got)
	}
	g.waitEntered(t, 1)

	appendAsync(l, g, 1, second)
	if got := recv(t, w.writes); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("second write carried seqs %v, want [2]", got)
	}
	if n := g.synced.Load(); n != 0 {
		t.Fatalf("fsync call %d completed before the second write was seen; want it still blocked", n)
	}
	if data, err := os.ReadFile(path); err != nil || !bytes.Contains(data, []byte(`"seq":2,`)) {
		t.Fatalf("seq 2 not in the file while fsync 1 is blocked: %v", err)
	}
	notYet(t, first, "the first Append")
	notYet(t, second, "the second Append")
	if h := l.Head(); h.Seq != 0 {
		t.Fatalf("head seq %d with no fsync completed, want 0", h.Seq)
	}

	g.release(1)
	if r := recv(t, first); r.err != nil || r.syncedCall != 1 {
		t.Fatalf("first Append = %v after fsync call %d, want nil after call 1", r.err, r.syncedCall)
	}
	g.waitEntered(t, 2)
	notYet(t, second, "the second Append (written during fsync 1)")
	if h := l.Head(); h.Seq != 1 {
		t.Fatalf("head seq %d after fsync 1, want 1: fsync 1 began before seq 2 was written", h.Seq)
	}
	g.release(2)
	if r := recv(t, second); r.err != nil || r.syncedCall != 2 {
		t.Fatalf("second Append = %v after fsync call %d, want nil after call 2", r.err, r.syncedCall)
	}
	if h := l.Head(); h.Seq != 2 {
		t.Fatalf("head seq %d after fsync 2, want 2", h.Seq)
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// seqRange is from, from+1, ..., to.
func seqRange(from, to int) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, uint64(s))
	}
	return out
}

func TestMaxDelayGathersABatch(t *testing.T) {
	path := logPath(t)
	var mu sync.Mutex
	var sizes []int
	l := openLog(t, Config{Path: path, MaxBatch: 5, MaxDelay: time.Minute, OnBatch: func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}}, noSync)
	// With a long delay the writer holds the first line until the batch is
	// full, so all five go out together.
	errs := make(chan error, 5)
	for i := range 5 {
		go func() { errs <- l.Append(context.Background(), sample(i)) }()
	}
	for range 5 {
		if err := recv(t, errs); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int{5}) {
		t.Fatalf("batch sizes %v, want [5]", sizes)
	}
}

// TestFailedSyncPoisonsLog: a failed fsync fails exactly the waiters whose lines it covered and
// every line after them (written during it, or appended later), none before it.
func TestFailedSyncPoisonsLog(t *testing.T) {
	path := logPath(t)
	diskErr := errors.New("injected: EIO")
	// Call 1 (line 1) succeeds once released; call 2 (lines 2-6, written
	// during call 1) fails once released.
	g := newGatedSync(t, 2, map[int]error{2: diskErr})
	var mu sync.Mutex
	var sizes []int
	l := openLog(t, Config{Path: path, OnBatch: func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}}, g.sync)

	before := make(chan appendResult, 1)
	appendAsync(l, g, 0, before)
	g.waitEntered(t, 1)
	covered := make(chan appendResult, 5)
	for i := range 5 {
		appendAsync(l, g, i+1, covered)
	}
	eventually(t, "lines 2-6 to be written during fsync 1", func() bool { return unsynced(l) == 5 })
	g.release(1)
	if r := recv(t, before); r.err != nil {
		t.Fatalf("the line before the failing fsync: %v", r.err)
	}
	g.waitEntered(t, 2)
	// Lines written while the failing fsync runs fail too: their prev is a
	// line that never became durable.
	after := make(chan appendResult, 3)
	for i := range 3 {
		appendAsync(l, g, i+6, after)
	}
	eventually(t, "lines 7-9 to be written during fsync 2", func() bool { return unsynced(l) == 3 })
	g.release(2)
	for name, ch := range map[string]chan appendResult{"covered": covered, "after": after} {
		for range cap(ch) {
			if r := recv(t, ch); !errors.Is(r.err, ErrBroken) || !errors.Is(r.err, diskErr) {
				t.Fatalf("%s waiter got %v, want ErrBroken wrapping the sync error", name, r.err)
			}
		}
	}
	select {
	case <-l.Failed():
	default:
		t.Fatal("Failed not closed once the waiters were failed")
	}
	// Later appends fail fast without touching the disk.
	if err := l.Append(context.Background(), sample(9)); !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), path) {
		t.Fatalf("append after failure: %v, want ErrBroken naming %s", err, path)
	}
	if got := g.calls.Load(); got != 2 {
		t.Fatalf("%d fsync calls, want 2 (no fsync after the log broke)", got)
	}
	if h := l.Head(); h.Seq != 1 {
		t.Fatalf("head seq %d, want 1 (the last durable line)", h.Seq)
	}
	if err := l.Close(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Close = %v, want ErrBroken", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int{1}) {
		t.Fatalf("OnBatch saw %v, want [1]: only fsync 1 made lines durable", sizes)
	}
}

// TestFailedWriteDuringFsync: a write that fails while an earlier line's fsync runs fails its own
// line and breaks the log, but the running fsync still answers the line it covers: that line
// was written before the failure and is durable once the fsync returns.
func TestFailedWriteDuringFsync(t *testing.T) {
	path := logPath(t)
	g := newGatedSync(t, 1, nil)
	w := newWriteTap(map[int]error{2: syscall.ENOSPC})
	l := openLog(t, Config{Path: path, IO: IO{Write: w.write}}, g.sync)
	before := make(chan appendResult, 1)
	appendAsync(l, g, 0, before)
	g.waitEntered(t, 1)
	failing := make(chan appendResult, 1)
	appendAsync(l, g, 1, failing)
	if r := recv(t, failing); !errors.Is(r.err, ErrBroken) || !errors.Is(r.err, syscall.ENOSPC) {
		t.Fatalf("the line whose write failed got %v, want ErrBroken wrapping ENOSPC", r.err)
	}
	select {
	case <-l.Failed():
	default:
		t.Fatal("Failed not closed after the failed write")
	}
	notYet(t, before, "the line of the running fsync")
	g.release(1)
	if r := recv(t, before); r.err != nil || r.syncedCall != 1 {
		t.Fatalf("the line the running fsync covered got %v after call %d, want nil after call 1", r.err, r.syncedCall)
	}
	if h := l.Head(); h.Seq != 1 {
		t.Fatalf("head seq %d, want 1", h.Seq)
	}
	if err := l.Append(context.Background(), sample(2)); !errors.Is(err, ErrBroken) {
		t.Fatalf("append after the failed write: %v, want ErrBroken", err)
	}
	if err := l.Close(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Close = %v, want ErrBroken", err)
	}
	if got := g.calls.Load(); got != 1 {
		t.Fatalf("%d fsync calls, want 1", got)
	}
	if got := seqs(t, readLines(t, path)); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("file holds seqs %v, want [1]", got)
	}
}

func TestReopen(t *testing.T) {
	t.Run("ok/reopen-continues-chain", func(t *testing.T) {
		path := logPath(t)
		l := openLog(t, Config{Path: path}, noSync)
		for i := range 3 {
			if err := l.Append(context.Background(), sample(i)); err != nil {
				t.Fatal(err)
			}
		}
		before := l.Head()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2 := openLog(t, Config{Path: path}, noSync)
		if got := l2.Head(); got != before {
			t.Fatalf("head after reopen %+v, want %+v", got, before)
		}
		for i := range 2 {
			if err := l2.Append(context.Background(), sample(i+3)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
		lines := readLines(t, path)
		sum, err := Verify(bytes.NewReader(join(lines)))
		if err != nil {
			t.Fatal(err)
		}
		if sum.Chains[0].Seq != 5 || !slices.Equal(seqs(t, lines), []uint64{1, 2, 3, 4, 5}) {
			t.Fatalf("summary %+v, want one chain of 5", sum)
		}
	})
	t.Run("ok/reopen-empty-file", func(t *testing.T) {
		path := logPath(t)
		_ = openLog(t, Config{Path: path}, noSync).Close()
		l := openLog(t, Config{Path: path}, noSync)
		if h := l.Head(); h.Seq != 0 || h.Hash != GenesisHash("r1") {
			t.Fatalf("empty head %+v, want seq 0 at genesis", h)
		}
	})

	brokenTests := []struct {
		name    string
		corrupt func(lines [][]byte) []byte
		line    int
	}{
		{"fail/reopen-broken-chain", func(lines [][]byte) []byte {
			return join(replaceIn(lines, 2, func(s string) string { return strings.Replace(s, "agent", "admin", 1) }))
		}, 2},
		// Finding 5: a final line with a newline is not torn but corrupt, and
		// still refuses start, naming file and line.
		{"fail/reopen-corrupt-terminated-final-line", func(lines [][]byte) []byte {
			return append(join(lines), append(lines[0][:20:20], '\n')...)
		}, 4},
	}
	for _, tc := range brokenTests {
		t.Run(tc.name, func(t *testing.T) {
			path := logPath(t)
			l := openLog(t, Config{Path: path}, noSync)
			for i := range 3 {
				if err := l.Append(context.Background(), sample(i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.corrupt(readLines(t, path)), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := New(Config{Path: path, Replica: "r1"})
			wantBreak(t, err, tc.line)
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}

	// Finding 5: a torn final line (never acknowledged) is cut and saved
	// aside at start, with a log line, and the chain continues.
	t.Run("ok/reopen-cuts-torn-tail", func(t *testing.T) {
		path := logPath(t)
		l := openLog(t, Config{Path: path}, noSync)
		for i := range 3 {
			if err := l.Append(context.Background(), sample(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		lines := readLines(t, path)
		torn := lines[0][:20]
		if err := os.WriteFile(path, append(join(lines), torn...), 0o600); err != nil {
			t.Fatal(err)
		}
		var logged bytes.Buffer
		l2, err := New(Config{Path: path, Replica: "r1", Now: stepClock(), IO: IO{Sync: noSync},
			Logger: slog.New(slog.NewTextHandler(&logged, nil))})
		if err != nil {
			t.Fatalf("New with a torn final line: %v", err)
		}
		defer func() { _ = l2.Close() }()
		if h := l2.Head(); h.Seq != 3 {
			t.Fatalf("head %+v, want seq 3 (the last whole line)", h)
		}
		saved := tornFiles(t, path)
		if len(saved) != 1 {
			t.Fatalf("torn files %v, want one", saved)
		}
		wantPrivate(t, saved[0], torn)
		for _, w := range []string{"torn", path, saved[0], "line=4"} {
			if !strings.Contains(logged.String(), w) {
				t.Fatalf("log %q lacks %q", logged.String(), w)
			}
		}
		if err := l2.Append(context.Background(), sample(3)); err != nil {
			t.Fatal(err)
		}
		if got := seqs(t, readLines(t, path)); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
			t.Fatalf("seqs %v, want the chain to continue at 4", got)
		}
	})

	t.Run("fail/reopen-other-replica", func(t *testing.T) {
		path := logPath(t)
		l := openLog(t, Config{Path: path, Replica: "r1"}, noSync)
		if err := l.Append(context.Background(), sample(0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := New(Config{Path: path, Replica: "r2"})
		var fe *FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), `"r1"`) || !strings.Contains(err.Error(), path) {
			t.Fatalf("New = %v, want *FieldError naming the file and its replica", err)
		}
	})
}

func TestNewRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) Config
		check func(t *testing.T, cfg Config, err error)
	}{
		{"fail/dir-mode-0755", func(t *testing.T) Config {
			dir := filepath.Join(t.TempDir(), "audit")
			mkdir(t, dir, 0o755)
			return Config{Path: filepath.Join(dir, "a.log"), Replica: "r1"}
		}, wantMode(func(cfg Config) string { return filepath.Dir(cfg.Path) })},
		{"fail/file-mode-0644", func(t *testing.T) Config {
			dir := filepath.Join(t.TempDir(), "audit")
			mkdir(t, dir, 0o700)
			path := filepath.Join(dir, "a.log")
			writeFile(t, path, 0o644)
			return Config{Path: path, Replica: "r1"}
		}, wantMode(func(cfg Config) string { return cfg.Path })},
		{"fail/file-is-symlink", func(t *testing.T) Config {
			dir := filepath.Join(t.TempDir(), "audit")
			mkdir(t, dir, 0o700)
			target := filepath.Join(dir, "real.log")
			writeFile(t, target, 0o600)
			link := filepath.Join(dir, "a.log")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			return Config{Path: link, Replica: "r1"}
		}, wantMode(func(cfg Config) string { return cfg.Path })},
		{"fail/file-is-directory", func(t *testing.T) Config {
			dir := filepath.Join(t.TempDir(), "audit")
			mkdir(t, dir, 0o700)
			mkdir(t, filepath.Join(dir, "a.log"), 0o700)
			return Config{Path: filepath.Join(dir, "a.log"), Replica: "r1"}
		}, func(t *testing.T, cfg Config, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), cfg.Path) {
				t.Fatalf("New = %v, want an error naming %s", err, cfg.Path)
			}
		}},
		{"fail/in-use", func(t *testing.T) Config {
			path := logPath(t)
			openLog(t, Config{Path: path}, noSync)
			return Config{Path: path, Replica: "r1"}
		}, func(t *testing.T, cfg Config, err error) {
			t.Helper()
			if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), cfg.Path) {
				t.Fatalf("New = %v, want ErrInUse naming %s", err, cfg.Path)
			}
		}},
		{"fail/no-path", func(t *testing.T) Config { return Config{Replica: "r1"} }, wantField("path")},
		{"fail/no-replica", func(t *testing.T) Config { return Config{Path: logPath(t)} }, wantField("replica")},
		{"fail/replica-with-space", func(t *testing.T) Config { return Config{Path: logPath(t), Replica: "r 1"} }, wantField("replica")},
		{"fail/negative-max-batch", func(t *testing.T) Config { return Config{Path: logPath(t), Replica: "r1", MaxBatch: -1} }, wantField("max_batch")},
		{"fail/negative-max-delay", func(t *testing.T) Config { return Config{Path: logPath(t), Replica: "r1", MaxDelay: -1} }, wantField("max_delay")},
		{"fail/max-bytes-below-minimum", func(t *testing.T) Config { return Config{Path: logPath(t), Replica: "r1", MaxBytes: MinMaxBytes - 1} }, wantField("max_bytes")},
		{"fail/negative-max-bytes", func(t *testing.T) Config { return Config{Path: logPath(t), Replica: "r1", MaxBytes: -1} }, wantField("max_bytes")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.setup(t)
			l, err := New(cfg)
			if err == nil {
				_ = l.Close()
			}
			tc.check(t, cfg, err)
		})
	}
}

func TestNewCreatesPrivateDirAndFile(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path}, noSync)
	if err := l.Append(context.Background(), sample(0)); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{filepath.Dir(path): fs.ModeDir | 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Fatalf("%s has mode %v, want %v", p, fi.Mode(), want)
		}
	}
}

func TestAppendAfterCloseAndCancel(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path}, noSync)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Append(ctx, sample(0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with a done ctx = %v, want context.Canceled", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(context.Background(), sample(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v, want ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if got := readLines(t, path); len(got) != 0 {
		t.Fatalf("file has %d lines, want 0", len(got))
	}
}

func mkdir(t *testing.T, dir string, mode fs.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // defeat the umask
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, nil, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func wantMode(path func(Config) string) func(*testing.T, Config, error) {
	return func(t *testing.T, cfg Config, err error) {
		t.Helper()
		var me *ModeError
		if !errors.As(err, &me) || me.Path != path(cfg) || !strings.Contains(err.Error(), path(cfg)) {
			t.Fatalf("New = %v, want *ModeError naming %s", err, path(cfg))
		}
	}
}

func wantField(field string) func(*testing.T, Config, error) {
	return func(t *testing.T, _ Config, err error) {
		t.Helper()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Fatalf("New = %v, want *FieldError for %s", err, field)
		}
	}
}

func TestAppendCanceledWhileWaiting(t *testing.T) {
	path := logPath(t)
	g := newGatedSync(t, 1, nil)
	l := openLog(t, Config{Path: path}, g.sync)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- l.Append(ctx, sample(0)) }()
	g.waitEntered(t, 1)
	cancel()
	if err := recv(t, res); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append = %v, want context.Canceled", err)
	}
	// The queued line still lands: over-reporting is the safe side.
	g.release(1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := Verify(bytes.NewReader(join(readLines(t, path))))
	if err != nil || sum.Lines != 1 {
		t.Fatalf("Verify = %+v, %v; want the canceled line on the chain", sum, err)
	}
}

// TestBrokenLogIsVisible (finding 5): a write or fsync failure closes Failed
// and Err names the cause, so a signer can stop looking healthy.
func TestBrokenLogIsVisible(t *testing.T) {
	tests := []struct {
		name string
		io   IO
	}{
		{"fail/write-enospc", IO{Write: func(*os.File, []byte) (int, error) { return 0, syscall.ENOSPC }}},
		{"fail/short-write-enospc", IO{Write: func(f *os.File, b []byte) (int, error) {
			n, err := f.Write(b[:len(b)/2])
			if err != nil {
				return n, err
			}
			return n, syscall.ENOSPC
		}}},
		{"fail/fsync-eio", IO{Sync: func(*os.File) error { return syscall.EIO }}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := logPath(t)
			healthy := openLog(t, Config{Path: path}, nil)
			if err := healthy.Append(context.Background(), sample(0)); err != nil {
				t.Fatal(err)
			}
			if err := healthy.Close(); err != nil {
				t.Fatal(err)
			}
			l, err := New(Config{Path: path, Replica: "r1", IO: tc.io})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Close() }()
			select {
			case <-l.Failed():
				t.Fatal("Failed closed before any failure")
			default:
			}
			if l.Err() != nil {
				t.Fatalf("Err = %v before any failure", l.Err())
			}
			if err := l.Append(context.Background(), sample(1)); !errors.Is(err, ErrBroken) {
				t.Fatalf("Append = %v, want ErrBroken", err)
			}
			select {
			case <-l.Failed():
			case <-time.After(5 * time.Second):
				t.Fatal("Failed not closed after the log broke")
			}
			err = l.Err()
			if !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Err = %v, want ErrBroken naming %s", err, path)
			}
			if want := tc.io.Sync == nil; want != errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Err = %v: ENOSPC reported %v, want %v", err, !want, want)
			}
			// Space freed: a restart verifies the file, cuts what the failed
			// write tore and continues the chain.
			_ = l.Close()
			again := openLog(t, Config{Path: path}, nil)
			if err := again.Append(context.Background(), sample(2)); err != nil {
				t.Fatalf("append after restart: %v", err)
			}
			if err := again.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(bytes.NewReader(join(readLines(t, path)))); err != nil {
				t.Fatalf("file after restart: %v", err)
			}
			if n := len(tornFiles(t, path)); (n == 1) != strings.Contains(tc.name, "short-write") {
				t.Fatalf("%d torn files saved", n)
			}
		})
	}
}

// tornFiles lists the files a torn tail of path was saved to.
func tornFiles(t *testing.T, path string) []string {
	t.Helper()
	got, err := filepath.Glob(path + ".torn.*")
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// wantPrivate asserts path is a 0600 file holding exactly want.
func wantPrivate(t *testing.T, path string, want []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s mode %v, want 0600", path, fi.Mode().Perm())
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s holds %q, want %q", path, got, want)
	}
}
