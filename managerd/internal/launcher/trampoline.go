package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// TrampolineArg is argv[1] of the launcher's own binary re-executed as an agent's trampoline
// (`managerd launcher-exec UID GID -- ARGV...`). Go's os/exec can change the uid in the child
// but cannot empty the capability bounding set nor set PR_SET_NO_NEW_PRIVS between fork and exec,
// so the launcher execs itself (/proc/self/exe) as root, already in the agent's cgroup, session and
// terminal, and this trampoline drops everything and execs the connector. It is not a door: it
// runs only what its own (root) caller tells it, and only ever lowers privilege.
const TrampolineArg = "launcher-exec"

// statusFD is the trampoline's status pipe (the launcher's ExtraFiles[0]): the trampoline writes
// its start time (8 bytes, big-endian, field 22 of /proc/self/stat: exec keeps it), then either
// execs (the pipe is close-on-exec, so the launcher reads EOF: started) or writes why it failed
// and exits 127.
const statusFD = 3

// Trampoline is the agent process's last step as root: args are UID GID -- ARGV... . In order it
// marks every descriptor above 2 close-on-exec (nothing the launcher holds, nor anything its
// starter left open, reaches the agent), sets no supplementary group and the gid, empties the
// capability bounding set (needs CAP_SETPCAP), clears the ambient set, sets the uid (all of
// real, effective, saved), clears the inheritable set, sets PR_SET_NO_NEW_PRIVS, checks
// /proc/self/status says so, and execs ARGV with the environment it was given. It returns only on
// failure (exit code 127), after writing the cause to the status pipe.
func Trampoline(args []string) int {
	// The bounding set and no_new_privs are per thread: every step and the exec run on this one.
	runtime.LockOSThread()
	status := os.NewFile(statusFD, "launcher-status")
	fail := func(err error) int {
		fmt.Fprintf(status, "launcher-exec: %v", err)
		return 127
	}
	if err := unix.CloseRange(statusFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fail(fmt.Errorf("close_range: %w", err))
	}
	if len(args) < 4 || args[2] != "--" {
		return fail(errors.New("usage: launcher-exec UID GID -- PROGRAM [ARG]"))
	}
	uid, err1 := strconv.ParseUint(args[0], 10, 32)
	gid, err2 := strconv.ParseUint(args[1], 10, 32)
	if err1 != nil || err2 != nil || uid == 0 || gid == 0 {
		return fail(fmt.Errorf("uid %q gid %q: not a non-root id", args[0], args[1]))
	}
	argv := args[3:]
	st, err := ReadProcStat(os.Getpid())
	if err != nil {
		return fail(fmt.Errorf("own start time: %w", err))
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], st.StartTime)
	if _, err := status.Write(b[:]); err != nil {
		return 127
	}
	if err := dropPrivileges(int(uid), int(gid)); err != nil {
		return fail(err)
	}
	err = unix.Exec(argv[0], argv, os.Environ())
	return fail(fmt.Errorf("exec %s: %w", argv[0], err))
}

// dropPrivileges leaves the calling thread as uid:gid with no supplementary group, no capability
// in any set, the bounding set empty and no_new_privs set, and proves it from /proc/self/status.
func dropPrivileges(uid, gid int) error {
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setresgid %d: %w", gid, err)
	}
	for c := 0; c < 64; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) { // past the kernel's last capability
				break
			}
			return fmt.Errorf("emptying the capability bounding set (cap %d; the launcher needs CAP_SETPCAP): %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	// From root to a non-zero uid in all three ids: the kernel clears the permitted and
	// effective sets.
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
	}
	return checkDropped(uid, gid)
}

// checkDropped reads /proc/self/status (this thread's view) and refuses unless every uid and gid
// field is the agent's, no supplementary group is left, every capability set is empty and
// NoNewPrivs is 1.
func checkDropped(uid, gid int) error {
	data, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return fmt.Errorf("reading status: %w", err)
	}
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	want := map[string]string{
		"Uid": strings.Join([]string{u, u, u, u}, "\t"), "Gid": strings.Join([]string{g, g, g, g}, "\t"),
		"Groups": "", "CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	}
	seen := 0
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		w, check := want[k]
		if !ok || !check {
			continue
		}
		if strings.TrimSpace(v) != w {
			return fmt.Errorf("after dropping privileges %s is %q, want %q", k, strings.TrimSpace(v), w)
		}
		seen++
	}
	if seen != len(want) {
		return fmt.Errorf("status shows %d of the %d checked fields", seen, len(want))
	}
	return nil
}

// CloseInheritedFDs closes every descriptor above 2 that this process inherited from whoever
// started it (those without close-on-exec: everything Go opens itself has it), so that nothing
// its starter left open (a root-only file, a socket) reaches an agent. `managerd launcher` calls
// it first thing; the trampoline's close-on-exec sweep is a second line. It returns the numbers
// it closed.
func CloseInheritedFDs() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing /proc/self/fd: %w", err)
	}
	var closed []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue // gone already (the directory's own descriptor), or Go's own
		}
		if err := unix.Close(fd); err != nil {
			return closed, fmt.Errorf("closing inherited descriptor %d: %w", fd, err)
		}
		closed = append(closed, fd)
	}
	return closed, nil
}
