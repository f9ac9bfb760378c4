package mtls

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cotalgo/cotal/pkg/creds"
)

// maxFileSize bounds every file this package reads. PEM certificates, keys and CA bundles are
// a few kilobytes; anything larger is a mistake, not material.
const maxFileSize = 1 << 20

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

// ensurePrivateDir creates dir (and missing parents) with mode 0700 and then applies the
// project's secret-directory check (creds.CheckSecretDir): an existing dir that is a symlink,
// not owned by the effective uid, or grants any group or other bit is refused.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, creds.DirMode); err != nil {
		return err
	}
	return creds.CheckSecretDir(dir)
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
