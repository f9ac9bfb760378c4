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
// after the checks of ReadSecretFile. It refuses content that is not exactly one valid seed.
func ReadSeedFile(path string) (*Seed, error) {
	raw, err := ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	defer wipe(raw)
	b := trimSpaceCopy(raw)
	defer wipe(b)
	if _, _, err := nkeys.DecodeSeed(b); err != nil {
		return nil, &FormatError{Path: path, Reason: "not a valid nkey seed"}
	}
	return NewSeed(b), nil
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
