package creds

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Permission bits a trusted file or directory may carry at most: anyone may read it, only its
// owner may write it.
const (
	TrustedFileMode fs.FileMode = 0o644
	TrustedDirMode  fs.FileMode = 0o755
)

// maxSymlinkHops bounds symlink resolution in CheckTrustedFile, as the kernel's ELOOP limit does.
const maxSymlinkHops = 40

// CheckTrustedFile checks a file that is not secret but decides who may do what (a client CA
// bundle, a policy): whoever can rewrite it can grant themselves anything. It walks path from
// / one component at a time and refuses, naming the offending path:
//   - any directory on the way, and the file itself, owned by a uid other than root or the
//     effective uid (*OwnerError);
//   - any such directory or the file with the group or other write bit (*ModeError), except a
//     directory with the sticky bit (like /tmp), where no one else can rename or remove the
//     entries it holds;
//   - a final path that is not a regular file, or a component on the way that is not a
//     directory (*TypeError).
//
// A symlink is followed, and its target is walked and checked the same way in full; the
// directory holding the link is itself checked first, so no one else can redirect it. It
// returns the resolved path (free of symlinks) and the file's information; ReadTrustedFile
// opens that path and checks the opened file is the one checked here.
func CheckTrustedFile(path string) (string, fs.FileInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", nil, err
	}
	root, err := os.Lstat("/")
	if err != nil {
		return "", nil, err
	}
	if err := checkTrustedInfo("/", root, true); err != nil {
		return "", nil, err
	}
	// cur is always a real directory path (no symlinks) that has passed the check, so ".."
	// is its parent and a relative link target resolves against it.
	cur := "/"
	rest := strings.Split(abs, "/")
	hops := 0
	for len(rest) > 0 {
		comp := rest[0]
		rest = rest[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, comp)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", nil, err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if hops++; hops > maxSymlinkHops {
				return "", nil, fmt.Errorf("%s: more than %d symlinks while resolving %s", next, maxSymlinkHops, path)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", nil, err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		if last := !hasComponent(rest); last {
			if !fi.Mode().IsRegular() {
				return "", nil, &TypeError{Path: next, Mode: fi.Mode(), Want: "regular file"}
			}
			if err := checkTrustedInfo(next, fi, false); err != nil {
				return "", nil, err
			}
			return next, fi, nil
		}
		if !fi.IsDir() {
			return "", nil, &TypeError{Path: next, Mode: fi.Mode(), Want: "directory"}
		}
		if err := checkTrustedInfo(next, fi, true); err != nil {
			return "", nil, err
		}
		cur = next
	}
	return "", nil, &TypeError{Path: cur, Mode: fs.ModeDir, Want: "regular file"}
}

// hasComponent reports whether rest still names something to walk into ("." and "" do not; ".."
// does, since the path then ends in a directory).
func hasComponent(rest []string) bool {
	for _, c := range rest {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

// checkTrustedInfo applies the owner and write-bit rules of CheckTrustedFile to one entry.
func checkTrustedInfo(path string, fi fs.FileInfo, dir bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: cannot read owner", path)
	}
	if euid := os.Geteuid(); st.Uid != 0 && int(st.Uid) != euid {
		return &OwnerError{Path: path, UID: int(st.Uid), Want: euid, OrRoot: true}
	}
	m := fi.Mode()
	if m.Perm()&0o022 == 0 || (dir && m&fs.ModeSticky != 0) {
		return nil
	}
	want := TrustedFileMode
	if dir {
		want = TrustedDirMode
	}
	return &ModeError{Path: path, Mode: m.Perm(), Want: want}
}

// ReadTrustedFile reads a file that passes CheckTrustedFile, at most maxSize bytes. It opens
// the resolved path without following a symlink and refuses the read if the opened file is not
// the one that was checked (a swap in between) or no longer passes the check.
func ReadTrustedFile(path string, maxSize int64) ([]byte, error) {
	resolved, checked, err := CheckTrustedFile(path)
	if err != nil {
		return nil, err
	}
	f, fi, err := openNoFollow(resolved)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if !os.SameFile(fi, checked) {
		return nil, fmt.Errorf("%s: replaced while being checked", resolved)
	}
	if !fi.Mode().IsRegular() {
		return nil, &TypeError{Path: resolved, Mode: fi.Mode(), Want: "regular file"}
	}
	if err := checkTrustedInfo(resolved, fi, false); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", resolved, err)
	}
	if int64(len(data)) > maxSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", resolved, maxSize)
	}
	return data, nil
}
