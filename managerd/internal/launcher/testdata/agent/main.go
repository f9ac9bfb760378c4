// Command agent is the launcher tests' agent: it reports, on its terminal, what the launcher gave
// it (credentials from /proc/self/status, session, working directory, environment, launch
// material) followed by every byte value, then blocks reading its terminal until it is signalled.
// "agent stubborn" ignores SIGTERM, so only SIGKILL ends it. "agent escape" first leaves a
// descendant behind that the agent's process group and session do not hold: it starts itself
// in a new session ("orphan-parent"), which starts a grandchild in yet another session
// ("orphan", ignoring SIGTERM and SIGHUP) and exits (a double fork); the grandchild's line
// "orphan <pid>" is in the report.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	case "orphan-parent":
		orphanParent()
	case "orphan":
		signal.Ignore(syscall.SIGTERM, syscall.SIGHUP)
		fmt.Printf("orphan %d\n", os.Getpid())
		for {
			_ = unix.Pause()
		}
	}
	escaped := ""
	if mode == "escape" {
		out, err := selfCommand("orphan-parent").Output()
		if err != nil {
			fail(fmt.Errorf("orphan-parent: %v", err))
		}
		escaped = string(out)
	}
	// Output passes through the terminal unchanged (no \n → \r\n), so the reader sees it byte-exact.
	t, err := unix.IoctlGetTermios(1, unix.TCGETS)
	if err != nil {
		fail(err)
	}
	t.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(1, unix.TCSETS, t); err != nil {
		fail(err)
	}
	var b strings.Builder
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fail(err)
	}
	for _, line := range strings.SplitAfter(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:") || strings.HasPrefix(line, "Groups:") {
			b.WriteString(line)
		}
	}
	pid := os.Getpid()
	sid, _ := unix.Getsid(0)
	fg, _ := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	fmt.Fprintf(&b, "session-leader=%v pgrp-leader=%v controlling-tty=%v\n", sid == pid, unix.Getpgrp() == pid, fg == pid)
	wd, _ := os.Getwd()
	fmt.Fprintf(&b, "cwd=%s\n", wd)
	env := os.Environ()
	sort.Strings(env)
	for _, e := range env {
		fmt.Fprintf(&b, "env %s\n", e)
	}
	if p := os.Getenv("COTAL_LAUNCH_MATERIAL"); p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			fail(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			fail(err)
		}
		fmt.Fprintf(&b, "material %#o %d:%d %q\n", st.Mode&0o7777, st.Uid, st.Gid, data)
	}
	b.WriteString(escaped)
	b.WriteString("bytes:")
	for i := range 256 {
		b.WriteByte(byte(i))
	}
	b.WriteString("END\n")
	if _, err := io.WriteString(os.Stdout, b.String()); err != nil {
		fail(err)
	}
	// Wait on the terminal until a signal (or a hang-up) ends the process.
	r := bufio.NewReader(os.Stdin)
	for {
		if _, err := r.ReadString('\n'); err != nil {
			for {
				_ = unix.Pause()
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "agent: %v\n", err)
	os.Exit(1)
}

// selfCommand runs this program with one argument in a session of its own.
func selfCommand(arg string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(self, arg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// orphanParent starts the orphan, relays its first line and exits without waiting for it.
func orphanParent() {
	cmd := selfCommand("orphan")
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail(err)
	}
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		fail(err)
	}
	fmt.Print(line)
	os.Exit(0)
}
