package serve

import (
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// streamWindowBytes is the HTTP/2 flow-control window of each stream and of each connection.
// Setting it turns off gRPC's dynamic window (which grows a window up to 16 MiB to fill a
// long link), so a client can never have more than this many unread bytes buffered per
// stream; requests are small and the link is local.
const streamWindowBytes = 64 << 10

// ServerOptions returns the gRPC server options that enforce l: the handshake timeout, the
// receive, header and stream limits, keepalive enforcement and connection ages. `signerd
// serve` applies them to its listener; anything else serving SignerService should too.
func (l LimitsConfig) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(time.Duration(l.HandshakeTimeout)),
		grpc.MaxRecvMsgSize(l.MaxRecvMsgBytes),
		grpc.MaxConcurrentStreams(uint32(l.MaxConcurrentStreams)),
		grpc.MaxHeaderListSize(uint32(l.MaxHeaderListBytes)),
		grpc.InitialWindowSize(streamWindowBytes),
		grpc.InitialConnWindowSize(streamWindowBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: time.Duration(l.KeepaliveMinTime), PermitWithoutStream: false,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     time.Duration(l.MaxConnectionIdle),
			MaxConnectionAge:      time.Duration(l.MaxConnectionAge),
			MaxConnectionAgeGrace: time.Duration(l.MaxConnectionAgeGrace),
		}),
	}
}

// limitListener closes, at accept, a connection over the total cap or over the cap for its
// source IP address, before any byte of it is read: a flood of connections costs signerd a
// file descriptor for a moment, not one per connection until the handshake times out.
type limitListener struct {
	net.Listener
	max, perSource int
	refused        *prometheus.CounterVec

	mu sync.Mutex
	// open and bySource count connections accepted and not yet closed; mu must be held.
	open     int
	bySource map[string]int
}

// newLimitListener wraps lis with the caps of l. refused counts closed connections by reason
// ("total" or "per-source").
func newLimitListener(lis net.Listener, l LimitsConfig, refused *prometheus.CounterVec) *limitListener {
	return &limitListener{Listener: lis, max: l.MaxConnections, perSource: l.MaxConnectionsPerSource,
		refused: refused, bySource: make(map[string]int)}
}

// Accept returns the next connection within the caps, closing those over them.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		if reason := l.admit(src); reason != "" {
			l.refused.WithLabelValues(reason).Inc()
			_ = c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.release(src) })}, nil
	}
}

// admit counts a connection from src, or returns why it is over a cap.
func (l *limitListener) admit(src string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.max {
		return "total"
	}
	if src != "" && l.bySource[src] >= l.perSource {
		return "per-source"
	}
	l.open++
	if src != "" {
		l.bySource[src]++
	}
	return ""
}

func (l *limitListener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if src == "" {
		return
	}
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// sourceOf is the IP address of a TCP peer, or "" for a Unix socket peer (all local, one
// source: only the total cap applies).
func sourceOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return ""
}

// limitedConn gives its slot back when closed, once.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
