package keystore_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// agentParams is a valid agent profile parameter set.
var agentParams = profiles.Params{
	Owner: "local", Actor: "bob", LifecycleUID: "01jabcdefghjkmnpqrstvwxyz0",
	AllowPublish: []string{"general"}, AllowSubscribe: []string{"general", "ops"}, Subscribe: []string{"general"},
}

func TestOpen(t *testing.T) {
	f := newFixture(t, "beta", "alpha")
	st := open(t, f.config())

	if got := st.Spaces(); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Fatalf("Spaces() = %v, want [alpha beta]", got)
	}
	// Spaces returns a copy.
	st.Spaces()[0] = "mutated"
	if got := st.Spaces(); got[0] != "alpha" {
		t.Fatalf("Spaces() shares its slice: %v", got)
	}
	pb, err := keystore.ReadPublicBroker(f.publicDir())
	if err != nil {
		t.Fatal(err)
	}
	if st.Broker().OperatorJWT() != pb.OperatorJWT || st.Broker().SystemAccountJWT() != pb.SystemAccountJWT {
		t.Fatal("Broker() does not hold broker.json's JWTs")
	}
	if _, ok := st.Space("gamma"); ok {
		t.Fatal(`Space("gamma") found a space that was never created`)
	}

	for _, name := range []string{"alpha", "beta"} {
		t.Run("ok/open/"+name, func(t *testing.T) {
			sp, ok := st.Space(name)
			if !ok {
				t.Fatalf("Space(%q) not loaded", name)
			}
			ps, err := keystore.ReadPublicSpace(keystore.PublicSpacePath(f.publicDir(), name))
			if err != nil {
				t.Fatal(err)
			}
			if sp.Name != name || sp.Trust.Name() != name || sp.Trust.DataAccountPublicKey() != ps.DataAccountPublicKey || sp.Public.SentinelJWT != ps.SentinelJWT {
				t.Fatalf("space %q: name %q, trust %q/%s", name, sp.Name, sp.Trust.Name(), sp.Trust.DataAccountPublicKey())
			}
			for _, k := range []struct {
				role string
				key  *keystore.SigningKey
				want []string
			}{{"data", sp.DataSigning, ps.DataSigningKeys}, {"auth", sp.AuthSigning, ps.AuthSigningKeys}} {
				pub, err := k.key.PublicKey()
				if err != nil || pub != k.key.Public() || !slices.Contains(k.want, pub) || !nkeys.IsValidPublicAccountKey(pub) {
					t.Fatalf("%s signing key %s, %v; want an account key in %v", k.role, pub, err, k.want)
				}
				if b, err := k.key.Seed(); b != nil || !errors.Is(err, keystore.ErrExportRefused) {
					t.Fatalf("%s Seed() = %d bytes, %v; want ErrExportRefused", k.role, len(b), err)
				}
				if b, err := k.key.PrivateKey(); b != nil || !errors.Is(err, keystore.ErrExportRefused) {
					t.Fatalf("%s PrivateKey() = %d bytes, %v; want ErrExportRefused", k.role, len(b), err)
				}
			}
			if sp.DataSigning.Public() == sp.AuthSigning.Public() {
				t.Fatal("data and auth signing keys are the same key")
			}

			// A user JWT signed through jwt/v2 with the SigningKey verifies and names it.
			ukp, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			defer ukp.Wipe()
			upub, _ := ukp.PublicKey()
			spec, err := profiles.Build(name, profiles.Agent, agentParams)
			if err != nil {
				t.Fatal(err)
			}
			uc, err := spec.Claims(upub, ps.DataAccountPublicKey, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := uc.Encode(sp.DataSigning)
			if err != nil {
				t.Fatal(err)
			}
			got, err := jwt.DecodeUserClaims(tok)
			if err != nil {
				t.Fatalf("DecodeUserClaims: %v", err)
			}
			if got.Subject != upub || got.Issuer != sp.DataSigning.Public() || got.IssuerAccount != ps.DataAccountPublicKey {
				t.Fatalf("decoded sub %s iss %s acct %s", got.Subject, got.Issuer, got.IssuerAccount)
			}
			// Tampering with the payload breaks the signature.
			parts := strings.Split(tok, ".")
			other, err := uc.Encode(sp.AuthSigning)
			if err != nil {
				t.Fatal(err)
			}
			forged := parts[0] + "." + parts[1] + "." + strings.Split(other, ".")[2]
			if _, err := jwt.DecodeUserClaims(forged); err == nil {
				t.Fatal("a JWT with another key's signature decoded")
			}
		})
	}
}

func TestSigningKey(t *testing.T) {
	f := newFixture(t, "alpha")
	st := open(t, f.config())
	sp, _ := st.Space("alpha")
	msg := bytes.Repeat([]byte("cotal "), 70)

	t.Run("ok/sign-matches-nkeys", func(t *testing.T) {
		for _, k := range []struct {
			file string
			key  *keystore.SigningKey
		}{{keystore.FileDataSigning, sp.DataSigning}, {keystore.FileAuthSigning, sp.AuthSigning}} {
			kp := seedKeyPair(t, f.secret("alpha", k.file))
			want, err := kp.Sign(msg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.key.Sign(msg)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: Sign = %x, %v; want nkeys' %x", k.file, got, err, want)
			}
			if err := kp.Verify(msg, got); err != nil {
				t.Fatalf("%s: nkeys does not verify the cached key's signature: %v", k.file, err)
			}
			if err := k.key.Verify(msg, want); err != nil {
				t.Fatalf("%s: Verify: %v", k.file, err)
			}
			bad := slices.Clone(want)
			bad[0] ^= 1
			if err := k.key.Verify(msg, bad); !errors.Is(err, nkeys.ErrInvalidSignature) {
				t.Fatalf("%s: Verify(tampered) = %v, want ErrInvalidSignature", k.file, err)
			}
		}
	})
	t.Run("fail/curve-operations", func(t *testing.T) {
		if _, err := sp.DataSigning.Seal([]byte("x"), sp.Public.XKeyPublicKey); !errors.Is(err, nkeys.ErrInvalidNKeyOperation) {
			t.Fatalf("Seal = %v", err)
		}
		if _, err := sp.DataSigning.SealWithRand([]byte("x"), sp.Public.XKeyPublicKey, rand.Reader); !errors.Is(err, nkeys.ErrInvalidNKeyOperation) {
			t.Fatalf("SealWithRand = %v", err)
		}
		if _, err := sp.DataSigning.Open([]byte("x"), sp.Public.XKeyPublicKey); !errors.Is(err, nkeys.ErrInvalidNKeyOperation) {
			t.Fatalf("Open = %v", err)
		}
	})
}

func TestNewSigningKey(t *testing.T) {
	seedOf := func(create func() (nkeys.KeyPair, error)) []byte {
		kp, err := create()
		if err != nil {
			t.Fatal(err)
		}
		s, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(s)
	}
	account := seedOf(nkeys.CreateAccount)
	accountKP, _ := nkeys.FromSeed(account)
	accountPub, _ := accountKP.PublicKey()
	tests := []struct {
		name    string
		seed    []byte
		wantPub func(string) bool
		wantErr string
	}{
		{"ok/account", account, func(p string) bool { return p == accountPub }, ""},
		{"ok/operator", seedOf(nkeys.CreateOperator), nkeys.IsValidPublicOperatorKey, ""},
		{"ok/user", seedOf(nkeys.CreateUser), nkeys.IsValidPublicUserKey, ""},
		// Only the canonical encoding is a seed: Go's base32 decoder skips line ends, but the
		// key store's decoder does not (the file reader trims surrounding whitespace first).
		{"fail/trailing-newline", append(slices.Clone(account), '\n'), nil, "decode seed"},
		{"fail/inner-newline", slices.Concat(account[:20], []byte("\r\n"), account[20:]), nil, "decode seed"},
		{"fail/curve", seedOf(nkeys.CreateCurveKeys), nil, "cannot sign JWTs"},
		{"fail/public-key", []byte(accountPub), nil, "decode seed"},
		{"fail/garbage", []byte("not a seed"), nil, "decode seed"},
		{"fail/empty", nil, nil, "decode seed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := keystore.NewSigningKey(tt.seed)
			if tt.wantErr != "" {
				if err == nil || k != nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewSigningKey: key %v, err %v; want error %q", k != nil, err, tt.wantErr)
				}
				if bytes.Contains([]byte(err.Error()), tt.seed) && len(tt.seed) > 0 {
					t.Fatal("the error quotes the seed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.wantPub(k.Public()) {
				t.Fatalf("public key %s", k.Public())
			}
			sig, err := k.Sign([]byte("m"))
			if err != nil || k.Verify([]byte("m"), sig) != nil {
				t.Fatalf("Sign/Verify: %v", err)
			}
			k.Wipe()
			if _, err := k.Sign([]byte("m")); err == nil {
				t.Fatal("a wiped key signed")
			}
			if err := k.Verify([]byte("m"), sig); err == nil {
				t.Fatal("a wiped key verified")
			}
			k.Wipe() // idempotent
		})
	}
}

func TestOpenFlat(t *testing.T) {
	f := newFixture(t, "alpha", "beta")
	nested := open(t, f.config())
	for _, m := range []struct {
		name          string
		file, dirMode os.FileMode
	}{
		{"ok/flat-credentials-dir/0600-in-0700", 0o600, 0o700},
		{"ok/flat-credentials-dir/systemd-0400-in-0500", 0o400, 0o500},
	} {
		t.Run(m.name, func(t *testing.T) {
			flat := flatten(t, f, m.file, m.dirMode)
			if fi, err := os.Stat(keystore.SecretPath(flat, "alpha", keystore.FileDataSigning, true)); err != nil || fi.Mode().Perm() != m.file ||
				filepath.Base(fi.Name()) != space.Segment("alpha")+"."+keystore.FileDataSigning {
				t.Fatalf("flat file %v, %v", fi, err)
			}
			st := open(t, keystore.Config{KeyDir: flat, Flat: true, PublicDir: f.publicDir()})
			if got := st.Spaces(); !slices.Equal(got, []string{"alpha", "beta"}) {
				t.Fatalf("Spaces() = %v", got)
			}
			for _, name := range st.Spaces() {
				a, _ := st.Space(name)
				b, _ := nested.Space(name)
				if a.DataSigning.Public() != b.DataSigning.Public() || a.AuthSigning.Public() != b.AuthSigning.Public() {
					t.Fatalf("%s: flat keys differ from nested keys", name)
				}
				msg := []byte("same key, same signature")
				s1, _ := a.DataSigning.Sign(msg)
				s2, _ := b.DataSigning.Sign(msg)
				if !bytes.Equal(s1, s2) {
					t.Fatalf("%s: flat and nested signatures differ", name)
				}
			}
		})
	}
}

// openFail is one refused key directory. mutate breaks a fresh two-space fixture (alpha, beta)
// and returns the Config to open and the path the error must name; check asserts the type.
type openFail struct {
	name   string
	root   bool
	mutate func(t *testing.T, f fixture) (keystore.Config, string)
	check  func(t *testing.T, err error, path string)
}

func TestOpenRefuses(t *testing.T) {
	other := newFixture(t, "alpha", "beta")
	tests := []openFail{
		{
			name: "fail/seed-mode-0644",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileDataSigning)
				chmod(t, p, 0o644)
				return f.config(), p
			},
			check: wantMode(0o644, creds.FileMode),
		},
		{
			name: "fail/seed-mode-0640-beta",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("beta", keystore.FileXKey)
				chmod(t, p, 0o640)
				return f.config(), p
			},
			check: wantMode(0o640, creds.FileMode),
		},
		{
			name: "fail/issuer-mode-0604",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileIssuer)
				chmod(t, p, 0o604)
				return f.config(), p
			},
			check: wantMode(0o604, creds.FileMode),
		},
		{
			name: "fail/dir-mode-0755",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.spaceDir("alpha")
				chmod(t, p, 0o755)
				return f.config(), p
			},
			check: wantMode(0o755, creds.DirMode),
		},
		{
			name: "fail/keydir-mode-0755",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				chmod(t, f.signerDir(), 0o755)
				return f.config(), f.signerDir()
			},
			check: wantMode(0o755, creds.DirMode),
		},
		{
			name: "fail/other-owner",
			root: true,
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileDataSigning)
				if err := os.Chown(p, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				return f.config(), p
			},
			check: wantOwner(65534),
		},
		{
			name: "fail/other-owner-space-dir",
			root: true,
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.spaceDir("beta")
				if err := os.Chown(p, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				return f.config(), p
			},
			check: wantOwner(65534),
		},
		{
			name: "fail/symlink-seed",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileDataSigning)
				// The target is a perfectly private copy: the link itself is refused.
				elsewhere := filepath.Join(t.TempDir(), "data-signing.nk")
				if err := os.WriteFile(elsewhere, readFile(t, p), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(elsewhere, p); err != nil {
					t.Fatal(err)
				}
				return f.config(), p
			},
			check: func(t *testing.T, err error, path string) {
				var te *creds.TypeError
				if !errors.As(err, &te) || te.Path != path || te.Mode&fs.ModeSymlink == 0 {
					t.Fatalf("err = %v, want *creds.TypeError (symlink) naming %s", err, path)
				}
			},
		},
		{
			name: "fail/symlink-space-dir",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.spaceDir("alpha")
				moved := filepath.Join(t.TempDir(), "moved")
				if err := os.Rename(p, moved); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(moved, p); err != nil {
					t.Fatal(err)
				}
				return f.config(), p
			},
			check: func(t *testing.T, err error, path string) {
				var te *creds.TypeError
				if !errors.As(err, &te) || te.Path != path {
					t.Fatalf("err = %v, want *creds.TypeError naming %s", err, path)
				}
			},
		},
		{
			name: "fail/foreign-keys",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				for _, file := range keystore.SecretFiles {
					writeFile(t, f.secret("alpha", file), readFile(t, other.secret("alpha", file)))
				}
				return f.config(), f.spaceDir("alpha")
			},
			check: wantMismatch("data signing"),
		},
		{
			name: "fail/foreign-auth-signing",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				writeFile(t, f.secret("beta", keystore.FileAuthSigning), readFile(t, other.secret("beta", keystore.FileAuthSigning)))
				return f.config(), f.spaceDir("beta")
			},
			check: wantMismatch("callout signing"),
		},
		{
			name: "fail/foreign-xkey",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				writeFile(t, f.secret("alpha", keystore.FileXKey), readFile(t, other.secret("alpha", keystore.FileXKey)))
				return f.config(), f.spaceDir("alpha")
			},
			check: wantMismatch("callout xkey"),
		},
		{
			// Another space of the same broker: right operator, wrong accounts.
			name: "fail/other-space-keys",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				for _, file := range keystore.SecretFiles {
					writeFile(t, f.secret("alpha", file), readFile(t, f.secret("beta", file)))
				}
				return f.config(), f.spaceDir("alpha")
			},
			check: wantMismatch("data signing"),
		},
		{
			name: "fail/swapped-signing-keys",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				d, a := f.secret("alpha", keystore.FileDataSigning), f.secret("alpha", keystore.FileAuthSigning)
				dd, ad := readFile(t, d), readFile(t, a)
				writeFile(t, d, ad)
				writeFile(t, a, dd)
				return f.config(), f.spaceDir("alpha")
			},
			check: wantMismatch("data signing"),
		},
		{
			name: "fail/user-seed-as-signing-key",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				kp, _ := nkeys.CreateUser()
				seed, _ := kp.Seed()
				writeFile(t, f.secret("alpha", keystore.FileDataSigning), append(slices.Clone(seed), '\n'))
				return f.config(), f.spaceDir("alpha")
			},
			check: wantMismatch("data signing"),
		},
		{
			name: "fail/seed-not-a-seed",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileAuthSigning)
				writeFile(t, p, []byte("SAnot-a-seed\n"))
				return f.config(), p
			},
			check: func(t *testing.T, err error, path string) {
				var fe *creds.FormatError
				if !errors.As(err, &fe) || fe.Path != path {
					t.Fatalf("err = %v, want *creds.FormatError naming %s", err, path)
				}
			},
		},
		{
			name: "fail/bad-issuer-pem",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileIssuer)
				writeFile(t, p, []byte("-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n"))
				return f.config(), p
			},
			check: wantText("not a PKCS#8 PEM private key"),
		},
		{
			name: "fail/issuer-wrong-pem-type",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileIssuer)
				block, _ := pem.Decode(readFile(t, p))
				writeFile(t, p, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: block.Bytes}))
				return f.config(), p
			},
			check: wantText("not a PKCS#8 PEM private key"),
		},
		{
			name: "fail/issuer-not-pkcs8",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileIssuer)
				writeFile(t, p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0x03, 0x02, 0x01, 0x00}}))
				return f.config(), p
			},
			check: wantText("not an Ed25519 key"),
		},
		{
			name: "fail/issuer-not-ed25519",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileIssuer)
				k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
				if err != nil {
					t.Fatal(err)
				}
				der, err := x509.MarshalPKCS8PrivateKey(k)
				if err != nil {
					t.Fatal(err)
				}
				writeFile(t, p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
				return f.config(), p
			},
			check: wantText("not an Ed25519 key"),
		},
		{
			name: "fail/short-owner-secret",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileOwnerSecret)
				writeFile(t, p, []byte(base64.StdEncoding.EncodeToString(make([]byte, 16))+"\n"))
				return f.config(), p
			},
			check: wantText("want 32 bytes in base64"),
		},
		{
			name: "fail/long-mac-key",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("beta", keystore.FileMACKey)
				writeFile(t, p, []byte(base64.StdEncoding.EncodeToString(make([]byte, 33))))
				return f.config(), p
			},
			check: wantText("want 32 bytes in base64"),
		},
		{
			name: "fail/mac-key-not-base64",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := f.secret("alpha", keystore.FileMACKey)
				writeFile(t, p, []byte("not*base64"))
				return f.config(), p
			},
			check: wantText("want 32 bytes in base64"),
		},
		{
			name: "fail/flat-seed-mode-0644",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				flat := flatten(t, f, 0o600, 0o700)
				p := keystore.SecretPath(flat, "beta", keystore.FileAuthSigning, true)
				chmod(t, p, 0o644)
				return keystore.Config{KeyDir: flat, Flat: true, PublicDir: f.publicDir()}, p
			},
			check: wantMode(0o644, creds.FileMode),
		},
		{
			name: "fail/flat-dir-mode-0755",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				flat := flatten(t, f, 0o600, 0o755)
				return keystore.Config{KeyDir: flat, Flat: true, PublicDir: f.publicDir()}, flat
			},
			check: wantMode(0o755, creds.DirMode),
		},
		{
			// A nested key directory opened as flat has no <seg>.<file> names.
			name: "fail/nested-opened-flat",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				cfg := f.config()
				cfg.Flat = true
				return cfg, keystore.SecretPath(f.signerDir(), "alpha", keystore.FileDataSigning, true)
			},
			check: wantNotExist,
		},
		{
			name: "fail/no-space-facts",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				for _, name := range f.spaces {
					if err := os.Remove(keystore.PublicSpacePath(f.publicDir(), name)); err != nil {
						t.Fatal(err)
					}
				}
				return f.config(), f.publicDir()
			},
			check: wantText("no space facts"),
		},
		{
			name: "fail/broker-facts-missing",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := filepath.Join(f.publicDir(), keystore.BrokerFile)
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				return f.config(), p
			},
			check: wantNotExist,
		},
		{
			// Public facts of another broker: the space accounts are not its operator's.
			name: "fail/foreign-broker-facts",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := filepath.Join(f.publicDir(), keystore.BrokerFile)
				writeFile(t, p, readFile(t, filepath.Join(other.publicDir(), keystore.BrokerFile)))
				return f.config(), keystore.PublicSpacePath(f.publicDir(), "alpha")
			},
			check: func(t *testing.T, err error, path string) {
				var fa *trust.ForeignAccountError
				if !errors.As(err, &fa) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want *trust.ForeignAccountError naming %s", err, path)
				}
			},
		},
		{
			name: "fail/space-facts-unknown-field",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := keystore.PublicSpacePath(f.publicDir(), "beta")
				data := bytes.Replace(readFile(t, p), []byte(`"ver": 1,`), []byte(`"ver": 1, "seed": "x",`), 1)
				writeFile(t, p, data)
				return f.config(), p
			},
			check: wantText(`unknown field "seed"`),
		},
		{
			name: "fail/facts-signing-keys-disagree",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				return editFacts(t, f, "alpha", func(ps *keystore.PublicSpace) {
					ps.DataSigningKeys = append(ps.DataSigningKeys, ps.AuthSigningKeys...)
				})
			},
			check: wantText("data_signing_keys"),
		},
		{
			name: "fail/facts-callout-users-disagree",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				kp, _ := nkeys.CreateUser()
				pub, _ := kp.PublicKey()
				return editFacts(t, f, "beta", func(ps *keystore.PublicSpace) { ps.CalloutUsers = []string{pub} })
			},
			check: wantText("callout_users"),
		},
		{
			name: "fail/facts-xkey-disagrees",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				o, _ := keystore.ReadPublicSpace(keystore.PublicSpacePath(other.publicDir(), "alpha"))
				return editFacts(t, f, "alpha", func(ps *keystore.PublicSpace) { ps.XKeyPublicKey = o.XKeyPublicKey })
			},
			check: wantText("xkey_public_key"),
		},
		{
			name: "fail/sentinel-foreign",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				o, _ := keystore.ReadPublicSpace(keystore.PublicSpacePath(other.publicDir(), "alpha"))
				return editFacts(t, f, "alpha", func(ps *keystore.PublicSpace) { ps.SentinelJWT = o.SentinelJWT })
			},
			check: wantText("not by a signing key of the callout account"),
		},
		{
			// Signed by the right key, but a callout-service user, not the deny-all bearer.
			name: "fail/sentinel-not-deny-all",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				signer := seedKeyPair(t, f.secret("alpha", keystore.FileAuthSigning))
				return editFacts(t, f, "alpha", func(ps *keystore.PublicSpace) {
					ukp, _ := nkeys.CreateUser()
					upub, _ := ukp.PublicKey()
					spec, err := profiles.Build("alpha", profiles.AuthCallout, profiles.Params{})
					if err != nil {
						t.Fatal(err)
					}
					uc, err := spec.Claims(upub, ps.AuthAccountPublicKey, time.Now(), time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					if ps.SentinelJWT, err = uc.Encode(signer); err != nil {
						t.Fatal(err)
					}
				})
			},
			check: wantText("not a deny-all bearer user"),
		},
		{
			name: "fail/sentinel-garbage",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				return editFacts(t, f, "alpha", func(ps *keystore.PublicSpace) { ps.SentinelJWT = "eyJ.not.a-jwt" })
			},
			check: wantText("sentinel_jwt"),
		},
		{
			name: "fail/space-facts-renamed",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				p := keystore.PublicSpacePath(f.publicDir(), "gamma")
				writeFile(t, p, readFile(t, keystore.PublicSpacePath(f.publicDir(), "alpha")))
				return f.config(), p
			},
			check: wantText(`names space "alpha"`),
		},
		{
			name: "fail/space-not-in-key-dir",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				if err := os.RemoveAll(f.spaceDir("beta")); err != nil {
					t.Fatal(err)
				}
				return f.config(), f.spaceDir("beta")
			},
			check: wantNotExist,
		},
		{
			name: "fail/no-key-dir",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				return keystore.Config{PublicDir: f.publicDir()}, ""
			},
			check: wantText("key directory and public directory are required"),
		},
		{
			name: "fail/no-public-dir",
			mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
				return keystore.Config{KeyDir: f.signerDir()}, ""
			},
			check: wantText("key directory and public directory are required"),
		},
	}
	for _, file := range keystore.SecretFiles {
		for _, name := range []string{"alpha", "beta"} {
			tests = append(tests, openFail{
				name: "fail/missing-file/" + name + "/" + file,
				mutate: func(t *testing.T, f fixture) (keystore.Config, string) {
					p := f.secret(name, file)
					if err := os.Remove(p); err != nil {
						t.Fatal(err)
					}
					return f.config(), p
				},
				check: wantNotExist,
			})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			f := newFixture(t, "alpha", "beta")
			cfg, path := tt.mutate(t, f)
			st, err := keystore.Open(cfg)
			if err == nil {
				st.Close()
				t.Fatal("Open succeeded")
			}
			if st != nil {
				t.Fatal("Open returned a store with its error")
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want it to name %s", err, path)
			}
			tt.check(t, err, path)
		})
	}
}

// editFacts rewrites a space's public facts file through edit and returns the config and the
// file's path.
func editFacts(t *testing.T, f fixture, name string, edit func(*keystore.PublicSpace)) (keystore.Config, string) {
	t.Helper()
	p := keystore.PublicSpacePath(f.publicDir(), name)
	ps, err := keystore.ReadPublicSpace(p)
	if err != nil {
		t.Fatal(err)
	}
	edit(ps)
	if err := keystore.WriteJSON(p, ps, 0o644); err != nil {
		t.Fatal(err)
	}
	return f.config(), p
}

// wantMode expects a *creds.ModeError for path with the given bits.
func wantMode(mode, want os.FileMode) func(*testing.T, error, string) {
	return func(t *testing.T, err error, path string) {
		t.Helper()
		var me *creds.ModeError
		if !errors.As(err, &me) || me.Path != path || me.Mode != mode || me.Want != want {
			t.Fatalf("err = %v, want *creds.ModeError{%s %#o want %#o}", err, path, mode, want)
		}
	}
}

// wantOwner expects a *creds.OwnerError for path owned by uid.
func wantOwner(uid int) func(*testing.T, error, string) {
	return func(t *testing.T, err error, path string) {
		t.Helper()
		var oe *creds.OwnerError
		if !errors.As(err, &oe) || oe.Path != path || oe.UID != uid || oe.Want != os.Geteuid() {
			t.Fatalf("err = %v, want *creds.OwnerError{%s uid %d}", err, path, uid)
		}
	}
}

// wantMismatch expects a *trust.KeyMismatchError for role, reported as keys not belonging to
// the space.
func wantMismatch(role string) func(*testing.T, error, string) {
	return func(t *testing.T, err error, path string) {
		t.Helper()
		var km *trust.KeyMismatchError
		if !errors.As(err, &km) || km.Role != role || !strings.Contains(err.Error(), "do not belong to space") {
			t.Fatalf("err = %v, want *trust.KeyMismatchError for %q", err, role)
		}
	}
}

// wantNotExist expects an fs.ErrNotExist.
func wantNotExist(t *testing.T, err error, _ string) {
	t.Helper()
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist", err)
	}
}

// wantText expects text in the error.
func wantText(text string) func(*testing.T, error, string) {
	return func(t *testing.T, err error, _ string) {
		t.Helper()
		if !strings.Contains(err.Error(), text) {
			t.Fatalf("err = %v, want it to contain %q", err, text)
		}
	}
}

func TestClose(t *testing.T) {
	f := newFixture(t, "alpha", "beta")
	st, err := keystore.Open(f.config())
	if err != nil {
		t.Fatal(err)
	}
	var keys []*keystore.SigningKey
	for _, name := range st.Spaces() {
		sp, _ := st.Space(name)
		keys = append(keys, sp.DataSigning, sp.AuthSigning)
	}
	msg := []byte("before close")
	sigs := make([][]byte, len(keys))
	for i, k := range keys {
		if sigs[i], err = k.Sign(msg); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	t.Run("ok/close-wipes", func(t *testing.T) {
		for i, k := range keys {
			if sig, err := k.Sign(msg); err == nil || sig != nil {
				t.Fatalf("key %d signed after Close", i)
			}
			if err := k.Verify(msg, sigs[i]); err == nil {
				t.Fatalf("key %d verified after Close", i)
			}
			// The public half stays: it is not secret and names the key in logs.
			if !nkeys.IsValidPublicAccountKey(k.Public()) {
				t.Fatalf("key %d lost its public key", i)
			}
		}
	})
	t.Run("ok/close-twice", func(t *testing.T) {
		st.Close()
	})
}

// TestRedaction proves no formatting or logging path prints key material: every verb prints
// the fixed public form.
func TestRedaction(t *testing.T) {
	f := newFixture(t, "alpha")
	st := open(t, f.config())
	sp, _ := st.Space("alpha")
	key := sp.DataSigning
	wantKey := "SigningKey(" + key.Public() + ")"
	wantSpace := "keystore.Space(alpha)"
	type holder struct {
		K  keystore.SigningKey
		PK *keystore.SigningKey
		S  keystore.Space
	}
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"ok/key-pointer", key, wantKey},
		{"ok/key-value", *key, wantKey},
		{"ok/space-pointer", sp, wantSpace},
		{"ok/space-value", *sp, wantSpace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
				if got := fmt.Sprintf(verb, tt.v); got != tt.want {
					t.Fatalf("Sprintf(%s) = %d bytes, want %q", verb, len(got), tt.want)
				}
			}
			var buf bytes.Buffer
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("m", "v", tt.v)
			if !strings.Contains(buf.String(), `"v":"`+tt.want+`"`) {
				t.Fatalf("slog printed %d bytes without %q", buf.Len(), tt.want)
			}
		})
	}
	t.Run("ok/nested", func(t *testing.T) {
		got := fmt.Sprintf("%+v", holder{K: *key, PK: key, S: *sp})
		seed := bytes.TrimSpace(readFile(t, f.secret("alpha", keystore.FileDataSigning)))
		if !strings.Contains(got, "K:"+wantKey) || !strings.Contains(got, "S:"+wantSpace) || strings.Contains(got, string(seed)) || strings.Count(got, "[") > 0 {
			t.Fatalf("nested print is not redacted (%d bytes)", len(got))
		}
	})
}
