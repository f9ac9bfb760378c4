package creds

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Permission bits a secret file or directory may carry at most.
const (
	FileMode fs.FileMode = 0o600
	DirMode  fs.FileMode = 0o700
)

// MaxSecretFileSize bounds what ReadSecretFile reads. Seeds, creds files and key material are
// a few KiB; anything larger is not one of ours.
const MaxSecretFileSize = 1 << 20

// ModeError reports a secret file or directory whose permission bits are looser than Want
// (any group or other bit set).
type ModeError struct {
	Path string
	Mode fs.FileMode
	Want fs.FileMode
}

func (e *ModeError) Error() string {
	return fmt.Sprintf("%s: mode %#o is looser than %#o", e.Path, uint32(e.Mode.Perm()), uint32(e.Want))
}

// OwnerError reports a secret file or directory not owned by the effective uid Want (or, for a
// trusted file, by neither Want nor root).
type OwnerError struct {
	Path string
	UID  int
	Want int
	// OrRoot says root would also have been accepted (trusted files, see CheckTrustedFile).
	OrRoot bool
}

func (e *OwnerError) Error() string {
	if e.OrRoot && e.Want != 0 {
		return fmt.Sprintf("%s: owned by uid %d, want uid %d or root", e.Path, e.UID, e.Want)
	}
	return fmt.Sprintf("%s: owned by uid %d, want uid %d", e.Path, e.UID, e.Want)
}

// TypeError reports a secret path that is a symlink, or not a regular file (for files) or not
// a directory (for directories). Symlinks are refused so that a writable directory elsewhere
// cannot redirect a secret read or write.
type TypeError struct {
	Path string
	Mode fs.FileMode
	Want string // "regular file" or "directory"
}

func (e *TypeError) Error() string {
	if e.Mode&fs.ModeSymlink != 0 {
		return fmt.Sprintf("%s: is a symlink, want a %s", e.Path, e.Want)
	}
	return fmt.Sprintf("%s: is %s, want a %s", e.Path, kindOf(e.Mode), e.Want)
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	default:
		return "not a regular file"
	}
}

// SizeError reports a secret file larger than MaxSecretFileSize.
type SizeError struct {
	Path string
	Size int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%s: %d bytes is larger than the %d allowed for a secret file", e.Path, e.Size, MaxSecretFileSize)
}

// CheckSecretFile returns an error naming path unless it is a regular file (not a symlink)
// owned by the effective uid with no group or other permission bit.
func CheckSecretFile(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	return checkInfo(path, fi, false)
}

// CheckSecretDir returns an error naming path unless it is a directory (not a symlink) owned by
// the effective uid with no group or other permission bit.
func CheckSecretDir(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	return checkInfo(path, fi, true)
}

func checkInfo(path string, fi fs.FileInfo, dir bool) error {
	m := fi.Mode()
	want, kind := FileMode, "regular file"
	if dir {
		want, kind = DirMode, "directory"
	}
	if (dir && !m.IsDir()) || (!dir && !m.IsRegular()) {
		return &TypeError{Path: path, Mode: m, Want: kind}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: cannot read owner", path)
	}
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return &OwnerError{Path: path, UID: int(st.Uid), Want: euid}
	}
	if m.Perm()&0o077 != 0 {
		return &ModeError{Path: path, Mode: m.Perm(), Want: want}
	}
	return nil
}

// ReadSecretFile reads a secret file after checking its directory and the file itself. The
// file is opened without following a symlink and re-checked on the open descriptor, so a swap
// between check and read is caught. The caller should wipe the returned bytes after use.
func ReadSecretFile(path string) ([]byte, error) {
	if err := CheckSecretDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	f, fi, err := openNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkInfo(path, fi, false); err != nil {
		return nil, err
	}
	if fi.Size() > MaxSecretFileSize {
		return nil, &SizeError{Path: path, Size: fi.Size()}
	}
	buf, err := readWiping(f, int(fi.Size())+1)
	if err != nil {
		var se *SizeError
		if errors.As(err, &se) {
			se.Path = path
			return nil, se
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return buf, nil
}

// openNoFollow opens path read-only without following a symlink (a symlink is a TypeError naming
// path) and stats the open descriptor, so the checks that follow judge the file that is read.
func openNoFollow(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, &TypeError{Path: path, Mode: fs.ModeSymlink, Want: "regular file"}
		}
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// readWiping reads r to EOF into one buffer of capacity hint, growing it if r holds more; every
// buffer it leaves behind (a grown-out one, or the result on error) is wiped first, so no copy
// of a secret is left to the garbage collector. It refuses more than MaxSecretFileSize bytes.
func readWiping(r io.Reader, hint int) ([]byte, error) {
	buf := make([]byte, 0, max(hint, 512))
	for {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), 2*cap(buf))
			copy(grown, buf)
			wipe(buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > MaxSecretFileSize {
			wipe(buf)
			return nil, &SizeError{Size: int64(len(buf))}
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			wipe(buf)
			return nil, err
		}
	}
}

// WriteFileAtomic writes data to path with mode 0600: a temporary file in the same directory is
// written, fsynced and renamed over path, then the directory is fsynced, so a reader sees the
// old or the new content and never a torn file. A missing parent directory is created with
// mode 0700; an existing parent looser than 0700, not owned by the effective uid, or a symlink
// is refused.
func WriteFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if _, statErr := os.Lstat(dir); errors.Is(statErr, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, DirMode); err != nil {
			return err
		}
		// MkdirAll applies the umask; set the mode we promise explicitly.
		if err := os.Chmod(dir, DirMode); err != nil {
			return err
		}
	}
	if err := CheckSecretDir(dir); err != nil {
		return err
	}
	if fi, statErr := os.Lstat(path); statErr == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		// rename would replace a symlink entry (not its target), which is fine; anything else
		// that is not a file is a mistake in the caller's path.
		return &TypeError{Path: path, Mode: fi.Mode(), Want: "regular file"}
	}
	return replaceFile(dir, path, data, FileMode)
}

// WritePublicFile writes a file that holds no secret (a rendered broker configuration, public
// account facts) atomically in the same way as WriteFileAtomic, with the given mode, which must
// not be group- or world-writable. Its directory must exist.
func WritePublicFile(path string, data []byte, mode fs.FileMode) error {
	if mode&0o022 != 0 || mode&^fs.ModePerm != 0 {
		return fmt.Errorf("%s: refusing mode %v for a public file (no group or world write)", path, mode)
	}
	return replaceFile(filepath.Dir(path), path, data, mode)
}

// replaceFile writes data to a temporary file in dir with mode, fsyncs it, renames it over path
// and fsyncs dir.
func replaceFile(dir, path string, data []byte, mode fs.FileMode) (err error) {
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
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
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%s: fsync directory: %w", dir, err)
	}
	return nil
}
