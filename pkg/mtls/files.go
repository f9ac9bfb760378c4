package mtls

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxFileSize bounds every file this package reads. PEM certificates, keys and CA bundles are
// a few kilobytes; anything larger is a mistake, not material.
const maxFileSize = 1 << 20

// ModeError says a secret file or directory grants permission bits beyond what is allowed.
type ModeError struct {
	// Path is the offending file or directory.
	Path string
	// Mode is its permission bits.
	Mode fs.FileMode
	// Max is the most permissive mode allowed (0600 for key files, 0700 for directories).
	Max fs.FileMode
}

// Error names the path, its mode and the limit.
func (e *ModeError) Error() string {
	return fmt.Sprintf("mtls: %s has mode %04o; permission bits beyond %04o are refused", e.Path, uint32(e.Mode), uint32(e.Max))
}

// ExistsError says WriteDevPKI refused to overwrite a file. It matches fs.ErrExist.
type ExistsError struct {
	// Path is the file that already exists.
	Path string
}

// Error names the file.
func (e *ExistsError) Error() string {
	return fmt.Sprintf("mtls: %s already exists; refusing to overwrite it", e.Path)
}

// Is reports whether target is fs.ErrExist.
func (e *ExistsError) Is(target error) bool { return target == fs.ErrExist }

// readPublicFile reads a certificate or CA file.
func readPublicFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, path)
}

// readSecretFile reads a private key file after checking, on the open descriptor, that it is
// a regular file with no permission bits beyond 0600. Checking the descriptor rather than the
// path means the file checked is the file read, even if the path is swapped in between.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("mtls: %s is not a regular file (%s)", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&^0o600 != 0 {
		return nil, &ModeError{Path: path, Mode: perm, Max: 0o600}
	}
	return readLimited(f, path)
}

func readLimited(f *os.File, path string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("mtls: %s is larger than %d bytes", path, maxFileSize)
	}
	return b, nil
}

// ensurePrivateDir creates dir (and missing parents) with mode 0700 and refuses an existing
// dir whose permission bits go beyond 0700.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("mtls: %s is not a directory", dir)
	}
	if perm := st.Mode().Perm(); perm&^0o700 != 0 {
		return &ModeError{Path: dir, Mode: perm, Max: 0o700}
	}
	return nil
}

// writeFileExclusive writes data to path atomically and without ever replacing an existing
// file: it writes and fsyncs a temporary file in the same directory, then hard-links it to
// path (link fails if path exists, where rename would silently replace it), removes the
// temporary name and fsyncs the directory.
func writeFileExclusive(path string, data []byte, mode fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmpName := tmp.Name()
	defer func() {
		if rmErr := os.Remove(tmpName); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) && err == nil {
			err = rmErr
		}
	}()
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return &ExistsError{Path: path}
		}
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
