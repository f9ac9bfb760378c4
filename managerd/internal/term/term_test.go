package term

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/cotalgo/cotal/managerd/internal/api"
)

// The tests run real children on real PTYs: /bin/sh, or this test binary re-executed with
// childEnv set (flowChild).
const childEnv = "TERM_TEST_CHILD"

const (
	flowBlocks    = 128
	flowBlockSize = 4 << 10
	flowQueue     = 64
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "flow" {
		flowChild()
		return
	}
	os.Exit(m.Run())
}

// block is the deterministic content of flow block i: every byte value, pseudo-random.
func block(i int) []byte {
	var seed [32]byte
	binary.BigEndian.PutUint64(seed[:], uint64(i)+1)
	r := rand.NewChaCha8(seed)
	b := make([]byte, flowBlockSize)
	_, _ = r.Read(b)
	return b
}

func flowTotal() []byte {
	var all []byte
	for i := range flowBlocks {
		all = append(all, block(i)...)
	}
	return all
}

// flowChild puts its terminal in raw mode (no echo, no output processing), then writes the flow
// blocks, waiting for one byte of input (an ack) after each but the last: its output never runs
// more than a block ahead of the test's fast reader.
func flowChild() {
	tio, err := unix.IoctlGetTermios(0, unix.TCGETS)
	if err != nil {
		os.Exit(2)
	}
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(0, unix.TCSETS, tio); err != nil {
		os.Exit(2)
	}
	ack := make([]byte, 1)
	for i := range flowBlocks {
		if _, err := os.Stdout.Write(block(i)); err != nil {
			os.Exit(3)
		}
		if i < flowBlocks-1 {
			if _, err := os.Stdin.Read(ack); err != nil {
				os.Exit(4)
			}
		}
	}
	os.Exit(0)
}

// start runs argv on a new PTY (its own session, the PTY its controlling terminal) and returns
// the shared terminal and the running command; the test's cleanup closes the terminal and waits.
func start(t *testing.T, opts Options, env []string, argv ...string) (*Terminal, *exec.Cmd) {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "TERM=dumb"}, env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close() // the child holds the only slave descriptors: its exit ends the master's read
	term, err := New(master, opts)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = term.Close()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
			t.Errorf("child %v did not exit after the terminal closed", argv)
		}
	})
	return term, cmd
}

// collector accumulates a subscription's stream.
type collector struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	closed chan struct{}
}

func collect(snapshot []byte, out <-chan []byte) *collector {
	c := &collector{closed: make(chan struct{})}
	c.buf.Write(snapshot)
	go func() {
		for chunk := range out {
			c.mu.Lock()
			c.buf.Write(chunk)
			c.mu.Unlock()
		}
		close(c.closed)
	}()
	return c
}

func (c *collector) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

// waitFor polls until the stream holds want.
func (c *collector) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Contains(c.bytes(), []byte(want)) {
		if time.Now().After(deadline) {
			t.Fatalf("terminal output never held %q; got %q", want, c.bytes())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not closed", what)
	}
}

// TestStream: a fast subscriber (attached from the start) gets the child's 512 KiB byte-exact
// across its snapshot and stream and is never cut off; a subscriber that never reads is cut off
// (lagged, its channel closed after at most QueueLen chunks) without slowing the child; a late
// attach made while the child is writing gets a full snapshot whose concatenation with its
// stream is exactly the tail of the output (nothing lost or repeated at the seam).
//
// The child writes one 4 KiB block per ack and the test acks a block once every reading
// subscriber has it, so a reader's queue never holds more than one block's chunks (no reader but
// the idle one can be cut off), while the idle one receives at least one chunk per block, 128 in
// all, over its queue of 64.
func TestStream(t *testing.T) {
	const snap = 16 << 10
	term, _ := start(t, Options{SnapshotBytes: snap, QueueLen: flowQueue}, []string{childEnv + "=flow"}, os.Args[0])
	want := flowTotal()

	fastSnap, fastOut, fastLagged, fastDetach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer fastDetach()
	_, slowOut, slowLagged, slowDetach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer slowDetach()

	got := bytes.Clone(fastSnap)
	var (
		lateSnap, late []byte
		lateOut        <-chan []byte
		lateLagged     func() bool
		lateBase       = -1 // the output offset the late snapshot starts at
		lateDone       bool
		lateDetach     func()
	)
	defer func() {
		if lateDetach != nil {
			lateDetach()
		}
	}()
	acked := 0
	// ack sends the child every ack its output so far has earned (all of block 0 may already be
	// in the fast subscriber's snapshot, with nothing more coming until it is acked).
	ack := func() {
		for acked < flowBlocks-1 {
			need := (acked + 1) * flowBlockSize
			if len(got) < need || (lateBase >= 0 && !lateDone && lateBase+len(late) < need) {
				break
			}
			if _, err := term.Write(context.Background(), []byte{'k'}); err != nil {
				t.Fatalf("ack %d: %v", acked, err)
			}
			acked++
			if acked == 20 {
				// The child is writing block 20 now: attach concurrently with the reader.
				lateSnap, lateOut, lateLagged, lateDetach, err = term.Attach()
				if err != nil {
					t.Fatal(err)
				}
				late = bytes.Clone(lateSnap)
				if lateBase = bytes.Index(want, lateSnap); lateBase < 0 {
					t.Fatalf("late snapshot of %d bytes is not in the output", len(lateSnap))
				}
			}
		}
	}
	for ack(); fastOut != nil || (lateOut != nil && !lateDone); ack() {
		select {
		case <-time.After(20 * time.Second):
			t.Fatalf("no output for 20 s: %d bytes read, %d blocks acked (the child waits for an ack, or the reader for output)", len(got), acked)
		case chunk, ok := <-fastOut:
			if !ok {
				fastOut = nil
				continue
			}
			got = append(got, chunk...)
		case chunk, ok := <-lateOut:
			if !ok {
				lateDone = true
				lateOut = nil
				continue
			}
			late = append(late, chunk...)
		}
	}
	if fastLagged() {
		t.Fatal("the fast subscriber was cut off")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("fast subscriber: %d bytes, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	waitClosed(t, "Done", term.Done())

	n := 0
	for range slowOut {
		n++
	}
	if !slowLagged() {
		t.Fatal("the subscriber that never read was not cut off")
	}
	if n > flowQueue {
		t.Fatalf("the cut-off subscriber held %d chunks, over its queue of %d", n, flowQueue)
	}

	if lateLagged == nil || lateLagged() {
		t.Fatal("the late subscriber was not attached or was cut off")
	}
	if len(lateSnap) != snap {
		t.Fatalf("late snapshot of %d bytes, want the full ring of %d (20 blocks were out)", len(lateSnap), snap)
	}
	if lateBase+len(late) != len(want) || !bytes.Equal(late, want[lateBase:]) {
		t.Fatalf("late snapshot+stream (%d bytes from offset %d) is not the tail of the output (%d bytes)", len(late), lateBase, len(want))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestInputAndResize: keystrokes written to the terminal reach the child (its shell reads the
// line), and a resize is what the child's stty reports.
func TestInputAndResize(t *testing.T) {
	term, _ := start(t, Options{}, nil, "/bin/sh", "-c", `read x; echo "got:$x"; read y; stty size; read z`)
	snap, out, _, detach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer detach()
	c := collect(snap, out)
	if _, err := term.Write(context.Background(), []byte("hello-terminal\n")); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "got:hello-terminal")
	if err := term.Resize(33, 101); err != nil {
		t.Fatal(err)
	}
	if _, err := term.Write(context.Background(), []byte("\n")); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "33 101")
	if err := term.Resize(0, 80); err == nil {
		t.Fatal("a zero size was accepted")
	}
}

// TestDone: after the child exits, Done closes and every subscription ends without lag; a later
// Attach still gets the snapshot, with its stream already closed. After Close, Attach, Write and
// Resize refuse with ErrClosed.
func TestDone(t *testing.T) {
	term, cmd := start(t, Options{}, nil, "/bin/sh", "-c", `read x; printf 'bye-%s' "$x"`)
	snap, out, lagged, _, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	c := collect(snap, out)
	if _, err := term.Write(context.Background(), []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, "Done", term.Done())
	waitClosed(t, "the subscription", c.closed)
	if lagged() {
		t.Fatal("a subscription ended by the child's exit reports lagged")
	}
	if !bytes.HasSuffix(c.bytes(), []byte("bye-now")) {
		t.Fatalf("output %q does not end with bye-now", c.bytes())
	}
	// The master's read ends once the child closed the slave, as it exits (just before it
	// becomes a zombie).
	waitGone(t, cmd.Process.Pid)
	s2, out2, lagged2, detach2, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(s2, []byte("bye-now")) {
		t.Fatalf("snapshot after the end %q", s2)
	}
	if _, ok := <-out2; ok || lagged2() {
		t.Fatal("a subscription after the end is open or lagged")
	}
	detach2()
	detach2() // idempotent

	if err := term.Close(); err != nil {
		t.Fatal(err)
	}
	if err := term.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, _, _, err := term.Attach(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Attach after Close: %v", err)
	}
	if _, err := term.Write(context.Background(), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if err := term.Resize(24, 80); !errors.Is(err, ErrClosed) {
		t.Fatalf("Resize after Close: %v", err)
	}
}

// processGone reports whether pid is gone or a zombie.
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// TestClose: Close ends a live terminal at once (the reader unblocks although the child still
// runs), closes its subscriptions without lag, and hangs the child up (SIGHUP ends the shell).
func TestClose(t *testing.T) {
	term, cmd := start(t, Options{}, nil, "/bin/sh", "-c", `echo started; read x`)
	snap, out, lagged, detach, err := term.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer detach()
	c := collect(snap, out)
	c.waitFor(t, "started")
	if err := term.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, "Done", term.Done())
	waitClosed(t, "the subscription", c.closed)
	if lagged() {
		t.Fatal("a subscription ended by Close reports lagged")
	}
	waitGone(t, cmd.Process.Pid)
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRing: the ring keeps exactly the last SnapshotBytes across writes smaller than, equal to
// and larger than it, and across the wrap.
func TestRing(t *testing.T) {
	tm := &Terminal{ring: make([]byte, 0, 10)}
	var all []byte
	for i, n := range []int{3, 4, 5, 10, 1, 23, 7, 9, 2} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		for j := range p {
			p[j] += byte(j % 2) // not uniform within a write
		}
		all = append(all, p...)
		tm.record(p)
		want := all[max(0, len(all)-10):]
		if got := tm.snapshot(); !bytes.Equal(got, want) {
			t.Fatalf("after write %d: ring %q, want %q", i, got, want)
		}
	}
}

// withExit is a Terminal with the process facts the Manager adds; it satisfies api.Terminal, so
// Attach, Write and Resize have exactly the interface's signatures.
type withExit struct {
	*Terminal
	exited chan struct{}
}

func (w withExit) Exited() <-chan struct{} { return w.exited }
func (w withExit) ExitCode() int32         { return -1 }

var _ api.Terminal = withExit{}

func TestOptions(t *testing.T) {
	if _, err := New(nil, Options{SnapshotBytes: -1}); err == nil {
		t.Fatal("negative SnapshotBytes accepted")
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := New(f, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	if cap(tm.ring) != DefaultSnapshotBytes || tm.queueLen != DefaultQueueLen {
		t.Fatalf("defaults: ring %d, queue %d", cap(tm.ring), tm.queueLen)
	}
	waitClosed(t, "Done on EOF", tm.Done())

}
