package mtls

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/creds"
)

func TestNewServerTLSRefuses(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, f *fixture) ServerFiles
		opts    []Option
		check   func(t *testing.T, f *fixture, files ServerFiles, err error)
	}{
		{
			name: "fail/key-mode-0644",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				chmod(t, f.server.KeyFile, 0o644)
				return f.server
			},
			check: wantModeError(0o644),
		},
		{
			name: "fail/key-mode-0640",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				chmod(t, f.server.KeyFile, 0o640)
				return f.server
			},
			check: wantModeError(0o640),
		},
		{
			// A symlink could let whoever controls its target choose the key.
			name: "fail/key-symlink",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				link := filepath.Join(f.dir, "link.key")
				if err := os.Symlink(f.server.KeyFile, link); err != nil {
					t.Fatal(err)
				}
				files := f.server
				files.KeyFile = link
				return files
			},
			check: func(t *testing.T, _ *fixture, files ServerFiles, err error) {
				wantLoadError(t, err, files.KeyFile)
				var te *creds.TypeError
				if !errors.As(err, &te) || te.Path != files.KeyFile {
					t.Fatalf("error = %v, want *creds.TypeError for %s", err, files.KeyFile)
				}
			},
		},
		{
			name: "fail/key-missing",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				files := f.server
				files.KeyFile = filepath.Join(f.dir, "absent.key")
				return files
			},
			check: func(t *testing.T, _ *fixture, files ServerFiles, err error) {
				wantLoadError(t, err, files.KeyFile)
				if !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("error = %v, want fs.ErrNotExist", err)
				}
			},
		},
		{
			name: "fail/key-does-not-match-cert",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				_, key := writeLeaf(t, f.dir, "other", serverLeaf(t, f.serverCA))
				files := f.server
				files.KeyFile = key
				return files
			},
			check: func(t *testing.T, _ *fixture, files ServerFiles, err error) {
				wantLoadError(t, err, files.CertFile)
				if !strings.Contains(err.Error(), "private key does not match public key") {
					t.Fatalf("error = %v, want key mismatch", err)
				}
			},
		},
		{
			name:    "fail/ca-empty",
			prepare: caContent([]byte("\n")),
			check:   wantCAError("no CA certificate"),
		},
		{
			name: "fail/ca-holds-private-key",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				key, err := f.clientCA.KeyPEM()
				if err != nil {
					t.Fatal(err)
				}
				return caContent(append(f.clientCA.CertPEM(), key...))(t, f)
			},
			check: wantCAError(`is "PRIVATE KEY", want CERTIFICATE`),
		},
		{
			name: "fail/ca-is-leaf",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				return caContent(clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/authd/x").CertPEM())(t, f)
			},
			check: wantCAError("is not a CA"),
		},
		{
			name: "fail/ca-trailing-garbage",
			prepare: func(t *testing.T, f *fixture) ServerFiles {
				return caContent(append(f.clientCA.CertPEM(), "-----BEGIN CERTIF"...))(t, f)
			},
			check: wantCAError("trailing data"),
		},
		{
			name:    "fail/server-id-option-on-server",
			prepare: func(_ *testing.T, f *fixture) ServerFiles { return f.server },
			opts:    []Option{WithServerID("spiffe://" + testTD + "/signerd")},
			check:   wantErrText("applies to clients only"),
		},
		{
			name:    "fail/zero-poll-interval",
			prepare: func(_ *testing.T, f *fixture) ServerFiles { return f.server },
			opts:    []Option{WithPollInterval(0)},
			check:   wantErrText("is not positive"),
		},
		{
			name:    "fail/nil-clock",
			prepare: func(_ *testing.T, f *fixture) ServerFiles { return f.server },
			opts:    []Option{WithClock(nil)},
			check:   wantErrText("nil clock"),
		},
		{
			name: "fail/empty-client-ca-field",
			prepare: func(_ *testing.T, f *fixture) ServerFiles {
				files := f.server
				files.ClientCAFile = ""
				return files
			},
			check: wantErrText("ClientCAFile is empty"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			files := tt.prepare(t, f)
			cfg, r, err := NewServerTLS(files, tt.opts...)
			if cfg != nil || r != nil {
				t.Fatalf("NewServerTLS returned a config or reloader with error %v", err)
			}
			tt.check(t, f, files, err)
		})
	}
	t.Run("fail/key-dir-mode-0755", func(t *testing.T) {
		f := newFixture(t)
		chmod(t, f.dir, 0o755)
		_, _, err := NewServerTLS(f.server)
		wantLoadError(t, err, f.server.KeyFile)
		var me *creds.ModeError
		if !errors.As(err, &me) || me.Path != f.dir || me.Mode != 0o755 {
			t.Fatalf("error = %v, want *creds.ModeError for %s", err, f.dir)
		}
	})
	t.Run("ok/key-mode-0400", func(t *testing.T) {
		f := newFixture(t)
		chmod(t, f.server.KeyFile, 0o400)
		cfg, r, err := NewServerTLS(f.server)
		if err != nil || cfg == nil || r == nil {
			t.Fatalf("NewServerTLS with a 0400 key: %v", err)
		}
		if cfg.MinVersion != 0x0304 || cfg.GetConfigForClient == nil || !cfg.SessionTicketsDisabled {
			t.Fatalf("config = MinVersion %x, GetConfigForClient set %v, tickets disabled %v", cfg.MinVersion, cfg.GetConfigForClient != nil, cfg.SessionTicketsDisabled)
		}
	})
}

func TestNewClientTLSRefuses(t *testing.T) {
	f := newFixture(t)
	cert, key := writeLeaf(t, f.dir, "authd", clientLeaf(t, f.clientCA, "spiffe://"+testTD+"/authd/sp1"))
	files := ClientFiles{CertFile: cert, KeyFile: key, ServerCAFile: f.serverCAFile}
	t.Run("fail/key-mode-0644", func(t *testing.T) {
		chmod(t, key, 0o644)
		t.Cleanup(func() { chmod(t, key, 0o600) })
		_, _, err := NewClientTLS(files, "localhost")
		wantModeError(0o644)(t, f, ServerFiles{KeyFile: key}, err)
	})
	t.Run("fail/empty-server-name", func(t *testing.T) {
		_, _, err := NewClientTLS(files, "")
		wantErrText("empty server name")(t, f, ServerFiles{}, err)
	})
	t.Run("fail/invalid-server-id", func(t *testing.T) {
		_, _, err := NewClientTLS(files, "localhost", WithServerID("https://signerd"))
		if !errors.Is(err, ErrInvalidID) {
			t.Fatalf("error = %v, want ErrInvalidID", err)
		}
	})
	t.Run("ok/files", func(t *testing.T) {
		cfg, r, err := NewClientTLS(files, "localhost")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MinVersion != 0x0304 || cfg.ServerName != "localhost" || !cfg.RootCAs.Equal(r.CAPool()) {
			t.Fatalf("config = MinVersion %x, ServerName %q", cfg.MinVersion, cfg.ServerName)
		}
		got, err := cfg.GetClientCertificate(nil)
		if err != nil || got != r.Certificate() {
			t.Fatalf("GetClientCertificate = %p, %v; want the reloader's %p", got, err, r.Certificate())
		}
	})
}

func TestReloadKeepsOldMaterial(t *testing.T) {
	f := newFixture(t)
	_, r, err := NewServerTLS(f.server)
	if err != nil {
		t.Fatal(err)
	}
	orig, origPool := r.Certificate(), r.CAPool()
	goodCert, _ := os.ReadFile(f.server.CertFile)

	tests := []struct {
		name  string
		spoil func(t *testing.T)
		check func(t *testing.T, err error)
	}{
		{
			name:  "fail/garbage-cert",
			spoil: func(t *testing.T) { writeFile(t, f.server.CertFile, []byte("not PEM"), 0o644) },
			check: func(t *testing.T, err error) { wantLoadError(t, err, f.server.CertFile) },
		},
		{
			name:  "fail/key-mode-0644",
			spoil: func(t *testing.T) { chmod(t, f.server.KeyFile, 0o644) },
			check: func(t *testing.T, err error) { wantModeError(0o644)(t, f, f.server, err) },
		},
		{
			name:  "fail/ca-removed",
			spoil: func(t *testing.T) { mustRemove(t, f.server.ClientCAFile) },
			check: func(t *testing.T, err error) {
				wantLoadError(t, err, f.server.ClientCAFile)
				if !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("error = %v, want fs.ErrNotExist", err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spoil(t)
			err := r.Reload()
			tt.check(t, err)
			if r.Certificate() != orig || r.CAPool() != origPool {
				t.Fatal("a failed Reload replaced the current material")
			}
			// Repair for the next case.
			writeFile(t, f.server.CertFile, goodCert, 0o644)
			chmod(t, f.server.KeyFile, 0o600)
			writeCA(t, f.dir, "client-ca", f.clientCA)
		})
	}
	t.Run("ok/valid-change-replaces", func(t *testing.T) {
		rotated := serverLeaf(t, f.serverCA)
		writeLeaf(t, f.dir, "signerd", rotated)
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Certificate().Leaf.Raw, rotated.Certificate().Raw) {
			t.Fatal("Reload did not install the rotated certificate")
		}
	})
}

func TestPollReportsEachFailureOnce(t *testing.T) {
	f := newFixture(t)
	_, r, err := NewServerTLS(f.server)
	if err != nil {
		t.Fatal(err)
	}
	origPool := r.CAPool()
	steps := []struct {
		name    string
		change  func(t *testing.T)
		wantErr bool
		wantNew bool // the CA pool was replaced
	}{
		{name: "ok/unchanged", change: func(*testing.T) {}},
		{name: "fail/bad-ca", change: func(t *testing.T) { writeFile(t, f.server.ClientCAFile, []byte("junk"), 0o644) }, wantErr: true},
		{name: "ok/same-bad-ca-not-reported-again", change: func(*testing.T) {}},
		{name: "fail/ca-removed", change: func(t *testing.T) { mustRemove(t, f.server.ClientCAFile) }, wantErr: true},
		{name: "ok/same-missing-ca-not-reported-again", change: func(*testing.T) {}},
		{
			name:    "ok/new-ca",
			change:  func(t *testing.T) { writeCA(t, f.dir, "client-ca", newTestCA(t, "next CA")) },
			wantNew: true,
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.change(t)
			err := r.poll()
			if (err != nil) != st.wantErr {
				t.Fatalf("poll() = %v, want error %v", err, st.wantErr)
			}
			if st.wantErr {
				wantLoadError(t, err, f.server.ClientCAFile)
			}
			if replaced := r.CAPool() != origPool; replaced != st.wantNew {
				t.Fatalf("CA pool replaced = %v, want %v", replaced, st.wantNew)
			}
		})
	}
	t.Run("ok/run-returns-on-cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx, 0, nil) }()
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	})
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// caContent returns a prepare step that writes data as the client CA file.
func caContent(data []byte) func(t *testing.T, f *fixture) ServerFiles {
	return func(t *testing.T, f *fixture) ServerFiles {
		t.Helper()
		writeFile(t, f.server.ClientCAFile, data, 0o644)
		return f.server
	}
}

func wantLoadError(t *testing.T, err error, path string) {
	t.Helper()
	var le *LoadError
	if !errors.As(err, &le) || le.Path != path || !strings.Contains(err.Error(), path) {
		t.Fatalf("error = %v, want *LoadError naming %s", err, path)
	}
}

func wantModeError(mode os.FileMode) func(t *testing.T, f *fixture, files ServerFiles, err error) {
	return func(t *testing.T, _ *fixture, files ServerFiles, err error) {
		t.Helper()
		var me *creds.ModeError
		if !errors.As(err, &me) || me.Path != files.KeyFile || me.Mode != mode || me.Want != 0o600 {
			t.Fatalf("error = %v, want *ModeError{%s, %04o, 0600}", err, files.KeyFile, mode)
		}
		if !strings.Contains(err.Error(), files.KeyFile) {
			t.Fatalf("error %q does not name %s", err, files.KeyFile)
		}
	}
}

func wantCAError(text string) func(t *testing.T, f *fixture, files ServerFiles, err error) {
	return func(t *testing.T, _ *fixture, files ServerFiles, err error) {
		t.Helper()
		wantLoadError(t, err, files.ClientCAFile)
		if !strings.Contains(err.Error(), text) {
			t.Fatalf("error = %v, want it to contain %q", err, text)
		}
	}
}

func wantErrText(text string) func(t *testing.T, f *fixture, files ServerFiles, err error) {
	return func(t *testing.T, _ *fixture, _ ServerFiles, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), text) {
			t.Fatalf("error = %v, want it to contain %q", err, text)
		}
	}
}

// FuzzParseCAPool checks that the CA bundle parser never panics and never accepts a bundle
// without a CA certificate.
func FuzzParseCAPool(f *testing.F) {
	ca, err := NewCA("fuzz CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{ca.CertPEM(), append(ca.CertPEM(), key...), append(ca.CertPEM(), "x"...), nil, []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pool, err := parseCAPool(data)
		if (pool == nil) == (err == nil) {
			t.Fatalf("parseCAPool = %v, %v: want exactly one of pool and error", pool, err)
		}
		if err == nil && bytes.Count(data, []byte("-----BEGIN CERTIFICATE-----")) == 0 {
			t.Fatal("accepted a bundle with no certificate block")
		}
	})
}

// TestClientCATrust is finding 7 of issue 7: whoever can rewrite the client CA can mint as
// anyone, so NewServerTLS (start) and Reload refuse a CA file anyone but root or signerd's uid
// could rewrite, naming the path; a refused reload keeps the current pool.
func TestClientCATrust(t *testing.T) {
	for _, tc := range []struct {
		name string
		// spoil makes the bad layout and returns the CA path to configure and the path the
		// error must name.
		spoil func(t *testing.T, f *fixture) (caFile, offender string)
		root  bool
		check func(t *testing.T, err error)
	}{
		{"fail/mode-0666", func(t *testing.T, f *fixture) (string, string) {
			chmod(t, f.server.ClientCAFile, 0o666)
			return f.server.ClientCAFile, f.server.ClientCAFile
		}, false, func(t *testing.T, err error) {
			var me *creds.ModeError
			if !errors.As(err, &me) || me.Mode != 0o666 {
				t.Fatalf("error = %v, want *creds.ModeError for mode 0666", err)
			}
		}},
		{"fail/group-writable-parent", func(t *testing.T, f *fixture) (string, string) {
			dir := filepath.Join(f.dir, "shared")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			chmod(t, dir, 0o770)
			return writeCA(t, dir, "client-ca", f.clientCA), dir
		}, false, func(t *testing.T, err error) {
			var me *creds.ModeError
			if !errors.As(err, &me) || me.Mode != 0o770 {
				t.Fatalf("error = %v, want *creds.ModeError for mode 0770", err)
			}
		}},
		{"fail/symlink-to-foreign-owned-file", func(t *testing.T, f *fixture) (string, string) {
			theirs := writeCA(t, f.dir, "theirs", f.clientCA)
			if err := os.Chown(theirs, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(f.dir, "link-ca.pem")
			if err := os.Symlink(theirs, link); err != nil {
				t.Fatal(err)
			}
			return link, theirs
		}, true, func(t *testing.T, err error) {
			var oe *creds.OwnerError
			if !errors.As(err, &oe) || oe.UID != 65534 {
				t.Fatalf("error = %v, want *creds.OwnerError for uid 65534", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown to another uid (CI runs as root)")
			}
			f := newFixture(t)
			_, r, err := NewServerTLS(f.server)
			if err != nil {
				t.Fatal(err)
			}
			pool := r.CAPool()
			caFile, offender := tc.spoil(t, f)
			files := f.server
			files.ClientCAFile = caFile
			// At start.
			_, _, err = NewServerTLS(files)
			wantLoadError(t, err, caFile)
			if !strings.Contains(err.Error(), offender) {
				t.Fatalf("error %q does not name %s", err, offender)
			}
			tc.check(t, err)
			// At reload: point the running reloader's CA path at the bad file.
			if caFile != f.server.ClientCAFile {
				if err := os.Remove(f.server.ClientCAFile); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(caFile, f.server.ClientCAFile); err != nil {
					t.Fatal(err)
				}
			}
			err = r.Reload()
			if err == nil || !strings.Contains(err.Error(), offender) {
				t.Fatalf("Reload error = %v, want one naming %s", err, offender)
			}
			tc.check(t, err)
			if r.CAPool() != pool {
				t.Fatal("a refused CA file replaced the pool")
			}
		})
	}
}
