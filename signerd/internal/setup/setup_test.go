package setup_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// initCase is one Init scenario. prepare runs on the (not yet existing) init directory first;
// then Init runs with opts (Dir filled in). An ok case has check; a fail case has wantErr, and
// every fail case must leave every file that existed before Init byte-for-byte unchanged and
// add none.
type initCase struct {
	name     string
	prepare  func(t *testing.T, dir string)
	opts     setup.Options
	relative bool // run Init with a relative --dir
	check    func(t *testing.T, dir string, res *setup.Result, before map[string][]byte)
	wantErr  func(t *testing.T, dir string, err error)
}

func TestInit(t *testing.T) {
	_, givenUser := newUser(t)
	accountKP, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	accountPub, _ := accountKP.PublicKey()
	userKP, _ := newUser(t)
	userSeed, _ := userKP.Seed()

	initAlpha := func(t *testing.T, dir string) {
		t.Helper()
		mustInit(t, setup.Options{Dir: dir, Spaces: []string{"alpha"}})
	}

	tests := []initCase{
		{
			name:  "ok/init-two-spaces",
			opts:  setup.Options{Spaces: []string{"alpha", "beta team"}},
			check: checkTwoSpaces,
		},
		{
			name:  "ok/broker-config-boots",
			opts:  setup.Options{Spaces: []string{"alpha"}},
			check: checkBrokerBoots,
		},
		{
			name:  "ok/sentinel-jwt",
			opts:  setup.Options{Spaces: []string{"alpha"}},
			check: checkSentinel,
		},
		{
			name: "ok/callout-user-registered",
			opts: setup.Options{Spaces: []string{"alpha"}},
			check: func(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
				ps := readPublic(t, dir, "alpha")
				seedFile := filepath.Join(dir, setup.AuthdDir, seg("alpha"), setup.CalloutSeedFile)
				if res.Spaces[0].CalloutSeedFile != seedFile {
					t.Fatalf("CalloutSeedFile = %q, want %q", res.Spaces[0].CalloutSeedFile, seedFile)
				}
				pub, err := seedKeyPair(t, seedFile).PublicKey()
				if err != nil {
					t.Fatal(err)
				}
				if got := authUsers(t, ps.AuthAccountJWT); !slices.Equal(got, []string{pub}) {
					t.Fatalf("auth_users = %v, want [%s] (the key in %s)", got, pub, seedFile)
				}
				if !slices.Equal(ps.CalloutUsers, []string{pub}) || res.Spaces[0].CalloutUser != pub {
					t.Fatalf("public callout_users %v, result %q; want %s", ps.CalloutUsers, res.Spaces[0].CalloutUser, pub)
				}
				ac, err := jwt.DecodeAccountClaims(ps.AuthAccountJWT)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ac.Authorization.AllowedAccounts, []string{ps.DataAccountPublicKey}) || ac.Authorization.XKey != ps.XKeyPublicKey {
					t.Fatalf("callout account allows %v with xkey %s; want [%s] and %s", ac.Authorization.AllowedAccounts, ac.Authorization.XKey, ps.DataAccountPublicKey, ps.XKeyPublicKey)
				}
			},
		},
		{
			name: "ok/callout-user-given",
			opts: setup.Options{Spaces: []string{"alpha", "beta"}, CalloutUsers: map[string]string{"alpha": givenUser}},
			check: func(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
				authdAlpha := filepath.Join(dir, setup.AuthdDir, seg("alpha"))
				if _, err := os.Lstat(authdAlpha); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("Lstat(%s) = %v, want not exist: a given key needs no seed file", authdAlpha, err)
				}
				if r := res.Spaces[0]; r.Name != "alpha" || r.CalloutSeedFile != "" || r.CalloutUser != givenUser {
					t.Fatalf("alpha result = %+v, want no seed file and callout user %s", r, givenUser)
				}
				ps := readPublic(t, dir, "alpha")
				if got := authUsers(t, ps.AuthAccountJWT); !slices.Equal(got, []string{givenUser}) || !slices.Equal(ps.CalloutUsers, []string{givenUser}) {
					t.Fatalf("auth_users = %v, public %v; want [%s]", got, ps.CalloutUsers, givenUser)
				}
				// The other space still gets a generated key and its seed file.
				beta := res.Spaces[1]
				pub, err := seedKeyPair(t, beta.CalloutSeedFile).PublicKey()
				if err != nil {
					t.Fatal(err)
				}
				if pub == givenUser || beta.CalloutUser != pub || !slices.Equal(authUsers(t, readPublic(t, dir, "beta").AuthAccountJWT), []string{pub}) {
					t.Fatalf("beta callout user %s, seed file key %s; want its own generated key", beta.CalloutUser, pub)
				}
			},
		},
		{
			name:     "ok/relative-dir",
			opts:     setup.Options{Spaces: []string{"alpha"}},
			relative: true,
			check: func(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
				// nats-server resolves a relative store_dir against its own working directory,
				// not the config file's, so init must write an absolute one.
				conf := string(readFile(t, res.BrokerConfig))
				want := `store_dir: "` + filepath.Join(dir, setup.BrokerDir, "jetstream") + `"`
				if !filepath.IsAbs(res.BrokerConfig) || !strings.Contains(conf, want) {
					t.Fatalf("BrokerConfig %q; config lacks %s", res.BrokerConfig, want)
				}
			},
		},
		{
			name:    "fail/reinit",
			prepare: initAlpha,
			opts:    setup.Options{Spaces: []string{"alpha"}},
			wantErr: wantExists(func(dir string) string { return filepath.Join(dir, setup.OperatorDir, "operator.nk") }),
		},
		{
			name:    "fail/reinit-other-space",
			prepare: initAlpha,
			opts:    setup.Options{Spaces: []string{"beta"}},
			wantErr: wantExists(func(dir string) string { return filepath.Join(dir, setup.OperatorDir, "operator.nk") }),
		},
		{
			name:    "ok/add-space",
			prepare: initAlpha,
			opts:    setup.Options{Spaces: []string{"beta"}, AddSpace: true},
			check:   checkAddSpace,
		},
		{
			name:    "fail/add-space-existing",
			prepare: initAlpha,
			opts:    setup.Options{Spaces: []string{"alpha"}, AddSpace: true},
			wantErr: wantExists(func(dir string) string { return filepath.Join(dir, setup.SignerDir, seg("alpha")) }),
		},
		{
			// The refusal comes before anything is written for the new space beta either.
			name:    "fail/add-space-existing-second",
			prepare: initAlpha,
			opts:    setup.Options{Spaces: []string{"beta", "alpha"}, AddSpace: true},
			wantErr: wantExists(func(dir string) string { return filepath.Join(dir, setup.SignerDir, seg("alpha")) }),
		},
		{
			name: "fail/add-space-existing-public-only",
			prepare: func(t *testing.T, dir string) {
				initAlpha(t, dir)
				for _, sub := range []string{setup.SignerDir, setup.OperatorDir, setup.AuthdDir} {
					if err := os.RemoveAll(filepath.Join(dir, sub, seg("alpha"))); err != nil {
						t.Fatal(err)
					}
				}
			},
			opts:    setup.Options{Spaces: []string{"alpha"}, AddSpace: true},
			wantErr: wantExists(func(dir string) string { return keystore.PublicSpacePath(filepath.Join(dir, setup.PublicDir), "alpha") }),
		},
		{
			name: "fail/add-space-uninitialised",
			opts: setup.Options{Spaces: []string{"alpha"}, AddSpace: true},
			wantErr: func(t *testing.T, dir string, err error) {
				var ee *setup.ExistsError
				if errors.As(err, &ee) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), filepath.Join(dir, setup.PublicDir, keystore.BrokerFile)) {
					t.Fatalf("err = %v, want a not-exist error naming broker.json", err)
				}
			},
		},
		{
			name: "fail/add-space-foreign-operator",
			prepare: func(t *testing.T, dir string) {
				initAlpha(t, dir)
				other := newDir(t)
				mustInit(t, setup.Options{Dir: other, Spaces: []string{"alpha"}})
				copyFile(t, filepath.Join(other, setup.OperatorDir, "operator-signing.nk"), filepath.Join(dir, setup.OperatorDir, "operator-signing.nk"))
			},
			opts: setup.Options{Spaces: []string{"beta"}, AddSpace: true},
			wantErr: func(t *testing.T, dir string, err error) {
				var km *trust.KeyMismatchError
				if !errors.As(err, &km) || km.Role != "operator signing" || !strings.Contains(err.Error(), filepath.Join(dir, setup.OperatorDir)) {
					t.Fatalf("err = %v, want *trust.KeyMismatchError for the operator signing seed naming the operator dir", err)
				}
			},
		},
		{
			// "a_b" would share the data account name of the existing "a.b": the broker config
			// could never be rendered again, so nothing may be written.
			name: "fail/add-space-token-collision",
			prepare: func(t *testing.T, dir string) {
				mustInit(t, setup.Options{Dir: dir, Spaces: []string{"a.b"}})
			},
			opts: setup.Options{Spaces: []string{"a_b"}, AddSpace: true},
			wantErr: func(t *testing.T, dir string, err error) {
				if msg := err.Error(); !strings.Contains(msg, `"a_b"`) || !strings.Contains(msg, `"a.b"`) || !strings.Contains(msg, "wire token") {
					t.Fatalf("err = %v, want it to name both spaces and the shared wire token", err)
				}
			},
		},
		{
			// Refused before the operator is created, so a rerun after cleaning up works.
			name: "fail/stale-space-dir",
			prepare: func(t *testing.T, dir string) {
				if err := os.MkdirAll(filepath.Join(dir, setup.SignerDir, seg("alpha")), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			opts:    setup.Options{Spaces: []string{"alpha"}},
			wantErr: wantExists(func(dir string) string { return filepath.Join(dir, setup.SignerDir, seg("alpha")) }),
		},
		{
			name: "fail/loose-operator-dir",
			prepare: func(t *testing.T, dir string) {
				p := filepath.Join(dir, setup.OperatorDir)
				if err := os.MkdirAll(p, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			opts: setup.Options{Spaces: []string{"alpha"}},
			wantErr: func(t *testing.T, dir string, err error) {
				var me *creds.ModeError
				if !errors.As(err, &me) || me.Path != filepath.Join(dir, setup.OperatorDir) || me.Mode != 0o755 {
					t.Fatalf("err = %v, want *creds.ModeError naming %s", err, filepath.Join(dir, setup.OperatorDir))
				}
			},
		},
		{name: "fail/bad-space-name/empty", opts: setup.Options{Spaces: []string{""}}, wantErr: wantNameError("")},
		{name: "fail/bad-space-name/leading-space", opts: setup.Options{Spaces: []string{"alpha", " lead"}}, wantErr: wantNameError(" lead")},
		{name: "fail/bad-space-name/control", opts: setup.Options{Spaces: []string{"a\nb"}}, wantErr: wantNameError("a\nb")},
		{name: "fail/bad-space-name/too-long", opts: setup.Options{Spaces: []string{strings.Repeat("x", space.MaxNameLen+1)}}, wantErr: wantNameError(strings.Repeat("x", space.MaxNameLen+1))},
		{
			name:    "fail/duplicate-token",
			opts:    setup.Options{Spaces: []string{"a.b", "a_b"}},
			wantErr: wantMessage(`"a_b"`, "wire token"),
		},
		{
			name:    "fail/duplicate-name",
			opts:    setup.Options{Spaces: []string{"alpha", "alpha"}},
			wantErr: wantMessage(`"alpha"`, "given twice"),
		},
		{
			name:    "fail/callout-user-not-user-key",
			opts:    setup.Options{Spaces: []string{"alpha"}, CalloutUsers: map[string]string{"alpha": accountPub}},
			wantErr: wantMessage(`"alpha"`, accountPub, "not a user public key"),
		},
		{
			// An operator who pastes a seed by mistake must not find it echoed in the error.
			name: "fail/callout-user-seed-not-echoed",
			opts: setup.Options{Spaces: []string{"alpha"}, CalloutUsers: map[string]string{"alpha": string(userSeed)}},
			wantErr: func(t *testing.T, _ string, err error) {
				msg := err.Error()
				// The failure message does not print msg: it would hold the seed.
				if strings.Contains(msg, string(userSeed)) || seedPattern.MatchString(msg) {
					t.Fatal("the error quotes the seed")
				}
				if !strings.Contains(msg, `"alpha"`) || !strings.Contains(msg, "not a user public key") {
					t.Fatalf("err = %q, want a refusal naming the space", msg)
				}
			},
		},
		{
			name:    "fail/callout-user-unknown-space",
			opts:    setup.Options{Spaces: []string{"alpha"}, CalloutUsers: map[string]string{"gamma": givenUser}},
			wantErr: wantMessage(`"gamma"`, "not being created"),
		},
		{name: "fail/no-space", opts: setup.Options{}, wantErr: wantMessage("--space")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newDir(t)
			if tt.prepare != nil {
				tt.prepare(t, dir)
			}
			before := snapshot(t, dir)
			opts := tt.opts
			opts.Dir = dir
			opts.Now = func() time.Time { return fixedNow }
			if tt.relative {
				t.Chdir(filepath.Dir(dir))
				opts.Dir = filepath.Base(dir)
			}
			res, err := setup.Init(opts)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Init succeeded with %+v, want an error", res)
				}
				if res != nil {
					t.Errorf("Init returned a result with its error: %+v", res)
				}
				tt.wantErr(t, dir, err)
				if after := snapshot(t, dir); !maps.EqualFunc(before, after, bytes.Equal) {
					t.Fatalf("a failed Init changed files: before %v, after %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
				}
				return
			}
			if err != nil {
				t.Fatalf("Init: %v", err)
			}
			tt.check(t, dir, res, before)
		})
	}
}

// TestInitNoDir covers the one refusal that has no directory to snapshot.
func TestInitNoDir(t *testing.T) {
	if _, err := setup.Init(setup.Options{Spaces: []string{"alpha"}}); err == nil || !strings.Contains(err.Error(), "--dir") {
		t.Fatalf("err = %v, want --dir is required", err)
	}
}

// TestExistsError pins the message: the CLI prints it as is.
func TestExistsError(t *testing.T) {
	err := error(&setup.ExistsError{Path: "/x/operator/operator.nk"})
	if got, want := err.Error(), "refusing to overwrite existing key material: /x/operator/operator.nk"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// wantExists expects an *setup.ExistsError naming path(dir), in the message too.
func wantExists(path func(dir string) string) func(*testing.T, string, error) {
	return func(t *testing.T, dir string, err error) {
		t.Helper()
		var ee *setup.ExistsError
		want := path(dir)
		if !errors.As(err, &ee) || ee.Path != want || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want *setup.ExistsError naming %s", err, want)
		}
	}
}

// wantNameError expects a *space.NameError for name, and no init directory at all.
func wantNameError(name string) func(*testing.T, string, error) {
	return func(t *testing.T, dir string, err error) {
		t.Helper()
		var ne *space.NameError
		if !errors.As(err, &ne) || ne.Value != name {
			t.Fatalf("err = %v, want *space.NameError for %q", err, name)
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Lstat(%s) = %v: a refused name must not create the directory", dir, err)
		}
	}
}

// wantMessage expects every part in the error text.
func wantMessage(parts ...string) func(*testing.T, string, error) {
	return func(t *testing.T, _ string, err error) {
		t.Helper()
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Fatalf("err = %v, want it to contain %q", err, p)
			}
		}
	}
}

// snapshot reads every regular file under dir (absent dir: empty).
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return out
	}
	for _, p := range regularFiles(t, dir) {
		out[p] = readFile(t, p)
	}
	return out
}

// copyFile copies src to dst (0600), replacing dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.WriteFile(dst+".tmp", readFile(t, src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		t.Fatal(err)
	}
}

// checkTwoSpaces proves the layout: every file and directory with its exact mode, each seed of
// the right kind and key, and no secret anywhere under broker/ or public/.
func checkTwoSpaces(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
	t.Helper()
	names := []string{"alpha", "beta team"}
	if res.BrokerConfig != filepath.Join(dir, setup.BrokerDir, setup.BrokerConfigFile) ||
		res.OperatorDir != filepath.Join(dir, setup.OperatorDir) ||
		res.SignerDir != filepath.Join(dir, setup.SignerDir) ||
		res.PublicDir != filepath.Join(dir, setup.PublicDir) || len(res.Spaces) != 2 {
		t.Fatalf("result = %+v", res)
	}

	want := map[string]fs.FileMode{
		"operator/": 0o700, "signer/": 0o700, "authd/": 0o700,
		"operator/operator.nk": 0o600, "operator/operator-signing.nk": 0o600, "operator/system-account.nk": 0o600,
		"signer/system-signing.nk": 0o600,
		"broker/nats.conf":         0o644, "public/broker.json": 0o644,
	}
	for i, name := range names {
		s := seg(name)
		r := res.Spaces[i]
		if r.Name != name || r.Segment != s || r.PublicFile != filepath.Join(dir, "public", s+".json") ||
			r.CalloutSeedFile != filepath.Join(dir, "authd", s, "callout.nk") || !nkeys.IsValidPublicUserKey(r.CalloutUser) {
			t.Fatalf("Spaces[%d] = %+v", i, r)
		}
		for _, d := range []string{"operator/" + s + "/", "signer/" + s + "/", "authd/" + s + "/"} {
			want[d] = 0o700
		}
		want["operator/"+s+"/data-account.nk"] = 0o600
		want["operator/"+s+"/auth-account.nk"] = 0o600
		for _, f := range keystore.SecretFiles {
			want["signer/"+s+"/"+f] = 0o600
		}
		want["authd/"+s+"/callout.nk"] = 0o600
		want["public/"+s+".json"] = 0o644
	}
	got := modes(t, dir)
	// broker/ and public/ are made with the umask; they must never be group or world writable.
	for _, d := range []string{"broker/", "public/"} {
		if m, ok := got[d]; !ok || m&0o700 != 0o700 || m&0o022 != 0 {
			t.Errorf("%s mode %#o, want owner rwx and no group/other write", d, m)
		}
		delete(got, d)
	}
	if !maps.Equal(got, want) {
		for k, m := range got {
			if w, ok := want[k]; !ok || w != m {
				t.Errorf("%s: mode %#o (expected: %v %#o)", k, m, ok, w)
			}
		}
		for k := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("%s: missing", k)
			}
		}
		t.FailNow()
	}

	// Each seed is of the right kind and is the key the public facts name.
	br, err := keystore.ReadPublicBroker(filepath.Join(dir, setup.PublicDir))
	if err != nil {
		t.Fatal(err)
	}
	broker, err := trust.LoadBroker(br.OperatorJWT, br.SystemAccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	checkSeed(t, filepath.Join(dir, "operator/operator.nk"), nkeys.PrefixByteOperator, broker.OperatorPublicKey())
	checkSeed(t, filepath.Join(dir, "operator/operator-signing.nk"), nkeys.PrefixByteOperator, broker.OperatorSigningKeys()...)
	checkSeed(t, filepath.Join(dir, "signer/system-signing.nk"), nkeys.PrefixByteAccount, broker.SystemSigningKeys()...)
	checkSeed(t, filepath.Join(dir, "operator/system-account.nk"), nkeys.PrefixByteAccount, broker.SystemAccountPublicKey())
	var perSpace [][]byte
	for i, name := range names {
		s := seg(name)
		ps := readPublic(t, dir, name)
		if ps.Space != name || ps.Token != space.Token(name) || ps.OperatorPublicKey != broker.OperatorPublicKey() {
			t.Fatalf("public facts of %q: space %q token %q operator %s", name, ps.Space, ps.Token, ps.OperatorPublicKey)
		}
		checkSeed(t, filepath.Join(dir, "operator", s, "data-account.nk"), nkeys.PrefixByteAccount, ps.DataAccountPublicKey)
		checkSeed(t, filepath.Join(dir, "operator", s, "auth-account.nk"), nkeys.PrefixByteAccount, ps.AuthAccountPublicKey)
		checkSeed(t, filepath.Join(dir, "signer", s, keystore.FileDataSigning), nkeys.PrefixByteAccount, ps.DataSigningKeys...)
		checkSeed(t, filepath.Join(dir, "signer", s, keystore.FileAuthSigning), nkeys.PrefixByteAccount, ps.AuthSigningKeys...)
		checkSeed(t, filepath.Join(dir, "signer", s, keystore.FileXKey), nkeys.PrefixByteCurve, ps.XKeyPublicKey)
		checkSeed(t, filepath.Join(dir, "authd", s, "callout.nk"), nkeys.PrefixByteUser, res.Spaces[i].CalloutUser)
		checkIssuer(t, filepath.Join(dir, "signer", s, keystore.FileIssuer))
		for _, f := range []string{keystore.FileOwnerSecret, keystore.FileMACKey} {
			raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(readFile(t, filepath.Join(dir, "signer", s, f)))))
			if err != nil || len(raw) != keystore.SecretLen {
				t.Fatalf("%s/%s: %d bytes, %v; want %d bytes of base64", s, f, len(raw), err, keystore.SecretLen)
			}
			perSpace = append(perSpace, raw)
		}
	}
	for i := range perSpace {
		for j := range i {
			if bytes.Equal(perSpace[i], perSpace[j]) {
				t.Fatalf("owner secrets and MAC keys repeat (%d and %d)", i, j)
			}
		}
	}

	// No secret in any broker or public file: no seed shape, no PEM key, and none of the secret
	// files' contents.
	secrets := secretValues(t, dir)
	var public []string
	for _, sub := range []string{setup.BrokerDir, setup.PublicDir} {
		public = append(public, regularFiles(t, filepath.Join(dir, sub))...)
	}
	if len(public) != 4 {
		t.Fatalf("public files = %v, want nats.conf, broker.json and two space files", public)
	}
	for _, p := range public {
		data := readFile(t, p)
		if m := seedPattern.Find(data); m != nil {
			t.Errorf("%s holds something shaped like a seed (%.4s…)", p, m)
		}
		if bytes.Contains(data, []byte("PRIVATE KEY")) {
			t.Errorf("%s holds a PEM private key", p)
		}
		for sp, v := range secrets {
			if bytes.Contains(data, v) {
				t.Errorf("%s holds the content of secret file %s", p, sp)
			}
		}
	}
	// signerd's directory holds no operator or account identity seed.
	for op, v := range secrets {
		if !strings.HasPrefix(op, filepath.Join(dir, setup.OperatorDir)+"/") {
			continue
		}
		for _, p := range regularFiles(t, filepath.Join(dir, setup.SignerDir)) {
			if bytes.Contains(readFile(t, p), v) {
				t.Errorf("%s holds the identity seed of %s", p, op)
			}
		}
	}
}

// checkSeed reads an .nk file and checks its kind and public key.
func checkSeed(t *testing.T, path string, kind nkeys.PrefixByte, wantPub ...string) {
	t.Helper()
	s, err := creds.ReadSeedFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Wipe()
	p, err := s.Prefix()
	if err != nil || p != kind {
		t.Fatalf("%s: seed kind %v, %v; want %v", path, p, err, kind)
	}
	pub, err := s.Public()
	if err != nil || !slices.Contains(wantPub, pub) {
		t.Fatalf("%s: public key %s, %v; want one of %v", path, pub, err, wantPub)
	}
}

// checkIssuer checks the bearer issuer key is a PKCS#8 PEM Ed25519 private key.
func checkIssuer(t *testing.T, path string) {
	t.Helper()
	block, rest := pem.Decode(readFile(t, path))
	if block == nil || block.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("%s: not exactly one PRIVATE KEY PEM block", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if _, ok := key.(ed25519.PrivateKey); !ok {
		t.Fatalf("%s: %T, want ed25519.PrivateKey", path, key)
	}
}

// checkSentinel decodes the public sentinel: a bearer user of the callout account, signed by its
// signing key, denying everything both ways, without exp.
func checkSentinel(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
	t.Helper()
	ps := readPublic(t, dir, "alpha")
	uc, err := jwt.DecodeUserClaims(ps.SentinelJWT)
	if err != nil {
		t.Fatal(err)
	}
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	switch {
	case vr.IsBlocking(true):
		t.Fatalf("sentinel does not validate: %v", vr.Errors())
	case !uc.BearerToken:
		t.Fatal("sentinel is not a bearer token")
	case uc.IssuerAccount != ps.AuthAccountPublicKey:
		t.Fatalf("issuer account %s, want the callout account %s", uc.IssuerAccount, ps.AuthAccountPublicKey)
	case !slices.Contains(ps.AuthSigningKeys, uc.Issuer):
		t.Fatalf("issuer %s, want a callout signing key %v", uc.Issuer, ps.AuthSigningKeys)
	case !slices.Equal(uc.Pub.Deny, []string{">"}) || !slices.Equal(uc.Sub.Deny, []string{">"}):
		t.Fatalf("deny pub %v sub %v, want [>] both", uc.Pub.Deny, uc.Sub.Deny)
	case len(uc.Pub.Allow) != 0 || len(uc.Sub.Allow) != 0 || uc.Resp != nil:
		t.Fatalf("allow pub %v sub %v resp %v, want none", uc.Pub.Allow, uc.Sub.Allow, uc.Resp)
	case uc.Expires != 0:
		t.Fatalf("exp %d, want none", uc.Expires)
	case !nkeys.IsValidPublicUserKey(uc.Subject) || uc.Subject == res.Spaces[0].CalloutUser:
		t.Fatalf("subject %s, want a throwaway user key", uc.Subject)
	case uc.Name != string(profiles.Sentinel) || !slices.Equal(uc.Tags, []string{"profile:sentinel"}):
		t.Fatalf("name %q tags %v", uc.Name, uc.Tags)
	}
}

// checkBrokerBoots starts nats-server from the rendered file and proves the trust it carries
// with users signed by signerd's keys.
func checkBrokerBoots(t *testing.T, dir string, res *setup.Result, _ map[string][]byte) {
	t.Helper()
	s := startBroker(t, dir)
	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("client URL %s, want loopback", url)
	}
	st, err := keystore.Open(keystore.Config{KeyDir: filepath.Join(dir, setup.SignerDir), PublicDir: filepath.Join(dir, setup.PublicDir)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	sp, ok := st.Space("alpha")
	if !ok {
		t.Fatal("space alpha not loaded")
	}
	ps := sp.Public

	t.Run("ok/agent-round-trip", func(t *testing.T) {
		kp, pub := newUser(t)
		p := profiles.Params{Owner: "local", Actor: "bob", LifecycleUID: "01jabcdefghjkmnpqrstvwxyz0", AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}}
		tok := mint(t, "alpha", profiles.Agent, p, pub, ps.DataAccountPublicKey, sp.DataSigning)
		nc, err := connect(url, tok, kp)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		names, err := space.NewNames("alpha")
		if err != nil {
			t.Fatal(err)
		}
		pubSubj, _ := names.Chat("local", "bob", "general")
		subSubj, _ := names.ChatRead("general")
		sub, err := nc.SubscribeSync(subSubj)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(pubSubj, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil || string(m.Data) != "hello" || m.Subject != pubSubj {
			t.Fatalf("NextMsg = %v, %v; want hello on %s", m, err, pubSubj)
		}
	})
	t.Run("ok/callout-user", func(t *testing.T) {
		kp := seedKeyPair(t, res.Spaces[0].CalloutSeedFile)
		pub, _ := kp.PublicKey()
		tok := mint(t, "alpha", profiles.AuthCallout, profiles.Params{}, pub, ps.AuthAccountPublicKey, sp.AuthSigning)
		nc, err := connect(url, tok, kp)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.SubscribeSync(space.AuthCalloutSubject); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil || !nc.IsConnected() {
			t.Fatalf("Flush = %v, connected %v", err, nc.IsConnected())
		}
	})
	refused := []struct {
		name    string
		signer  func(t *testing.T) nkeys.KeyPair
		profile profiles.Name
		account string
	}{
		// Strict signing-key usage: the account identity key cannot sign users.
		{"fail/user-signed-by-data-identity-key", func(t *testing.T) nkeys.KeyPair {
			return seedKeyPair(t, filepath.Join(dir, setup.OperatorDir, seg("alpha"), "data-account.nk"))
		}, profiles.Probe, ps.DataAccountPublicKey},
		// A callout-account user whose key is not in auth_users goes to the callout, which
		// nobody answers here.
		{"fail/unregistered-callout-user", func(*testing.T) nkeys.KeyPair { return sp.AuthSigning }, profiles.AuthCallout, ps.AuthAccountPublicKey},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			kp, pub := newUser(t)
			tok := mint(t, "alpha", tt.profile, profiles.Params{}, pub, tt.account, tt.signer(t))
			nc, err := connect(url, tok, kp, nats.Name(pub))
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			// A user the AUTH account does not register goes to the callout, which nobody
			// answers here: the broker refuses it at its 2 s auth timeout, and its RTT PING can
			// reach the client first; the broker's record then says why it closed the connection.
			err = testkit.RefusedOnRecord(t, s, pub, err)
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				t.Fatalf("err = %v, want an authorization violation", err)
			}
		})
	}
}

// checkAddSpace proves --add-space keeps the first space untouched and renders both.
func checkAddSpace(t *testing.T, dir string, res *setup.Result, before map[string][]byte) {
	t.Helper()
	if len(res.Spaces) != 1 || res.Spaces[0].Name != "beta" {
		t.Fatalf("result spaces = %+v, want beta only", res.Spaces)
	}
	after := snapshot(t, dir)
	for p, b := range before {
		if p == res.BrokerConfig {
			continue
		}
		if !bytes.Equal(after[p], b) {
			t.Errorf("%s changed", p)
		}
	}
	names, err := keystore.ListPublicSpaces(filepath.Join(dir, setup.PublicDir))
	if err != nil || !slices.Equal(names, []string{"alpha", "beta"}) {
		t.Fatalf("public spaces = %v, %v; want [alpha beta]", names, err)
	}
	conf := string(readFile(t, res.BrokerConfig))
	for _, name := range names {
		ps := readPublic(t, dir, name)
		for _, k := range []string{ps.DataAccountPublicKey, ps.AuthAccountPublicKey} {
			if !strings.Contains(conf, "\n  "+k+": \"") {
				t.Errorf("nats.conf does not preload %s of %s", k, name)
			}
		}
	}
	st, err := keystore.Open(keystore.Config{KeyDir: filepath.Join(dir, setup.SignerDir), PublicDir: filepath.Join(dir, setup.PublicDir)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Spaces(); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Fatalf("keystore spaces = %v", got)
	}
	// The new space's users are trusted by a broker started from the re-rendered file.
	s := startBroker(t, dir)
	sp, _ := st.Space("beta")
	kp, pub := newUser(t)
	tok := mint(t, "beta", profiles.Probe, profiles.Params{}, pub, sp.Public.DataAccountPublicKey, sp.DataSigning)
	nc, err := connect(s.ClientURL(), tok, kp)
	if err != nil {
		t.Fatalf("beta probe user refused: %v", err)
	}
	nc.Close()
}
