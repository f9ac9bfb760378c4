package mtls

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/creds"
)

var pkiNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestWriteDevPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	res, err := WriteDevPKI(PKIOptions{
		Dir: dir, TrustDomain: testTD, Spaces: []string{"sp1", "team_2-b"},
		Validity: 48 * time.Hour, Now: func() time.Time { return pkiNow },
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ok/layout-and-modes", func(t *testing.T) {
		var got []string
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			got = append(got, fmt.Sprintf("%s %04o", rel, uint32(info.Mode().Perm())))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{". 0700", "ca.key 0600", "ca.pem 0644", "clients 0700"}
		for _, sp := range []string{"sp1", "team_2-b"} {
			for _, k := range []string{"authd", "deliveryd", "managerd"} {
				want = append(want, "clients/"+k+"-"+sp+".key 0600", "clients/"+k+"-"+sp+".pem 0644")
			}
		}
		want = append(want, "signerd.key 0600", "signerd.pem 0644")
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("files:\n got %q\nwant %q", got, want)
		}
	})

	ca := readCert(t, res.CACertFile)
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	t.Run("ok/ca", func(t *testing.T) {
		if !ca.IsCA || !ca.BasicConstraintsValid || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Fatalf("CA constraints: IsCA %v, MaxPathLenZero %v, KeyUsage %v", ca.IsCA, ca.MaxPathLenZero, ca.KeyUsage)
		}
		pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P256() {
			t.Fatalf("CA key is %T, want ECDSA P-256", ca.PublicKey)
		}
		if !ca.NotBefore.Equal(pkiNow.Add(-backdate)) || !ca.NotAfter.Equal(pkiNow.Add(48*time.Hour)) || !res.NotAfter.Equal(ca.NotAfter) {
			t.Fatalf("CA validity %v..%v, result NotAfter %v", ca.NotBefore, ca.NotAfter, res.NotAfter)
		}
		keyMatches(t, res.CACertFile, res.CAKeyFile)
	})

	t.Run("ok/signerd", func(t *testing.T) {
		if res.Server.ClientCAFile != res.CACertFile || res.ServerID != "spiffe://"+testTD+"/signerd" {
			t.Fatalf("result server = %+v, id %q", res.Server, res.ServerID)
		}
		c := readCert(t, res.Server.CertFile)
		if !slices.Equal(c.DNSNames, []string{"localhost"}) || len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
			t.Fatalf("signerd SANs: DNS %v, IP %v", c.DNSNames, c.IPAddresses)
		}
		if id, err := IdentityFromCert(c); err != nil || id != res.ServerID {
			t.Fatalf("signerd identity = %q, %v", id, err)
		}
		// Finding 9 of issue 7: signerd's certificate is for serving only; with clientAuth
		// it would be a caller certificate too.
		if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
			t.Fatalf("signerd cert EKU = %v, want [serverAuth]", c.ExtKeyUsage)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: pkiNow, DNSName: "localhost", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Fatalf("signerd cert does not verify for serverAuth: %v", err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: pkiNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
			t.Fatal("signerd cert verifies for clientAuth")
		}
		keyMatches(t, res.Server.CertFile, res.Server.KeyFile)
	})

	t.Run("ok/clients", func(t *testing.T) {
		if len(res.Clients) != 6 {
			t.Fatalf("got %d clients, want 6", len(res.Clients))
		}
		for _, cl := range res.Clients {
			want := "spiffe://" + testTD + "/" + cl.Kind + "/" + cl.Space
			if cl.ID != want || cl.Files.ServerCAFile != res.CACertFile {
				t.Fatalf("client %+v, want ID %q", cl, want)
			}
			c := readCert(t, cl.Files.CertFile)
			if len(c.URIs) != 1 || c.URIs[0].String() != want || len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 {
				t.Fatalf("%s SANs: URIs %v, DNS %v, IP %v", want, c.URIs, c.DNSNames, c.IPAddresses)
			}
			if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || c.IsCA {
				t.Fatalf("%s: EKU %v, IsCA %v", want, c.ExtKeyUsage, c.IsCA)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: pkiNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Fatalf("%s does not verify as a client: %v", want, err)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: pkiNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
				t.Fatalf("%s verifies as a server certificate", want)
			}
			keyMatches(t, cl.Files.CertFile, cl.Files.KeyFile)
		}
	})

	t.Run("fail/pki-refuses-overwrite", func(t *testing.T) {
		before := snapshot(t, dir)
		again, err := WriteDevPKI(PKIOptions{Dir: dir, TrustDomain: testTD, Spaces: []string{"sp1", "team_2-b"}})
		var ee *ExistsError
		if again != nil || !errors.As(err, &ee) || ee.Path != res.CACertFile || !errors.Is(err, fs.ErrExist) {
			t.Fatalf("second WriteDevPKI = %v, %v; want *ExistsError for %s", again, err, res.CACertFile)
		}
		if after := snapshot(t, dir); !maps.Equal(before, after) {
			t.Fatal("a refused WriteDevPKI changed the directory")
		}
	})
}

func TestWriteDevPKIRefuses(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string) // runs before WriteDevPKI
		opts    func(dir string) PKIOptions
		check   func(t *testing.T, dir string, err error)
	}{
		{
			// One existing client key anywhere in the layout stops the whole run before it writes.
			name: "fail/pki-refuses-overwrite-one-client-key",
			prepare: func(t *testing.T, dir string) {
				mkdir(t, filepath.Join(dir, "clients"))
				writeFile(t, filepath.Join(dir, "clients", "managerd-sp1.key"), []byte("keep me"), 0o600)
			},
			opts: func(dir string) PKIOptions { return PKIOptions{Dir: dir, TrustDomain: testTD, Spaces: []string{"sp1"}} },
			check: func(t *testing.T, dir string, err error) {
				want := filepath.Join(dir, "clients", "managerd-sp1.key")
				var ee *ExistsError
				if !errors.As(err, &ee) || ee.Path != want || !strings.Contains(err.Error(), want) {
					t.Fatalf("error = %v, want *ExistsError naming %s", err, want)
				}
				if got := snapshot(t, dir); len(got) != 1 || got["clients/managerd-sp1.key"] != "keep me" {
					t.Fatalf("directory after refusal = %v", got)
				}
			},
		},
		{
			name:    "fail/dir-too-open",
			prepare: func(t *testing.T, dir string) { mkdir(t, dir); chmod(t, dir, 0o755) },
			opts:    func(dir string) PKIOptions { return PKIOptions{Dir: dir, TrustDomain: testTD} },
			check: func(t *testing.T, dir string, err error) {
				var me *creds.ModeError
				if !errors.As(err, &me) || me.Path != dir || me.Mode != 0o755 || me.Want != 0o700 {
					t.Fatalf("error = %v, want *ModeError for %s", err, dir)
				}
				if got := snapshot(t, dir); len(got) != 0 {
					t.Fatalf("files written into a refused dir: %v", got)
				}
			},
		},
		{name: "fail/empty-dir", opts: func(string) PKIOptions { return PKIOptions{TrustDomain: testTD} }, check: errText("empty Dir")},
		{name: "fail/bad-trust-domain", opts: func(d string) PKIOptions { return PKIOptions{Dir: d, TrustDomain: "Cotal.Local"} }, check: errText(`trust domain "Cotal.Local"`)},
		{name: "fail/empty-trust-domain", opts: func(d string) PKIOptions { return PKIOptions{Dir: d} }, check: errText("empty trust domain")},
		{name: "fail/space-with-dot", opts: spaces("a.b"), check: errText(`space token "a.b"`)},
		{name: "fail/space-with-slash", opts: spaces("a/b"), check: errText(`space token "a/b"`)},
		{name: "fail/empty-space", opts: spaces(""), check: errText(`space token ""`)},
		{name: "fail/duplicate-space", opts: spaces("sp1", "sp1"), check: errText(`"sp1" is listed twice`)},
		{
			name:  "fail/negative-validity",
			opts:  func(d string) PKIOptions { return PKIOptions{Dir: d, TrustDomain: testTD, Validity: -time.Hour} },
			check: errText("negative validity"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			if tt.prepare != nil {
				tt.prepare(t, dir)
			}
			res, err := WriteDevPKI(tt.opts(dir))
			if res != nil {
				t.Fatalf("WriteDevPKI returned a result with error %v", err)
			}
			tt.check(t, dir, err)
		})
	}
}

func TestSecretsRedacted(t *testing.T) {
	ca := newTestCA(t, "redaction CA")
	leaf := clientLeaf(t, ca, "spiffe://"+testTD+"/authd/sp1")
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("issued", "ca", ca, "leaf", leaf)
	for _, text := range []string{fmt.Sprint(ca), fmt.Sprintf("%v %s", leaf, leaf), logged.String()} {
		if strings.Contains(text, "PRIVATE KEY") || strings.Contains(text, "MII") {
			t.Fatalf("key material in %q", text)
		}
		if !strings.Contains(text, "serial") {
			t.Fatalf("description %q lacks the serial", text)
		}
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newTestCA(t, "CA")
	tests := []struct {
		name string
		spec LeafSpec
		want string
	}{
		{name: "fail/empty-validity", spec: LeafSpec{NotBefore: pkiNow, NotAfter: pkiNow}, want: "is not after NotBefore"},
		{name: "fail/unparsable-uri", spec: LeafSpec{NotBefore: pkiNow, NotAfter: pkiNow.Add(time.Hour), URIs: []string{"spiffe://td/%zz"}}, want: `URI SAN "spiffe://td/%zz"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf, err := ca.Issue(tt.spec)
			if leaf != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Issue = %v, %v; want error containing %q", leaf, err, tt.want)
			}
		})
	}
	t.Run("fail/ca-empty-name", func(t *testing.T) {
		if _, err := NewCA("", pkiNow, pkiNow.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "empty common name") {
			t.Fatalf("NewCA error = %v", err)
		}
	})
}

func spaces(s ...string) func(string) PKIOptions {
	return func(d string) PKIOptions { return PKIOptions{Dir: d, TrustDomain: testTD, Spaces: s} }
}

func errText(text string) func(t *testing.T, dir string, err error) {
	return func(t *testing.T, _ string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), text) {
			t.Fatalf("error = %v, want it to contain %q", err, text)
		}
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" || len(rest) != 0 {
		t.Fatalf("%s is not exactly one PEM certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// keyMatches checks that the key file holds the private key of the certificate file.
func keyMatches(t *testing.T, certFile, keyFile string) {
	t.Helper()
	c, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := creds.ReadSecretFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(c, k); err != nil {
		t.Fatalf("%s and %s: %v", certFile, keyFile, err)
	}
}

// snapshot maps each regular file under dir (relative path) to its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
