package testkit_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

func TestBinaries(t *testing.T) {
	t.Run("ok/built-once-named-by-package", func(t *testing.T) {
		b := testkit.Binaries{Prefix: "testkit-binaries-", Pkgs: []string{"github.com/cotalgo/cotal/examples/connect"}}
		dir := b.Dir(t)
		again, err := b.Build()
		if err != nil || again != dir {
			t.Fatalf("second Build = %q, %v; want %q", again, err, dir)
		}
		fi, err := os.Stat(filepath.Join(dir, "connect"))
		if err != nil || fi.Mode()&0o111 == 0 {
			t.Fatalf("built binary: %v, mode %v", err, fi.Mode())
		}
		if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o755 {
			t.Fatalf("directory mode %v, %v; want 0755", di.Mode().Perm(), err)
		}
		b.Remove()
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("after Remove: %v", err)
		}
	})
	t.Run("fail/unknown-package", func(t *testing.T) {
		b := testkit.Binaries{Prefix: "testkit-binaries-", Pkgs: []string{"github.com/cotalgo/cotal/no/such/package"}}
		defer b.Remove()
		if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "no/such/package") {
			t.Fatalf("Build = %v; want an error naming the package", err)
		}
	})
	t.Run("fail/no-package", func(t *testing.T) {
		var b testkit.Binaries
		if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "names no package") {
			t.Fatalf("Build = %v; want a refusal", err)
		}
	})
}
