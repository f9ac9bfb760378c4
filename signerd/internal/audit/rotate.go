package audit

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Rotation. A file is rotated when the next line would take it past
// Config.MaxBytes, or on request (Rotate; signerd serve on SIGHUP). The
// current file is renamed to its rotated name, path + "." + the seq of its
// first line in 20 digits, so names sort in chain order, and a new file is
// started at path whose first line is a continuation line: a Record whose
// prev is the rotated file's last hash and whose seq is one more. The chain
// therefore runs on across files, each file verifies on its own, and
// VerifyFiles checks that consecutive files link.

// The continuation line's fixed fields. Append refuses a record with this
// RPC, so only the Log writes one.
const (
	ContinueRPC    = "audit.continue"
	ContinueCaller = "signerd"
)

// Reasons a continuation line records.
const (
	reasonMaxBytes = "max-bytes"        // the file reached Config.MaxBytes
	reasonRequest  = "rotate-requested" // Rotate was called (SIGHUP)
	reasonResumed  = "rotation-resumed" // a crash came between the rename and the new file's first line
)

// DefaultMaxBytes is the rotation size when Config.MaxBytes is 0; MinMaxBytes
// is the smallest accepted, so that a continuation line and the largest line
// always fit in a fresh file.
const (
	DefaultMaxBytes = 64 << 20
	MinMaxBytes     = 64 << 10
)

// rotatedDigits is the width of the seq in a rotated file's name: every
// uint64 fits, so the names sort in chain order.
const rotatedDigits = 20

func isContinuation(r *Record) bool { return r.RPC == ContinueRPC }

// RotatedName is the name path's current file gets when rotated, given the
// seq of its first line.
func RotatedName(path string, firstSeq uint64) string {
	return fmt.Sprintf("%s.%0*d", path, rotatedDigits, firstSeq)
}

// rotatedSeq returns the first seq a rotated file's name carries, if name is
// base + "." + 20 digits.
func rotatedSeq(base, name string) (uint64, bool) {
	digits, ok := strings.CutPrefix(name, base+".")
	if !ok || len(digits) != rotatedDigits || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	return seq, err == nil
}

// Rotated lists the rotated predecessors of the audit file at path, oldest
// first (the order of their first seq).
func Rotated(path string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	base := filepath.Base(path)
	var out []string
	for _, e := range entries {
		if _, ok := rotatedSeq(base, e.Name()); ok {
			out = append(out, filepath.Join(filepath.Dir(path), e.Name()))
		}
	}
	slices.Sort(out) // fixed width: lexical order is seq order
	return out, nil
}

// Rotate starts a new file now, if the current one holds any decision, and
// returns once the new file's continuation line is durable. It fails like
// Append: ErrBroken after a failed write (a failed rotation breaks the log
// too), ErrClosed after Close, ctx's error if ctx ends first.
func (l *Log) Rotate(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	if err := l.unusableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.decisions == 0 {
		l.mu.Unlock()
		return nil
	}
	p := l.queueContinuation(reasonRequest, true)
	l.mu.Unlock()
	l.kick()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("audit: waiting for rotation: %w", ctx.Err())
	}
}

// queueContinuation queues a continuation line that starts a new file, after
// renaming the current one when rotate is set. l.mu must be held.
func (l *Log) queueContinuation(reason string, rotate bool) *pending {
	r := Record{Time: l.now().UTC(), Replica: l.replica, Seq: l.seq + 1, Caller: ContinueCaller,
		RPC: ContinueRPC, Decision: Granted, Reason: reason}
	line, sum := seal(l.prev, &r)
	p := &pending{
		line: line,
		head: Head{Replica: r.Replica, Seq: r.Seq, Hash: r.Hash, Time: r.Time},
		done: make(chan error, 1),
	}
	if rotate {
		p.rotateTo = RotatedName(l.path, l.first)
	}
	l.seq, l.prev = r.Seq, sum
	l.first, l.size, l.decisions, l.resume = r.Seq, int64(len(line)), 0, false
	l.queue = append(l.queue, p)
	return p
}

// rotateFile renames the current file to name, never over an existing file,
// and opens a new, empty one at the path. It runs on the writer goroutine.
func (l *Log) rotateFile(name string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, l.path, unix.AT_FDCWD, name, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("rotate to %s: %w", name, err)
	}
	// O_EXCL: a file that appeared at the path meanwhile is not ours to
	// append to. openFile fsyncs the directory, which makes the rename and
	// the new name durable together.
	f, err := openFile(l.path, os.O_CREATE|os.O_EXCL)
	if err != nil {
		return fmt.Errorf("rotate: new file: %w", err)
	}
	old := l.f
	l.f = f
	if err := old.Close(); err != nil {
		l.log.Warn("audit: closing the rotated file", "path", name, "err", err)
	}
	l.log.Info("audit: rotated", "path", l.path, "rotated_to", name)
	return nil
}

// resumeFrom sets the chain head from the newest rotated file when the
// current file is empty: a crash came after the rename and before the new
// file's first line was durable. Without this the chain would restart at
// genesis and the rotated files would no longer link to it. It reports
// whether there was a rotated file.
func (l *Log) resumeFrom() (bool, error) {
	rotated, err := Rotated(l.path)
	if err != nil || len(rotated) == 0 {
		return false, err
	}
	name := rotated[len(rotated)-1]
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("audit: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err == nil {
		err = checkMode(name, fi, false)
	}
	if err != nil {
		return false, err
	}
	sum, err := Verify(io.NewSectionReader(f, 0, fi.Size()))
	if err != nil {
		return false, fmt.Errorf("audit: %s (the newest rotated file, which the empty %s continues): %w", name, l.path, err)
	}
	if len(sum.Chains) != 1 || sum.Chains[0].Replica != l.replica {
		return false, &FieldError{Field: "replica", Reason: fmt.Sprintf("%s does not hold replica %q's chain alone", name, l.replica)}
	}
	h := sum.Chains[0]
	prev, _ := decodeHash(h.Hash) // Verify checked it
	l.seq, l.prev, l.durable, l.first = h.Seq, prev, h, h.Seq+1
	l.resume = true
	l.log.Warn("audit: the current file is empty after an interrupted rotation; continuing the chain from the newest rotated file",
		"path", l.path, "rotated", name, "seq", h.Seq)
	return true, nil
}
