package mtls

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cotalgo/cotal/pkg/creds"
)

// DefaultPollInterval is how often Run checks the files when neither Run nor WithPollInterval
// gives an interval.
const DefaultPollInterval = 2 * time.Second

// LoadError says a certificate, key or CA file could not be read or parsed.
type LoadError struct {
	// Path is the offending file.
	Path string
	Err  error
}

// Error names the file.
func (e *LoadError) Error() string { return fmt.Sprintf("mtls: load %s: %v", e.Path, e.Err) }

// Unwrap returns the cause (for example a *creds.ModeError or fs.ErrNotExist).
func (e *LoadError) Unwrap() error { return e.Err }

// material is one consistent snapshot of a key pair and a CA pool. It is never modified after
// it is stored, so readers need no lock.
type material struct {
	cert   *tls.Certificate
	pool   *x509.CertPool
	digest string // hex SHA-256 over the three files' bytes
}

// Reloader holds the current key pair and CA pool read from three files, and swaps them as a
// unit when the files change. An invalid new set (unreadable, unparsable, a key that does not
// match the certificate, a key file that fails the secret-file check, a CA file with no
// certificate)
// never replaces a valid one: the old material stays in use and the error is returned.
// The key file must pass the project's secret-file rules (creds.ReadSecretFile: a regular
// file, not a symlink, owned by the effective uid, no group or other permission bit, in a
// directory with the same rules). On a server, the client CA file decides who may call, so it
// must pass creds.CheckTrustedFile (owned by root or the effective uid, no group or other
// write bit, the same for every directory up to /, symlink targets checked in full); a
// refused CA file is refused at construction and on reload like any invalid set. The
// certificate file, and a client's server CA file, are only read.
// A Reloader is safe for concurrent use: handshakes read the current material through an
// atomic pointer while Reload or Run swap it.
type Reloader struct {
	certFile, keyFile, caFile string
	interval                  time.Duration
	// trustedCA makes read apply creds.ReadTrustedFile to the CA file (servers: the client CA).
	trustedCA bool

	cur atomic.Pointer[material]

	// mu serialises loads so an older read can never overwrite a newer one.
	mu sync.Mutex
	// lastFailure is the digest or read error of the last failed load; mu must be held.
	// Run uses it to report each distinct failure once rather than on every poll.
	lastFailure string
}

// newReloader reads the files once; it fails if they are not valid now.
func newReloader(certFile, keyFile, caFile string, interval time.Duration, trustedCA bool) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, caFile: caFile, interval: interval, trustedCA: trustedCA}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Certificate returns the current key pair. Callers must not modify it.
func (r *Reloader) Certificate() *tls.Certificate { return r.cur.Load().cert }

// CAPool returns the current CA pool. Callers must not modify it.
func (r *Reloader) CAPool() *x509.CertPool { return r.cur.Load().pool }

// Reload re-reads the three files and, if they form a valid set, makes them current. On error
// the previous material stays current.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, err := r.read()
	if err != nil {
		r.lastFailure = err.Error()
		return err
	}
	defer clear(raw.key)
	if err := r.load(raw); err != nil {
		r.lastFailure = raw.digest()
		return err
	}
	return nil
}

// Run polls the files every interval (DefaultPollInterval or the WithPollInterval value when
// interval <= 0) and reloads when their content changes. It compares a hash of the content, not
// only mtime and size, so a same-size rewrite within one mtime tick is still seen. Each
// distinct failure is passed to onErr once (onErr may be nil); the old material stays in use.
// Run returns when ctx is done.
func (r *Reloader) Run(ctx context.Context, interval time.Duration, onErr func(error)) {
	if interval <= 0 {
		interval = r.interval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.poll(); err != nil && onErr != nil {
			onErr(err)
		}
	}
}

// poll reloads if the files differ from both the current material and the last failure.
func (r *Reloader) poll() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, err := r.read()
	if err != nil {
		if err.Error() == r.lastFailure {
			return nil
		}
		r.lastFailure = err.Error()
		return err
	}
	defer clear(raw.key)
	d := raw.digest()
	if d == r.cur.Load().digest || d == r.lastFailure {
		return nil
	}
	if err := r.load(raw); err != nil {
		r.lastFailure = d
		return err
	}
	return nil
}

// rawFiles is the content of the three files as read in one pass.
type rawFiles struct{ cert, key, ca []byte }

func (f rawFiles) digest() string {
	h := sha256.New()
	for _, b := range [][]byte{f.cert, f.key, f.ca} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// read reads the three files; mu must be held.
func (r *Reloader) read() (rawFiles, error) {
	var f rawFiles
	var err error
	if f.cert, err = readPublicFile(r.certFile); err != nil {
		return f, &LoadError{Path: r.certFile, Err: err}
	}
	// The project's secret-file reader: no symlink, owned by the effective uid, no group or
	// other bit, re-checked on the open descriptor.
	if f.key, err = creds.ReadSecretFile(r.keyFile); err != nil {
		return f, &LoadError{Path: r.keyFile, Err: err}
	}
	if r.trustedCA {
		f.ca, err = creds.ReadTrustedFile(r.caFile, maxFileSize)
	} else {
		f.ca, err = readPublicFile(r.caFile)
	}
	if err != nil {
		clear(f.key)
		return f, &LoadError{Path: r.caFile, Err: err}
	}
	return f, nil
}

// load parses raw and, if valid, makes it current; mu must be held.
func (r *Reloader) load(raw rawFiles) error {
	cert, err := tls.X509KeyPair(raw.cert, raw.key)
	if err != nil {
		return &LoadError{Path: r.certFile, Err: fmt.Errorf("with key %s: %w", r.keyFile, err)}
	}
	pool, err := parseCAPool(raw.ca)
	if err != nil {
		return &LoadError{Path: r.caFile, Err: err}
	}
	r.cur.Store(&material{cert: &cert, pool: pool, digest: raw.digest()})
	r.lastFailure = ""
	return nil
}

// parseCAPool parses a PEM bundle of CA certificates. It refuses an empty bundle, a block that
// is not a CERTIFICATE, a certificate that is not a CA, and trailing non-PEM bytes: a CA file
// that is half written or holds the wrong thing must not quietly become a smaller trust set.
func parseCAPool(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n+1, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		if !c.IsCA || !c.BasicConstraintsValid {
			return nil, fmt.Errorf("certificate %d (%q) is not a CA", n+1, c.Subject.String())
		}
		pool.AddCert(c)
		n++
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("trailing data that is not PEM")
	}
	if n == 0 {
		return nil, errors.New("no CA certificate")
	}
	return pool, nil
}
