package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
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
// SIGTERM if cotal-dev dies first.
func (s *stack) startChild(name string, cred *syscall.Credential, argv ...string) (*child, error) {
	logPath := filepath.Join(s.l.logs, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	c := &child{name: name, log: logPath, cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan struct{})}
	c.cmd.Env = childEnv
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM, Credential: cred}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	c.cmd.Stdout, c.cmd.Stderr = pw, pw
	fmt.Fprintf(logf, "---- cotal-dev started %s at %s\n", name, time.Now().UTC().Format(time.RFC3339))
	if err := c.cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()
	s.children = append(s.children, c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.scan(pr, logf)
	}()
	go func() {
		c.err = c.cmd.Wait()
		<-done
		pr.Close()
		logf.Close()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) scan(r io.Reader, logf io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		fmt.Fprintf(logf, "%s\n", line)
		c.mu.Lock()
		kept := c.waiters[:0]
		for _, w := range c.waiters {
			if w.match(line) {
				w.ch <- append([]byte(nil), line...)
			} else {
				kept = append(kept, w)
			}
		}
		c.waiters = kept
		c.mu.Unlock()
	}
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
