package keystore

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/space"
)

// File names inside a space's signer directory.
const (
	FileDataSigning = "data-signing.nk"
	FileAuthSigning = "auth-signing.nk"
	FileXKey        = "xkey.nk"
	FileIssuer      = "issuer.key"
	FileOwnerSecret = "owner-secret"
	FileMACKey      = "mac.key"
)

// FileSystemSigning is the system account's signing seed, one per broker, at the root of the
// signer directory (flat or not). It is optional: without it signerd mints no $SYS user.
const FileSystemSigning = "system-signing.nk"

// SecretFiles lists every secret file of a space, in load order.
var SecretFiles = []string{FileDataSigning, FileAuthSigning, FileXKey, FileIssuer, FileOwnerSecret, FileMACKey}

// BrokerFile is the public broker facts file inside the public directory.
const BrokerFile = "broker.json"

// PublicBroker is the content of broker.json.
type PublicBroker struct {
	Ver              int    `json:"ver"`
	OperatorJWT      string `json:"operator_jwt"`
	SystemAccountJWT string `json:"system_account_jwt"`
}

// PublicSpace is the content of <seg>.json: a space's public facts. Nothing in it is secret.
type PublicSpace struct {
	Ver   int    `json:"ver"`
	Space string `json:"space"`
	Token string `json:"token"`
	// OperatorPublicKey is the operator that signed both account JWTs.
	OperatorPublicKey    string   `json:"operator_public_key"`
	DataAccountPublicKey string   `json:"data_account_public_key"`
	DataAccountJWT       string   `json:"data_account_jwt"`
	DataSigningKeys      []string `json:"data_signing_keys"`
	AuthAccountPublicKey string   `json:"auth_account_public_key"`
	AuthAccountJWT       string   `json:"auth_account_jwt"`
	AuthSigningKeys      []string `json:"auth_signing_keys"`
	XKeyPublicKey        string   `json:"xkey_public_key"`
	CalloutUsers         []string `json:"callout_users"`
	// SentinelJWT is the deny-all bearer user of the callout account. It is a bearer token, so
	// the server does not check a nonce signature: clients present it with any nkey, and no
	// seed is published with it.
	SentinelJWT string `json:"sentinel_jwt"`
}

// PublicSpacePath returns <publicDir>/<seg>.json.
func PublicSpacePath(publicDir, spaceName string) string {
	return filepath.Join(publicDir, space.Segment(spaceName)+".json")
}

// SecretPath returns the path of a space's secret file in a key directory; flat (systemd
// credentials) directories use <seg>.<file>.
func SecretPath(keyDir, spaceName, file string, flat bool) string {
	seg := space.Segment(spaceName)
	if flat {
		return filepath.Join(keyDir, seg+"."+file)
	}
	return filepath.Join(keyDir, seg, file)
}

// ReadPublicBroker reads and decodes broker.json strictly.
func ReadPublicBroker(publicDir string) (*PublicBroker, error) {
	var b PublicBroker
	if err := readJSON(filepath.Join(publicDir, BrokerFile), &b); err != nil {
		return nil, err
	}
	if b.Ver != 1 {
		return nil, fmt.Errorf("keystore: %s: unsupported ver %d", filepath.Join(publicDir, BrokerFile), b.Ver)
	}
	return &b, nil
}

// ReadPublicSpace reads and decodes a space's public facts strictly.
func ReadPublicSpace(path string) (*PublicSpace, error) {
	var s PublicSpace
	if err := readJSON(path, &s); err != nil {
		return nil, err
	}
	if s.Ver != 1 {
		return nil, fmt.Errorf("keystore: %s: unsupported ver %d", path, s.Ver)
	}
	if err := space.ValidateName(s.Space); err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", path, err)
	}
	if want := filepath.Base(PublicSpacePath("", s.Space)); filepath.Base(path) != want {
		return nil, fmt.Errorf("keystore: %s names space %q, whose file is %s", path, s.Space, want)
	}
	return &s, nil
}

// ListPublicSpaces returns the space names with a public facts file in publicDir, sorted.
func ListPublicSpaces(publicDir string) ([]string, error) {
	entries, err := os.ReadDir(publicDir)
	if err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, "space.") || !strings.HasSuffix(n, ".json") {
			continue
		}
		ps, err := ReadPublicSpace(filepath.Join(publicDir, n))
		if err != nil {
			return nil, err
		}
		names = append(names, ps.Space)
	}
	return names, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("keystore: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("keystore: %s: %w", path, err)
	}
	if dec.More() {
		return fmt.Errorf("keystore: %s: trailing data", path)
	}
	return nil
}

// WriteJSON writes v as indented JSON to path atomically with the given mode (public files
// are 0644: they hold no secret).
func WriteJSON(path string, v any, mode os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	return creds.WritePublicFile(path, data, mode)
}
