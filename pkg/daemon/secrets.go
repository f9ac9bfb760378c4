package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
	"go.yaml.in/yaml/v3"

	"github.com/cotalgo/cotal/pkg/creds"
)

// SecretError says a file holds signing material a daemon must never sit next to. It names the
// file and the kind of secret, never the secret.
type SecretError struct {
	Path string
	// What is "an operator seed", "an account seed", "a curve seed" or "a private JWK".
	What string
}

func (e *SecretError) Error() string {
	return fmt.Sprintf("%s holds %s: signing material belongs to signerd alone; move it out of this daemon's files", e.Path, e.What)
}

// jwkScanLimit bounds the files parsed as JSON or YAML for a private JWK; larger files are only
// scanned for seeds (a JWK file is a few KiB).
const jwkScanLimit = 1 << 20

// scanChunk is how much of a file is scanned for seeds at a time; consecutive chunks overlap by
// one encoded seed less a byte so no seed is split unseen.
const scanChunk = 1 << 20

// encodedSeedLen is the length of a canonical encoded nkey seed (pkg/creds).
const encodedSeedLen = 58

// ScanSecrets walks each path (a file, or a directory tree; symbolic links are not followed
// into directories, but a link to a file is read) and refuses with a *SecretError, naming the
// first file found, when one holds an operator, account or curve nkey seed in canonical
// encoding (SO…, SA…, SX…; a user seed, SU…, is a daemon's own broker identity and passes) or a
// JSON/YAML object that is a private JWK (kty OKP, EC or RSA with a "d" member). A path that
// cannot be read is an error naming it; a missing path is not (a state directory not yet made
// holds nothing).
func ScanSecrets(paths ...string) error {
	for _, root := range paths {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) && path == root {
					return nil
				}
				return fmt.Errorf("secret scan: %w", err)
			}
			if d.IsDir() {
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				fi, err := os.Stat(path)
				if err != nil {
					return fmt.Errorf("secret scan: %w", err)
				}
				if !fi.Mode().IsRegular() {
					return nil
				}
			} else if !d.Type().IsRegular() {
				return nil
			}
			return scanFile(path)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// scanFile scans one regular file in chunks.
func scanFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("secret scan: %w", err)
	}
	defer f.Close()
	buf := make([]byte, scanChunk+encodedSeedLen)
	defer clear(buf)
	keep, first := 0, true
	for {
		n, rerr := io.ReadFull(f, buf[keep:])
		data := buf[:keep+n]
		if first && rerr != nil && len(data) <= jwkScanLimit {
			// The whole file fits: look for a private JWK too.
			if hasPrivateJWK(data) {
				return &SecretError{Path: path, What: "a private JWK"}
			}
		}
		first = false
		if what := findSeed(data); what != "" {
			return &SecretError{Path: path, What: what}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				return nil
			}
			return fmt.Errorf("secret scan: %s: %w", path, rerr)
		}
		keep = min(encodedSeedLen-1, len(data))
		copy(buf, data[len(data)-keep:])
	}
}

// scanBytes is ScanSecrets for content already read (a configuration file).
func scanBytes(path string, data []byte) error {
	if len(data) <= jwkScanLimit && hasPrivateJWK(data) {
		return &SecretError{Path: path, What: "a private JWK"}
	}
	if what := findSeed(data); what != "" {
		return &SecretError{Path: path, What: what}
	}
	return nil
}

func isB32(c byte) bool { return 'A' <= c && c <= 'Z' || '2' <= c && c <= '7' }

// findSeed returns what kind of forbidden seed data holds, or "". A candidate is a run of
// exactly 58 base32 characters starting with S, decoded by creds.DecodeSeed (prefix, canonical
// bits and CRC-16 checked), so ordinary text does not match.
func findSeed(data []byte) string {
	for i := 0; i+encodedSeedLen <= len(data); i++ {
		if data[i] != 'S' || (i > 0 && isB32(data[i-1])) {
			continue
		}
		end := i + encodedSeedLen
		if end < len(data) && isB32(data[end]) {
			continue
		}
		what := ""
		_ = creds.DecodeSeed(data[i:end], func(kind nkeys.PrefixByte, _ []byte) error {
			switch kind {
			case nkeys.PrefixByteOperator:
				what = "an operator seed"
			case nkeys.PrefixByteAccount:
				what = "an account seed"
			case nkeys.PrefixByteCurve:
				what = "a curve seed"
			}
			return nil
		})
		if what != "" {
			return what
		}
	}
	return ""
}

// hasPrivateJWK reports whether data parses as JSON or YAML holding, at any depth, an object
// with kty OKP, EC or RSA and a "d" member (the private part of each key type).
func hasPrivateJWK(data []byte) bool {
	var v any
	if json.Valid(data) {
		if json.Unmarshal(data, &v) != nil {
			return false
		}
	} else if yaml.Unmarshal(data, &v) != nil {
		return false
	}
	return walkJWK(v, 0)
}

func walkJWK(v any, depth int) bool {
	if depth > 64 {
		return false
	}
	switch t := v.(type) {
	case map[string]any:
		if kty, ok := t["kty"].(string); ok && (kty == "OKP" || kty == "EC" || kty == "RSA") {
			if _, ok := t["d"]; ok {
				return true
			}
		}
		for _, c := range t {
			if walkJWK(c, depth+1) {
				return true
			}
		}
	case []any:
		for _, c := range t {
			if walkJWK(c, depth+1) {
				return true
			}
		}
	}
	return false
}
