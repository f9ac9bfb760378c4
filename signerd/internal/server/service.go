// Package server implements signerd's SignerService: it authenticates the caller by its verified
// client certificate, validates the request, asks the per-caller policy, builds the claims itself
// from pkg/profiles, caps the lifetime, signs with keys from the keystore, and writes an audit
// line that is durable before any answer, granted or denied, leaves the process.
//
// It refuses: a caller without a verified SPIFFE identity, or whose certificate has since
// expired or no longer chains to the current client CA (UNAUTHENTICATED), malformed requests
// and parameters that would widen a profile (INVALID_ARGUMENT), anything the policy does not
// allow (PERMISSION_DENIED with a reason code), callers over their rate (RESOURCE_EXHAUSTED),
// unknown spaces (NOT_FOUND), and every answer whose audit line could not be made durable
// (UNAVAILABLE). Causes of internal failures go to the log, never to the caller.
//
// The rate limit is asked first, right after the caller's certificate is read and before any
// byte of the request is: every identity has a bucket (unknown ones, and certificates without
// an identity by fingerprint, a small one), and a global bucket caps them all. A refusal past a
// rate is not audited on its own line but counted, and Run writes the counts, one line per
// caller and reason per interval.
package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// Defaults.
const (
	// IdempotencyWindow is how long a Mint request_id is remembered.
	IdempotencyWindow = 10 * time.Minute
	// ProofWindow is how far a Remint proof's timestamp may be from signerd's clock.
	ProofWindow = 60 * time.Second
	// RemintContext is the domain separator of the Remint proof.
	RemintContext = "cotal-remint/v1"
	// MinterTagPrefix starts the tag that records which caller minted a credential: the first
	// 16 bytes of SHA-256(caller identity), hex. Remint compares it with the presenting caller.
	MinterTagPrefix = "minter:"
	// ProfileTagPrefix starts the tag that names a credential's profile (set by pkg/profiles).
	ProfileTagPrefix = "profile:"
	// MaxJWTBytes bounds a presented JWT. Mint issues agent JWTs of about 50 KB for 128
	// channels, so a bound below that would make such credentials unrenewable; 64 KiB stays
	// under limits.max_recv_msg_bytes' smallest allowed value.
	MaxJWTBytes = 64 << 10
)

// Auditor makes audit lines durable. *audit.Log implements it.
type Auditor interface {
	// Append returns once r's line is durable.
	Append(ctx context.Context, r audit.Record) error
	// AppendWritten returns once r's line is written, before its fsync (OpenCalloutRequest's
	// line; see audit.Log.AppendWritten).
	AppendWritten(ctx context.Context, r audit.Record) error
}

var _ Auditor = (*audit.Log)(nil)

// PeerVerifier re-verifies the caller of each request: its certificate must still be valid now
// and still chain to the current client CA. *mtls.CallerVerifier implements it.
type PeerVerifier interface {
	VerifyPeer(ctx context.Context) error
}

var _ PeerVerifier = (*mtls.CallerVerifier)(nil)

// Config is what a Service needs. Keys, Policy, Limiter, Audit and Peers are required.
type Config struct {
	Keys    *keystore.Store
	Policy  *policy.Store
	Limiter *policy.Limiter
	Audit   Auditor
	// Peers re-verifies every request's caller certificate (the handshake checked it only
	// once, when the connection was made).
	Peers PeerVerifier
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives causes of internal errors and one line per denial; nil discards.
	Logger *slog.Logger
	// Metrics is optional.
	Metrics *Metrics
	// IdempotencyBytes is the request_id cache's byte budget; 0 means DefaultIdempotencyBytes.
	IdempotencyBytes int64
	// IdempotencyCallerBytes is one caller's share of it (a caller over its share loses its
	// own oldest entries); 0 means DefaultIdempotencyCallerBytes, and it is capped at
	// IdempotencyBytes.
	IdempotencyCallerBytes int64
	// NoStream serves no Stream RPC: it answers UNIMPLEMENTED, as a signerd from before it
	// does (tests of the clients' fallback to the unary RPCs).
	NoStream bool
}

// Service implements signerv1.SignerServiceServer.
type Service struct {
	signerv1.UnimplementedSignerServiceServer

	keys    *keystore.Store
	policy  *policy.Store
	limiter *policy.Limiter
	audit   Auditor
	peers   PeerVerifier
	now     func() time.Time
	log     *slog.Logger
	metrics *Metrics
	idem    *idemCache
	opened  *openedCache
	// refusals counts the refusals past a rate limit until Run writes them.
	refusals *refusalTally
	// streams counts open Streams per caller and tells them to drain; see stream.go.
	streams  *streamTable
	noStream bool
}

var _ signerv1.SignerServiceServer = (*Service)(nil)

// New checks cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Keys == nil:
		return nil, errors.New("server: no keystore")
	case cfg.Policy == nil || cfg.Policy.Current() == nil:
		return nil, errors.New("server: no policy")
	case cfg.Limiter == nil:
		return nil, errors.New("server: no rate limiter")
	case cfg.Audit == nil:
		return nil, errors.New("server: no audit log")
	case cfg.Peers == nil:
		return nil, errors.New("server: no caller certificate verifier")
	case cfg.IdempotencyBytes < 0 || cfg.IdempotencyCallerBytes < 0:
		return nil, errors.New("server: negative idempotency cache budget")
	}
	s := &Service{keys: cfg.Keys, policy: cfg.Policy, limiter: cfg.Limiter, audit: cfg.Audit,
		peers: cfg.Peers, now: cfg.Now, log: cfg.Logger, metrics: cfg.Metrics, refusals: newRefusalTally(),
		streams: newStreamTable(), noStream: cfg.NoStream}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	budget, share := cfg.IdempotencyBytes, cfg.IdempotencyCallerBytes
	if budget == 0 {
		budget = DefaultIdempotencyBytes
	}
	if share == 0 {
		share = DefaultIdempotencyCallerBytes
	}
	s.idem = newIdemCache(IdempotencyWindow, budget, share)
	s.opened = newOpenedCache(OpenedCacheBytes, OpenedCacheTTL)
	return s, nil
}

// Register registers the service on gs.
func (s *Service) Register(gs *grpc.Server) { signerv1.RegisterSignerServiceServer(gs, s) }

// call collects what one request's audit line says.
type call struct {
	start     time.Time
	rpc       policy.RPC
	caller    string
	space     string
	profile   string
	subject   string
	requestID string
	jti       string
	expiry    time.Time
	replay    bool
	// note is a reason code that qualifies a granted answer in its audit line (for example
	// "callout-refusal"); empty for a plain grant.
	note string
	// limited is the reason of a refusal past a rate limit, which finish counts instead of
	// auditing; limitKey is the caller key it was charged to (the identity, or the
	// certificate's fingerprint when it has none).
	limited  policy.Reason
	limitKey string
}

// begin authenticates the caller and charges the request to its rate, before anything reads the
// request. A caller past its rate, or past the global cap, is refused RESOURCE_EXHAUSTED and
// counted by finish, not audited on its own line. A missing identity is returned as a refusal;
// the call is still audited by finish.
func (s *Service) begin(ctx context.Context, rpc policy.RPC) (*call, error) {
	c := &call{start: s.now(), rpc: rpc}
	id, idErr := mtls.IdentityFromContext(ctx)
	key := id
	if idErr != nil {
		c.caller = "-"
		key = certKey(ctx)
	} else {
		c.caller = id
	}
	if v := s.limiter.Allow(key); v != policy.Allowed {
		c.limited, c.limitKey = v.Reason(), key
		return c, refuse(codes.ResourceExhausted, policy.ReasonRateLimited, "rate limit exceeded")
	}
	if idErr != nil {
		s.log.Warn("caller without a usable identity", "rpc", string(rpc), "err", idErr)
		return c, refuse(codes.Unauthenticated, reasonUnauthenticated, "client certificate carries no usable SPIFFE identity")
	}
	// The handshake checked the certificate once; an expired one or a removed CA must also
	// stop a connection made before. Asked after the rate limit, so a flood with a revoked
	// certificate is counted, not audited line by line.
	if err := s.peers.VerifyPeer(ctx); err != nil {
		s.log.Warn("caller certificate no longer verifies", "rpc", string(rpc), "caller", id, "err", err)
		return c, refuse(codes.Unauthenticated, reasonUnauthenticated, "client certificate expired or no longer issued by a trusted CA")
	}
	return c, nil
}

// finish writes the audit line for c with the outcome err, records metrics, and returns what the
// caller may see. If the audit line cannot be made durable, the answer is withheld.
func (s *Service) finish(ctx context.Context, c *call, err error) error {
	if c.limited != "" {
		s.refusals.add(c.limitKey, c.limited, c.rpc, c.start)
		s.metrics.observeRateLimited(string(c.rpc), string(c.limited))
		s.metrics.observe(string(c.rpc), string(audit.Denied), string(c.limited), s.now().Sub(c.start).Seconds())
		return publicError(err)
	}
	rec := audit.Record{
		Time: c.start, Caller: c.caller, RPC: string(c.rpc), Space: c.space, Profile: c.profile,
		Subject: c.subject, RequestID: c.requestID, Decision: audit.Granted,
	}
	reason := ""
	if err == nil {
		rec.JTI, rec.Expiry = c.jti, c.expiry
		if c.replay {
			rec.Reason = "replay"
		} else if c.note != "" {
			rec.Reason = c.note
		}
	} else {
		rec.Decision = audit.Denied
		var r *refusal
		if errors.As(err, &r) {
			reason = string(r.reason)
			s.log.Info("denied", "rpc", string(c.rpc), "caller", c.caller, "space", c.space, "profile", c.profile, "reason", reason, "detail", r.detail)
		} else {
			reason = "internal-error"
			s.log.Error("internal error", "rpc", string(c.rpc), "caller", c.caller, "space", c.space, "err", err)
		}
		rec.Reason = reason
	}
	appendLine := s.audit.Append
	if c.rpc == policy.RPCOpenCalloutRequest {
		// It signs nothing, and the answer that acts on it waits for its own durable line, which
		// follows this one in the chain; see the callout choices in callout.go.
		appendLine = s.audit.AppendWritten
	}
	if aerr := appendLine(ctx, rec); aerr != nil {
		s.log.Error("audit append failed; withholding the answer", "rpc", string(c.rpc), "caller", c.caller, "err", aerr)
		s.metrics.observe(string(c.rpc), "error", "audit-failed", s.now().Sub(c.start).Seconds())
		return refuse(codes.Unavailable, "audit-unavailable", "audit log unavailable").status()
	}
	decision := string(rec.Decision)
	s.metrics.observe(string(c.rpc), decision, reason, s.now().Sub(c.start).Seconds())
	return publicError(err)
}

// decide runs the policy for req. The rate was charged in begin.
func (s *Service) decide(req policy.Request) (policy.Decision, error) {
	d := s.policy.Current().Decide(req)
	if !d.Allow {
		return d, refuse(codeFor(d.Reason), d.Reason, d.Detail)
	}
	return d, nil
}

// admit asks the policy only whether the caller may call req.RPC in req.Space, without the rate
// limiter (decide, which follows, takes the token). Remint asks it before reading the
// credential, so that a caller the policy does not know, or does not allow there, learns
// nothing about the space or the credential.
func (s *Service) admit(req policy.Request) error {
	if d := s.policy.Current().Admit(req); !d.Allow {
		return refuse(codeFor(d.Reason), d.Reason, d.Detail)
	}
	return nil
}

// space returns the keys of a space or NOT_FOUND.
func (s *Service) space(name string) (*keystore.Space, error) {
	sp, ok := s.keys.Space(name)
	if !ok {
		return nil, refuse(codes.NotFound, reasonUnknownSpace, fmt.Sprintf("signerd holds no keys for space %q", name))
	}
	return sp, nil
}

// ProfileName maps a proto Profile to a profiles.Name.
func ProfileName(p signerv1.Profile) (profiles.Name, error) {
	if p == signerv1.Profile_PROFILE_UNSPECIFIED {
		return "", errors.New("profile is required")
	}
	s, ok := signerv1.Profile_name[int32(p)]
	if !ok {
		return "", fmt.Errorf("unknown profile %d", int32(p))
	}
	return profiles.Parse(strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s, "PROFILE_")), "_", "-"))
}

// ProfileEnum maps a profiles.Name to the proto Profile.
func ProfileEnum(n profiles.Name) signerv1.Profile {
	v, ok := signerv1.Profile_value["PROFILE_"+strings.ToUpper(strings.ReplaceAll(string(n), "-", "_"))]
	if !ok {
		return signerv1.Profile_PROFILE_UNSPECIFIED
	}
	return signerv1.Profile(v)
}

// MinterTag is the tag recording caller as a credential's minter.
func MinterTag(caller string) string {
	sum := sha256.Sum256([]byte(caller))
	return MinterTagPrefix + hex.EncodeToString(sum[:16])
}
