package api

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/managerd/internal/term"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// ptyTerminal is a real agent terminal (managerd's term.Terminal on a real PTY) with the process
// facts the Manager adds.
type ptyTerminal struct {
	*term.Terminal
	exited chan struct{}
}

func (p ptyTerminal) Exited() <-chan struct{} { return p.exited }
func (ptyTerminal) ExitCode() int32           { return -1 }

// ptyBackend is the fake Backend with real terminals.
type ptyBackend struct {
	*fakeBackend
	mu    sync.Mutex
	terms map[string]Terminal
}

func (b *ptyBackend) Terminal(name string) (Terminal, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.terms[name]
	if !ok {
		return nil, Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "no agent %s", name)
	}
	return t, nil
}

// startPTY runs script under /bin/sh on a real PTY, as the launcher starts an agent (its own
// session, the PTY its controlling terminal), until the test ends.
func startPTY(t *testing.T, script string) ptyTerminal {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TERM=dumb"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	tm, err := term.New(master, term.Options{})
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = tm.Close()
	})
	return ptyTerminal{Terminal: tm, exited: exited}
}

// returnsWithin runs f and fails the test when it has not returned after d.
func returnsWithin(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// outputHolds polls a terminal's output (snapshot and stream) until it holds want.
func outputHolds(t *testing.T, tm Terminal, want string) {
	t.Helper()
	snap, out, _, detach, err := tm.Attach()
	if err != nil {
		t.Fatal(err)
	}
	defer detach()
	got := bytes.Clone(snap)
	deadline := time.After(10 * time.Second)
	for !bytes.Contains(got, []byte(want)) {
		select {
		case p, ok := <-out:
			if !ok {
				t.Fatalf("output ended without %q: %q", want, got)
			}
			got = append(got, p...)
		case <-deadline:
			t.Fatalf("output never held %q: %q", want, got)
		}
	}
}

// TestInputAgentNotReading: with real PTYs and an agent that never reads its input, Input and
// Attach writes end at the call's deadline (or WriteTimeout) with DEADLINE_EXCEEDED instead of
// blocking for ever, and another agent's Input is served meanwhile.
func TestInputAgentNotReading(t *testing.T) {
	deaf := startPTY(t, "stty raw -echo; echo deaf; exec sleep 600")
	cat := startPTY(t, "stty raw -echo; echo ready; exec cat")
	outputHolds(t, deaf, "deaf")
	outputHolds(t, cat, "ready")
	b := &ptyBackend{fakeBackend: newFakeBackend(), terms: map[string]Terminal{"deaf": deaf, "cat": cat}}
	const writeTimeout = time.Second
	c, _ := startSocket(t, b, Options{AllowUIDs: []uint32{myUID()}, WriteTimeout: writeTimeout})
	chunk := bytes.Repeat([]byte("x"), MaxInputBytes)

	t.Run("fail/an Input with a deadline to an agent that does not read returns DEADLINE_EXCEEDED", func(t *testing.T) {
		// Fill the PTY: 64 KiB Inputs until one is not taken (the kernel buffers about 68 KiB).
		// The call's deadline is the earlier one.
		var err error
		for i := 0; i < 32 && err == nil; i++ {
			returnsWithin(t, 10*time.Second, "an Input with a deadline", func() {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				_, err = c.Input(ctx, &managerv1.InputRequest{Name: "deaf", Text: chunk})
			})
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Input to a full terminal = %v; want DEADLINE_EXCEEDED", err)
		}
	})
	t.Run("fail/an Input without a deadline ends at the write timeout, naming why", func(t *testing.T) {
		// A timed-out write may leave the PTY room for a few bytes: Input until one is not taken.
		var err error
		for i := 0; i < 32 && err == nil; i++ {
			returnsWithin(t, 10*time.Second, "an Input without a deadline", func() {
				_, err = c.Input(context.Background(), &managerv1.InputRequest{Name: "deaf", Text: chunk, Enter: true})
			})
		}
		st := status.Convert(err)
		if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "not reading its terminal") {
			t.Fatalf("Input = %v; want DEADLINE_EXCEEDED saying the agent is not reading", err)
		}
	})
	t.Run("ok/another agent's Input is served while this one is full", func(t *testing.T) {
		var err error
		returnsWithin(t, 10*time.Second, "an Input to another agent", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var ir *managerv1.InputResponse
			ir, err = c.Input(ctx, &managerv1.InputRequest{Name: "cat", Text: []byte("hello-cat")})
			if err == nil && ir.GetWritten() != 9 {
				t.Errorf("Input wrote %d bytes, want 9", ir.GetWritten())
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		outputHolds(t, cat, "hello-cat")
	})
	t.Run("fail/an Attach data frame the agent does not take ends the session with DEADLINE_EXCEEDED", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, snap := attachOpen(t, ctx, c, "deaf")
		if !bytes.Contains(snap, []byte("deaf")) {
			t.Fatalf("snapshot %q lacks the agent's output", snap)
		}
		if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Data{Data: chunk}}); err != nil {
			t.Fatal(err)
		}
		var err error
		returnsWithin(t, 10*time.Second, "an Attach session whose write is stuck", func() {
			for err == nil {
				_, err = s.Recv()
			}
		})
		st := status.Convert(err)
		if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "not reading its terminal") {
			t.Fatalf("Attach ended with %v; want DEADLINE_EXCEEDED saying the agent is not reading", err)
		}
	})
}
