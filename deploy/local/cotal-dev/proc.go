package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cotalgo/cotal/pkg/daemon"
)

// childEnv is every child's whole environment: nothing of cotal-dev's own (no NOTIFY_SOCKET, no
// credentials a shell might hold) reaches a daemon.
var childEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/", "LANG=C.UTF-8"}

// child is one daemon process. Its stdout and stderr go, line by line, to its log file.
type child struct {
	name, log string
	cmd       *exec.Cmd
	exited    chan struct{}
	err       error
	// stop, when set, is how the stack stops it first (managerd: ManagerService Shutdown);
	// SIGTERM follows if it is still running.
	stop func(context.Context)

	mu      sync.Mutex
	waiters []waiter
}

type waiter struct {
	match func([]byte) bool
	ch    chan []byte
}

// startChild runs argv as a child in its own process group (a terminal's Ctrl-C reaches only
// cotal-dev, which stops the children in order), as cred when set, with the kernel sending it
// SIGTERM if cotal-dev dies first. Its stdout and stderr are its log file itself, not a pipe, so
// a child outlives a killed cotal-dev long enough to shut down cleanly (a write to a pipe with no
// reader would kill it with SIGPIPE); cotal-dev follows the file for the lines it waits for.
func (s *stack) startChild(name string, cred *syscall.Credential, argv ...string) (*child, error) {
	logPath := filepath.Join(s.l.logs, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- cotal-dev started %s at %s\n", name, time.Now().UTC().Format(time.RFC3339))
	from, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	follow, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	if _, err := follow.Seek(from, io.SeekStart); err != nil {
		follow.Close()
		return nil, err
	}
	c := &child{name: name, log: logPath, cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan struct{})}
	c.cmd.Env = childEnv
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM, Credential: cred}
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		follow.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s.children = append(s.children, c)
	waited := make(chan struct{})
	go func() {
		c.err = c.cmd.Wait()
		close(waited)
	}()
	go func() {
		c.follow(follow, waited)
		follow.Close()
		close(c.exited)
	}()
	return c, nil
}

// follow hands each complete line appended to the log to the waiters, polling at EOF, until
// the child has exited and the file is read to its end.
func (c *child) follow(r io.Reader, waited <-chan struct{}) {
	br := bufio.NewReaderSize(r, 64<<10)
	var partial []byte
	for {
		chunk, err := br.ReadBytes('\n')
		partial = append(partial, chunk...)
		if err == nil {
			c.offer(bytes.TrimSuffix(partial, []byte("\n")))
			partial = partial[:0]
			continue
		}
		select {
		case <-waited:
			// Exited: whatever is in the file now is all there will be.
			if len(partial) > 0 {
				c.offer(partial)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *child) offer(line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.match(line) {
			w.ch <- append([]byte(nil), line...)
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// watch returns a channel that receives the first later output line matching match.
func (c *child) watch(match func([]byte) bool) <-chan []byte {
	ch := make(chan []byte, 1)
	c.mu.Lock()
	c.waiters = append(c.waiters, waiter{match: match, ch: ch})
	c.mu.Unlock()
	return ch
}

// await waits for a line from ch, failing if the child exits, ctx ends or within passes.
func (c *child) await(ctx context.Context, ch <-chan []byte, what string, within time.Duration) ([]byte, error) {
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case line := <-ch:
		return line, nil
	case <-c.exited:
		return nil, fmt.Errorf("%s exited before %s (%v); see %s", c.name, what, c.err, c.log)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("%s: not %s after %v; see %s", c.name, what, within, c.log)
	}
}

func (c *child) running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// exitCode is the child's exit status once it exited (-1 for a signal).
func (c *child) exitCode() int {
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		return -1
	}
	return 0
}

// terminate stops the child: its own stop first when it has one, then SIGTERM, then SIGKILL
// after grace.
func (c *child) terminate(grace time.Duration) {
	if c.stop != nil && c.running() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		c.stop(ctx)
		cancel()
		select {
		case <-c.exited:
			return
		case <-time.After(grace):
		}
	}
	if c.running() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// leaseWait bounds how long a daemon's start is retried while the claim of a killed predecessor
// (an interrupted run) is still live: its TTL is 30 s (deliveryd's lease, authd's plane claim).
const leaseWait = 45 * time.Second

// startHeld starts a daemon with start, which returns the child and whether it is ready (or the
// error that stopped it). While the child exits refusing with heldCode in its refusal file
// (stateDir/refusalFile, naming its pid), a predecessor's claim has not expired yet: it says so
// once and starts the daemon again, until leaseWait has passed.
func (s *stack) startHeld(ctx context.Context, name, stateDir, refusalFile, heldCode string, start func() (*child, error)) (*child, error) {
	deadline := time.Now().Add(leaseWait)
	for said := false; ; {
		c, err := start()
		if err == nil {
			return c, nil
		}
		if c == nil || c.running() || !refusedWith(filepath.Join(stateDir, refusalFile), c.cmd.Process.Pid, heldCode) || time.Now().After(deadline) {
			return nil, err
		}
		s.drop(c)
		if !said {
			fmt.Fprintf(s.out, "%-10s the claim of an interrupted run is still live; starting again once it expires (at most %v)\n", name+":", leaseWait)
			said = true
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return nil, err
		}
	}
}

// refusedWith reports whether the refusal file at path names pid and code.
func refusedWith(path string, pid int, code string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var r daemon.Refusal
	return json.Unmarshal(b, &r) == nil && r.PID == pid && r.Code == code
}

// drop forgets an exited child (a start refused and retried).
func (s *stack) drop(c *child) {
	for i, x := range s.children {
		if x == c {
			s.children = append(s.children[:i], s.children[i+1:]...)
			return
		}
	}
}
