package setup_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// fixedNow is the test clock.
var fixedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// seedPattern matches an encoded nkey seed of any signing or curve kind anywhere in a text:
// 'S', the kind letter, then 56 base32 characters (58 in all).
var seedPattern = regexp.MustCompile(`S[OAUX][A-Z2-7]{56}`)

// newDir returns a path inside a fresh temporary directory that Init has not touched.
func newDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "state")
}

// mustInit runs Init with the test clock and fails the test on error.
func mustInit(t *testing.T, opts setup.Options) *setup.Result {
	t.Helper()
	if opts.Now == nil {
		opts.Now = func() time.Time { return fixedNow }
	}
	res, err := setup.Init(opts)
	if err != nil {
		t.Fatalf("Init(%v): %v", opts.Spaces, err)
	}
	return res
}

// seg is the on-disk segment of a space.
func seg(name string) string { return space.Segment(name) }

// readPublic reads a space's public facts from an init directory.
func readPublic(t *testing.T, dir, name string) *keystore.PublicSpace {
	t.Helper()
	ps, err := keystore.ReadPublicSpace(keystore.PublicSpacePath(filepath.Join(dir, setup.PublicDir), name))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// modes returns every entry under root (relative path to permission bits, directories marked
// with a trailing '/'), refusing anything that is neither a regular file nor a directory.
func modes(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.IsDir():
			out[rel+"/"] = fi.Mode().Perm()
		case fi.Mode().IsRegular():
			out[rel] = fi.Mode().Perm()
		default:
			t.Errorf("%s: unexpected file type %v", p, fi.Mode().Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// regularFiles lists the regular files under root (absolute paths), sorted.
func regularFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for rel := range modes(t, root) {
		if rel[len(rel)-1] != '/' {
			out = append(out, filepath.Join(root, rel))
		}
	}
	slices.Sort(out)
	return out
}

// readFile reads a file or fails the test.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// secretValues returns the trimmed content of every file under the secret directories of an init
// directory, keyed by path, so a test can prove none of it reaches a public file.
func secretValues(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, sub := range []string{setup.OperatorDir, setup.SignerDir, setup.AuthdDir} {
		for _, p := range regularFiles(t, filepath.Join(dir, sub)) {
			out[p] = bytes.TrimSpace(readFile(t, p))
		}
	}
	return out
}

// startBroker parses DIR/broker/nats.conf as nats-server would, moves it to a random loopback
// port and a temporary store, starts it, and shuts it down at cleanup.
func startBroker(t *testing.T, dir string) *server.Server {
	t.Helper()
	conf := filepath.Join(dir, setup.BrokerDir, setup.BrokerConfigFile)
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refused %s: %v", conf, err)
	}
	if want := filepath.Join(dir, setup.BrokerDir, "jetstream"); opts.StoreDir != want || opts.Host != "127.0.0.1" || !opts.JetStream {
		t.Fatalf("parsed config: store_dir %q host %q jetstream %v; want %q 127.0.0.1 true", opts.StoreDir, opts.Host, opts.JetStream, want)
	}
	opts.Port = server.RANDOM_PORT
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("broker not ready")
	}
	return s
}

// mint signs profile claims for userPub with signer, for the profile's maximum lifetime, and
// returns the JWT.
func mint(t *testing.T, spaceName string, profile profiles.Name, p profiles.Params, userPub, account string, signer nkeys.KeyPair) string {
	t.Helper()
	spec, err := profiles.Build(spaceName, profile, p)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := spec.Claims(userPub, account, time.Now(), profile.Lifetime().Max)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := uc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// connect dials url over TCP with a user JWT and its nkey.
func connect(url, userJWT string, kp nkeys.KeyPair, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(url, append([]nats.Option{
		nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign),
		nats.NoReconnect(), nats.Timeout(5 * time.Second)}, opts...)...)
}

// newUser creates a user key pair and wipes it at cleanup.
func newUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, _ := kp.PublicKey()
	return kp, pub
}

// seedKeyPair reads an .nk file into a key pair, wiped at cleanup.
func seedKeyPair(t *testing.T, path string) nkeys.KeyPair {
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

// authUsers decodes a callout account JWT and returns its auth_users.
func authUsers(t *testing.T, authJWT string) []string {
	t.Helper()
	ac, err := jwt.DecodeAccountClaims(authJWT)
	if err != nil {
		t.Fatal(err)
	}
	return []string(ac.Authorization.AuthUsers)
}
