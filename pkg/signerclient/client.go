// Package signerclient is how every Cotal daemon and hosted platform calls signerd: a gRPC
// client over mutual TLS with typed errors, and the credential rail that keeps one broker
// credential alive for a process (generate a user nkey in memory, Mint, prove, renew with Remint
// at 75% of the lifetime, prove again, swap).
//
// It refuses: a configuration without an address or TLS files, a signerd whose certificate does
// not chain to the configured CA (or does not carry the expected SPIFFE ID), and any signerd
// answer that does not match its request (a credential for another subject). It never logs,
// returns in an error, or writes anywhere a JWT or a seed.
package signerclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
)

// Defaults.
const (
	// DefaultServerName is the TLS server name signerd's certificate is verified for.
	DefaultServerName = "localhost"
	// DefaultCallTimeout bounds a call whose context carries no deadline.
	DefaultCallTimeout = 10 * time.Second
	// RemintContext is the domain separator of the Remint proof; it must match signerd's.
	RemintContext = "cotal-remint/v1"
)

// Config is what Dial needs. TLS and one of Addr and Addrs are required.
type Config struct {
	// Addr is signerd's address: host:port, or "unix:/path/to/socket".
	Addr string
	// Addrs lists several signerd replicas (each host:port or unix:/path, no duplicates),
	// instead of Addr. Calls are spread over the replicas that are up and healthy and fail
	// over between them (see HealthService). Every replica must present a certificate valid
	// for ServerName (and ServerID, when set).
	Addrs []string
	// TLS names this caller's client certificate and key and the CA bundle signerd's
	// certificate must chain to.
	TLS mtls.ClientFiles
	// ServerName is the name signerd's certificate is verified for; empty means
	// DefaultServerName.
	ServerName string
	// ServerID, when set, is the SPIFFE ID signerd's certificate must carry as its only URI SAN
	// (for example "spiffe://cotal.local/signerd"); any other server is refused at the handshake.
	ServerID string
	// CallTimeout bounds each call whose context has no deadline; zero means
	// DefaultCallTimeout. Negative values are refused.
	CallTimeout time.Duration
	// Now is the clock used for Remint proofs; nil means time.Now.
	Now func() time.Time
	// Logger receives certificate reload failures; nil discards them.
	Logger *slog.Logger
	// Interceptors run around every unary call, after the deadline is set (to time calls, say).
	Interceptors []grpc.UnaryClientInterceptor
}

// Client calls signerd. It is safe for concurrent use. The client certificate files are
// re-read while the client is open, so a rotated certificate is used by the next handshake.
type Client struct {
	conn     *grpc.ClientConn
	attempts *attemptCounter
	api      signerv1.SignerServiceClient
	calls    *Calls
	now      func() time.Time
	cancel   context.CancelFunc
	done     chan struct{}
}

// Dial validates cfg, loads the TLS files and returns a client. The connections are made lazily
// by the first call, so Dial does not fail when signerd is down; calls do, with ErrUnavailable
// (once every replica is down). It refuses both Addr and Addrs set, neither, a duplicate
// address and an address that is not host:port or unix:/path.
func Dial(cfg Config) (*Client, error) {
	addrs, err := cfg.addresses()
	if err != nil {
		return nil, err
	}
	if cfg.CallTimeout < 0 {
		return nil, fmt.Errorf("signerclient: Config.CallTimeout %v is negative", cfg.CallTimeout)
	}
	if cfg.ServerName == "" {
		cfg.ServerName = DefaultServerName
	}
	var opts []mtls.Option
	if cfg.ServerID != "" {
		opts = append(opts, mtls.WithServerID(cfg.ServerID))
	}
	tlsCfg, reloader, err := mtls.NewClientTLS(cfg.TLS, cfg.ServerName, opts...)
	if err != nil {
		return nil, fmt.Errorf("signerclient: TLS for %s: %w", strings.Join(addrs, ","), err)
	}
	c, err := dial(cfg, tlsCfg)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	go func() {
		defer close(c.done)
		reloader.Run(ctx, 0, func(err error) {
			logger.Warn("signerclient: client certificate reload failed; keeping the current one", "err", err)
		})
	}()
	return c, nil
}

// dial builds the client over an already made TLS configuration: one channel over every
// address, with the resolver, balancer, health checking and retry policy of replicas.go.
func dial(cfg Config, tlsCfg *tls.Config) (*Client, error) {
	addrs, err := cfg.addresses()
	if err != nil {
		return nil, err
	}
	timeout := cfg.CallTimeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	attempts := &attemptCounter{}
	conn, err := grpc.NewClient(resolverScheme+":///signerd",
		grpc.WithResolvers(newResolver(addrs)),
		grpc.WithContextDialer(dialAddr),
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithStatsHandler(attempts),
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithChainUnaryInterceptor(append([]grpc.UnaryClientInterceptor{deadlineInterceptor(timeout), attempts.interceptor}, cfg.Interceptors...)...),
	)
	if err != nil {
		return nil, fmt.Errorf("signerclient: dial %s: %w", strings.Join(addrs, ","), err)
	}
	done := make(chan struct{})
	close(done)
	c := &Client{conn: conn, attempts: attempts, api: signerv1.NewSignerServiceClient(conn), now: now, cancel: func() {}, done: done}
	c.calls = newCalls(c, len(addrs), timeout, cfg.Interceptors)
	return c, nil
}

// deadlineInterceptor gives every call without a deadline one, so no outbound call can hang,
// raw API calls included.
func deadlineInterceptor(timeout time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Close ends the streams of Calls (their calls in flight fail UNAVAILABLE), stops the
// certificate reloader and closes the connection.
func (c *Client) Close() error {
	c.calls.close()
	c.cancel()
	<-c.done
	return c.conn.Close()
}

// Retried counts the calls gRPC sent more than once (a retry on UNAVAILABLE, usually to
// another replica, or a transparent retry of a call that never reached a replica) and that
// have returned, answered or not. A daemon reports it as signer calls failed over.
func (c *Client) Retried() uint64 { return c.attempts.retried.Load() }

// API returns the raw generated client for RPCs without a typed wrapper. Its errors are gRPC
// status errors; pass them through AsError to get an *Error.
func (c *Client) API() signerv1.SignerServiceClient { return c.api }

// Mint asks signerd for a user JWT. It refuses (locally, ErrInvalid) a nil request, and refuses
// a response whose credential is missing or names another user key than the request.
func (c *Client) Mint(ctx context.Context, req *signerv1.MintRequest) (*signerv1.Credential, error) {
	if req == nil {
		return nil, localInvalid("nil MintRequest")
	}
	resp, err := c.api.Mint(ctx, req)
	return mintAnswer(req, resp, err)
}

// mintAnswer is Mint's answer to req: the call's error as an *Error, or the credential once it
// is checked against req (Client.Mint and Calls.Mint share it).
func mintAnswer(req *signerv1.MintRequest, resp *signerv1.MintResponse, err error) (*signerv1.Credential, error) {
	if err != nil {
		return nil, AsError(err)
	}
	cred := resp.GetCredential()
	if err := checkCredential(cred, req.GetUserPublicKey()); err != nil {
		return nil, err
	}
	return cred, nil
}

// Remint renews token, a credential signerd issued for holder's public key, proving possession
// of holder with a signature over RemintProofMessage. ttl <= 0 asks for the default lifetime.
// It refuses (locally, ErrInvalid) a token that is not a user JWT and a nil holder, and refuses a
// response whose credential names another subject than token.
func (c *Client) Remint(ctx context.Context, space, token string, holder nkeys.KeyPair, ttl time.Duration) (*signerv1.Credential, error) {
	if holder == nil {
		return nil, localInvalid("nil holder key")
	}
	return c.remint(ctx, space, token, holder.Sign, ttl, c.now())
}

// remint is Remint with the signer and the proof time given, so the rail can use its own key
// guard and clock.
func (c *Client) remint(ctx context.Context, space, token string, sign func([]byte) ([]byte, error), ttl time.Duration, now time.Time) (*signerv1.Credential, error) {
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		// The decode error may quote the token; say only that it is not a user JWT.
		return nil, localInvalid("token is not a valid user JWT")
	}
	at := now.Unix()
	proof, err := sign(RemintProofMessage(space, uc.ID, at))
	if err != nil {
		return nil, fmt.Errorf("signerclient: sign remint proof: %w", err)
	}
	req := &signerv1.RemintRequest{Space: space, Jwt: token, ProofUnixSeconds: at, Proof: proof}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := c.api.Remint(ctx, req)
	if err != nil {
		return nil, AsError(err)
	}
	cred := resp.GetCredential()
	if err := checkCredential(cred, uc.Subject); err != nil {
		return nil, err
	}
	return cred, nil
}

// GetSpace returns the public facts of a space.
func (c *Client) GetSpace(ctx context.Context, space string) (*signerv1.GetSpaceResponse, error) {
	resp, err := c.api.GetSpace(ctx, &signerv1.GetSpaceRequest{Space: space})
	if err != nil {
		return nil, AsError(err)
	}
	return resp, nil
}

// RemintProofMessage is what a Remint proof signs:
// "cotal-remint/v1" NUL space NUL jti NUL decimal unix seconds.
func RemintProofMessage(space, jti string, unixSeconds int64) []byte {
	return []byte(RemintContext + "\x00" + space + "\x00" + jti + "\x00" + strconv.FormatInt(unixSeconds, 10))
}

// ErrBadResponse marks a signerd answer that does not match its request. It is never expected
// from a correct signerd; the credential in it is not used.
var ErrBadResponse = errors.New("signerclient: signerd response does not match the request")

// ResponseError says which field of a signerd answer disagrees with the request. Want and Got
// are public keys or ids, never a JWT.
type ResponseError struct {
	Field, Want, Got string
}

// Error names the field and both values.
func (e *ResponseError) Error() string {
	return fmt.Sprintf("signerclient: signerd response %s is %q, want %q", e.Field, e.Got, e.Want)
}

// Is reports whether target is ErrBadResponse.
func (e *ResponseError) Is(target error) bool { return target == ErrBadResponse }

// checkCredential ties a returned credential to the subject asked for: the response field and
// the JWT's own subject must both be it.
func checkCredential(cred *signerv1.Credential, subject string) error {
	if cred == nil || cred.GetJwt() == "" {
		return &ResponseError{Field: "credential", Want: "present", Got: "missing"}
	}
	if got := cred.GetUserPublicKey(); got != subject {
		return &ResponseError{Field: "user_public_key", Want: subject, Got: got}
	}
	uc, err := jwt.DecodeUserClaims(cred.GetJwt())
	if err != nil {
		return &ResponseError{Field: "jwt", Want: "a valid user JWT", Got: "undecodable"}
	}
	if uc.Subject != subject {
		return &ResponseError{Field: "jwt subject", Want: subject, Got: uc.Subject}
	}
	if uc.ID != cred.GetJti() {
		return &ResponseError{Field: "jti", Want: uc.ID, Got: cred.GetJti()}
	}
	return nil
}

// localInvalid is a request this package refuses before sending it.
func localInvalid(detail string) *Error {
	return &Error{Code: codes.InvalidArgument, Detail: detail}
}
