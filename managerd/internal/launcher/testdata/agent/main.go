// Command agent is the launcher tests' agent: it reports, on its terminal, what the launcher gave
// it (credentials from /proc/self/status, session, working directory, environment, launch
// material) followed by every byte value, then blocks reading its terminal until it is signalled.
// "agent stubborn" ignores SIGTERM, so only SIGKILL ends it.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
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
