// Package idp is authd's bridge to the one external identity provider a space trusts: the pin
// (idp.json in authd's state dir, written once by `authd idp pin URL`), the IdP's JWKS with a
// bounded cache, and the verification of IdP tokens (auth.md §4).
//
// It refuses: a JWKS URL that is neither https nor http on a loopback address; re-pinning a state
// dir to another URL (that would re-key every owner, since owners derive from the IdP issuer); a
// pin whose JWKS does not answer with at least one Ed25519 key; and every IdP token that is not
// an EdDSA JWS from a pinned key with the exact issuer, exactly one audience, an expiry, and an
// issued-at that is not in the future.
package idp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/cotalgo/cotal/pkg/creds"
)

// FileName is the pin's file in authd's state dir.
const FileName = "idp.json"

// PinVersion is the ver of the idp.json this package writes and reads.
const PinVersion = 1

// maxPinFileBytes bounds idp.json; a real pin is a few hundred bytes.
const maxPinFileBytes = 8 << 10

// ErrNotPinned reports a state dir with no idp.json: the human exchange arm is off until
// `authd idp pin URL` runs.
var ErrNotPinned = errors.New("idp: no IdP is pinned (run `authd idp pin URL`)")

// ErrRepin reports an attempt to pin a state dir that is already pinned to another IdP.
var ErrRepin = errors.New("idp: already pinned to another IdP; re-pinning would re-key every owner")

// Pin is the pinned IdP (idp.json). Issuer and Audience are the URL's origin: the exact iss and
// aud an IdP token must carry. JWKSURI is URL + "/jwks".
type Pin struct {
	Ver      int    `json:"ver"`
	URL      string `json:"url"`
	Issuer   string `json:"issuer"`
	Audience string `json:"audience"`
	JWKSURI  string `json:"jwksUri"`
}

// NewPin builds the pin of an IdP base URL. It refuses a URL that is not absolute, carries user
// info, a query or a fragment, or is plain http to anything but a loopback IP or localhost: a
// JWKS fetched in the clear from the network would let anyone on the path mint identities.
func NewPin(rawURL string) (Pin, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Pin{}, fmt.Errorf("idp: URL %.200q: %w", rawURL, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return Pin{}, fmt.Errorf("idp: URL %.200q: scheme must be https (or http to a loopback address)", rawURL)
	case u.Host == "" || u.Opaque != "":
		return Pin{}, fmt.Errorf("idp: URL %.200q is not an absolute URL with a host", rawURL)
	case u.User != nil:
		return Pin{}, fmt.Errorf("idp: URL %.200q carries user info; credentials do not belong in the pin", rawURL)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return Pin{}, fmt.Errorf("idp: URL %.200q has a query or fragment", rawURL)
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		return Pin{}, fmt.Errorf("idp: URL %.200q: plain http is allowed only to a loopback address", rawURL)
	}
	base := strings.TrimSuffix(u.String(), "/")
	origin := u.Scheme + "://" + u.Host
	return Pin{Ver: PinVersion, URL: base, Issuer: origin, Audience: origin, JWKSURI: base + "/jwks"}, nil
}

// loopbackHost reports whether host is localhost or a loopback IP literal.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validate checks a pin read from disk: it must be exactly what NewPin builds from its URL, so a
// hand-edited file cannot point the issuer at one origin and the JWKS at another.
func (p Pin) validate() error {
	if p.Ver != PinVersion {
		return fmt.Errorf("ver %d is not %d", p.Ver, PinVersion)
	}
	want, err := NewPin(p.URL)
	if err != nil {
		return err
	}
	if p != want {
		return fmt.Errorf("issuer, audience or jwksUri do not follow from url %.200q", p.URL)
	}
	return nil
}

// Load reads the pin from stateDir. It returns ErrNotPinned when there is none, and refuses a
// file looser than 0600, not owned by this uid, or inconsistent, naming the path.
func Load(stateDir string) (Pin, error) {
	path := filepath.Join(stateDir, FileName)
	b, err := creds.ReadSecretFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Pin{}, ErrNotPinned
	}
	if err != nil {
		return Pin{}, fmt.Errorf("idp: %w", err)
	}
	if len(b) > maxPinFileBytes {
		return Pin{}, fmt.Errorf("idp: %s: larger than %d bytes", path, maxPinFileBytes)
	}
	var p Pin
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Pin{}, fmt.Errorf("idp: %s: %w", path, err)
	}
	if err := p.validate(); err != nil {
		return Pin{}, fmt.Errorf("idp: %s: %w", path, err)
	}
	return p, nil
}

// PinURL pins stateDir to the IdP at rawURL: it builds the pin, fetches the JWKS once with
// client (nil means a client with a 10 s timeout) and writes idp.json (0600, atomically, in a
// 0700 dir) only if the JWKS answered with at least one Ed25519 key. Pinning the URL already
// pinned returns the existing pin; any other URL is ErrRepin.
func PinURL(ctx context.Context, stateDir, rawURL string, client *http.Client) (Pin, error) {
	p, err := NewPin(rawURL)
	if err != nil {
		return Pin{}, err
	}
	switch old, err := Load(stateDir); {
	case err == nil && old == p:
		return old, nil
	case err == nil:
		return Pin{}, fmt.Errorf("%w (pinned: %s, asked: %s)", ErrRepin, old.URL, p.URL)
	case !errors.Is(err, ErrNotPinned):
		return Pin{}, err
	}
	if _, err := FetchJWKS(ctx, httpClient(client), p.JWKSURI); err != nil {
		return Pin{}, fmt.Errorf("idp: probe before pinning: %w", err)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return Pin{}, err
	}
	if err := os.MkdirAll(stateDir, creds.DirMode); err != nil {
		return Pin{}, fmt.Errorf("idp: %w", err)
	}
	if err := creds.WriteFileAtomic(filepath.Join(stateDir, FileName), append(b, '\n')); err != nil {
		return Pin{}, fmt.Errorf("idp: %w", err)
	}
	return p, nil
}
