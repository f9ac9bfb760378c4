// Package managerclient dials managerd's ManagerService on its Unix socket. It is the exported
// face of managerd/internal/api's Dial, for programs outside managerd/ (the local dev stack, tools)
// that drive a running managerd. The connection is plain gRPC over the socket: the socket's modes
// and managerd's SO_PEERCRED gate (api.allow_uids) decide who may call, and nothing secret crosses it.
package managerclient

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// Dial returns a ManagerService client for the socket at socketPath and the closer of its
// connection. It fails when socketPath is not a socket; the connection itself is made by the
// first call.
func Dial(ctx context.Context, socketPath string) (managerv1.ManagerServiceClient, io.Closer, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	abs, err := filepath.Abs(socketPath)
	if err != nil {
		return nil, nil, fmt.Errorf("managerd api: %w", err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, nil, fmt.Errorf("managerd api: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return nil, nil, fmt.Errorf("managerd api: %s is not a socket", abs)
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("managerd api: %w", err)
	}
	return managerv1.NewManagerServiceClient(conn), conn, nil
}
