package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// DefaultDevValidity is the lifetime of dev PKI certificates when PKIOptions.Validity is zero.
const DefaultDevValidity = 365 * 24 * time.Hour

// backdate is how far before "now" certificates start, so a peer whose clock runs slightly
// behind does not see a brand-new certificate as not yet valid.
const backdate = 5 * time.Minute

// CA is a certificate authority with an ECDSA P-256 key held in memory. It signs the dev PKI
// and, in tests, second CAs, expired certificates and certificates with unusual SANs. Its
// String and LogValue never show the key.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA valid from notBefore to notAfter. It refuses an empty common
// name and an empty validity period.
func NewCA(commonName string, notBefore, notAfter time.Time) (*CA, error) {
	if commonName == "" {
		return nil, errors.New("mtls: NewCA: empty common name")
	}
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("mtls: NewCA %q: notAfter %v is not after notBefore %v", commonName, notAfter, notBefore)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// The CA signs leaves only; a leaf that claims to be a CA cannot extend the chain.
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("mtls: NewCA %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: pemCert(der), key: key}, nil
}

// Certificate returns the CA certificate. Callers must not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM returns the CA certificate in PEM form, the content of a CA bundle file.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// KeyPEM returns the CA private key as a PKCS #8 PEM block. Write it only to a 0600 file.
func (ca *CA) KeyPEM() ([]byte, error) { return pemKey(ca.key) }

// String describes the CA without its key.
func (ca *CA) String() string {
	return fmt.Sprintf("CA(%s, serial %s)", ca.cert.Subject.String(), ca.cert.SerialNumber.Text(16))
}

// LogValue describes the CA without its key.
func (ca *CA) LogValue() slog.Value { return slog.StringValue(ca.String()) }

// LeafSpec describes a certificate for CA.Issue. Issue does not validate URIs as SPIFFE IDs:
// tests need certificates that IdentityFromCert must refuse.
type LeafSpec struct {
	// CommonName is informational; nothing in this project treats it as an identity.
	CommonName string
	// URIs become URI SANs, parsed with net/url.
	URIs []string
	// DNSNames and IPAddresses become DNS and IP SANs, for server certificates.
	DNSNames    []string
	IPAddresses []net.IP
	// NotBefore and NotAfter bound validity. NotAfter must be after NotBefore; both may lie in
	// the past, which is how tests make expired certificates.
	NotBefore, NotAfter time.Time
	// ExtKeyUsage lists the extended key usages; empty means client authentication only.
	ExtKeyUsage []x509.ExtKeyUsage
	// OmitExtKeyUsage issues a certificate with no extended key usage extension at all, which
	// crypto/x509 accepts for any purpose. Tests use it to show a caller needs clientAuth.
	OmitExtKeyUsage bool
}

// Leaf is an issued certificate and its ECDSA P-256 private key. Its String and LogValue
// never show the key.
type Leaf struct {
	cert    *x509.Certificate
	certPEM []byte
	keyPEM  []byte
}

// Certificate returns the issued certificate. Callers must not modify it.
func (l *Leaf) Certificate() *x509.Certificate { return l.cert }

// CertPEM returns the certificate in PEM form.
func (l *Leaf) CertPEM() []byte { return append([]byte(nil), l.certPEM...) }

// KeyPEM returns the private key as a PKCS #8 PEM block. Write it only to a 0600 file.
func (l *Leaf) KeyPEM() []byte { return append([]byte(nil), l.keyPEM...) }

// String describes the certificate without its key.
func (l *Leaf) String() string {
	return fmt.Sprintf("Leaf(%s, serial %s)", l.cert.Subject.String(), l.cert.SerialNumber.Text(16))
}

// LogValue describes the certificate without its key.
func (l *Leaf) LogValue() slog.Value { return slog.StringValue(l.String()) }

// Issue creates a leaf certificate signed by ca with a fresh ECDSA P-256 key. It refuses an
// empty validity period and a URI that does not parse.
func (ca *CA) Issue(spec LeafSpec) (*Leaf, error) {
	if !spec.NotAfter.After(spec.NotBefore) {
		return nil, fmt.Errorf("mtls: Issue %q: NotAfter %v is not after NotBefore %v", spec.CommonName, spec.NotAfter, spec.NotBefore)
	}
	var uris []*url.URL
	for _, s := range spec.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("mtls: Issue %q: URI SAN %q: %w", spec.CommonName, s, err)
		}
		uris = append(uris, u)
	}
	eku := spec.ExtKeyUsage
	switch {
	case spec.OmitExtKeyUsage && len(eku) != 0:
		return nil, fmt.Errorf("mtls: Issue %q: OmitExtKeyUsage with ExtKeyUsage %v", spec.CommonName, eku)
	case spec.OmitExtKeyUsage:
	case len(eku) == 0:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: spec.CommonName},
		NotBefore:             spec.NotBefore,
		NotAfter:              spec.NotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
		URIs:                  uris,
		DNSNames:              spec.DNSNames,
		IPAddresses:           spec.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("mtls: Issue %q: %w", spec.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pemKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{cert: cert, certPEM: pemCert(der), keyPEM: keyPEM}, nil
}

// newSerial returns a random positive 127-bit serial number.
func newSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 127)
	n, err := rand.Int(rand.Reader, limit)
	if err != nil {
		return nil, err
	}
	return n.Add(n, big.NewInt(1)), nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Kinds of dev PKI client certificates, the first path segment of their IDs.
const (
	KindAuthd     = "authd"
	KindDeliveryd = "deliveryd"
	KindManagerd  = "managerd"
	// KindSignerd is the path of signerd's own ID, spiffe://<td>/signerd.
	KindSignerd = "signerd"
)

// devClientKinds are the callers that get a certificate per space.
var devClientKinds = [...]string{KindAuthd, KindDeliveryd, KindManagerd}

// spaceTokenRE matches a space token: upstream maps every character outside [A-Za-z0-9_-]
// to "_", so a token never holds anything else.
var spaceTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// PKIOptions configures WriteDevPKI.
type PKIOptions struct {
	// Dir receives the files; it is created 0700 if missing, and refused if it exists but is
	// a symlink, not owned by the effective uid, or grants any group or other bit.
	Dir string
	// TrustDomain is the SPIFFE trust domain, for example "cotal.local".
	TrustDomain string
	// Spaces are space tokens ([A-Za-z0-9_-]+, no duplicates); each gets one client
	// certificate per caller kind.
	Spaces []string
	// Validity is the lifetime of every certificate; zero means DefaultDevValidity.
	Validity time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DevClient describes one client certificate WriteDevPKI wrote.
type DevClient struct {
	// Kind is authd, deliveryd or managerd; Space is the space token.
	Kind, Space string
	// ID is the certificate's only URI SAN, spiffe://<td>/<kind>/<space>.
	ID string
	// Files are ready for NewClientTLS.
	Files ClientFiles
}

// PKIResult lists what WriteDevPKI wrote.
type PKIResult struct {
	// CACertFile and CAKeyFile are ca.pem and ca.key.
	CACertFile, CAKeyFile string
	// Server holds signerd.pem, signerd.key and ca.pem, ready for NewServerTLS.
	Server ServerFiles
	// ServerID is signerd's URI SAN, spiffe://<td>/signerd.
	ServerID string
	// Clients lists the client certificates, by space then kind.
	Clients []DevClient
	// NotAfter is when every certificate expires.
	NotAfter time.Time
}

// WriteDevPKI writes a development PKI into opts.Dir: an ECDSA P-256 CA (ca.pem, ca.key); the
// signerd certificate (signerd.pem, signerd.key) for DNS localhost, IP 127.0.0.1 and URI
// spiffe://<td>/signerd, usable for server authentication only; and for each space and
// each of authd, deliveryd and managerd a client certificate clients/<kind>-<space>.pem/.key
// whose single URI SAN is spiffe://<td>/<kind>/<space>. Keys are 0600, certificates 0644,
// directories 0700; each file is written atomically.
//
// It refuses to overwrite anything: if any target file exists it writes nothing and returns an
// *ExistsError naming it. If writing fails part-way, the files it created are removed.
func WriteDevPKI(opts PKIOptions) (*PKIResult, error) {
	if opts.Dir == "" {
		return nil, errors.New("mtls: WriteDevPKI: empty Dir")
	}
	if reason := checkTrustDomain(opts.TrustDomain); reason != "" {
		return nil, fmt.Errorf("mtls: WriteDevPKI: trust domain %q: %s", opts.TrustDomain, reason)
	}
	seen := make(map[string]bool, len(opts.Spaces))
	for _, s := range opts.Spaces {
		if !spaceTokenRE.MatchString(s) {
			return nil, fmt.Errorf("mtls: WriteDevPKI: space token %q is not [A-Za-z0-9_-]+", s)
		}
		if seen[s] {
			return nil, fmt.Errorf("mtls: WriteDevPKI: space token %q is listed twice", s)
		}
		seen[s] = true
	}
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultDevValidity
	}
	if validity < 0 {
		return nil, fmt.Errorf("mtls: WriteDevPKI: negative validity %v", validity)
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	t0 := now()
	notBefore, notAfter := t0.Add(-backdate), t0.Add(validity)

	clientsDir := filepath.Join(opts.Dir, "clients")
	res := &PKIResult{
		CACertFile: filepath.Join(opts.Dir, "ca.pem"),
		CAKeyFile:  filepath.Join(opts.Dir, "ca.key"),
		NotAfter:   notAfter,
	}
	res.Server = ServerFiles{
		CertFile:     filepath.Join(opts.Dir, "signerd.pem"),
		KeyFile:      filepath.Join(opts.Dir, "signerd.key"),
		ClientCAFile: res.CACertFile,
	}
	serverID, err := NewID(opts.TrustDomain, KindSignerd)
	if err != nil {
		return nil, err
	}
	res.ServerID = serverID.String()
	for _, space := range opts.Spaces {
		for _, kind := range devClientKinds {
			id, err := NewID(opts.TrustDomain, kind, space)
			if err != nil {
				return nil, err
			}
			base := filepath.Join(clientsDir, kind+"-"+space)
			res.Clients = append(res.Clients, DevClient{
				Kind: kind, Space: space, ID: id.String(),
				Files: ClientFiles{CertFile: base + ".pem", KeyFile: base + ".key", ServerCAFile: res.CACertFile},
			})
		}
	}

	// Refuse before generating or writing anything, so a second run leaves the first intact.
	targets := []string{res.CACertFile, res.CAKeyFile, res.Server.CertFile, res.Server.KeyFile}
	for _, c := range res.Clients {
		targets = append(targets, c.Files.CertFile, c.Files.KeyFile)
	}
	for _, p := range targets {
		if _, err := os.Lstat(p); err == nil {
			return nil, &ExistsError{Path: p}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}

	ca, err := NewCA("Cotal dev CA ("+opts.TrustDomain+")", notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	server, err := ca.Issue(LeafSpec{
		CommonName:  KindSignerd,
		URIs:        []string{res.ServerID},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		// serverAuth only: with clientAuth too, signerd's own certificate would be accepted
		// as a caller certificate by any server trusting this CA.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	type file struct {
		path string
		data []byte
		mode fs.FileMode
	}
	files := []file{
		{res.CAKeyFile, caKey, 0o600},
		{res.CACertFile, ca.CertPEM(), 0o644},
		{res.Server.KeyFile, server.KeyPEM(), 0o600},
		{res.Server.CertFile, server.CertPEM(), 0o644},
	}
	for _, c := range res.Clients {
		leaf, err := ca.Issue(LeafSpec{
			CommonName:  c.Kind + "-" + c.Space,
			URIs:        []string{c.ID},
			NotBefore:   notBefore,
			NotAfter:    notAfter,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return nil, err
		}
		files = append(files,
			file{c.Files.KeyFile, leaf.KeyPEM(), 0o600},
			file{c.Files.CertFile, leaf.CertPEM(), 0o644})
	}

	if err := ensurePrivateDir(opts.Dir); err != nil {
		return nil, err
	}
	if len(res.Clients) > 0 {
		if err := ensurePrivateDir(clientsDir); err != nil {
			return nil, err
		}
	}
	var written []string
	for _, f := range files {
		if err := writeFileExclusive(f.path, f.data, f.mode); err != nil {
			for _, p := range written {
				_ = os.Remove(p)
			}
			return nil, err
		}
		written = append(written, f.path)
	}
	return res, nil
}
