package mtls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"
)

// ServerFiles names the files a server reads: its certificate and key, and the CA bundle that
// client certificates must chain to.
type ServerFiles struct {
	CertFile, KeyFile, ClientCAFile string
}

// ClientFiles names the files a client reads: its certificate and key, and the CA bundle the
// server certificate must chain to.
type ClientFiles struct {
	CertFile, KeyFile, ServerCAFile string
}

// Option adjusts NewServerTLS or NewClientTLS.
type Option func(*options) error

type options struct {
	now      func() time.Time
	interval time.Duration
	serverID string
}

// WithClock sets the clock used to check certificate validity (tls.Config.Time). Tests use it
// to move time past NotAfter; production leaves it unset.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return errors.New("mtls: WithClock: nil clock")
		}
		o.now = now
		return nil
	}
}

// WithPollInterval sets the interval Reloader.Run uses when called with interval <= 0. It
// refuses a non-positive interval.
func WithPollInterval(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("mtls: WithPollInterval: interval %v is not positive", d)
		}
		o.interval = d
		return nil
	}
}

// WithServerID makes a client refuse, at the handshake, a server whose verified certificate
// does not carry exactly this SPIFFE ID as its only URI SAN (for example
// "spiffe://cotal.local/signerd"). It applies to NewClientTLS only; NewServerTLS refuses it.
func WithServerID(id string) Option {
	return func(o *options) error {
		parsed, err := ParseID(id)
		if err != nil {
			return fmt.Errorf("mtls: WithServerID: %w", err)
		}
		o.serverID = parsed.String()
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	o := options{interval: DefaultPollInterval}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// PeerIDError says a server presented a verified certificate with the wrong identity.
type PeerIDError struct {
	Want, Got string
}

// Error names both identities.
func (e *PeerIDError) Error() string {
	return fmt.Sprintf("mtls: server identity %q, want %q", e.Got, e.Want)
}

// NewServerTLS returns a server configuration that requires TLS 1.3 and a client certificate
// verified against the client CA file, together with the Reloader that owns the files. The
// configuration is built per handshake through GetConfigForClient, so after the Reloader swaps
// material a changed server certificate or client CA applies to the next handshake without a
// restart; established connections keep the identity they were verified with.
//
// It refuses, at the handshake: a client with no certificate, one not issued by the current
// client CA, one outside its validity period, and one whose leaf does not list the clientAuth
// extended key usage (ErrNoClientAuth: crypto/tls alone would take a leaf with no extended key
// usage as good for any purpose). It does not check the client's URI SAN; call
// IdentityFromContext in the handler or an interceptor and map its error to Unauthenticated.
// A handshake is checked once: re-check every request with a CallerVerifier reading the
// Reloader's CAPool, so an expired certificate or a removed CA also ends established
// connections.
// Session tickets are disabled so every connection is verified against the current client CA
// rather than resumed from a session verified against an older one.
func NewServerTLS(files ServerFiles, opts ...Option) (*tls.Config, *Reloader, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, nil, err
	}
	if o.serverID != "" {
		return nil, nil, errors.New("mtls: WithServerID applies to clients only")
	}
	if err := requireFiles("CertFile", files.CertFile, "KeyFile", files.KeyFile, "ClientCAFile", files.ClientCAFile); err != nil {
		return nil, nil, err
	}
	r, err := newReloader(files.CertFile, files.KeyFile, files.ClientCAFile, o.interval, true)
	if err != nil {
		return nil, nil, err
	}
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.Certificate(), nil }
	perHandshake := func() *tls.Config {
		return &tls.Config{
			MinVersion:             tls.VersionTLS13,
			ClientAuth:             tls.RequireAndVerifyClientCert,
			ClientCAs:              r.CAPool(),
			GetCertificate:         getCert,
			SessionTicketsDisabled: true,
			Time:                   o.now,
			VerifyConnection:       verifyClientConnection,
		}
	}
	cfg := perHandshake()
	// The outer ClientCAs is only a fallback for code that inspects the config; every
	// handshake uses the pool GetConfigForClient reads at that moment.
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return perHandshake(), nil }
	return cfg, r, nil
}

// NewClientTLS returns a client configuration that requires TLS 1.3, verifies the server
// certificate for serverName against the server CA file, and presents the Reloader's current
// client certificate through GetClientCertificate, so a rotated client certificate is used by
// the next handshake.
//
// The server CA pool is the one read at construction: crypto/tls gives clients no
// per-handshake configuration hook, and verifying by hand behind InsecureSkipVerify would trade
// a rare rotation for a standing foot-gun. The Reloader still re-reads and validates the CA
// file; build a new configuration to trust a new server CA.
func NewClientTLS(files ClientFiles, serverName string, opts ...Option) (*tls.Config, *Reloader, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, nil, err
	}
	if serverName == "" {
		return nil, nil, errors.New("mtls: empty server name")
	}
	if err := requireFiles("CertFile", files.CertFile, "KeyFile", files.KeyFile, "ServerCAFile", files.ServerCAFile); err != nil {
		return nil, nil, err
	}
	r, err := newReloader(files.CertFile, files.KeyFile, files.ServerCAFile, o.interval, false)
	if err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		RootCAs:    r.CAPool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.Certificate(), nil
		},
		Time: o.now,
	}
	if want := o.serverID; want != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return ErrNotVerified
			}
			got, err := IdentityFromCert(cs.VerifiedChains[0][0])
			if err != nil {
				return err
			}
			if got != want {
				return &PeerIDError{Want: want, Got: got}
			}
			return nil
		}
	}
	return cfg, r, nil
}

// requireFiles takes (field name, path) pairs and refuses the first empty path.
func requireFiles(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return fmt.Errorf("mtls: %s is empty", pairs[i])
		}
	}
	return nil
}
