// Package material is the launch material managerd hands an agent: one JSON file, 0600 and the
// agent's own, written by the launcher into the agent's directory and named by the
// COTAL_LAUNCH_MATERIAL environment variable (its path only; never its content). It holds the
// agent's NATS credential (the signerd-minted JWT and the agent's own user seed, in the .creds
// format) and the non-secret facts the agent needs to join its space. managerd rewrites it,
// through the launcher and atomically, each time it renews the credential, so an agent reads it
// again at every broker connect.
//
// A remote managerd's agent gets the exchange form instead (no credential of its own): the
// authority's public exchange URL, its standing actor token and the space's sentinel, with which
// it exchanges for a bearer and connects through the auth callout (pkg/authclient's agent arm).
package material

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

// Version is the only material version this package writes and reads.
const Version = 1

// EnvVar names the environment variable that carries the material's path.
const EnvVar = "COTAL_LAUNCH_MATERIAL"

// MaxBytes bounds an encoded material (the launcher's own limit is 64 KiB).
const MaxBytes = 32 << 10

// Material is what an agent is launched with.
type Material struct {
	Version int `json:"version"`
	// Space is the space's name.
	Space string `json:"space"`
	// Servers are the broker URLs (nats:// or tls://).
	Servers []string `json:"servers"`
	// Owner, Actor and LifecycleUID name the agent's principal and incarnation.
	Owner        string `json:"owner"`
	Actor        string `json:"actor"`
	LifecycleUID string `json:"lifecycle_uid"`
	// InstanceID is the manager instance that spawned the agent.
	InstanceID string `json:"instance_id"`
	// Role is the agent's service role, if any.
	Role string `json:"role,omitempty"`
	// Subscribe, AllowSubscribe and AllowPublish are the agent's channels, as its credential
	// grants them.
	Subscribe      []string `json:"subscribe"`
	AllowSubscribe []string `json:"allow_subscribe"`
	AllowPublish   []string `json:"allow_publish"`
	// Creds is the agent's NATS credential in the .creds format: the user JWT and the agent's
	// user seed. A secret: never log it. Empty in the exchange form.
	Creds string `json:"creds,omitempty"`
	// The exchange form (a remote managerd's agent, whose grant the authority enrolled): the
	// agent exchanges Token, its standing actor token (a secret: never log it), at ExchangeURL
	// (the authority's public auth-service base, pkg/authclient's Config.URL) for a bearer, and
	// connects through the auth callout with Sentinel (the space's public bearer user JWT) as its
	// user JWT. The three are given together and never with Creds.
	ExchangeURL string `json:"exchange_url,omitempty"`
	Token       string `json:"token,omitempty"`
	Sentinel    string `json:"sentinel,omitempty"`
}

// Exchange reports whether m is the exchange form (no credential of its own).
func (m Material) Exchange() bool { return m.Creds == "" }

// String never shows the credential.
func (m Material) String() string {
	if m.Exchange() {
		return fmt.Sprintf("material{space %s, principal %s.%s, uid %s, exchange at %s}", m.Space, m.Owner, m.Actor, m.LifecycleUID, m.ExchangeURL)
	}
	return fmt.Sprintf("material{space %s, principal %s.%s, uid %s}", m.Space, m.Owner, m.Actor, m.LifecycleUID)
}

// Encode validates m and renders it.
func Encode(m Material) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("material: %w", err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("material: %d bytes, over the %d-byte limit", len(b), MaxBytes)
	}
	return b, nil
}

// Decode parses and validates an encoded material: strict JSON (no unknown field, nothing after
// the object), version 1, every name by the grammars of pkg/space, broker URLs nats:// or
// tls://, and either a credential whose seed is a user seed for the JWT's subject or the exchange
// form (Exchange).
func Decode(b []byte) (Material, error) {
	if len(b) > MaxBytes {
		return Material{}, fmt.Errorf("material: %d bytes, over the %d-byte limit", len(b), MaxBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Material
	if err := dec.Decode(&m); err != nil {
		return Material{}, fmt.Errorf("material: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Material{}, errors.New("material: data after the object")
	}
	if err := m.Validate(); err != nil {
		return Material{}, err
	}
	return m, nil
}

// Validate checks every field.
func (m Material) Validate() error {
	if m.Version != Version {
		return fmt.Errorf("material: version %d, want %d", m.Version, Version)
	}
	if err := space.ValidateName(m.Space); err != nil {
		return fmt.Errorf("material: space: %w", err)
	}
	if len(m.Servers) == 0 {
		return errors.New("material: no servers")
	}
	for _, s := range m.Servers {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" || u.User != nil {
			return fmt.Errorf("material: server %q is not a nats:// or tls:// URL without user info", s)
		}
	}
	if _, err := space.ACLKey(m.Owner, m.Actor, m.LifecycleUID); err != nil {
		return fmt.Errorf("material: principal: %w", err)
	}
	if m.InstanceID == "" || len(m.InstanceID) > 128 {
		return errors.New("material: instance_id is empty or over 128 bytes")
	}
	if m.Role != "" {
		if err := space.ValidateRole(m.Role); err != nil {
			return fmt.Errorf("material: role: %w", err)
		}
	}
	for _, c := range m.Subscribe {
		if err := space.ValidateChannel(c); err != nil {
			return fmt.Errorf("material: subscribe: %w", err)
		}
	}
	for _, list := range [][]string{m.AllowSubscribe, m.AllowPublish} {
		for _, c := range list {
			if err := space.ValidateChannelPattern(c); err != nil {
				return fmt.Errorf("material: channel pattern: %w", err)
			}
		}
	}
	if m.Creds == "" {
		return m.validateExchange()
	}
	if m.ExchangeURL != "" || m.Token != "" || m.Sentinel != "" {
		return errors.New("material: creds and the exchange form are given together")
	}
	_, kp, err := m.credential()
	if kp != nil {
		kp.Wipe()
	}
	return err
}

// maxToken bounds the actor token (authd's are 43 characters).
const maxToken = 512

// validateExchange checks the exchange form: an absolute https URL (or http to a loopback host)
// without user info, query or fragment; a token of 16-512 printable ASCII characters; and a
// sentinel that is a bearer user JWT.
func (m Material) validateExchange() error {
	u, err := url.Parse(m.ExchangeURL)
	if err != nil || u.Host == "" || u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return errors.New("material: no creds, and exchange_url is not an absolute URL without user info, query or fragment")
	}
	if u.Scheme != "https" {
		ip := net.ParseIP(u.Hostname())
		if u.Scheme != "http" || (u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback())) {
			return errors.New("material: exchange_url must be https (or http to a loopback host)")
		}
	}
	if len(m.Token) < 16 || len(m.Token) > maxToken || strings.IndexFunc(m.Token, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return errors.New("material: token is not 16-512 printable ASCII characters")
	}
	uc, err := jwt.DecodeUserClaims(m.Sentinel)
	if err != nil || !uc.BearerToken {
		return errors.New("material: sentinel is not a bearer user JWT")
	}
	return nil
}

// credential parses Creds: the JWT and the seed's key pair (which the caller wipes).
func (m Material) credential() (string, nkeys.KeyPair, error) {
	raw := []byte(m.Creds)
	if !bytes.Contains(raw, []byte("-----BEGIN NATS USER JWT-----")) {
		return "", nil, errors.New("material: creds hold no decorated user JWT")
	}
	userJWT, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		return "", nil, errors.New("material: creds hold no decorated user JWT")
	}
	uc, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return "", nil, fmt.Errorf("material: creds: invalid user JWT: %v", err)
	}
	kp, err := jwt.ParseDecoratedNKey(raw)
	if err != nil {
		return "", nil, errors.New("material: creds hold no valid nkey seed")
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		kp.Wipe()
		return "", nil, errors.New("material: creds seed is not a user seed")
	}
	if pub != uc.Subject {
		kp.Wipe()
		return "", nil, fmt.Errorf("material: creds seed public key %s is not the JWT subject %s", pub, uc.Subject)
	}
	return userJWT, kp, nil
}

// Credential returns the user JWT and the key pair to sign the broker's nonce with; the caller
// wipes the key pair when done.
func (m Material) Credential() (string, nkeys.KeyPair, error) { return m.credential() }

// FormatCreds renders a user JWT and seed in the .creds format.
func FormatCreds(userJWT string, seed []byte) (string, error) {
	b, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		return "", fmt.Errorf("material: %w", err)
	}
	defer clear(b)
	return string(b), nil
}

// ReadFile reads and decodes the material at path as an agent must: a regular file (no
// symbolic link followed) owned by this process's effective uid with no group or other
// permission bit, at most MaxBytes. The read buffer is wiped.
func ReadFile(path string) (Material, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Material{}, fmt.Errorf("launch material: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Material{}, fmt.Errorf("launch material: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return Material{}, fmt.Errorf("launch material %s is not a regular file", path)
	case !ok || int(st.Uid) != os.Geteuid():
		return Material{}, fmt.Errorf("launch material %s is not owned by uid %d", path, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return Material{}, fmt.Errorf("launch material %s: mode %#o is looser than 0600", path, uint32(fi.Mode().Perm()))
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return Material{}, fmt.Errorf("launch material: %w", err)
	}
	defer clear(b)
	m, err := Decode(b)
	if err != nil {
		return Material{}, fmt.Errorf("launch material %s: %w", path, err)
	}
	return m, nil
}
