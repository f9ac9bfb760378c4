package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/cotalgo/cotal/managerd/internal/unixsock"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// PeerInfo is the credentials.AuthInfo of a connection: the peer's uid, gid and pid as the
// kernel reported them at connect (SO_PEERCRED), or as Options.InMemoryPeerUID declared them for a
// connection that is no OS socket.
type PeerInfo struct {
	credentials.CommonAuthInfo
	UID, GID uint32
	PID      int32
	// Declared is true when the uid came from Options.InMemoryPeerUID, not from the kernel.
	Declared bool
}

// PeerFromContext returns the calling peer of a ManagerService call (for a Backend that logs who
// asked); ok is false outside one.
func PeerFromContext(ctx context.Context) (info PeerInfo, ok bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return PeerInfo{}, false
	}
	info, ok = p.AuthInfo.(PeerInfo)
	return info, ok
}

// AuthType implements credentials.AuthInfo.
func (PeerInfo) AuthType() string { return "peercred" }

// peerCreds is the server's transport credentials: no encryption (the socket and its directory's
// modes are the boundary), only the peer's identity, read once at accept.
type peerCreds struct {
	declared *uint32
}

var _ credentials.TransportCredentials = (*peerCreds)(nil)

// errNoPeerCred refuses a connection whose peer cannot be identified.
var errNoPeerCred = errors.New("managerd api: connection is neither a Unix socket nor in-memory; no peer identity")

// ServerHandshake identifies the peer. A Unix socket connection is identified by SO_PEERCRED
// only, whatever the options say. A declared uid is used only for a connection that is not an OS
// socket at all (bufconn, net.Pipe); any other socket (TCP) is refused.
func (c *peerCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := PeerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	switch uc := conn.(type) {
	case *net.UnixConn:
		cred, err := unixsock.PeerCred(uc)
		if err != nil {
			return nil, nil, fmt.Errorf("managerd api: SO_PEERCRED: %w", err)
		}
		info.UID, info.GID, info.PID = cred.Uid, cred.Gid, cred.Pid
		return conn, info, nil
	case syscall.Conn:
		return nil, nil, errNoPeerCred
	}
	if c.declared == nil {
		return nil, nil, errNoPeerCred
	}
	info.UID, info.Declared = *c.declared, true
	return conn, info, nil
}

// ClientHandshake is not used: clients dial with insecure credentials (see Dial).
func (c *peerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("managerd api: peer credentials are server-side only")
}

func (c *peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

func (c *peerCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

func (c *peerCreds) OverrideServerName(string) error { return nil }

// gate admits a call only from a peer uid in allow; an empty list admits nobody.
type gate struct {
	allow []uint32
	log   *slog.Logger
}

// check returns nil for an admitted peer, else a PEER_NOT_ALLOWED refusal as a status error.
func (g *gate) check(ctx context.Context, method string) error {
	info, ok := PeerFromContext(ctx)
	if !ok {
		g.log.Warn("managerd api: refused a peer with no identity", "method", method)
		return Refuse(codes.PermissionDenied, managerv1.Reason_REASON_PEER_NOT_ALLOWED, "peer not identified").status().Err()
	}
	if !slices.Contains(g.allow, info.UID) {
		g.log.Warn("managerd api: refused peer", "method", method, "peer_uid", info.UID, "peer_pid", info.PID)
		return Refuse(codes.PermissionDenied, managerv1.Reason_REASON_PEER_NOT_ALLOWED, "uid %d may not use this manager", info.UID).status().Err()
	}
	return nil
}

func (g *gate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
