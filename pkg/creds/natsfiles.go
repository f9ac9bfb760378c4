package creds

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// FormatError reports a seed or creds file whose content is not what its kind requires. It
// names the path and never quotes the content, which may hold a seed.
type FormatError struct {
	Path   string
	Reason string
}

func (e *FormatError) Error() string { return fmt.Sprintf("%s: %s", e.Path, e.Reason) }

// WriteSeedFile writes seed as an .nk file (the encoded seed and a newline) with
// WriteFileAtomic. It refuses a nil, empty, wiped or invalid Seed.
func WriteSeedFile(path string, seed *Seed) error {
	if _, err := seed.Prefix(); err != nil {
		return err
	}
	return seed.Use(func(b []byte) error {
		buf := make([]byte, 0, len(b)+1)
		buf = append(append(buf, b...), '\n')
		defer wipe(buf)
		return WriteFileAtomic(path, buf)
	})
}

// ReadSeedFile reads an .nk file written by WriteSeedFile (surrounding whitespace allowed),
// after the checks of ReadSecretFile. It refuses content that is not exactly one canonically
// encoded seed. The file's bytes are wiped before it returns; the Seed holds the only copy.
func ReadSeedFile(path string) (*Seed, error) {
	data, err := ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	return parseSeedFile(path, data)
}

// UseSeedFile reads an .nk file like ReadSeedFile and hands the decoded seed to f as
// DecodeSeed does, without ever holding the seed text outside the file buffer: the file's bytes
// are wiped once the seed is decoded, the raw seed when f returns. f must not retain raw.
func UseSeedFile(path string, f func(kind nkeys.PrefixByte, raw []byte) error) error {
	data, err := ReadSecretFile(path)
	if err != nil {
		return err
	}
	return useSeedFile(path, data, f)
}

// parseSeedFile checks data, the content of the .nk file at path, and copies the seed text out;
// data is wiped before it returns, whatever the outcome.
func parseSeedFile(path string, data []byte) (*Seed, error) {
	defer wipe(data)
	text := bytes.TrimSpace(data)
	var raw [RawSeedLen]byte
	defer clear(raw[:])
	if _, err := decodeSeed(text, &raw); err != nil {
		return nil, &FormatError{Path: path, Reason: "not a valid nkey seed"}
	}
	return NewSeed(text), nil
}

// useSeedFile decodes data, the content of the .nk file at path, into a raw seed, wipes data,
// then calls f with the raw seed and wipes that.
func useSeedFile(path string, data []byte, f func(kind nkeys.PrefixByte, raw []byte) error) error {
	var raw [RawSeedLen]byte
	defer clear(raw[:])
	kind, err := decodeSeed(bytes.TrimSpace(data), &raw)
	wipe(data)
	if err != nil {
		return &FormatError{Path: path, Reason: "not a valid nkey seed"}
	}
	return f(kind, raw[:])
}

// WriteCreds writes a NATS .creds file (the decorated user JWT and seed) with WriteFileAtomic.
// jwt.FormatUserConfig refuses a non-user JWT, a non-user seed and a seed whose public key is
// not the JWT subject. The formatted buffer is wiped after the write.
func WriteCreds(path, userJWT string, seed *Seed) error {
	return seed.Use(func(b []byte) error {
		data, err := jwt.FormatUserConfig(userJWT, b)
		if err != nil {
			// The jwt errors name the mismatch, not the seed.
			return fmt.Errorf("%s: %w", path, err)
		}
		defer wipe(data)
		return WriteFileAtomic(path, data)
	})
}

// ReadCreds reads a NATS .creds file after the checks of ReadSecretFile and returns its user JWT
// and seed. It refuses a file whose JWT is not a valid user JWT or whose seed is not the key of
// that JWT's subject. The read buffer is wiped before returning.
func ReadCreds(path string) (userJWT string, seed *Seed, err error) {
	raw, err := ReadSecretFile(path)
	if err != nil {
		return "", nil, err
	}
	defer wipe(raw)
	return parseCreds(path, raw)
}

// parseCreds decodes the content of a creds file; path only names the file in errors.
func parseCreds(path string, raw []byte) (string, *Seed, error) {
	if !bytes.Contains(raw, []byte("-----BEGIN NATS USER JWT-----")) {
		// ParseDecoratedJWT would return the whole file as the "JWT"; refuse instead.
		return "", nil, &FormatError{Path: path, Reason: "no decorated user JWT"}
	}
	userJWT, err := jwt.ParseDecoratedJWT(raw) // copies out of raw
	if err != nil {
		return "", nil, &FormatError{Path: path, Reason: "no decorated user JWT"}
	}
	uc, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return "", nil, &FormatError{Path: path, Reason: "invalid user JWT: " + err.Error()}
	}
	kp, err := jwt.ParseDecoratedNKey(raw)
	if err != nil {
		return "", nil, &FormatError{Path: path, Reason: "no valid nkey seed"}
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", nil, &FormatError{Path: path, Reason: "no valid nkey seed"}
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", nil, &FormatError{Path: path, Reason: "seed is not a user seed"}
	}
	if pub != uc.Subject {
		return "", nil, &FormatError{Path: path, Reason: fmt.Sprintf("seed public key %s is not the JWT subject %s", pub, uc.Subject)}
	}
	seed, err := SeedFromKeyPair(kp)
	if err != nil {
		return "", nil, errors.Join(&FormatError{Path: path, Reason: "no valid nkey seed"}, err)
	}
	return userJWT, seed, nil
}
