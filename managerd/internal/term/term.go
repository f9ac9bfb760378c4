// Package term shares one agent's PTY master among managerd's attach sessions.
//
// One reader goroutine drains the master for the terminal's whole life, so the agent never
// stalls on its output whatever the viewers do: it keeps the last SnapshotBytes of output as the
// snapshot a late attach starts from, and hands every chunk to each subscriber through a bounded
// queue. A subscriber whose queue is full is cut off (its channel closed, lagged reporting true)
// rather than ever blocking the reader. Attach takes the snapshot and subscribes under the lock
// the reader appends under, so the snapshot followed by the stream is the output with no byte
// lost or repeated.
//
// Writes to the agent take the caller's context: a PTY whose agent stopped reading its input
// fills (the line discipline's buffer, a few KiB, then the kernel's), and a write without a bound
// would wait for ever and hold every later writer of that terminal behind it. Writers queue one at
// a time, each giving up at its own deadline or cancellation, having written what it could.
//
// The terminal knows nothing of the process behind it: Done closes when the master's read ends
// (EIO once every slave descriptor is closed, that is after the agent and everything that
// inherited its terminal have exited). Exit codes are the Manager's, which knows the process.
package term

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults.
const (
	// DefaultSnapshotBytes is the size of the recent-output ring.
	DefaultSnapshotBytes = 64 << 10
	// DefaultQueueLen is how many chunks a subscriber may have pending before it is cut off.
	DefaultQueueLen = 256
	// readBufferBytes is the most one read takes from the master (one chunk).
	readBufferBytes = 32 << 10
)

// ErrClosed is returned by Attach, Write and Resize after Close.
var ErrClosed = errors.New("term: terminal closed")

// Options are optional settings for New.
type Options struct {
	// SnapshotBytes is the ring's size; zero means DefaultSnapshotBytes.
	SnapshotBytes int
	// QueueLen is a subscriber's bound in chunks (one read of the master each, at most 32 KiB,
	// usually a few KiB: a viewer holds at most QueueLen × 32 KiB); zero means DefaultQueueLen.
	QueueLen int
}

// Terminal is a PTY master shared among attach sessions.
type Terminal struct {
	f        *os.File
	queueLen int
	done     chan struct{}
	readerWG sync.WaitGroup
	// writing is the write lock, a channel so a waiting writer can give up at its deadline; its
	// holder owns the descriptor's write deadline.
	writing chan struct{}

	mu sync.Mutex // guards everything below; the reader appends and fans out under it
	// ring is the recent output: ring[start:] then ring[:start] once full (len(ring) == cap).
	ring   []byte
	start  int
	subs   map[*subscriber]struct{}
	ended  bool // the master's read has ended: no more output
	closed bool // Close was called
}

type subscriber struct {
	ch     chan []byte
	lagged atomic.Bool
}

// New takes ownership of master and starts its reader. The master is re-opened as a
// non-blocking descriptor registered with Go's poller (a duplicate; master itself is closed), so
// Close always unblocks the reader: a master from pty.Open is in blocking mode, because reading
// its Fd switches it there.
func New(master *os.File, opts Options) (*Terminal, error) {
	if opts.SnapshotBytes < 0 || opts.QueueLen < 0 {
		return nil, fmt.Errorf("term: negative SnapshotBytes %d or QueueLen %d", opts.SnapshotBytes, opts.QueueLen)
	}
	if opts.SnapshotBytes == 0 {
		opts.SnapshotBytes = DefaultSnapshotBytes
	}
	if opts.QueueLen == 0 {
		opts.QueueLen = DefaultQueueLen
	}
	f, err := pollable(master)
	if err != nil {
		return nil, err
	}
	t := &Terminal{
		f: f, queueLen: opts.QueueLen, done: make(chan struct{}), writing: make(chan struct{}, 1),
		ring: make([]byte, 0, opts.SnapshotBytes), subs: map[*subscriber]struct{}{},
	}
	t.readerWG.Add(1)
	go t.read()
	return t, nil
}

// pollable duplicates master's descriptor (close-on-exec), sets it non-blocking and wraps it
// with os.NewFile, which registers a non-blocking descriptor with the poller; master is closed.
func pollable(master *os.File) (*os.File, error) {
	rc, err := master.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("term: master: %w", err)
	}
	dup := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("term: master: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("term: dup master: %w", derr)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("term: master: %w", err)
	}
	_ = master.Close()
	return os.NewFile(uintptr(dup), "pty-master"), nil
}

// read drains the master until its read fails, then ends every subscription.
func (t *Terminal) read() {
	defer t.readerWG.Done()
	buf := make([]byte, readBufferBytes)
	for {
		n, err := t.f.Read(buf)
		if n > 0 {
			t.publish(append([]byte(nil), buf[:n]...))
		}
		if err != nil {
			// EIO (every slave closed), EOF or the descriptor closed: no more output.
			break
		}
	}
	t.mu.Lock()
	t.ended = true
	for s := range t.subs {
		delete(t.subs, s)
		close(s.ch)
	}
	t.mu.Unlock()
	close(t.done)
}

// publish records chunk in the ring and queues it for every subscriber, cutting off any whose
// queue is full. The chunk is shared read-only among subscribers.
func (t *Terminal) publish(chunk []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.record(chunk)
	for s := range t.subs {
		select {
		case s.ch <- chunk:
		default:
			s.lagged.Store(true)
			delete(t.subs, s)
			close(s.ch)
		}
	}
}

// record appends p to the ring, keeping the last cap(ring) bytes. t.mu must be held.
func (t *Terminal) record(p []byte) {
	size := cap(t.ring)
	if len(p) >= size {
		t.ring = append(t.ring[:0], p[len(p)-size:]...)
		t.start = 0
		return
	}
	if room := size - len(t.ring); room > 0 {
		k := min(room, len(p))
		t.ring = append(t.ring, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 { // full: overwrite from start, wrapping
		k := copy(t.ring[t.start:], p)
		p = p[k:]
		t.start = (t.start + k) % size
	}
}

// snapshot copies the ring in order. t.mu must be held.
func (t *Terminal) snapshot() []byte {
	out := make([]byte, 0, len(t.ring))
	out = append(out, t.ring[t.start:]...)
	return append(out, t.ring[:t.start]...)
}

// Attach subscribes to the output: snapshot is the recent output (at most SnapshotBytes), out
// carries every later byte in order, and closes when the terminal ends or the subscriber fell a
// full queue behind (then lagged reports true). detach unsubscribes (idempotent). Once the
// terminal has ended, Attach still returns the snapshot, with out already closed. After Close it
// returns ErrClosed.
func (t *Terminal) Attach() (snapshot []byte, out <-chan []byte, lagged func() bool, detach func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, nil, nil, nil, ErrClosed
	}
	s := &subscriber{ch: make(chan []byte, t.queueLen)}
	snapshot = t.snapshot()
	if t.ended {
		close(s.ch)
	} else {
		t.subs[s] = struct{}{}
	}
	detach = func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, ok := t.subs[s]; ok {
			delete(t.subs, s)
			close(s.ch)
		}
	}
	return snapshot, s.ch, s.lagged.Load, detach, nil
}

// Write sends keystrokes to the agent. It waits for earlier writers of this terminal, then for
// the agent to take the bytes, at most until ctx is done: then it returns how many bytes it wrote
// (possibly some: the rest were never sent) and ctx's error (context.DeadlineExceeded or
// context.Canceled, wrapped). A ctx without a deadline waits as long as it is not cancelled. After
// Close it returns ErrClosed.
func (t *Terminal) Write(ctx context.Context, p []byte) (int, error) {
	if t.isClosed() {
		return 0, ErrClosed
	}
	if ctx.Err() != nil {
		return 0, fmt.Errorf("term: write: %w", context.Cause(ctx))
	}
	select {
	case t.writing <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("term: write: waiting for an earlier write: %w", context.Cause(ctx))
	}
	defer func() { <-t.writing }()
	deadline, _ := ctx.Deadline() // zero: none
	if err := t.f.SetWriteDeadline(deadline); err != nil {
		return 0, fmt.Errorf("term: write: %w", err)
	}
	// A cancellation wakes the blocked write through a deadline in the past. The lock is held
	// until that callback has finished, so it never cuts the next writer's write short.
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = t.f.SetWriteDeadline(time.Unix(1, 0))
		close(woke)
	})
	n, err := t.f.Write(p)
	if !stop() {
		<-woke
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The poller's deadline can fire a moment before ctx's own timer does.
		cause := context.Cause(ctx)
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return n, fmt.Errorf("term: write: the agent took %d of %d bytes: %w", n, len(p), cause)
	}
	return n, err
}

// Resize sets the terminal size (TIOCSWINSZ; the kernel sends the agent SIGWINCH). It issues
// the ioctl through the descriptor's raw connection rather than pty.Setsize, whose use of Fd
// would put the master back in blocking mode.
func (t *Terminal) Resize(rows, cols uint16) error {
	if t.isClosed() {
		return ErrClosed
	}
	if rows == 0 || cols == 0 {
		return fmt.Errorf("term: size %dx%d: rows and cols must be positive", rows, cols)
	}
	rc, err := t.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("term: resize: %w", err)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return fmt.Errorf("term: resize: %w", err)
	}
	if ierr != nil {
		return fmt.Errorf("term: resize: %w", ierr)
	}
	return nil
}

// Done is closed once the master's read has ended: the agent's side of the terminal is closed
// (it exited), or Close was called.
func (t *Terminal) Done() <-chan struct{} { return t.done }

// Close closes the master (which hangs the agent's terminal up), ends every subscription and
// waits for the reader. It is idempotent.
func (t *Terminal) Close() error {
	t.mu.Lock()
	already := t.closed
	t.closed = true
	t.mu.Unlock()
	var err error
	if !already {
		err = t.f.Close()
	}
	t.readerWG.Wait()
	return err
}

func (t *Terminal) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}
