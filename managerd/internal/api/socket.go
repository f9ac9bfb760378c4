package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"

	"github.com/cotalgo/cotal/managerd/internal/unixsock"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
)

// Modes of the API socket and the directory holding it: the peer gate (Options.AllowUIDs) is
// the policy; these keep every uid outside the owner and the group from even connecting.
const (
	SocketDirMode  fs.FileMode = 0o750
	SocketFileMode fs.FileMode = 0o660
)

// Listen binds the API socket at path. Its directory is made 0750 if missing; an existing one
// must be a directory owned by this process's uid with no mode bit beyond 0750 (and of group gid
// when gid is not negative), else Listen refuses it, naming the path. A stale socket is
// removed; anything else at path, or a socket another process listens on, is refused. The
// socket is 0660 and, when gid is not negative, of group gid (the group whose members' uids
// Options.AllowUIDs may admit). Closing the listener removes the socket.
func Listen(path string, gid int) (*net.UnixListener, error) {
	if path == "" {
		return nil, errors.New("managerd api: socket path is empty")
	}
	path = filepath.Clean(path)
	if err := unixsock.Dir(filepath.Dir(path), gid, SocketDirMode); err != nil {
		return nil, fmt.Errorf("managerd api: socket %w", err)
	}
	ln, err := unixsock.Listen(path, gid, SocketFileMode)
	if err != nil {
		return nil, fmt.Errorf("managerd api: %w", err)
	}
	return ln, nil
}

// Dial returns a ManagerService client for the socket at socketPath and the closer of its
// connection (pkg/managerclient.Dial, which programs outside managerd/ use). The connection is
// plain gRPC (insecure credentials): the socket's modes and the server's SO_PEERCRED gate are the
// trust boundary, and nothing secret crosses it. It fails when socketPath is not a socket; the
// connection itself is made by the first call.
func Dial(ctx context.Context, socketPath string) (managerv1.ManagerServiceClient, io.Closer, error) {
	return managerclient.Dial(ctx, socketPath)
}
