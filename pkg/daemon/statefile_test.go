package daemon

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestStateFile: a state file is written 0600 and read back strictly; bad values are refused;
// another pid's refusal leaves it in place, while the writer's own refusal removes it.
func TestStateFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	t.Run("ok/write-and-read", func(t *testing.T) {
		for _, s := range []State{StateStarting, StateReady, StateUnavailable, StateStopped} {
			if err := WriteState(dir, "svc", 42, s); err != nil {
				t.Fatal(err)
			}
			got, err := ReadState(dir, "svc")
			if err != nil || got != (StateFile{Ver: FileVersion, PID: 42, State: s}) {
				t.Fatalf("ReadState = %+v, %v; want pid 42 %s", got, err, s)
			}
		}
		fi, err := os.Stat(DiscoveryPath(dir, "svc"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("state file mode = %v, %v; want 0600", fi, err)
		}
	})
	t.Run("fail/bad-values", func(t *testing.T) {
		for name, f := range map[string]func() error{
			"no pid":       func() error { return WriteState(dir, "svc", 0, StateReady) },
			"bad state":    func() error { return WriteState(dir, "svc", 1, "serving") },
			"path in name": func() error { return WriteState(dir, "../svc", 1, StateReady) },
		} {
			if err := f(); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}
		if err := os.WriteFile(DiscoveryPath(dir, "odd"), []byte(`{"ver":1,"pid":3,"state":"serving"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadState(dir, "odd"); err == nil {
			t.Fatal("ReadState accepted an unknown state")
		}
	})
	t.Run("ok/refusal-of-another-pid-keeps-it", func(t *testing.T) {
		if err := WriteState(dir, "svc", 42, StateReady); err != nil {
			t.Fatal(err)
		}
		if err := WriteRefusal(dir, "svc", Refusal{PID: 43, Code: "LEASE_HELD"}); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadState(dir, "svc"); err != nil || got.PID != 42 {
			t.Fatalf("state file after another pid's refusal = %+v, %v", got, err)
		}
		if err := ClearRefusal(dir, "svc"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(RefusalPath(dir, "svc")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("refusal file after ClearRefusal: %v", err)
		}
		if err := WriteRefusal(dir, "svc", Refusal{PID: 42, Code: "BIND"}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(DiscoveryPath(dir, "svc")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("own state file after own refusal: %v", err)
		}
	})
}
