package creds_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
)

const nobody = 65534

// privateDir returns a fresh 0700 directory owned by the test's uid.
func privateDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "secrets")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func writeFile(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // WriteFile applies the umask
		t.Fatal(err)
	}
}

func chownNobody(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown to another uid")
	}
	if err := os.Lchown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

func TestCheckSecretFile(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string
		want  any // nil, *creds.ModeError, *creds.OwnerError, *creds.TypeError, or fs.ErrNotExist
	}{
		{"ok/0600", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o600)
			return p
		}, nil},
		{"ok/0400", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o400)
			return p
		}, nil},
		{"fail/0644", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o644)
			return p
		}, &creds.ModeError{}},
		{"fail/0640", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o640)
			return p
		}, &creds.ModeError{}},
		{"fail/0602", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o602)
			return p
		}, &creds.ModeError{}},
		{"fail/other owner", func(t *testing.T, d string) string {
			p := filepath.Join(d, "f")
			writeFile(t, p, 0o600)
			chownNobody(t, p)
			return p
		}, &creds.OwnerError{}},
		{"fail/symlink", func(t *testing.T, d string) string {
			target := filepath.Join(d, "target")
			writeFile(t, target, 0o600)
			p := filepath.Join(d, "link")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p
		}, &creds.TypeError{}},
		{"fail/directory", func(t *testing.T, d string) string {
			p := filepath.Join(d, "sub")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}, &creds.TypeError{}},
		{"fail/missing", func(t *testing.T, d string) string { return filepath.Join(d, "missing") }, fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.setup(t, privateDir(t))
			checkErr(t, creds.CheckSecretFile(p), p, tt.want)
		})
	}
}

func TestCheckSecretDir(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, base string) string
		want  any
	}{
		{"ok/0700", func(t *testing.T, b string) string { return mkdir(t, b, 0o700) }, nil},
		{"ok/0500", func(t *testing.T, b string) string { return mkdir(t, b, 0o500) }, nil},
		{"fail/0755", func(t *testing.T, b string) string { return mkdir(t, b, 0o755) }, &creds.ModeError{}},
		{"fail/0710", func(t *testing.T, b string) string { return mkdir(t, b, 0o710) }, &creds.ModeError{}},
		{"fail/0701", func(t *testing.T, b string) string { return mkdir(t, b, 0o701) }, &creds.ModeError{}},
		{"fail/other owner", func(t *testing.T, b string) string {
			p := mkdir(t, b, 0o700)
			chownNobody(t, p)
			return p
		}, &creds.OwnerError{}},
		{"fail/symlink", func(t *testing.T, b string) string {
			target := mkdir(t, b, 0o700)
			p := filepath.Join(b, "link")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p
		}, &creds.TypeError{}},
		{"fail/regular file", func(t *testing.T, b string) string {
			p := filepath.Join(b, "f")
			writeFile(t, p, 0o600)
			return p
		}, &creds.TypeError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.setup(t, t.TempDir())
			checkErr(t, creds.CheckSecretDir(p), p, tt.want)
		})
	}
}

func mkdir(t *testing.T, base string, mode fs.FileMode) string {
	t.Helper()
	p := filepath.Join(base, "d")
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkErr asserts err matches want (nil, a typed error pointer, or a sentinel error) and, when
// not nil, that it names path.
func checkErr(t *testing.T, err error, path string, want any) {
	t.Helper()
	switch w := want.(type) {
	case nil:
		if err != nil {
			t.Fatalf("err = %v, want nil", err)
		}
		return
	case *creds.ModeError:
		var e *creds.ModeError
		if !errors.As(err, &e) || e.Path != path || e.Mode&0o077 == 0 {
			t.Fatalf("err = %#v, want *ModeError for %s", err, path)
		}
	case *creds.OwnerError:
		var e *creds.OwnerError
		if !errors.As(err, &e) || e.Path != path || e.UID != nobody || e.Want != os.Geteuid() {
			t.Fatalf("err = %#v, want *OwnerError{UID: %d} for %s", err, nobody, path)
		}
	case *creds.TypeError:
		var e *creds.TypeError
		if !errors.As(err, &e) || e.Path != path {
			t.Fatalf("err = %#v, want *TypeError for %s", err, path)
		}
	case error:
		if !errors.Is(err, w) {
			t.Fatalf("err = %v, want %v", err, w)
		}
	default:
		t.Fatalf("bad want %T", want)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q does not name %s", err, path)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	t.Run("ok/creates missing parent 0700", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "a", "b", "secret")
		if err := creds.WriteFileAtomic(p, []byte("one")); err != nil {
			t.Fatal(err)
		}
		assertMode(t, filepath.Dir(p), fs.ModeDir|0o700)
		assertMode(t, p, 0o600)
		got, err := creds.ReadSecretFile(p)
		if err != nil || string(got) != "one" {
			t.Fatalf("ReadSecretFile = %q, %v; want one", got, err)
		}
	})
	t.Run("ok/replaces content and leaves no temp file", func(t *testing.T) {
		d := privateDir(t)
		p := filepath.Join(d, "secret")
		for _, content := range []string{"first", "second"} {
			if err := creds.WriteFileAtomic(p, []byte(content)); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != "second" {
			t.Fatalf("content = %q, %v; want second", got, err)
		}
		entries, err := os.ReadDir(d)
		if err != nil || len(entries) != 1 {
			t.Fatalf("dir holds %v (%v); want only the secret", entries, err)
		}
	})
	t.Run("ok/replaces a loose file with a 0600 one", func(t *testing.T) {
		p := filepath.Join(privateDir(t), "secret")
		writeFile(t, p, 0o644)
		if err := creds.WriteFileAtomic(p, []byte("x")); err != nil {
			t.Fatal(err)
		}
		assertMode(t, p, 0o600)
	})
	t.Run("fail/parent 0755", func(t *testing.T) {
		d := mkdir(t, t.TempDir(), 0o755)
		p := filepath.Join(d, "secret")
		checkErr(t, creds.WriteFileAtomic(p, []byte("x")), d, &creds.ModeError{})
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("file written despite loose parent: %v", err)
		}
	})
	t.Run("fail/parent owned by another uid", func(t *testing.T) {
		d := mkdir(t, t.TempDir(), 0o700)
		chownNobody(t, d)
		checkErr(t, creds.WriteFileAtomic(filepath.Join(d, "secret"), []byte("x")), d, &creds.OwnerError{})
	})
	t.Run("fail/target is a directory", func(t *testing.T) {
		d := privateDir(t)
		p := mkdir(t, d, 0o700)
		checkErr(t, creds.WriteFileAtomic(p, []byte("x")), p, &creds.TypeError{})
	})
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
		t.Fatalf("%s: mode %v, want %v", path, got, want)
	}
}

func TestReadSecretFile(t *testing.T) {
	t.Run("fail/loose directory", func(t *testing.T) {
		d := mkdir(t, t.TempDir(), 0o700)
		p := filepath.Join(d, "f")
		writeFile(t, p, 0o600)
		if err := os.Chmod(d, 0o750); err != nil {
			t.Fatal(err)
		}
		_, err := creds.ReadSecretFile(p)
		checkErr(t, err, d, &creds.ModeError{})
	})
	t.Run("fail/loose file", func(t *testing.T) {
		p := filepath.Join(privateDir(t), "f")
		writeFile(t, p, 0o604)
		_, err := creds.ReadSecretFile(p)
		checkErr(t, err, p, &creds.ModeError{})
	})
	t.Run("fail/other owner", func(t *testing.T) {
		p := filepath.Join(privateDir(t), "f")
		writeFile(t, p, 0o600)
		chownNobody(t, p)
		_, err := creds.ReadSecretFile(p)
		checkErr(t, err, p, &creds.OwnerError{})
	})
	t.Run("fail/symlink to a private file", func(t *testing.T) {
		d := privateDir(t)
		target := filepath.Join(d, "target")
		writeFile(t, target, 0o600)
		p := filepath.Join(d, "link")
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		_, err := creds.ReadSecretFile(p)
		checkErr(t, err, p, &creds.TypeError{})
	})
	t.Run("fail/too large", func(t *testing.T) {
		p := filepath.Join(privateDir(t), "f")
		if err := os.WriteFile(p, make([]byte, creds.MaxSecretFileSize+1), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := creds.ReadSecretFile(p)
		var se *creds.SizeError
		if !errors.As(err, &se) || se.Path != p {
			t.Fatalf("err = %v, want *SizeError for %s", err, p)
		}
	})
}

func TestSeedFileRoundTrip(t *testing.T) {
	s, pub, raw := newUserSeed(t)
	p := filepath.Join(privateDir(t), "user.nk")
	if err := creds.WriteSeedFile(p, s); err != nil {
		t.Fatal(err)
	}
	assertMode(t, p, 0o600)
	onDisk, err := os.ReadFile(p)
	if err != nil || string(onDisk) != string(raw)+"\n" {
		t.Fatalf("file content is not the seed text and a newline (err %v)", err)
	}
	got, err := creds.ReadSeedFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if gp, err := got.Public(); err != nil || gp != pub {
		t.Fatalf("read seed Public = %q, %v; want %q", gp, err, pub)
	}
}

func TestSeedFileRefusals(t *testing.T) {
	d := privateDir(t)
	tests := []struct {
		name    string
		content string
	}{
		{"fail/empty", ""},
		{"fail/garbage", "not a seed\n"},
		{"fail/public key", "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(d, strings.ReplaceAll(tt.name, "/", "_"))
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := creds.ReadSeedFile(p)
			var fe *creds.FormatError
			if !errors.As(err, &fe) || fe.Path != p {
				t.Fatalf("err = %v, want *FormatError for %s", err, p)
			}
		})
	}
	if err := creds.WriteSeedFile(filepath.Join(d, "x"), creds.NewSeed([]byte("junk"))); err == nil {
		t.Fatal("WriteSeedFile accepted an invalid seed")
	}
	if err := creds.WriteSeedFile(filepath.Join(d, "y"), nil); !errors.Is(err, creds.ErrNoSeed) {
		t.Fatalf("WriteSeedFile(nil) = %v, want ErrNoSeed", err)
	}
}

// userJWT returns a user JWT for pub, self-issued by a throwaway account key (ReadCreds checks
// shape and subject, not the trust chain).
func userJWT(t *testing.T, pub string) string {
	t.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = "test"
	tok, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestCredsRoundTrip(t *testing.T) {
	s, pub, raw := newUserSeed(t)
	tok := userJWT(t, pub)
	p := filepath.Join(privateDir(t), "user.creds")
	if err := creds.WriteCreds(p, tok, s); err != nil {
		t.Fatal(err)
	}
	assertMode(t, p, 0o600)
	onDisk, err := os.ReadFile(p)
	if err != nil || !bytes.Contains(onDisk, raw) || !bytes.Contains(onDisk, []byte(tok)) {
		t.Fatalf("creds file lacks the JWT or seed (err %v)", err)
	}
	gotJWT, gotSeed, err := creds.ReadCreds(p)
	if err != nil {
		t.Fatal(err)
	}
	if gotJWT != tok {
		t.Fatalf("ReadCreds JWT differs from the one written")
	}
	if gp, err := gotSeed.Public(); err != nil || gp != pub {
		t.Fatalf("ReadCreds seed Public = %q, %v; want %q", gp, err, pub)
	}
}

func TestCredsRefusals(t *testing.T) {
	d := privateDir(t)
	s, pub, _ := newUserSeed(t)
	other, _, _ := newUserSeed(t)
	tok := userJWT(t, pub)

	t.Run("fail/write seed does not match subject", func(t *testing.T) {
		if err := creds.WriteCreds(filepath.Join(d, "w1"), tok, other); err == nil {
			t.Fatal("WriteCreds accepted a seed that is not the JWT subject")
		}
	})
	t.Run("fail/write wiped seed", func(t *testing.T) {
		w := creds.NewSeed(nil)
		if err := creds.WriteCreds(filepath.Join(d, "w2"), tok, w); !errors.Is(err, creds.ErrNoSeed) {
			t.Fatalf("err = %v, want ErrNoSeed", err)
		}
	})

	// A well-formed creds file whose seed belongs to another user.
	good, err := userCredsText(tok, s)
	if err != nil {
		t.Fatal(err)
	}
	mismatched := bytes.Replace(good, seedBytes(t, s), seedBytes(t, other), 1)
	tests := []struct {
		name    string
		content []byte
	}{
		{"fail/empty", nil},
		{"fail/plain seed file", append(seedBytes(t, s), '\n')},
		{"fail/jwt without seed", []byte("-----BEGIN NATS USER JWT-----\n" + tok + "\n------END NATS USER JWT------\n")},
		{"fail/seed of another user", mismatched},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(d, strings.ReplaceAll(tt.name, "/", "_"))
			if err := os.WriteFile(p, tt.content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, seed, err := creds.ReadCreds(p)
			var fe *creds.FormatError
			if !errors.As(err, &fe) || fe.Path != p || seed != nil {
				t.Fatalf("err = %v, want *FormatError for %s", err, p)
			}
			if bytes.Contains([]byte(err.Error()), seedBytes(t, s)) {
				t.Fatalf("error quotes the seed")
			}
		})
	}
}

func seedBytes(t *testing.T, s *creds.Seed) []byte {
	t.Helper()
	var out []byte
	if err := s.Use(func(b []byte) error { out = append([]byte(nil), b...); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func userCredsText(tok string, s *creds.Seed) ([]byte, error) {
	var out []byte
	err := s.Use(func(b []byte) error {
		var err error
		out, err = jwt.FormatUserConfig(tok, b)
		return err
	})
	return out, err
}

func TestWritePublicFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		mode fs.FileMode
		ok   bool
	}{
		{"ok/0644", 0o644, true},
		{"ok/0600", 0o600, true},
		{"fail/group-writable", 0o664, false},
		{"fail/world-writable", 0o646, false},
		{"fail/setuid", fs.ModeSetuid | 0o644, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, "/", "_"))
			err := creds.WritePublicFile(path, []byte("public\n"), tc.mode)
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want a refusal naming %s", err, path)
				}
				if _, statErr := os.Stat(path); !errors.Is(statErr, fs.ErrNotExist) {
					t.Fatalf("refused write left %s behind", path)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.mode.Perm() {
				t.Fatalf("mode %v, want %v", fi.Mode().Perm(), tc.mode.Perm())
			}
			if got, _ := os.ReadFile(path); string(got) != "public\n" {
				t.Fatalf("content %q", got)
			}
		})
	}
}
