package creds_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/creds"
)

// TestTrustedFile is finding 7 of issue 7: a client CA or policy file must be writable by no
// one but root or signerd's uid, along its whole path, symlink targets included.
func TestTrustedFile(t *testing.T) {
	tests := []struct {
		name string
		// setup builds the case under base (a 0755 directory) and returns the path to check
		// and the path the error must name.
		setup func(t *testing.T, base string) (path, offender string)
		want  any // nil, *creds.ModeError, *creds.OwnerError or *creds.TypeError
	}{
		{"ok/0644", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "ca.pem")
			writeFile(t, p, 0o644)
			return p, ""
		}, nil},
		{"ok/0400", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "ca.pem")
			writeFile(t, p, 0o400)
			return p, ""
		}, nil},
		{"ok/sticky-world-writable-parent", func(t *testing.T, b string) (string, string) {
			d := mkdirMode(t, b, "tmp", fs.ModeSticky|0o777)
			p := filepath.Join(d, "ca.pem")
			writeFile(t, p, 0o644)
			return p, ""
		}, nil},
		{"ok/symlink-to-trusted-target", func(t *testing.T, b string) (string, string) {
			target := filepath.Join(mkdirMode(t, b, "real", 0o755), "ca.pem")
			writeFile(t, target, 0o644)
			link := filepath.Join(b, "ca.pem")
			symlink(t, "real/ca.pem", link)
			return link, ""
		}, nil},
		{"ok/symlinked-parent", func(t *testing.T, b string) (string, string) {
			real := mkdirMode(t, b, "real", 0o755)
			writeFile(t, filepath.Join(real, "ca.pem"), 0o644)
			symlink(t, real, filepath.Join(b, "etc"))
			return filepath.Join(b, "etc", "..", "etc", "ca.pem"), ""
		}, nil},
		{"fail/mode-0666", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "ca.pem")
			writeFile(t, p, 0o666)
			return p, p
		}, &creds.ModeError{}},
		{"fail/mode-0620", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "ca.pem")
			writeFile(t, p, 0o620)
			return p, p
		}, &creds.ModeError{}},
		{"fail/group-writable-parent", func(t *testing.T, b string) (string, string) {
			d := mkdirMode(t, b, "pki", 0o775)
			p := filepath.Join(d, "ca.pem")
			writeFile(t, p, 0o644)
			return p, d
		}, &creds.ModeError{}},
		{"fail/group-writable-grandparent", func(t *testing.T, b string) (string, string) {
			d := mkdirMode(t, b, "etc", 0o770)
			p := filepath.Join(mkdirMode(t, d, "pki", 0o755), "ca.pem")
			writeFile(t, p, 0o644)
			return p, d
		}, &creds.ModeError{}},
		{"fail/symlink-to-world-writable-file", func(t *testing.T, b string) (string, string) {
			target := filepath.Join(b, "loose.pem")
			writeFile(t, target, 0o646)
			link := filepath.Join(b, "ca.pem")
			symlink(t, target, link)
			return link, target
		}, &creds.ModeError{}},
		{"fail/symlink-in-group-writable-dir", func(t *testing.T, b string) (string, string) {
			target := filepath.Join(b, "ca.pem")
			writeFile(t, target, 0o644)
			d := mkdirMode(t, b, "links", 0o775)
			link := filepath.Join(d, "ca.pem")
			symlink(t, target, link)
			return link, d
		}, &creds.ModeError{}},
		{"fail/directory", func(t *testing.T, b string) (string, string) {
			d := mkdirMode(t, b, "ca.pem", 0o755)
			return d, d
		}, &creds.TypeError{}},
		{"fail/parent-is-a-file", func(t *testing.T, b string) (string, string) {
			f := filepath.Join(b, "file")
			writeFile(t, f, 0o644)
			return filepath.Join(f, "ca.pem"), f
		}, &creds.TypeError{}},
		{"fail/symlink-loop", func(t *testing.T, b string) (string, string) {
			link := filepath.Join(b, "ca.pem")
			symlink(t, "ca.pem", link)
			return link, link
		}, errors.New("more than 40 symlinks")},
		{"fail/missing", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "nope.pem")
			return p, p
		}, fs.ErrNotExist},
		{"fail/foreign-owned-file", func(t *testing.T, b string) (string, string) {
			p := filepath.Join(b, "ca.pem")
			writeFile(t, p, 0o644)
			chownNobody(t, p)
			return p, p
		}, &creds.OwnerError{}},
		{"fail/symlink-to-foreign-owned-file", func(t *testing.T, b string) (string, string) {
			target := filepath.Join(b, "theirs.pem")
			writeFile(t, target, 0o644)
			chownNobody(t, target)
			link := filepath.Join(b, "policy.yaml")
			symlink(t, target, link)
			return link, target
		}, &creds.OwnerError{}},
		{"fail/foreign-owned-parent", func(t *testing.T, b string) (string, string) {
			d := mkdirMode(t, b, "theirs", 0o755)
			p := filepath.Join(d, "ca.pem")
			writeFile(t, p, 0o644)
			chownNobody(t, d)
			return p, d
		}, &creds.OwnerError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := mkdirMode(t, t.TempDir(), "base", 0o755)
			path, offender := tt.setup(t, base)
			resolved, _, err := creds.CheckTrustedFile(path)
			_, readErr := creds.ReadTrustedFile(path, 1<<10)
			for _, err := range []error{err, readErr} {
				if tt.want == nil {
					if err != nil {
						t.Fatalf("err = %v, want nil", err)
					}
					continue
				}
				checkTrustedErr(t, err, offender, tt.want)
			}
			if tt.want == nil {
				if fi, err := os.Lstat(resolved); err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("resolved %q is not a regular file (%v)", resolved, err)
				}
			}
		})
	}
}

func TestReadTrustedFile(t *testing.T) {
	base := mkdirMode(t, t.TempDir(), "base", 0o755)
	p := filepath.Join(base, "ca.pem")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := creds.ReadTrustedFile(p, 5)
	if err != nil || string(got) != "hello" {
		t.Fatalf("ReadTrustedFile = %q, %v; want hello", got, err)
	}
	if _, err := creds.ReadTrustedFile(p, 4); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("ReadTrustedFile over the limit: err = %v, want an error naming %s", err, p)
	}
}

// checkTrustedErr asserts err matches want and names offender.
func checkTrustedErr(t *testing.T, err error, offender string, want any) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %T for %s", want, offender)
	}
	switch w := want.(type) {
	case *creds.ModeError:
		var e *creds.ModeError
		if !errors.As(err, &e) || e.Path != offender || e.Mode&0o022 == 0 {
			t.Fatalf("err = %#v, want *ModeError for %s", err, offender)
		}
	case *creds.OwnerError:
		var e *creds.OwnerError
		if !errors.As(err, &e) || e.Path != offender || e.UID != nobody || !e.OrRoot {
			t.Fatalf("err = %#v, want *OwnerError{UID: %d} for %s", err, nobody, offender)
		}
	case *creds.TypeError:
		var e *creds.TypeError
		if !errors.As(err, &e) || e.Path != offender {
			t.Fatalf("err = %#v, want *TypeError for %s", err, offender)
		}
	case error:
		if !errors.Is(err, w) && !strings.Contains(err.Error(), w.Error()) {
			t.Fatalf("err = %v, want %v", err, w)
		}
	}
	if !strings.Contains(err.Error(), offender) {
		t.Fatalf("error %q does not name %s", err, offender)
	}
}

func mkdirMode(t *testing.T, base, name string, mode fs.FileMode) string {
	t.Helper()
	p := filepath.Join(base, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
