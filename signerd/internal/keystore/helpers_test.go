package keystore_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// fixture is an init directory made by setup.Init.
type fixture struct {
	dir    string
	spaces []string
}

func (f fixture) signerDir() string { return filepath.Join(f.dir, setup.SignerDir) }
func (f fixture) publicDir() string { return filepath.Join(f.dir, setup.PublicDir) }

// spaceDir is the signer directory of one space.
func (f fixture) spaceDir(name string) string {
	return filepath.Join(f.signerDir(), space.Segment(name))
}

// secret is the path of one space's secret file in the nested layout.
func (f fixture) secret(name, file string) string {
	return keystore.SecretPath(f.signerDir(), name, file, false)
}

// config is the nested-layout Config for the fixture.
func (f fixture) config() keystore.Config {
	return keystore.Config{KeyDir: f.signerDir(), PublicDir: f.publicDir()}
}

// newFixture runs setup.Init for spaces in a fresh directory.
func newFixture(t testing.TB, spaces ...string) fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	_, err := setup.Init(setup.Options{Dir: dir, Spaces: spaces, Now: func() time.Time {
		return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	}})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{dir: dir, spaces: spaces}
}

// open opens the store for cfg and closes it at cleanup.
func open(t testing.TB, cfg keystore.Config) *keystore.Store {
	t.Helper()
	st, err := keystore.Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// readFile reads a file or fails the test.
func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile replaces path with data at mode 0600.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// seedKeyPair reads an .nk file into an nkeys key pair, wiped at cleanup.
func seedKeyPair(t testing.TB, path string) nkeys.KeyPair {
	t.Helper()
	s, err := creds.ReadSeedFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Wipe()
	kp, err := s.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	return kp
}

// chmod sets mode or fails the test.
func chmod(t testing.TB, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// flatten copies every space's secret files into a new flat directory named <seg>.<file>, as
// systemd's LoadCredential= presents them, with the given file and directory modes.
func flatten(t testing.TB, f fixture, fileMode, dirMode os.FileMode) string {
	t.Helper()
	flat := filepath.Join(t.TempDir(), "credentials")
	if err := os.Mkdir(flat, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range f.spaces {
		for _, file := range keystore.SecretFiles {
			dst := keystore.SecretPath(flat, name, file, true)
			if err := os.WriteFile(dst, readFile(t, f.secret(name, file)), fileMode); err != nil {
				t.Fatal(err)
			}
			chmod(t, dst, fileMode)
		}
	}
	chmod(t, flat, dirMode)
	// Give the owner write access back so the temporary directory can be removed.
	t.Cleanup(func() { _ = os.Chmod(flat, 0o700) })
	return flat
}
