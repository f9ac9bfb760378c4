package testkit

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// SyncBuffer is an io.Writer that several goroutines may write to at once (a child process's
// stdout and stderr, a logger), read with String.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// AddUser creates a throwaway system user with a group of its own (useradd -r -M -U, a random
// cotal<hex> name), removed at the test's cleanup, and returns its uid and gid; it needs root.
// Without useradd it returns fallback for both, an id with no passwd entry (enough for a
// process credential), and logs that; a zero fallback skips the test instead.
func AddUser(t testing.TB, fallback uint32) (uid, gid uint32) {
	t.Helper()
	if _, err := exec.LookPath("useradd"); err != nil {
		if fallback == 0 {
			t.Skip("useradd not found: this test needs real users")
		}
		t.Logf("useradd not found: using uid/gid %d without a passwd entry", fallback)
		return fallback, fallback
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "cotal" + hex.EncodeToString(b)
	if out, err := exec.Command("useradd", "-r", "-M", "-U", "-s", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	ui, _ := strconv.ParseUint(u.Uid, 10, 32)
	gi, _ := strconv.ParseUint(u.Gid, 10, 32)
	return uint32(ui), uint32(gi)
}

// ProcUIDs is the four fields of the Uid: line of /proc/<pid>/status (real, effective, saved,
// filesystem).
func ProcUIDs(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("/proc/%d/status has no Uid: line", pid)
	return nil
}
