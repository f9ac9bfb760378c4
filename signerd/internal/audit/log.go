package audit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Config says where a Log writes and how it batches.
type Config struct {
	// Path is the audit file. Required. Its directory must be mode 0700 (it is
	// created so when missing) and the file mode 0600; both must belong to
	// this process's uid.
	Path string
	// Replica names this signerd replica's chain. Required; letters, digits,
	// '.', '_', '-', ':' only, at most 64 bytes.
	Replica string
	// MaxBatch caps the lines the writer puts in one write. 0 means 256. An
	// fsync covers every line written since the previous fsync began, which
	// may be several writes.
	MaxBatch int
	// MaxBytes is the size at which the file is rotated: a line that would
	// take it past MaxBytes goes to a new file (see Rotate). 0 means
	// DefaultMaxBytes (64 MiB); less than MinMaxBytes (64 KiB) is refused.
	MaxBytes int64
	// MaxDelay is how long the writer may wait for more lines before it
	// writes a batch smaller than MaxBatch. 0 means no wait: lines are written
	// as they come, also while an fsync runs, and the next fsync covers all
	// of them, which is already group commit without adding latency.
	MaxDelay time.Duration
	// WrittenSyncDelay is how long lines appended with AppendWritten may stay
	// written but not fsynced when no durable line follows them (a durable
	// line's fsync covers them). 0 means DefaultWrittenSyncDelay.
	WrittenSyncDelay time.Duration
	// Now is the clock for Record.Time. nil means time.Now.
	Now func() time.Time
	// OnBatch, if set, is called after every fsync with the number of lines
	// it made durable (for a histogram the caller owns), from the goroutine
	// that ran the fsync, never from two at once. It must not block or call
	// back into the Log.
	OnBatch func(n int)
	// IO replaces the writer's write and fsync calls; its zero value means
	// the file's own. It exists so tests can make the disk fail (ENOSPC,
	// EIO) under the real writer and its failure handling.
	IO IO
	// Logger receives what the Log does on its own: cutting a torn final
	// line at start, rotating. nil discards.
	Logger *slog.Logger
}

// IO is the two calls the writer makes to put a batch on disk. A nil field
// means the *os.File method of the same name.
type IO struct {
	Write func(f *os.File, b []byte) (int, error)
	Sync  func(f *os.File) error
}

const defaultMaxBatch = 256

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("audit: log closed")

// ErrBroken marks every error from a Log whose write or fsync failed. Once
// broken, a Log fails every Append and closes Failed: a signer must not sign
// without audit, and must not look healthy either. Restarting re-verifies the
// file, cuts a torn final line the failed write left (saving it aside) and
// refuses any other break, naming the line.
var ErrBroken = errors.New("audit: log broken")

// ErrInUse is returned by New when another Log (in this or another process)
// holds the file.
var ErrInUse = errors.New("audit: file in use by another writer")

// ModeError reports a file or directory whose type, mode or owner is looser
// than the log requires.
type ModeError struct {
	Path   string
	Mode   fs.FileMode
	Reason string
}

func (e *ModeError) Error() string {
	return fmt.Sprintf("audit: %s (mode %v): %s", e.Path, e.Mode, e.Reason)
}

// Log appends records to one replica's chain in one file. It is safe for
// concurrent use; seq and chain order equal file order.
type Log struct {
	path    string
	replica string
	f       *os.File
	now     func() time.Time
	onBatch func(int)
	io      IO
	log     *slog.Logger

	maxBatch         int
	maxDelay         time.Duration
	writtenSyncDelay time.Duration
	maxBytes         int64

	wake        chan struct{} // capacity 1: "the queue changed"
	syncWake    chan struct{} // capacity 1: "lines were written"
	stop        chan struct{} // closed by Close
	stopped     chan struct{} // closed when the writer has drained, synced and exited
	syncStopped chan struct{} // closed when the syncer has exited
	failed      chan struct{} // closed when the log breaks

	mu      sync.Mutex
	seq     uint64     // seq of the last line queued; mu must be held
	prev    [32]byte   // hash of the last line queued; mu must be held
	queue   []*pending // lines appended, not yet taken by the writer
	closed  bool
	broken  error
	durable Head // last line known to be on disk; mu must be held

	// Lines written and not yet taken by an fsync, in file order, and the file that holds
	// them (all of them: a rotation fsyncs them first); mu must be held. writtenDurable says
	// one of them waits for its fsync (Append), so the syncer must not wait.
	written        []*pending
	writtenFile    *os.File
	writtenDurable bool
	spare          []*pending // a drained written slice, for reuse
	syncing        bool       // an fsync is running; syncDone is broadcast when it ends
	syncDone       *sync.Cond // on mu

	// The current file, counting lines queued for it; mu must be held.
	first     uint64 // seq of its first line (of the next line when empty)
	size      int64  // bytes
	decisions int    // lines other than its continuation line
	resume    bool   // empty after an interrupted rotation: the next line continues the newest rotated file

	closeOnce sync.Once
	closeErr  error
}

// pending is one line waiting to be written and then covered by an fsync.
type pending struct {
	line     []byte
	head     Head
	rotateTo string     // if set, the writer renames the current file to this name and starts a new one with line
	done     chan error // capacity 1, written exactly once (by the writer, the syncer or fail)
	// written releases the waiter once the line is written to the file, before the fsync
	// (AppendWritten); the writer sets answered (under mu) when it hands the line to the
	// syncer, so neither a later fsync nor a failure answers it twice.
	written, answered bool
}

// New opens (or creates) the audit file, verifies the chain already in it
// and starts the writer. It refuses a directory or file with group or other
// permissions, a file owned by another uid, a symlink at Path, a file
// another Log holds, a broken chain (the error wraps *BreakError naming the
// line) and a file that holds another replica's chain.
func New(cfg Config) (*Log, error) {
	if cfg.Path == "" {
		return nil, &FieldError{Field: "path", Reason: "required"}
	}
	if err := checkReplica(cfg.Replica); err != nil {
		return nil, err
	}
	if cfg.MaxBatch < 0 {
		return nil, &FieldError{Field: "max_batch", Reason: fmt.Sprintf("%d is negative", cfg.MaxBatch)}
	}
	if cfg.MaxDelay < 0 {
		return nil, &FieldError{Field: "max_delay", Reason: fmt.Sprintf("%v is negative", cfg.MaxDelay)}
	}
	if cfg.WrittenSyncDelay < 0 {
		return nil, &FieldError{Field: "written_sync_delay", Reason: fmt.Sprintf("%v is negative", cfg.WrittenSyncDelay)}
	}
	if cfg.WrittenSyncDelay == 0 {
		cfg.WrittenSyncDelay = DefaultWrittenSyncDelay
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < MinMaxBytes {
		return nil, &FieldError{Field: "max_bytes", Reason: fmt.Sprintf("%d is less than %d", cfg.MaxBytes, MinMaxBytes)}
	}
	f, err := openFile(cfg.Path, os.O_CREATE)
	if err != nil {
		return nil, err
	}
	l := &Log{
		path:     cfg.Path,
		replica:  cfg.Replica,
		f:        f,
		now:      cfg.Now,
		onBatch:  cfg.OnBatch,
		io:       cfg.IO,
		log:      cfg.Logger,
		maxBatch: cfg.MaxBatch,
		maxDelay: cfg.MaxDelay,
		maxBytes: cfg.MaxBytes,

		writtenSyncDelay: cfg.WrittenSyncDelay,
		wake:             make(chan struct{}, 1),
		syncWake:         make(chan struct{}, 1),
		stop:             make(chan struct{}),
		stopped:          make(chan struct{}),
		syncStopped:      make(chan struct{}),
		failed:           make(chan struct{}),
	}
	l.syncDone = sync.NewCond(&l.mu)
	if l.io.Write == nil {
		l.io.Write = (*os.File).Write
	}
	if l.io.Sync == nil {
		l.io.Sync = (*os.File).Sync
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.maxBatch == 0 {
		l.maxBatch = defaultMaxBatch
	}
	if err := l.recover(); err != nil {
		_ = f.Close()
		return nil, err
	}
	go l.run()
	go l.syncer()
	return l, nil
}

// openFile checks the directory, opens the file without following a symlink
// (with create, os.O_CREATE and maybe os.O_EXCL, creating the directory too),
// checks what was opened (not the name, which could be swapped) and locks it.
func openFile(path string, create int) (*os.File, error) {
	dir := filepath.Dir(path)
	flags := os.O_RDWR | os.O_APPEND | syscall.O_NOFOLLOW | create
	if _, err := os.Stat(dir); create != 0 && errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("audit: create directory %s: %w", dir, err)
		}
	}
	di, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if err := checkMode(dir, di, true); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, &ModeError{Path: path, Mode: fs.ModeSymlink, Reason: "is a symlink"}
		}
		return nil, fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkMode(path, fi, false)
	}
	if err == nil {
		// Make a newly created file's name durable too.
		err = syncDir(dir)
	}
	if err == nil {
		if lerr := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); lerr != nil {
			err = fmt.Errorf("%w: %s: %w", ErrInUse, path, lerr)
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// checkMode refuses a path that is the wrong type, grants any permission to
// group or other, or is owned by another uid.
func checkMode(path string, fi fs.FileInfo, wantDir bool) error {
	mode := fi.Mode()
	switch {
	case wantDir && !fi.IsDir():
		return &ModeError{Path: path, Mode: mode, Reason: "is not a directory"}
	case !wantDir && !mode.IsRegular():
		return &ModeError{Path: path, Mode: mode, Reason: "is not a regular file"}
	case wantDir && mode.Perm()&0o077 != 0:
		return &ModeError{Path: path, Mode: mode, Reason: "directory must be mode 0700 (no group or other access)"}
	case !wantDir && mode.Perm()&0o077 != 0:
		return &ModeError{Path: path, Mode: mode, Reason: "file must be mode 0600 (no group or other access)"}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return &ModeError{Path: path, Mode: mode, Reason: fmt.Sprintf("owned by uid %d, not this process's uid %d", st.Uid, os.Geteuid())}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("audit: sync directory %s: %w", dir, err)
	}
	return nil
}

// recover verifies the existing file, cuts a torn final line (see Repair)
// and sets the chain head from it.
func (l *Log) recover() error {
	rep, sum, err := repairOpen(l.f, l.path, l.now)
	if err != nil {
		return err
	}
	if rep.Line > 0 {
		l.log.Warn("audit: cut a torn final line (a write that never completed, never acknowledged) and saved it aside",
			"path", l.path, "line", rep.Line, "bytes", rep.Bytes, "saved_to", rep.SavedTo)
	}
	l.prev = genesis(l.replica)
	l.durable = Head{Replica: l.replica, Hash: GenesisHash(l.replica)}
	l.first, l.size, l.decisions = 1, sum.Bytes, sum.Lines
	for i, h := range sum.Chains {
		if h.Replica != l.replica {
			return &FieldError{Field: "replica", Reason: fmt.Sprintf("%s holds replica %q's chain, not %q", l.path, h.Replica, l.replica)}
		}
		prev, _ := decodeHash(h.Hash) // Verify checked it
		l.seq, l.prev, l.durable = h.Seq, prev, h
		if start := sum.Starts[i]; start.Seq > 0 {
			l.decisions-- // the continuation line
			l.first = start.Seq + 1
		}
	}
	if sum.Lines == 0 {
		if _, err := l.resumeFrom(); err != nil {
			return err
		}
	}
	return nil
}

// Head returns the last line known to be durable: its seq (0 for an empty
// chain), hash and time. An operator anchors it outside the host to detect
// later truncation (see the package doc).
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

// Append writes r to the chain and returns once its line is fsynced, or with
// the error that kept it from being. It fills Time (when zero) and overwrites
// Replica, Seq, Prev and Hash. Free-text fields are made valid UTF-8, cut to
// MaxFieldBytes and replaced by Redacted when they hold a credential (by its
// structure; never Caller or Space, see the package doc).
// Append refuses an unknown decision, a denial without a reason, a reason that
// is not a code, a missing caller or RPC and the reserved ContinueRPC with
// *FieldError, before using a seq. A line that would take the file past
// MaxBytes goes to a new file (see Rotate). After a failed write every Append
// returns ErrBroken; after Close, ErrClosed.
//
// If ctx ends while the line is queued, Append returns ctx's error but the
// line may still be written: an audit line for a decision that did not take
// effect is the safe side of the trade.
func (l *Log) Append(ctx context.Context, r Record) error {
	return l.append(ctx, r, false)
}

// AppendWritten is Append for a line that need not be durable before the answer: it returns
// once the line is written to the file (the kernel holds it, so it survives the process), not
// once it is fsynced. Its fsync is the next durable line's (or the writer's own within
// Config.WrittenSyncDelay, 20 ms by default, when no durable line comes); only a crash of the
// machine before it can lose the line, and then with everything after it, as a cut at the end of
// the chain that Verify accepts and the durable Head shows. signerd uses it for
// OpenCalloutRequest, which signs nothing: the SignCalloutResponse that acts on an opened
// request waits for its own line, which lies after the open's in the chain, so a durable grant
// implies a durable open.
func (l *Log) AppendWritten(ctx context.Context, r Record) error {
	return l.append(ctx, r, true)
}

func (l *Log) append(ctx context.Context, r Record, written bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkInput(&r); err != nil {
		return err
	}
	sanitize(&r)
	l.mu.Lock()
	if err := l.unusableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if r.Time.IsZero() {
		r.Time = l.now()
	}
	r.Time = r.Time.UTC()
	if err := checkTime("time", r.Time); err != nil {
		l.mu.Unlock()
		return err
	}
	r.Expiry = r.Expiry.UTC()
	r.Replica = l.replica
	if l.resume {
		l.queueContinuation(reasonResumed, false)
	}
	r.Seq = l.seq + 1
	line, sum := seal(l.prev, &r)
	if l.decisions > 0 && l.size+int64(len(line)) > l.maxBytes {
		l.queueContinuation(reasonMaxBytes, true)
		r.Seq = l.seq + 1
		line, sum = seal(l.prev, &r)
	}
	l.seq, l.prev = r.Seq, sum
	l.size += int64(len(line))
	l.decisions++
	p := &pending{
		line:    line,
		head:    Head{Replica: r.Replica, Seq: r.Seq, Hash: r.Hash, Time: r.Time},
		done:    make(chan error, 1),
		written: written,
	}
	l.queue = append(l.queue, p)
	l.mu.Unlock()
	l.kick()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("audit: waiting for seq %d to be durable: %w", r.Seq, ctx.Err())
	}
}

// kick wakes the writer.
func (l *Log) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Failed is closed when the log breaks: a write or fsync failed and every
// later Append fails. A signer watches it to stop serving and report why
// (Err), because a signer that cannot audit must not look healthy.
func (l *Log) Failed() <-chan struct{} { return l.failed }

// Err returns the error that broke the log (wrapping ErrBroken and the
// write or fsync error), or nil while it is healthy.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken
}

// unusableLocked returns why l takes no more lines: the error that broke it, or ErrClosed; nil
// when it is usable. l.mu must be held.
func (l *Log) unusableLocked() error {
	if l.broken != nil {
		return l.broken
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

// Close writes what is queued, stops the writer and closes the file. It
// returns the error that broke the log, if one did. Calling it again returns
// the same result.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.stop)
		<-l.stopped
		<-l.syncStopped
		l.mu.Lock()
		broken := l.broken
		l.mu.Unlock()
		err := l.f.Close()
		if err != nil {
			err = fmt.Errorf("audit: close %s: %w", l.path, err)
		}
		l.closeErr = errors.Join(broken, err)
	})
	return l.closeErr
}

// DefaultWrittenSyncDelay is how long lines that only had to be written (AppendWritten) may wait
// for an fsync: the next fsync for a durable line covers them too, and when none comes within
// this delay the syncer fsyncs them on their own.
const DefaultWrittenSyncDelay = 20 * time.Millisecond

// The pipeline. Two goroutines share the file: run (the writer) takes queued lines, writes up to
// MaxBatch of them with one write and hands them to syncer, which fsyncs everything written so far
// and only then releases the waiters of the lines that fsync covered. The writer never waits for
// an fsync, so lines that arrive while one runs are written at once and the next fsync (the
// syncer's next call, started as soon as the running one ends) covers them all: a request waits
// for at most the rest of the running fsync and its own, never behind an fsync it is not part
// of. A line is released only by an fsync that began after its write completed, because the
// syncer takes a line only after the writer has handed it over, which it does after the write.
// Fsyncs never overlap (syncWritten waits for a running one), so "durable up to" only grows.
//
// A batch of only AppendWritten lines is answered once written; its fsync is the next one, or
// the syncer's own after WrittenSyncDelay without one, or the one before a rotation or at Close.
// On this machine an fsync costs about 165 µs of CPU, and a callout would otherwise pay two (its
// open's line and its answer's).

// run is the writer: it writes batches as they come and hands them to the syncer. Before a
// rotation it fsyncs what the current file holds (waiting for a running fsync first), so the
// syncer never fsyncs a file that was renamed away without its lines; at Close it drains the
// queue and fsyncs the rest.
func (l *Log) run() {
	defer close(l.stopped)
	var buf []byte
	var batch []*pending
	for {
		batch = l.next(batch[:0])
		if len(batch) == 0 {
			_ = l.syncWritten() // closed and drained; an error broke the log and answered everyone
			return
		}
		var err error
		if to := batch[0].rotateTo; to != "" {
			// The lines the current file holds unsynced become durable before it is renamed.
			if err = l.syncWritten(); err == nil {
				err = l.rotateFile(to)
			}
		}
		if err == nil {
			err = l.Err() // a broken log writes nothing more
		}
		if err == nil {
			buf = buf[:0]
			for _, p := range batch {
				buf = append(buf, p.line...)
			}
			_, err = l.io.Write(l.f, buf)
		}
		if err != nil {
			l.fail(batch, err, false)
		} else {
			l.handOff(batch)
		}
		clear(batch)
	}
}

// handOff gives a written batch to the syncer and answers its AppendWritten lines. A log that
// broke while the batch was being written fails it instead: its lines follow lines that never
// became durable.
func (l *Log) handOff(batch []*pending) {
	l.mu.Lock()
	if err := l.broken; err != nil {
		l.mu.Unlock()
		l.fail(batch, err, false)
		return
	}
	l.writtenFile = l.f // the writer's own field; every written line is in this file
	for _, p := range batch {
		if p.written {
			p.answered = true
		} else {
			l.writtenDurable = true
		}
	}
	l.written = append(l.written, batch...)
	l.mu.Unlock()
	for _, p := range batch {
		if p.written {
			p.done <- nil
		}
	}
	select {
	case l.syncWake <- struct{}{}:
	default:
	}
}

// syncer fsyncs written lines: at once when one of them waits for durability, after
// WrittenSyncDelay when they only had to be written. It exits when the writer has (the writer
// fsyncs the rest itself) or when the log breaks.
func (l *Log) syncer() {
	defer close(l.syncStopped)
	var timer *time.Timer
	var timeout <-chan time.Time
	stopTimer := func() {
		if timer != nil {
			timer.Stop()
			timer, timeout = nil, nil
		}
	}
	defer stopTimer()
	for {
		l.mu.Lock()
		n, durable, broken := len(l.written), l.writtenDurable, l.broken != nil
		l.mu.Unlock()
		switch {
		case broken:
			return
		case durable:
			stopTimer()
			_ = l.syncWritten()
			continue
		case n > 0 && timer == nil:
			timer = time.NewTimer(l.writtenSyncDelay)
			timeout = timer.C
		case n == 0:
			stopTimer()
		}
		select {
		case <-l.syncWake:
		case <-timeout:
			timer, timeout = nil, nil
			_ = l.syncWritten()
		case <-l.stopped:
			return
		}
	}
}

// syncWritten fsyncs every line written so far and releases their waiters. It first waits for
// a running fsync (the other goroutine's) to end. It returns the error that broke the log, if
// it is broken now.
func (l *Log) syncWritten() error {
	l.mu.Lock()
	for l.syncing {
		l.syncDone.Wait()
	}
	if l.broken != nil || len(l.written) == 0 {
		err := l.broken
		l.mu.Unlock()
		return err
	}
	batch, f := l.written, l.writtenFile
	l.written, l.spare, l.writtenDurable = l.spare, nil, false
	l.syncing = true
	l.mu.Unlock()

	if err := l.io.Sync(f); err != nil {
		return l.fail(batch, err, true)
	}
	head := batch[len(batch)-1].head
	l.mu.Lock()
	l.durable = head
	l.mu.Unlock()
	if l.onBatch != nil {
		l.onBatch(len(batch)) // still syncing: calls never overlap
	}
	l.mu.Lock()
	l.syncing = false
	l.syncDone.Broadcast()
	l.mu.Unlock()
	for _, p := range batch {
		if !p.answered {
			p.done <- nil
		}
	}
	clear(batch)
	l.mu.Lock()
	if l.spare == nil {
		l.spare = batch[:0]
	}
	l.mu.Unlock()
	return nil
}

// fail poisons the log and fails batch (the lines whose write or fsync failed) and every line
// not yet made durable behind it (written or queued): their seqs were assigned on top of lines
// that are not on disk. Lines an fsync running elsewhere covers are that fsync's to answer. With
// endSync it also ends the caller's fsync (syncing), in the same critical section, so no one
// fsyncs after it. It returns the error that broke the log.
func (l *Log) fail(batch []*pending, cause error, endSync bool) error {
	err := cause
	if !errors.Is(cause, ErrBroken) {
		err = fmt.Errorf("%w: %s: %w", ErrBroken, l.path, cause)
	}
	l.mu.Lock()
	first := l.broken == nil
	if first {
		l.broken = err
	}
	rest := append(l.written, l.queue...)
	l.written, l.queue, l.writtenDurable = nil, nil, false
	if endSync {
		l.syncing = false
		l.syncDone.Broadcast()
	}
	broken := l.broken
	l.mu.Unlock()
	if first {
		close(l.failed)
	}
	for _, p := range batch {
		if !p.answered {
			p.done <- err
		}
	}
	for _, p := range rest {
		if !p.answered {
			p.done <- err
		}
	}
	clear(batch)
	return broken
}

// next blocks until there is something to write and returns up to maxBatch lines, appended to
// batch. It returns an empty batch once the log is closed and drained.
func (l *Log) next(batch []*pending) []*pending {
	for {
		l.mu.Lock()
		n, closed := len(l.queue), l.closed
		l.mu.Unlock()
		if n == 0 {
			if closed {
				return batch
			}
			select {
			case <-l.wake:
			case <-l.stop:
			}
			continue
		}
		if n < l.maxBatch && l.maxDelay > 0 && !closed {
			l.gather()
		}
		l.mu.Lock()
		k := min(len(l.queue), l.maxBatch)
		// A batch goes to one file: it ends before the next rotation.
		for i := 1; i < k; i++ {
			if l.queue[i].rotateTo != "" {
				k = i
				break
			}
		}
		batch = append(batch, l.queue[:k]...)
		rest := copy(l.queue, l.queue[k:])
		clear(l.queue[rest:])
		l.queue = l.queue[:rest]
		l.mu.Unlock()
		return batch
	}
}

// gather waits up to maxDelay for the queue to fill a batch.
func (l *Log) gather() {
	t := time.NewTimer(l.maxDelay)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-l.stop:
			return
		case <-l.wake:
			l.mu.Lock()
			n := len(l.queue)
			l.mu.Unlock()
			if n >= l.maxBatch {
				return
			}
		}
	}
}
