package manager

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ReadableSeedError is the start refusal upstream calls "seed readable by the manager uid": this
// process could open a file under one of the signer's key paths.
type ReadableSeedError struct {
	Path string
}

func (e *ReadableSeedError) Error() string {
	return fmt.Sprintf("signer key %s can be opened by managerd's uid %d: the signer's keys must be unreadable to managerd (run signerd as its own uid with a 0700 key directory)", e.Path, os.Getuid())
}

// maxSeedWalk bounds how many entries a key directory walk opens.
const maxSeedWalk = 10000

// CheckSeedsUnreadable opens every path (a file, or a directory and every file under it) the way
// an attacker at this uid would, and refuses the first it can open for reading. A directory it
// cannot list proves nothing below it readable by name guessing only when it also cannot be
// searched, so a listable-but-not-searchable directory still counts as guarded; a missing path is
// an error (a typo must not pass as "unreadable").
func CheckSeedsUnreadable(paths []string) error {
	for _, p := range paths {
		if _, err := os.Lstat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("signer_seed_paths: %s does not exist", p)
			}
			if errors.Is(err, fs.ErrPermission) {
				continue // cannot even stat it: its parent is closed to this uid
			}
			return fmt.Errorf("signer_seed_paths: %w", err)
		}
		n := 0
		err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrPermission) {
					return fs.SkipDir // a directory this uid cannot read: nothing below is reachable by listing
				}
				return err
			}
			if n++; n > maxSeedWalk {
				return fmt.Errorf("signer_seed_paths: more than %d entries under %s", maxSeedWalk, p)
			}
			if d.IsDir() || d.Type()&fs.ModeSymlink != 0 && path != p {
				return nil
			}
			f, err := os.OpenFile(path, os.O_RDONLY|syscallNoFollow(path == p), 0)
			if err != nil {
				if errors.Is(err, fs.ErrPermission) {
					return nil
				}
				return nil // not openable for another reason (a socket, a vanished file): not readable
			}
			f.Close()
			return &ReadableSeedError{Path: path}
		})
		if err != nil {
			return err
		}
	}
	return nil
}
