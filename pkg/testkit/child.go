package testkit

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
)

// StartChild re-executes the running test binary with no test selected (-test.run=^$) and env
// added to this process's environment, for a TestMain that runs a child's body instead of the
// tests when it finds its variable there (the helper-process pattern). It returns once the child
// has printed its first line on stdout, with that line (trimmed), and fails the test if none
// comes within wait. The child's stderr is this process's; it is killed and reaped at cleanup.
func StartChild(t testing.TB, wait time.Duration, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		return cmd, l
	case <-time.After(wait):
		t.Fatalf("testkit: the child process printed nothing within %v", wait)
		return nil, ""
	}
}

// WriteCredsFile writes a NATS creds file of userJWT and kp's seed, mode 0600 in a 0700 test
// directory, for a child process to connect with, and returns its path.
func WriteCredsFile(t testing.TB, userJWT string, kp nkeys.KeyPair) string {
	t.Helper()
	seed, err := creds.SeedFromKeyPair(kp)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Wipe()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "user.creds")
	if err := creds.WriteCreds(path, userJWT, seed); err != nil {
		t.Fatal(err)
	}
	return path
}
