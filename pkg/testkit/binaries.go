package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Binaries are Go main packages a test binary builds once and runs as child processes (a daemon
// a test kills with SIGKILL has to be a real process). Declare one as a package variable, call
// Dir (or Build) from the tests, and Remove from TestMain after m.Run.
type Binaries struct {
	// Prefix names the temporary directory.
	Prefix string
	// Pkgs are the import paths to build. Each binary is named as `go build -o DIR/` names it:
	// the last path element, without a major-version suffix (github.com/nats-io/nats-server/v2
	// is nats-server).
	Pkgs []string

	once sync.Once
	dir  string
	err  error
}

// Build builds every package once, in one `go build` with GOTOOLCHAIN=auto, into a directory
// every user may read and enter (0755: the deployment proofs run some binaries as other users),
// and returns the directory. Later calls return the first call's result.
func (b *Binaries) Build() (string, error) {
	b.once.Do(func() {
		if len(b.Pkgs) == 0 {
			b.err = fmt.Errorf("testkit: Binaries %q names no package", b.Prefix)
			return
		}
		if b.dir, b.err = os.MkdirTemp("", b.Prefix); b.err != nil {
			return
		}
		if b.err = os.Chmod(b.dir, 0o755); b.err != nil {
			return
		}
		args := append([]string{"build", "-o", b.dir + string(os.PathSeparator)}, b.Pkgs...)
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=auto")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("testkit: go build %v: %v\n%s", b.Pkgs, err, out)
		}
	})
	return b.dir, b.err
}

// Dir is Build for a test: a failed build fails t.
func (b *Binaries) Dir(t testing.TB) string {
	t.Helper()
	dir, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Remove deletes the directory, if one was made.
func (b *Binaries) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
