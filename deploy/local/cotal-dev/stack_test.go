package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDevStackOnce runs `make run`'s stack end to end with --once: a real signerd binary as a
// child process, the embedded broker, the demo credential used and refused.
func TestDevStackOnce(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "signerd")
	build := exec.Command("go", "build", "-o", bin, "github.com/cotalgo/cotal/signerd")
	build.Env = append(os.Environ(), "GOTOOLCHAIN=auto")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build signerd: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, want := range []string{"signerd init:", "state:   reusing"} {
		var out bytes.Buffer
		if err := run(ctx, options{dir: dir, signerd: bin, space: "demo", natsPort: -1, once: true}, &out); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out.String())
		}
		s := out.String()
		for _, w := range []string{want, "minted:  agent demo.alice", "used:    published on cotal.demo.chat.demo.alice.general", "refused: the broker denied", "Permissions Violation"} {
			if !strings.Contains(s, w) {
				t.Fatalf("run %d output lacks %q:\n%s", i, w, s)
			}
		}
		if strings.Contains(s, "eyJ") || regexp.MustCompile(`S[OAUX][A-Z2-7]{56}`).MatchString(s) {
			t.Fatalf("run %d printed a JWT or seed:\n%s", i, s)
		}
	}
	audit, err := os.ReadFile(filepath.Join(dir, "audit", "signerd.audit"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(audit), `"decision":"granted"`); n < 2 {
		t.Fatalf("audit holds %d granted lines, want at least 2 (one mint per run)", n)
	}
}
