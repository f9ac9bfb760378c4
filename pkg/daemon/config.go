package daemon

import (
	"strings"

	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// MaxConfigBytes bounds a configuration file: a daemon's configuration is a few hundred bytes,
// and a larger file is a mistake or an attack on the parser.
const MaxConfigBytes = 1 << 20

// ConfigError names the configuration file a refusal is about.
type ConfigError struct {
	Path string
	Err  error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("config: %s: %v", e.Path, e.Err) }

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// ErrConfigTooLarge: the configuration file is larger than MaxConfigBytes.
var ErrConfigTooLarge = fmt.Errorf("larger than %d bytes", MaxConfigBytes)

// LoadConfig reads the configuration file at path into out (a pointer to the daemon's Config)
// and checks it holds no secret. It refuses, with a *ConfigError naming path: a file it cannot
// read or that is not a regular file, one over MaxConfigBytes, YAML that is not plain (anchors,
// aliases, merge keys, tags), an unknown key (named with its line), more than one document, and
// a file that ScanSecrets refuses. Validation of the values is the caller's.
func LoadConfig(path string, out any) error {
	data, err := readBounded(path, MaxConfigBytes)
	if err != nil {
		return &ConfigError{Path: path, Err: err}
	}
	if err := scanBytes(path, data); err != nil {
		return err
	}
	if err := yamlx.Decode(data, out); err != nil {
		return &ConfigError{Path: path, Err: err}
	}
	return nil
}

// readBounded reads a regular file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		if limit == MaxConfigBytes {
			return nil, ErrConfigTooLarge
		}
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}

// CheckBrokers refuses a broker list entry that is not a nats:// or tls:// URL with a host and
// without credentials (a daemon's credential comes from signerd, never from its config), and
// one holding a comma: each URL is its own entry, and the daemons join them for nats.Connect.
func CheckBrokers(urls []string) error {
	for _, b := range urls {
		if strings.Contains(b, ",") {
			return fmt.Errorf("brokers: %q holds a comma; list each broker URL as its own entry", b)
		}
		u, err := url.Parse(b)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" || u.User != nil {
			return fmt.Errorf("brokers: %q is not a nats:// or tls:// URL without credentials", b)
		}
	}
	return nil
}

// CheckLogLevel accepts the log_level values LogLevel maps: empty, debug, info, warn, error.
func CheckLogLevel(level string) error {
	switch level {
	case "", "debug", "info", "warn", "error":
		return nil
	}
	return fmt.Errorf("log_level %q: want debug, info, warn or error", level)
}

// CheckStateDir makes dir absolute and, when it exists, requires a directory that passes
// creds.CheckSecretDir (0700, this uid) and holds no secret (ScanSecrets); a state directory
// that does not exist yet is accepted (the daemon makes it). It returns the absolute path, with
// the refusal too, so a refusal file can still go there.
func CheckStateDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("state_dir: %w", err)
	}
	if fi, err := os.Lstat(abs); err == nil {
		if !fi.IsDir() {
			return abs, fmt.Errorf("state_dir %s is not a directory", abs)
		}
		if err := creds.CheckSecretDir(abs); err != nil {
			return abs, fmt.Errorf("state_dir: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return abs, fmt.Errorf("state_dir: %w", err)
	}
	return abs, ScanSecrets(abs)
}
