package launcher

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Containment: each agent runs in a cgroup v2 of its own, <parent>/cotal-agent-<uid>, which its
// process enters at clone (CLONE_INTO_CGROUP, so there is no moment it runs outside) and can
// never leave (the cgroup files are root's; moving a process needs write access to the target's
// cgroup.procs). Stop's SIGKILL is cgroup.kill, which reaches every process of the cgroup, one
// that called setsid or double-forked included, and "populated 0" in cgroup.events proves them
// all gone. A PID namespace per agent was the alternative: it would make the agent pid 1 of its
// namespace (which ignores signals it has no handler for, so SIGTERM would no longer stop an
// agent that did not ask for it), it needs CLONE_NEWPID, which the unit's RestrictNamespaces=
// forbids, and it proves emptiness only through the init's death, not by a file the launcher can
// read at any time.

// cgroupPrefix names an agent's cgroup: cotal-agent-<uid>. The uid makes the name unique among
// launchers whose ranges do not overlap, and ties the uid's release to the cgroup's removal.
const cgroupPrefix = "cotal-agent-"

// cgroupDir is the cgroup of the agent running as uid.
func cgroupDir(parent string, uid uint32) string {
	return filepath.Join(parent, cgroupPrefix+strconv.FormatUint(uint64(uid), 10))
}

// ownCgroup is this process's cgroup v2 directory: the "0::" line of /proc/self/cgroup under the
// cgroup2 mount of /proc/self/mountinfo.
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var rel string
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel, found = p, true
		}
	}
	if !found {
		return "", errors.New("/proc/self/cgroup has no cgroup v2 (0::) line")
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(mi))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		f := strings.Fields(sc.Text())
		sep := -1
		for i, v := range f {
			if v == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(f) || f[sep+1] != "cgroup2" {
			continue
		}
		root, mnt := unescapeMount(f[3]), unescapeMount(f[4])
		r, err := filepath.Rel(root, rel)
		if err != nil || strings.HasPrefix(r, "..") {
			continue
		}
		return filepath.Join(mnt, r), nil
	}
	return "", errors.New("no cgroup2 file system is mounted (/proc/self/mountinfo)")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// prepareCgroupParent resolves the agents' cgroup parent (configured, or the launcher's own) and
// proves it usable: on a cgroup2 file system, and writable, with cgroup.kill and cgroup.events in
// a child it makes and removes again. It refuses otherwise, naming what is missing.
func prepareCgroupParent(configured string) (string, error) {
	parent := configured
	if parent == "" {
		own, err := ownCgroup()
		if err != nil {
			return "", fmt.Errorf("launcher: containment needs cgroup v2 and the launcher's own cgroup could not be found: %w (set cgroup_parent)", err)
		}
		parent = own
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(parent, &sfs); err != nil {
		return "", fmt.Errorf("launcher: cgroup_parent %s: %w (containment needs a cgroup v2 directory)", parent, err)
	}
	if sfs.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("launcher: cgroup_parent %s is not on a cgroup2 file system (containment needs cgroup v2; no fallback)", parent)
	}
	probe := filepath.Join(parent, ".cotal-probe-"+randSuffix())
	if err := unix.Mkdir(probe, 0o755); err != nil {
		return "", fmt.Errorf("launcher: cgroup_parent %s: cannot make a child cgroup: %w (under systemd the unit needs Delegate=yes and no ProtectControlGroups=)", parent, err)
	}
	defer unix.Rmdir(probe)
	for _, f := range []string{"cgroup.kill", "cgroup.events", "cgroup.procs"} {
		if _, err := os.Stat(filepath.Join(probe, f)); err != nil {
			return "", fmt.Errorf("launcher: cgroup_parent %s: a child cgroup has no %s (containment needs Linux 5.14 or later): %w", parent, f, err)
		}
	}
	return parent, nil
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x", b)
}

// makeCgroup makes the agent's cgroup and opens it for CLONE_INTO_CGROUP. An existing one is
// refused: its uid is not free (another launcher's agent, or one not yet proven gone).
func makeCgroup(dir string) (int, error) {
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return -1, err
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		_ = unix.Rmdir(dir)
		return -1, err
	}
	return fd, nil
}

// killCgroup sends SIGKILL to every process of the cgroup at once (cgroup.kill): none can fork
// away meanwhile, none can leave it.
func killCgroup(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
}

// cgroupPopulated reads "populated" from cgroup.events: whether any live process is in the cgroup
// or below it.
func cgroupPopulated(dir string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return v != "0", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no populated line", dir)
}

// drainCgroup kills every process of the cgroup, waits until cgroup.events says populated 0
// (polling, until ctx ends) and removes the cgroup. It returns nil only once the cgroup is proven
// empty and gone; a missing cgroup is already gone.
func drainCgroup(ctx context.Context, dir string) error {
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		pop, err := cgroupPopulated(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !pop {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				return nil
			}
			if !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("removing %s: %w", dir, err)
			}
		} else if err := killCgroup(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup.kill in %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s not proven empty: %w", dir, ctx.Err())
		case <-tick.C:
		}
	}
}

// drainLeftovers drains every agent cgroup of the range a predecessor left under parent (its
// agents, or their descendants, still running): a uid is handed out only once nothing runs as it.
func drainLeftovers(ctx context.Context, parent string, r UIDRange) ([]string, error) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil, err
	}
	var drained []string
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), cgroupPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		uid, err := strconv.ParseUint(n, 10, 32)
		if err != nil || !r.Contains(uint32(uid)) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if err := drainCgroup(ctx, dir); err != nil {
			return drained, fmt.Errorf("launcher: a predecessor's agent cgroup: %w", err)
		}
		drained = append(drained, dir)
	}
	return drained, nil
}
