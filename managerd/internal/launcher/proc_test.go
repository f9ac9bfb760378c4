package launcher

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sleeperEnv makes the re-executed test binary a process that says "ready" and then waits for a
// signal; "ignore" ignores SIGTERM first.
const sleeperEnv = "LAUNCHER_TEST_SLEEPER"

func sleeperMain(mode string) {
	if mode == "ignore" {
		signal.Ignore(syscall.SIGTERM)
	}
	os.Stdout.WriteString("ready\n")
	for {
		_ = unix.Pause()
	}
}

// startSleeper starts the test binary as a sleeper in its own process group and returns it as a
// Child once it is ready.
func startSleeper(t *testing.T, mode string) (Child, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{sleeperEnv + "=" + mode}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("sleeper: %q, %v", line, err)
	}
	st, err := ReadProcStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return Child{Pid: cmd.Process.Pid, StartTime: st.StartTime}, cmd
}

// TestTerminate (any user): Terminate ends a real child process by its group, with SIGTERM
// alone, or with SIGKILL after the grace when the child ignores SIGTERM, and returns only once
// Gone proves it gone from /proc (it is still unreaped: a zombie counts as gone).
func TestTerminate(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		grace      time.Duration
		killed     bool
	}{
		{"ok/sigterm", "term", 5 * time.Second, false},
		{"ok/sigkill-after-grace", "ignore", 100 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			child, _ := startSleeper(t, tc.mode)
			if gone, err := child.Gone(); gone || err != nil {
				t.Fatalf("running child: gone=%v err=%v", gone, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			killed, err := Terminate(ctx, child, tc.grace, nil)
			if err != nil {
				t.Fatal(err)
			}
			if killed != tc.killed {
				t.Fatalf("killed=%v, want %v", killed, tc.killed)
			}
			if gone, err := child.Gone(); !gone || err != nil {
				t.Fatalf("after Terminate: gone=%v err=%v", gone, err)
			}
			st, err := ReadProcStat(child.Pid)
			if err != nil || st.State != 'Z' {
				t.Fatalf("unreaped child: state %q, %v; want a zombie", st.State, err)
			}
			// A second Terminate of a gone child is a no-op.
			if killed, err := Terminate(ctx, child, tc.grace, nil); killed || err != nil {
				t.Fatalf("second Terminate: %v, %v", killed, err)
			}
		})
	}
}

// TestGone (any user): a live process with another start time (a reused pid) is gone, as is a
// pid no process has; this process with its own start time is not.
func TestGone(t *testing.T) {
	st, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if gone, err := (Child{Pid: os.Getpid(), StartTime: st.StartTime}).Gone(); gone || err != nil {
		t.Fatalf("self: gone=%v err=%v", gone, err)
	}
	if gone, err := (Child{Pid: os.Getpid(), StartTime: st.StartTime + 1}).Gone(); !gone || err != nil {
		t.Fatalf("self with another start time: gone=%v err=%v", gone, err)
	}
	if _, err := ReadProcStat(1 << 30); err != ErrNoProcess { // above any pid_max (at most 2^22)
		t.Fatalf("ReadProcStat of an impossible pid: %v", err)
	}
	if gone, err := (Child{Pid: 1 << 30, StartTime: 1}).Gone(); !gone || err != nil {
		t.Fatalf("no such pid: gone=%v err=%v", gone, err)
	}
}
