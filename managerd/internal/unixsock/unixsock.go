// Package unixsock is what managerd's two Unix-socket servers, the launcher and the
// ManagerService API, share: binding a socket path without clobbering anything but a stale socket,
// checking the directory that holds it, and reading a peer's credentials (SO_PEERCRED).
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// PeerCred reads the connecting process's credentials (SO_PEERCRED: fixed by the kernel at
// connect, so a peer cannot change them afterwards).
func PeerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// Listen binds a Unix socket at sock and sets its group (gid; a negative gid leaves it) and its
// mode. It refuses a path that exists and is not a socket, and a socket another process still
// listens on; a stale socket (nobody listening) is removed first. The socket is unlinked when the
// listener closes. The directory holding sock is the caller's to secure (see Dir).
func Listen(sock string, gid int, mode fs.FileMode) (*net.UnixListener, error) {
	if fi, err := os.Lstat(sock); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", sock)
		}
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another server is listening", sock)
		}
		if err := os.Remove(sock); err != nil {
			return nil, fmt.Errorf("stale socket: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	ok := false
	defer func() {
		if !ok {
			ln.Close()
		}
	}()
	if gid >= 0 {
		if err := os.Chown(sock, -1, gid); err != nil {
			return nil, fmt.Errorf("socket %s: %w", sock, err)
		}
	}
	if err := os.Chmod(sock, mode); err != nil {
		return nil, fmt.Errorf("socket %s: %w", sock, err)
	}
	ok = true
	return ln, nil
}

// Dir makes dir with exactly mode (and group gid when gid is not negative) if it is missing, its
// parent existing. An existing dir must be a directory (not a symbolic link) owned by this
// process's effective uid, with no permission bit outside mode and, when gid is not negative, of
// group gid; otherwise Dir refuses it, naming the path, and changes nothing.
func Dir(dir string, gid int, mode fs.FileMode) error {
	mode &= fs.ModePerm
	if err := os.Mkdir(dir, 0o700); err == nil {
		if gid >= 0 {
			if err := os.Chown(dir, -1, gid); err != nil {
				return fmt.Errorf("directory %s: %w", dir, err)
			}
		}
		// Chmod after Mkdir: the umask may have taken bits mode asks for.
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("directory %s: %w", dir, err)
		}
		return nil
	} else if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("directory %s: not a directory (a symbolic link is refused)", dir)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("directory %s is owned by uid %d, not this process's %d", dir, st.Uid, euid)
	}
	if perm := fs.FileMode(st.Mode) & fs.ModePerm; perm&^mode != 0 {
		return fmt.Errorf("directory %s is mode %#o: looser than %#o", dir, perm, mode)
	}
	if gid >= 0 && st.Gid != uint32(gid) {
		return fmt.Errorf("directory %s has group %d, not %d", dir, st.Gid, gid)
	}
	return nil
}
