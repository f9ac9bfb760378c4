package signerclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/health" // registers gRPC's client-side health checking
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/stats"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// Several signerd replicas (ARCHITECTURE §7). A Client feeds every configured address to one
// gRPC channel through a per-client manual resolver, and gRPC's own machinery does the rest:
//
//   - the round_robin balancer keeps a subchannel to every replica and spreads calls over the
//     ready ones. pick_first would send everything to one replica, but as gRPC's top-level
//     policy it ignores client-side health checking (only round_robin's pick_first children
//     enable the health listener), and replicas are there for capacity too;
//   - client-side health checking (grpc.health.v1 Watch on HealthService, the name signerd
//     reports): a replica whose audit log broke turns NOT_SERVING and gets no new call, before
//     it has even finished stopping;
//   - a retry policy of one retry (maxAttempts 2) on UNAVAILABLE for every SignerService
//     method: a call that met a replica as it died, or a replica that refused it because its
//     audit log broke, is sent once more, and round_robin picks the next ready replica.
//
// Retrying any signerd call is safe: signerd keeps no state but its keys, so a call repeated
// elsewhere at worst mints a second credential for the same public key, which only the holder
// of that key's seed can use (see "Replicas" in docs/signerd.md).

// HealthService is the grpc.health.v1 service name the client watches on each replica: signerd
// serves it SERVING and turns it NOT_SERVING when its audit log breaks.
var HealthService = signerv1.SignerService_ServiceDesc.ServiceName

// resolverScheme is the scheme of the per-client resolver; it is registered with the client's
// own channel only (grpc.WithResolvers), never globally.
const resolverScheme = "cotal-signerd"

// serviceConfig selects the balancer, health checking and the retry policy described above.
var serviceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "healthCheckConfig": {"serviceName": "` + HealthService + `"},
  "methodConfig": [{
    "name": [{"service": "` + HealthService + `"}],
    "retryPolicy": {
      "maxAttempts": 2,
      "initialBackoff": "0.02s",
      "maxBackoff": "0.02s",
      "backoffMultiplier": 1,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// addresses returns the replica addresses cfg names: Addr alone or Addrs. It refuses both or
// neither, an empty entry, a duplicate, and anything that is not host:port (a port from 1 to
// 65535) or unix:/absolute/path.
func (cfg Config) addresses() ([]string, error) {
	var addrs []string
	switch {
	case cfg.Addr != "" && len(cfg.Addrs) > 0:
		return nil, errors.New("signerclient: both Config.Addr (signer.address) and Config.Addrs (signer.addresses) are set; keep one")
	case cfg.Addr != "":
		addrs = []string{cfg.Addr}
	case len(cfg.Addrs) > 0:
		addrs = cfg.Addrs
	default:
		return nil, errors.New("signerclient: Config.Addr is empty (set Addr, or Addrs for several replicas)")
	}
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if err := CheckAddress(a); err != nil {
			return nil, err
		}
		if seen[a] {
			return nil, fmt.Errorf("signerclient: address %q is listed twice", a)
		}
		seen[a] = true
	}
	return append([]string(nil), addrs...), nil
}

// CheckAddress refuses a signerd address that is not host:port (a port from 1 to 65535) or
// unix:/absolute/path.
func CheckAddress(a string) error {
	if p, ok := strings.CutPrefix(a, "unix:"); ok {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("signerclient: address %q: want unix:/absolute/path", a)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("signerclient: address %q: want host:port or unix:/path: %w", a, err)
	}
	n, err := strconv.Atoi(port)
	if host == "" || err != nil || n < 1 || n > 65535 || strings.ContainsAny(host, "/ ") {
		return fmt.Errorf("signerclient: address %q: want host:port with a port from 1 to 65535, or unix:/path", a)
	}
	return nil
}

// newResolver returns a resolver that reports addrs, each its own endpoint, and never changes.
func newResolver(addrs []string) *manual.Resolver {
	r := manual.NewBuilderWithScheme(resolverScheme)
	eps := make([]resolver.Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}}
	}
	r.InitialState(resolver.State{Endpoints: eps})
	return r
}

// dialAddr connects to one replica address: unix:/path over a Unix socket, anything else over
// TCP (a host name resolved at each dial).
func dialAddr(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return d.DialContext(ctx, "unix", p)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// attemptsKey carries a call's attempt counter from the interceptor to the stats handler.
type attemptsKey struct{}

// attemptCounter counts the attempts gRPC makes for each call (each attempt, a retry or a
// transparent retry, begins with a stats.Begin) and the calls that took more than one.
type attemptCounter struct{ retried atomic.Uint64 }

// interceptor gives each call a counter and records a call that needed a retry.
func (a *attemptCounter) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var n atomic.Int32
	err := invoker(context.WithValue(ctx, attemptsKey{}, &n), method, req, reply, cc, opts...)
	if n.Load() > 1 {
		a.retried.Add(1)
	}
	return err
}

var _ stats.Handler = (*attemptCounter)(nil)

// TagRPC implements stats.Handler.
func (a *attemptCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC counts an attempt at its Begin.
func (a *attemptCounter) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.Begin); ok {
		if n, ok := ctx.Value(attemptsKey{}).(*atomic.Int32); ok {
			n.Add(1)
		}
	}
}

// TagConn implements stats.Handler.
func (a *attemptCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

// HandleConn implements stats.Handler.
func (a *attemptCounter) HandleConn(context.Context, stats.ConnStats) {}
