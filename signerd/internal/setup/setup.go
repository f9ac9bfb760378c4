// Package setup is `signerd init`: the operator tool that creates a broker's trust (operator,
// system account) and each space's data and callout accounts, and lays the material out so that
// every secret lands only where it is used:
//
//	DIR/operator/                 0700  operator and account identity seeds (init and rotation only)
//	DIR/signer/system-signing.nk  0600  the system account's signing seed ($SYS users of deliveryd)
//	DIR/signer/space.<hex>/       0700  signing seeds, xkey, bearer issuer key, owner secret, MAC key
//	DIR/authd/space.<hex>/        0700  callout.nk: authd's own callout-service user seed
//	DIR/broker/nats.conf          0644  operator JWT, system account, MEMORY resolver preload; no seed
//	DIR/public/                   0755  broker.json and space.<hex>.json: public facts
//
// It refuses to overwrite any existing key material, naming the file. The one exception is
// Rotate (`signerd rotate`, rotate.go), which replaces an account signing seed on purpose and
// keeps the previous one as <file>.old until --retire.
package setup

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// Directory names under the init directory.
const (
	OperatorDir = "operator"
	SignerDir   = "signer"
	AuthdDir    = "authd"
	BrokerDir   = "broker"
	PublicDir   = "public"
	// CalloutSeedFile is authd's callout-service user seed inside DIR/authd/<seg>/.
	CalloutSeedFile = "callout.nk"
	// BrokerConfigFile is the rendered nats-server configuration inside DIR/broker/.
	BrokerConfigFile = "nats.conf"
	// BrokerName names the operator (cotal-<name>).
	BrokerName = "broker"
)

// Operator identity seed files inside DIR/operator/.
const (
	fileOperator        = "operator.nk"
	fileOperatorSigning = "operator-signing.nk"
	fileSystemAccount   = "system-account.nk"
	fileDataAccount     = "data-account.nk"
	fileAuthAccount     = "auth-account.nk"
)

// Options configures Init.
type Options struct {
	// Dir is the init directory. Required.
	Dir string
	// Spaces are the space names to create. At least one.
	Spaces []string
	// AddSpace adds Spaces to an existing broker trust in Dir instead of creating one.
	AddSpace bool
	// CalloutUsers maps a space name to a callout-service user public key generated elsewhere;
	// spaces not listed get a key generated here and written to DIR/authd/<seg>/callout.nk.
	CalloutUsers map[string]string
	// Host and Port go into nats.conf; zero values mean trust's defaults (127.0.0.1:4222).
	Host string
	Port int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// SpaceResult says what Init wrote for one space.
type SpaceResult struct {
	Name, Segment string
	// PublicFile is DIR/public/<seg>.json.
	PublicFile string
	// CalloutSeedFile is authd's seed file, or "" when the key came from CalloutUsers.
	CalloutSeedFile string
	// CalloutUser is the registered callout-service user public key.
	CalloutUser string
}

// Result says what Init wrote.
type Result struct {
	Spaces       []SpaceResult
	BrokerConfig string
	OperatorDir  string
	SignerDir    string
	PublicDir    string
}

// ExistsError reports key material Init refuses to overwrite.
type ExistsError struct{ Path string }

func (e *ExistsError) Error() string {
	return fmt.Sprintf("refusing to overwrite existing key material: %s", e.Path)
}

// Init creates (or, with AddSpace, extends) a broker trust in opts.Dir.
func Init(opts Options) (*Result, error) {
	if opts.Dir == "" {
		return nil, errors.New("setup: --dir is required")
	}
	if len(opts.Spaces) == 0 {
		return nil, errors.New("setup: at least one --space is required")
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	seen := map[string]bool{}
	for _, name := range opts.Spaces {
		if err := space.ValidateName(name); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if seen[space.Token(name)] {
			return nil, fmt.Errorf("setup: space %q given twice (or shares its wire token %q with another)", name, space.Token(name))
		}
		seen[space.Token(name)] = true
	}
	for name, pub := range opts.CalloutUsers {
		if !contains(opts.Spaces, name) {
			return nil, fmt.Errorf("setup: --callout-user names space %q, which is not being created", name)
		}
		if !nkey.IsUser(pub) {
			return nil, fmt.Errorf("setup: --callout-user for space %q: %s", name, describeKey(pub))
		}
	}
	// nats.conf names the JetStream store by this path, and nats-server resolves a relative
	// store_dir against its own working directory, not the config file's.
	root, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("setup: --dir: %w", err)
	}
	d := dirs(root)
	if err := d.make(); err != nil {
		return nil, err
	}

	// Refuse before writing anything: an existing operator (unless adding), then any space
	// that exists already. Only then is the operator created or loaded.
	if !opts.AddSpace {
		if err := d.refuseOperator(); err != nil {
			return nil, err
		}
	}
	for _, name := range opts.Spaces {
		seg := space.Segment(name)
		for _, p := range []string{filepath.Join(d.signer, seg), filepath.Join(d.operator, seg), keystore.PublicSpacePath(d.public, name), filepath.Join(d.authd, seg)} {
			if _, err := os.Lstat(p); err == nil {
				return nil, &ExistsError{Path: p}
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("setup: %w", err)
			}
		}
	}

	var (
		broker *trust.Broker
		op     *trust.OperatorIdentity
	)
	if opts.AddSpace {
		broker, op, err = d.loadOperator()
		if err == nil {
			err = d.refuseTokenCollisions(opts.Spaces)
			if err != nil {
				op.Wipe()
			}
		}
	} else {
		broker, op, err = d.createOperator()
	}
	if err != nil {
		return nil, err
	}
	defer op.Wipe()

	res := &Result{OperatorDir: d.operator, SignerDir: d.signer, PublicDir: d.public}
	for _, name := range opts.Spaces {
		sr, err := d.createSpace(broker, op, name, opts.CalloutUsers[name], now())
		if err != nil {
			return nil, err
		}
		res.Spaces = append(res.Spaces, *sr)
	}
	res.BrokerConfig, err = d.renderBroker(broker, opts.Host, opts.Port)
	if err != nil {
		return nil, err
	}
	return res, nil
}

type layout struct{ root, operator, signer, authd, broker, public string }

func dirs(root string) layout {
	return layout{
		root:     root,
		operator: filepath.Join(root, OperatorDir),
		signer:   filepath.Join(root, SignerDir),
		authd:    filepath.Join(root, AuthdDir),
		broker:   filepath.Join(root, BrokerDir),
		public:   filepath.Join(root, PublicDir),
	}
}

func (d layout) make() error {
	for _, m := range []struct {
		path string
		mode os.FileMode
	}{{d.root, 0o755}, {d.operator, 0o700}, {d.signer, 0o700}, {d.authd, 0o700}, {d.broker, 0o755}, {d.public, 0o755}} {
		if err := os.MkdirAll(m.path, m.mode); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if m.mode == 0o700 {
			if err := creds.CheckSecretDir(m.path); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
		}
	}
	return nil
}

// refuseOperator returns an *ExistsError naming the first operator seed or broker facts file
// that exists already.
func (d layout) refuseOperator() error {
	for _, f := range []string{fileOperator, fileOperatorSigning, fileSystemAccount} {
		if p := filepath.Join(d.operator, f); exists(p) {
			return &ExistsError{Path: p}
		}
	}
	for _, p := range []string{filepath.Join(d.signer, keystore.FileSystemSigning), filepath.Join(d.public, keystore.BrokerFile)} {
		if exists(p) {
			return &ExistsError{Path: p}
		}
	}
	return nil
}

// refuseTokenCollisions refuses a new space whose wire token an existing space already uses:
// both data accounts would carry the same name, the broker configuration could not be
// rendered any more, and the new space's files would be left behind unusable.
func (d layout) refuseTokenCollisions(names []string) error {
	existing, err := keystore.ListPublicSpaces(d.public)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for _, name := range names {
		for _, old := range existing {
			if space.Token(old) == space.Token(name) {
				return fmt.Errorf("setup: space %q shares its wire token %q with existing space %q", name, space.Token(name), old)
			}
		}
	}
	return nil
}

// createOperator creates the operator and system account and writes their seeds and the
// public broker facts. The caller has run refuseOperator.
func (d layout) createOperator() (*trust.Broker, *trust.OperatorIdentity, error) {
	broker, op, err := trust.NewBroker(BrokerName)
	if err != nil {
		return nil, nil, fmt.Errorf("setup: %w", err)
	}
	for _, f := range []struct {
		name string
		seed *creds.Seed
	}{{fileOperator, op.Operator}, {fileOperatorSigning, op.OperatorSigning}, {fileSystemAccount, op.SystemAccount}} {
		if err := creds.WriteSeedFile(filepath.Join(d.operator, f.name), f.seed); err != nil {
			op.Wipe()
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
	}
	// The system account's signing seed is the one broker-level seed signerd holds: it signs the
	// delivery daemon's $SYS users (membership observer, connection evictor), which only
	// deliveryd's policy may mint.
	if err := creds.WriteSeedFile(filepath.Join(d.signer, keystore.FileSystemSigning), op.SystemSigning); err != nil {
		op.Wipe()
		return nil, nil, fmt.Errorf("setup: %w", err)
	}
	pb := keystore.PublicBroker{Ver: 1, OperatorJWT: broker.OperatorJWT(), SystemAccountJWT: broker.SystemAccountJWT()}
	if err := keystore.WriteJSON(filepath.Join(d.public, keystore.BrokerFile), pb, 0o644); err != nil {
		op.Wipe()
		return nil, nil, fmt.Errorf("setup: %w", err)
	}
	return broker, op, nil
}

func (d layout) loadOperator() (*trust.Broker, *trust.OperatorIdentity, error) {
	pb, err := keystore.ReadPublicBroker(d.public)
	if err != nil {
		return nil, nil, fmt.Errorf("setup: --add-space needs an initialised directory: %w", err)
	}
	broker, err := trust.LoadBroker(pb.OperatorJWT, pb.SystemAccountJWT)
	if err != nil {
		return nil, nil, fmt.Errorf("setup: %w", err)
	}
	op := &trust.OperatorIdentity{}
	for _, f := range []struct {
		name string
		dst  **creds.Seed
	}{{fileOperator, &op.Operator}, {fileOperatorSigning, &op.OperatorSigning}, {fileSystemAccount, &op.SystemAccount}} {
		s, err := creds.ReadSeedFile(filepath.Join(d.operator, f.name))
		if err != nil {
			op.Wipe()
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
		*f.dst = s
	}
	if err := op.Verify(broker); err != nil {
		op.Wipe()
		return nil, nil, fmt.Errorf("setup: operator seeds in %s do not match %s: %w", d.operator, filepath.Join(d.public, keystore.BrokerFile), err)
	}
	return broker, op, nil
}

func (d layout) createSpace(broker *trust.Broker, op *trust.OperatorIdentity, name, calloutPub string, now time.Time) (*SpaceResult, error) {
	seg := space.Segment(name)
	res := &SpaceResult{Name: name, Segment: seg, PublicFile: keystore.PublicSpacePath(d.public, name)}
	if calloutPub == "" {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		defer kp.Wipe()
		seed, err := creds.SeedFromKeyPair(kp)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		defer seed.Wipe()
		res.CalloutSeedFile = filepath.Join(d.authd, seg, CalloutSeedFile)
		if err := creds.WriteSeedFile(res.CalloutSeedFile, seed); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if calloutPub, err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	res.CalloutUser = calloutPub

	sp, ident, signing, err := trust.NewSpace(broker, op, name, []string{calloutPub})
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	defer ident.Wipe()
	defer signing.Wipe()

	for _, f := range []struct {
		path string
		seed *creds.Seed
	}{
		{filepath.Join(d.operator, seg, fileDataAccount), ident.DataAccount},
		{filepath.Join(d.operator, seg, fileAuthAccount), ident.AuthAccount},
		{keystore.SecretPath(d.signer, name, keystore.FileDataSigning, false), signing.DataSigning},
		{keystore.SecretPath(d.signer, name, keystore.FileAuthSigning, false), signing.AuthSigning},
		{keystore.SecretPath(d.signer, name, keystore.FileXKey, false), signing.XKey},
	} {
		if err := creds.WriteSeedFile(f.path, f.seed); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	if err := writeIssuerKey(keystore.SecretPath(d.signer, name, keystore.FileIssuer, false)); err != nil {
		return nil, err
	}
	for _, f := range []string{keystore.FileOwnerSecret, keystore.FileMACKey} {
		if err := writeRandomSecret(keystore.SecretPath(d.signer, name, f, false)); err != nil {
			return nil, err
		}
	}

	sentinel, err := mintSentinel(sp, signing, now)
	if err != nil {
		return nil, err
	}
	ps := keystore.PublicSpace{
		Ver: 1, Space: name, Token: sp.Token(),
		OperatorPublicKey:    broker.OperatorPublicKey(),
		DataAccountPublicKey: sp.DataAccountPublicKey(), DataAccountJWT: sp.DataAccountJWT(), DataSigningKeys: sp.DataSigningKeys(),
		AuthAccountPublicKey: sp.AuthAccountPublicKey(), AuthAccountJWT: sp.AuthAccountJWT(), AuthSigningKeys: sp.AuthSigningKeys(),
		XKeyPublicKey: sp.XKey(), CalloutUsers: sp.CalloutUsers(), SentinelJWT: sentinel,
	}
	if err := keystore.WriteJSON(res.PublicFile, ps, 0o644); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	return res, nil
}

// mintSentinel signs the space's deny-all bearer user with the callout signing key. The user
// key is thrown away: a bearer JWT is presented without a nonce signature.
func mintSentinel(sp *trust.Space, signing *trust.SpaceSigning, now time.Time) (string, error) {
	spec, err := profiles.Build(sp.Name(), profiles.Sentinel, profiles.Params{})
	if err != nil {
		return "", fmt.Errorf("setup: sentinel: %w", err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	defer ukp.Wipe()
	upub, _ := ukp.PublicKey()
	uc, err := spec.Claims(upub, sp.AuthAccountPublicKey(), now, 0)
	if err != nil {
		return "", fmt.Errorf("setup: sentinel: %w", err)
	}
	var token string
	err = signing.AuthSigning.Use(func(b []byte) error {
		key, err := keystore.NewSigningKey(b)
		if err != nil {
			return err
		}
		defer key.Wipe()
		token, err = uc.Encode(key)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("setup: sentinel: %w", err)
	}
	return token, nil
}

func writeIssuerKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	defer wipe(priv)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	defer wipe(der)
	data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	defer wipe(data)
	if err := creds.WriteFileAtomic(path, data); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	return nil
}

func writeRandomSecret(path string) error {
	raw := make([]byte, keystore.SecretLen)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	defer wipe(raw)
	data := []byte(base64.StdEncoding.EncodeToString(raw) + "\n")
	defer wipe(data)
	if err := creds.WriteFileAtomic(path, data); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	return nil
}

// renderBroker writes DIR/broker/nats.conf for every space in the public directory.
func (d layout) renderBroker(broker *trust.Broker, host string, port int) (string, error) {
	names, err := keystore.ListPublicSpaces(d.public)
	if err != nil {
		return "", fmt.Errorf("setup: %w", err)
	}
	cfg := trust.ServerConfig{Host: host, Port: port, StoreDir: filepath.Join(d.broker, "jetstream"), Broker: broker}
	if cfg.Spaces, err = loadSpaces(d.public, broker, names); err != nil {
		return "", err
	}
	conf, err := trust.RenderServerConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("setup: %w", err)
	}
	path := filepath.Join(d.broker, BrokerConfigFile)
	if err := creds.WritePublicFile(path, conf, 0o644); err != nil {
		return "", fmt.Errorf("setup: %w", err)
	}
	return path, nil
}

// loadSpaces reads the named spaces' public facts from the public directory.
func loadSpaces(public string, broker *trust.Broker, names []string) ([]*trust.Space, error) {
	var out []*trust.Space
	for _, name := range names {
		ps, err := keystore.ReadPublicSpace(keystore.PublicSpacePath(public, name))
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		sp, err := trust.LoadSpace(broker, name, ps.DataAccountJWT, ps.AuthAccountJWT)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		out = append(out, sp)
	}
	return out, nil
}

// describeKey says why v is not a user public key without quoting v unless it is some other
// kind of public key: an operator who pastes a seed by mistake must not find it in a log.
func describeKey(v string) string {
	if nkeys.IsValidPublicKey(v) {
		return fmt.Sprintf("%q is not a user public key (U…)", v)
	}
	return fmt.Sprintf("the value (%d characters, not shown: it may be a secret) is not a user public key (U…)", len(v))
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}
