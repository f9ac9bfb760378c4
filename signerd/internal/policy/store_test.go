package policy

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

const (
	storeV1 = `version: 1
callers:
  - id: spiffe://td/reader
    rpcs: [GetSpace]
    spaces: [alpha]
    rate: {per_second: 1, burst: 1}
`
	storeV2 = `version: 1
callers:
  - id: spiffe://td/reader
    rpcs: [GetSpace]
    spaces: [beta]
    rate: {per_second: 1, burst: 1}
`
)

var readAlpha = Request{Caller: "spiffe://td/reader", RPC: RPCGetSpace, Space: "alpha"}

func TestNewStoreNilDeniesEverything(t *testing.T) {
	s := NewStore(nil)
	if s.Current() == nil {
		t.Fatal("Current() is nil")
	}
	if d := s.Current().Decide(readAlpha); d.Allow || d.Reason != ReasonCallerUnknown {
		t.Errorf("empty store Decide = %+v", d)
	}
}

func TestStoreReloadFile(t *testing.T) {
	path := writeFile(t, storeV1, 0o600)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	if !s.Current().Decide(readAlpha).Allow {
		t.Fatal("v1 denies alpha")
	}

	for _, tc := range []struct {
		name  string
		write func()
		parts []string
	}{
		{"fail/invalid-yaml", func() { replaceFile(t, path, "version: [\n") }, []string{path}},
		{"fail/unknown-key", func() { replaceFile(t, path, storeV1+"extra: 1\n") }, []string{path, "extra", "unknown key"}},
		{"fail/world-writable", func() {
			replaceFile(t, path, storeV2)
			if err := os.Chmod(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}, []string{path, "mode 0666"}},
		{"fail/missing", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, []string{path}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.Current()
			tc.write()
			err := s.ReloadFile(path)
			wantErrContains(t, err, tc.parts...)
			if s.Current() != before {
				t.Error("an invalid file replaced the policy")
			}
			if !s.Current().Decide(readAlpha).Allow {
				t.Error("the old policy is no longer in force")
			}
		})
	}

	t.Run("ok/valid", func(t *testing.T) {
		replaceFile(t, path, storeV2)
		if err := s.ReloadFile(path); err != nil {
			t.Fatalf("ReloadFile: %v", err)
		}
		if s.Current().Decide(readAlpha).Allow {
			t.Error("v2 still allows alpha")
		}
		if !s.Current().Decide(Request{Caller: "spiffe://td/reader", RPC: RPCGetSpace, Space: "beta"}).Allow {
			t.Error("v2 denies beta")
		}
	})
}

// reloads collects onReload calls.
type reloads struct {
	mu   sync.Mutex
	errs []error
}

func (r *reloads) add(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *reloads) snapshot() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not synchronisation
	}
}

func TestStoreWatch(t *testing.T) {
	path := writeFile(t, storeV1, 0o600)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	var got reloads
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Watch(ctx, path, 5*time.Millisecond, got.add)
	}()
	t.Cleanup(func() { cancel(); <-done })

	// The file already is the current policy: no reload is reported. Touch it so the watcher
	// re-reads it and compares the hash.
	now := time.Now().Add(time.Second)
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}

	// An invalid file is reported and the old policy stays.
	replaceFile(t, path, storeV1+"bogus: true\n")
	waitFor(t, "the invalid file to be reported", func() bool { return len(got.snapshot()) == 1 })
	if errs := got.snapshot(); errs[0] == nil {
		t.Fatal("invalid file reported as a successful reload")
	} else {
		wantErrContains(t, errs[0], "bogus", path)
	}
	if !s.Current().Decide(readAlpha).Allow {
		t.Fatal("invalid file replaced the policy")
	}

	// A valid change is swapped in.
	replaceFile(t, path, storeV2)
	waitFor(t, "the valid file to be loaded", func() bool { return len(got.snapshot()) == 2 })
	if err := got.snapshot()[1]; err != nil {
		t.Fatalf("reload error: %v", err)
	}
	if s.Current().Decide(readAlpha).Allow {
		t.Fatal("new policy not in force")
	}

	// A removed file is reported once, and the policy stays.
	before := s.Current()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the missing file to be reported", func() bool { return len(got.snapshot()) == 3 })
	wantErrContains(t, got.snapshot()[2], path)
	if s.Current() != before {
		t.Fatal("missing file changed the policy")
	}

	// Restoring the same content as the policy in force reloads nothing.
	replaceFile(t, path, storeV2)
	// Then a real change is loaded; had the restore been reported, it would be the 4th entry.
	replaceFile(t, path, storeV1)
	waitFor(t, "the final change to be loaded", func() bool { return s.Current().Decide(readAlpha).Allow })
	waitFor(t, "the final reload to be reported", func() bool { return len(got.snapshot()) >= 4 })
	for i, err := range got.snapshot()[3:] {
		if err != nil {
			t.Errorf("reload %d: %v", 3+i, err)
		}
	}
}

func TestStoreWatchStopsOnCancel(t *testing.T) {
	path := writeFile(t, storeV1, 0o600)
	s := NewStore(nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var got reloads
	go func() {
		defer close(done)
		s.Watch(ctx, path, time.Hour, got.add)
	}()
	// The first check runs at once: the empty store differs from the file, so it loads.
	waitFor(t, "the initial load", func() bool { return s.Current().Decide(readAlpha).Allow })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
	if errs := got.snapshot(); len(errs) != 1 || errs[0] != nil {
		t.Errorf("reloads = %v, want one success", errs)
	}
}

// TestPolicyFileTrust is finding 7 of issue 7: the policy decides who may mint what, so Load
// (start) and every reload refuse a file that anyone but root or signerd's uid could rewrite,
// naming the offending path; a refused reload keeps the policy in force.
func TestPolicyFileTrust(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes the bad layout in dir (a 0700 directory holding the valid policy.yaml)
		// and returns the path signerd is configured with and the path the error must name.
		setup func(t *testing.T, dir string) (path, offender string)
		root  bool // needs root to chown to another uid
	}{
		{"fail/mode-0666", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "policy.yaml")
			chmod(t, p, 0o666)
			return p, p
		}, false},
		{"fail/group-writable-parent", func(t *testing.T, dir string) (string, string) {
			chmod(t, dir, 0o770)
			return filepath.Join(dir, "policy.yaml"), dir
		}, false},
		{"fail/symlink-to-foreign-owned-file", func(t *testing.T, dir string) (string, string) {
			theirs := filepath.Join(dir, "theirs.yaml")
			if err := os.WriteFile(theirs, []byte(storeV2), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(theirs, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "link.yaml")
			if err := os.Symlink(theirs, link); err != nil {
				t.Fatal(err)
			}
			return link, theirs
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown to another uid (CI runs as root)")
			}
			dir := filepath.Join(t.TempDir(), "etc")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			good := filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(good, []byte(storeV1), 0o600); err != nil {
				t.Fatal(err)
			}
			p, err := Load(good)
			if err != nil {
				t.Fatal(err)
			}
			s := NewStore(p)

			path, offender := tc.setup(t, dir)
			// At start.
			_, err = Load(path)
			wantErrContains(t, err, path, offender)
			// At reload, explicit (SIGHUP) and polled; the old policy stays.
			wantErrContains(t, s.ReloadFile(path), path, offender)
			var got reloads
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); s.Watch(ctx, path, 5*time.Millisecond, got.add) }()
			waitFor(t, "the refusal to be reported", func() bool { return len(got.snapshot()) > 0 })
			cancel()
			<-done
			wantErrContains(t, got.snapshot()[0], offender)
			if s.Current() != p {
				t.Fatal("a refused file replaced the policy")
			}
		})
	}
}

// TestStoreWatchRetriesRefusedFile: repairing a parent directory does not change the file's own
// stat, so Watch must retry a refused file rather than wait for the file to change.
func TestStoreWatchRetriesRefusedFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(storeV1), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore(p)
	chmod(t, dir, 0o777)
	replaceFile(t, path, storeV2)
	var got reloads
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(ctx, path, 5*time.Millisecond, got.add) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the refusal to be reported", func() bool { return len(got.snapshot()) == 1 })
	wantErrContains(t, got.snapshot()[0], dir)
	if s.Current() != p {
		t.Fatal("a refused file replaced the policy")
	}
	chmod(t, dir, 0o700)
	waitFor(t, "the repaired file to be loaded", func() bool { return !s.Current().Decide(readAlpha).Allow })
	if errs := got.snapshot(); len(errs) != 2 || errs[1] != nil {
		t.Fatalf("reports = %v, want [refusal, nil]", errs)
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
