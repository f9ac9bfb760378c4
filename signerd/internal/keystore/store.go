package keystore

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
)

// SecretLen is the length of the owner secret and the MAC key.
const SecretLen = 32

// Config says where the keys are.
type Config struct {
	// KeyDir is the signer directory (or the systemd credentials directory when Flat).
	KeyDir string
	// Flat is true for a systemd credentials directory: files are named <seg>.<file>.
	Flat bool
	// PublicDir holds broker.json and the spaces' public facts.
	PublicDir string
}

// Space is one space's keys, parsed and checked. Its methods sign; nothing returns key material.
type Space struct {
	// Name is the space name; Trust its verified public facts; Public the file they came from.
	Name   string
	Trust  *trust.Space
	Public *PublicSpace

	// DataSigning signs data-account users; AuthSigning signs callout-account users and
	// authorization responses.
	DataSigning *SigningKey
	AuthSigning *SigningKey
	// SystemSigning signs the system-account users of this space's delivery daemon (membership
	// observer, connection evictor); nil when the signer directory holds no system-signing.nk.
	// Each space holds its own copy, so wiping one space never touches another's.
	SystemSigning *SigningKey
	// SystemAccount is the broker's system account public key, the issuer account of the users
	// SystemSigning signs.
	SystemAccount string

	// closed is set by wipe before any key is zeroed; every key operation checks it first. It is
	// a pointer so the value-receiver redaction methods can copy a Space.
	closed      *atomic.Bool
	xkey        *curveKey
	issuer      ed25519.PrivateKey
	issuerKID   string
	ownerSecret []byte
	macKey      []byte
}

var (
	_ fmt.Formatter  = Space{}
	_ slog.LogValuer = Space{}
)

// String returns "keystore.Space(<name>)". A Space holds the xkey, the issuer key, the owner
// secret and the MAC key in unexported fields, which fmt would otherwise print byte by byte.
func (sp Space) String() string { return "keystore.Space(" + sp.Name + ")" }

// GoString is String, so %#v prints no key material either.
func (sp Space) GoString() string { return sp.String() }

// Format prints String for every verb; the value receiver keeps copies redacted too.
func (sp Space) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(sp.String())) }

// LogValue makes slog print only the space name.
func (sp Space) LogValue() slog.Value { return slog.StringValue(sp.String()) }

// Store holds every space signerd serves. It is read-only after Open and safe for concurrent use.
type Store struct {
	broker *trust.Broker
	spaces map[string]*Space
	names  []string
}

// Open loads and checks the broker facts and every space listed in the public directory. Any
// missing, loose, foreign or malformed file refuses the whole store, naming the path.
func Open(cfg Config) (st *Store, err error) {
	if cfg.KeyDir == "" || cfg.PublicDir == "" {
		return nil, errors.New("keystore: key directory and public directory are required")
	}
	if err := creds.CheckSecretDir(cfg.KeyDir); err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	pb, err := ReadPublicBroker(cfg.PublicDir)
	if err != nil {
		return nil, err
	}
	broker, err := trust.LoadBroker(pb.OperatorJWT, pb.SystemAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", filepath.Join(cfg.PublicDir, BrokerFile), err)
	}
	names, err := ListPublicSpaces(cfg.PublicDir)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("keystore: no space facts (space.*.json) in %s", cfg.PublicDir)
	}
	// store is a local, not the named result: `return nil, err` sets st to nil before the
	// deferred cleanup runs, and the spaces already loaded must still be wiped.
	store := &Store{broker: broker, spaces: make(map[string]*Space, len(names))}
	defer func() {
		if err != nil {
			store.Close()
		}
	}()
	for _, name := range names {
		sp, err := openSpace(cfg, broker, name)
		if err != nil {
			return nil, err
		}
		store.spaces[name] = sp
		store.names = append(store.names, name)
	}
	sort.Strings(store.names)
	return store, nil
}

func openSpace(cfg Config, broker *trust.Broker, name string) (_ *Space, err error) {
	pubPath := PublicSpacePath(cfg.PublicDir, name)
	ps, err := ReadPublicSpace(pubPath)
	if err != nil {
		return nil, err
	}
	ts, err := trust.LoadSpace(broker, name, ps.DataAccountJWT, ps.AuthAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", pubPath, err)
	}
	if err := checkPublicFacts(broker, ts, ps); err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", pubPath, err)
	}
	if !cfg.Flat {
		dir := filepath.Dir(SecretPath(cfg.KeyDir, name, FileDataSigning, false))
		if err := creds.CheckSecretDir(dir); err != nil {
			return nil, fmt.Errorf("keystore: %w", err)
		}
	}
	path := func(file string) string { return SecretPath(cfg.KeyDir, name, file, cfg.Flat) }

	// sp is a local, not the named result, for the same reason as store in Open: the cleanup
	// must see it.
	sp := &Space{Name: name, Trust: ts, Public: ps, SystemAccount: broker.SystemAccountPublicKey(), closed: new(atomic.Bool)}
	defer func() {
		if err != nil {
			sp.wipe()
		}
	}()
	// Each seed is decoded once, straight from the file buffer (wiped as soon as it is
	// decoded) into a raw buffer (wiped as soon as the key is derived). The public keys checked
	// against the space's facts come from the derived keys, not from decoding a seed again.
	for _, f := range []struct {
		file   string
		derive func(kind nkeys.PrefixByte, raw []byte) error
	}{
		{FileDataSigning, func(kind nkeys.PrefixByte, raw []byte) (err error) {
			sp.DataSigning, err = newSigningKey(kind, raw)
			return err
		}},
		{FileAuthSigning, func(kind nkeys.PrefixByte, raw []byte) (err error) {
			sp.AuthSigning, err = newSigningKey(kind, raw)
			return err
		}},
		{FileXKey, func(kind nkeys.PrefixByte, raw []byte) (err error) {
			sp.xkey, err = newCurveKey(kind, raw)
			return err
		}},
	} {
		// UseSeedFile's own errors name the path; the derivation's do not.
		err := creds.UseSeedFile(path(f.file), func(kind nkeys.PrefixByte, raw []byte) error {
			if err := f.derive(kind, raw); err != nil {
				return fmt.Errorf("%s: %w", path(f.file), err)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("keystore: %w", err)
		}
	}
	if err := ts.VerifySigningKeys(sp.DataSigning.Public(), sp.AuthSigning.Public(), sp.xkey.Public()); err != nil {
		return nil, fmt.Errorf("keystore: keys in %s do not belong to space %q: %w", filepath.Dir(path(FileDataSigning)), name, err)
	}
	if err := sp.loadSystemSigning(cfg, broker); err != nil {
		return nil, err
	}
	if sp.issuer, err = readIssuer(path(FileIssuer)); err != nil {
		return nil, err
	}
	sp.issuerKID = Thumbprint(sp.issuer.Public().(ed25519.PublicKey))
	if sp.ownerSecret, err = readSecret32(path(FileOwnerSecret)); err != nil {
		return nil, err
	}
	if sp.macKey, err = readSecret32(path(FileMACKey)); err != nil {
		return nil, err
	}
	return sp, nil
}

// checkPublicFacts refuses a facts file whose plain fields disagree with its verified account
// JWTs, or whose sentinel is not the callout account's deny-all bearer user. GetSpace hands
// these fields to callers, so a stale or hand-edited file must not serve facts that the JWTs,
// and therefore the broker, contradict.
func checkPublicFacts(b *trust.Broker, ts *trust.Space, ps *PublicSpace) error {
	for _, f := range []struct {
		field     string
		got, want []string
	}{
		{"token", []string{ps.Token}, []string{ts.Token()}},
		{"operator_public_key", []string{ps.OperatorPublicKey}, []string{b.OperatorPublicKey()}},
		{"data_account_public_key", []string{ps.DataAccountPublicKey}, []string{ts.DataAccountPublicKey()}},
		{"data_signing_keys", ps.DataSigningKeys, ts.DataSigningKeys()},
		{"auth_account_public_key", []string{ps.AuthAccountPublicKey}, []string{ts.AuthAccountPublicKey()}},
		{"auth_signing_keys", ps.AuthSigningKeys, ts.AuthSigningKeys()},
		{"xkey_public_key", []string{ps.XKeyPublicKey}, []string{ts.XKey()}},
		{"callout_users", ps.CalloutUsers, ts.CalloutUsers()},
	} {
		if !slices.Equal(f.got, f.want) {
			return fmt.Errorf("%s %v disagrees with the account JWTs (%v)", f.field, f.got, f.want)
		}
	}
	uc, err := jwt.DecodeUserClaims(ps.SentinelJWT)
	if err != nil {
		return fmt.Errorf("sentinel_jwt: %w", err)
	}
	switch {
	case uc.IssuerAccount != ts.AuthAccountPublicKey() || !slices.Contains(ts.AuthSigningKeys(), uc.Issuer):
		return fmt.Errorf("sentinel_jwt is issued by %s for account %s, not by a signing key of the callout account %s", uc.Issuer, uc.IssuerAccount, ts.AuthAccountPublicKey())
	case !uc.BearerToken || uc.Expires != 0 || uc.Resp != nil ||
		len(uc.Pub.Allow) != 0 || len(uc.Sub.Allow) != 0 ||
		!slices.Equal(uc.Pub.Deny, []string{">"}) || !slices.Equal(uc.Sub.Deny, []string{">"}):
		return errors.New("sentinel_jwt is not a deny-all bearer user without expiry")
	}
	return nil
}

// readIssuer reads the bearer issuer key file (parseIssuer).
func readIssuer(path string) (ed25519.PrivateKey, error) {
	data, err := creds.ReadSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	return parseIssuer(path, data)
}

// pkcs8Ed25519Prefix is the DER of an RFC 8410 PKCS#8 (version 0) Ed25519 private key up to the
// 32-byte seed: SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING
// (32) } }. It is exactly what x509.MarshalPKCS8PrivateKey and OpenSSL write.
var pkcs8Ed25519Prefix = []byte{0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20}

// pkcs8Ed25519Len is the length of that DER: the prefix and the seed.
const pkcs8Ed25519Len = 16 + ed25519.SeedSize

// PEM armour of the issuer key file.
const (
	pemBegin = "-----BEGIN PRIVATE KEY-----"
	pemEnd   = "-----END PRIVATE KEY-----"
)

// parseIssuer decodes data, the content of the issuer key file at path: one PEM "PRIVATE KEY"
// block holding an RFC 8410 PKCS#8 Ed25519 key of exactly 48 bytes (no attributes, no public
// key). data is wiped before it returns, and so is every intermediate buffer; the returned key
// is the only copy.
//
// It does not use encoding/pem and x509.ParsePKCS8PrivateKey: pem.Decode copies the base64 text
// to strip whitespace, and x509 copies the seed twice while unmarshalling, and none of those
// copies can be reached to wipe them.
func parseIssuer(path string, data []byte) (ed25519.PrivateKey, error) {
	defer wipe(data)
	refuse := fmt.Errorf("keystore: %s: not a PKCS#8 PEM private key", path)
	text := bytes.TrimSpace(data)
	body, ok := bytes.CutPrefix(text, []byte(pemBegin))
	if !ok {
		return nil, refuse
	}
	if body, ok = bytes.CutSuffix(body, []byte(pemEnd)); !ok {
		return nil, refuse
	}
	// The armour lines are lines of their own, as encoding/pem requires.
	if !bytes.HasPrefix(body, []byte("\n")) && !bytes.HasPrefix(body, []byte("\r\n")) || !bytes.HasSuffix(body, []byte("\n")) {
		return nil, refuse
	}
	// base64.StdEncoding.Decode skips '\r' and '\n' in place, without a copy. A 48-byte key is
	// 64 characters, on one line or two; anything much longer is not one.
	body = bytes.TrimSpace(body)
	notEd25519 := fmt.Errorf("keystore: %s: not an Ed25519 key in RFC 8410 PKCS#8 form (48 bytes: version 0, no attributes or public key)", path)
	var der [2 * pkcs8Ed25519Len]byte
	defer clear(der[:])
	if base64.StdEncoding.DecodedLen(len(body)) > len(der) {
		return nil, notEd25519 // a larger key (RSA, ECDSA) or more than one
	}
	n, err := base64.StdEncoding.Decode(der[:], body)
	if err != nil {
		return nil, refuse
	}
	if n != pkcs8Ed25519Len || !bytes.Equal(der[:len(pkcs8Ed25519Prefix)], pkcs8Ed25519Prefix) {
		return nil, notEd25519
	}
	key := ed25519.NewKeyFromSeed(der[len(pkcs8Ed25519Prefix):n])
	burnStack()
	return key, nil
}

// readSecret32 reads the owner secret or MAC key file (parseSecret32).
func readSecret32(path string) ([]byte, error) {
	data, err := creds.ReadSecretFile(path)
	if err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	return parseSecret32(path, data)
}

// parseSecret32 decodes data, the content of the file at path: SecretLen bytes in standard
// base64, surrounding whitespace allowed. data and the decode buffer are wiped before it
// returns; the returned secret is the only copy.
func parseSecret32(path string, data []byte) ([]byte, error) {
	defer wipe(data)
	text := bytes.TrimSpace(data)
	var buf [2 * SecretLen]byte
	defer clear(buf[:])
	if base64.StdEncoding.DecodedLen(len(text)) > len(buf) {
		return nil, fmt.Errorf("keystore: %s: want %d bytes in base64", path, SecretLen)
	}
	n, err := base64.StdEncoding.Decode(buf[:], text)
	if err != nil || n != SecretLen {
		return nil, fmt.Errorf("keystore: %s: want %d bytes in base64", path, SecretLen)
	}
	return bytes.Clone(buf[:SecretLen]), nil
}

// Thumbprint returns the RFC 7638 JWK thumbprint of an Ed25519 public key (the bearer kid).
func Thumbprint(pub ed25519.PublicKey) string {
	x := base64.RawURLEncoding.EncodeToString(pub)
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// isClosed reports whether the store was closed and the keys wiped.
func (sp *Space) isClosed() bool { return sp.closed != nil && sp.closed.Load() }

// Broker returns the broker's public facts.
func (s *Store) Broker() *trust.Broker { return s.broker }

// Space returns a loaded space by name.
func (s *Store) Space(name string) (*Space, bool) {
	sp, ok := s.spaces[name]
	return sp, ok
}

// Spaces returns the loaded space names, sorted.
func (s *Store) Spaces() []string { return append([]string(nil), s.names...) }

// Close wipes every key. The store must not be used afterwards.
func (s *Store) Close() {
	for _, sp := range s.spaces {
		sp.wipe()
	}
}

// loadSystemSigning reads the optional broker-level system signing seed. A missing file leaves
// SystemSigning nil (no $SYS user can be minted); a present one must be a signing key the system
// account JWT lists, or the store is refused.
func (sp *Space) loadSystemSigning(cfg Config, broker *trust.Broker) error {
	p := filepath.Join(cfg.KeyDir, FileSystemSigning)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	err := creds.UseSeedFile(p, func(kind nkeys.PrefixByte, raw []byte) (err error) {
		if sp.SystemSigning, err = newSigningKey(kind, raw); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keystore: %w", err)
	}
	if !slices.Contains(broker.SystemSigningKeys(), sp.SystemSigning.Public()) {
		return fmt.Errorf("keystore: %s is not a signing key of the system account in %s", p, BrokerFile)
	}
	return nil
}

func (sp *Space) wipe() {
	if sp.closed == nil { // a Space not built by Open (tests)
		sp.closed = new(atomic.Bool)
	}
	sp.closed.Store(true)
	if sp.DataSigning != nil {
		sp.DataSigning.Wipe()
	}
	if sp.AuthSigning != nil {
		sp.AuthSigning.Wipe()
	}
	if sp.SystemSigning != nil {
		sp.SystemSigning.Wipe()
	}
	if sp.xkey != nil {
		sp.xkey.Wipe()
	}
	wipe(sp.issuer)
	wipe(sp.ownerSecret)
	wipe(sp.macKey)
}
