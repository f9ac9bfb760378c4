// Package server implements signerd's SignerService: it authenticates the caller by its verified
// client certificate, validates the request, asks the per-caller policy, builds the claims itself
// from pkg/profiles, caps the lifetime, signs with keys from the keystore, and writes an audit
// line that is durable before any answer, granted or denied, leaves the process.
//
// It refuses: a caller without a verified SPIFFE identity (UNAUTHENTICATED), malformed requests
// and parameters that would widen a profile (INVALID_ARGUMENT), anything the policy does not
// allow (PERMISSION_DENIED with a reason code), callers over their rate (RESOURCE_EXHAUSTED),
// unknown spaces (NOT_FOUND), and every answer whose audit line could not be made durable
// (UNAVAILABLE). Causes of internal failures go to the log, never to the caller.
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
	// DefaultIdempotencyEntries bounds the idempotency cache.
	DefaultIdempotencyEntries = 100_000
	// ProofWindow is how far a Remint proof's timestamp may be from signerd's clock.
	ProofWindow = 60 * time.Second
	// RemintContext is the domain separator of the Remint proof.
	RemintContext = "cotal-remint/v1"
	// MinterTagPrefix starts the tag that records which caller minted a credential: the first
	// 16 bytes of SHA-256(caller identity), hex. Remint compares it with the presenting caller.
	MinterTagPrefix = "minter:"
	// ProfileTagPrefix starts the tag that names a credential's profile (set by pkg/profiles).
	ProfileTagPrefix = "profile:"
	// MaxJWTBytes bounds a presented JWT.
	MaxJWTBytes = 16 << 10
)

// Auditor makes audit lines durable. *audit.Log implements it.
type Auditor interface {
	Append(ctx context.Context, r audit.Record) error
}

var _ Auditor = (*audit.Log)(nil)

// Config is what a Service needs. Keys, Policy, Limiter and Audit are required.
type Config struct {
	Keys    *keystore.Store
	Policy  *policy.Store
	Limiter *policy.Limiter
	Audit   Auditor
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives causes of internal errors and one line per denial; nil discards.
	Logger *slog.Logger
	// Metrics is optional.
	Metrics *Metrics
	// IdempotencyEntries bounds the request_id cache; 0 means DefaultIdempotencyEntries.
	IdempotencyEntries int
}

// Service implements signerv1.SignerServiceServer.
type Service struct {
	signerv1.UnimplementedSignerServiceServer

	keys    *keystore.Store
	policy  *policy.Store
	limiter *policy.Limiter
	audit   Auditor
	now     func() time.Time
	log     *slog.Logger
	metrics *Metrics
	idem    *idemCache
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
	}
	s := &Service{keys: cfg.Keys, policy: cfg.Policy, limiter: cfg.Limiter, audit: cfg.Audit,
		now: cfg.Now, log: cfg.Logger, metrics: cfg.Metrics}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	n := cfg.IdempotencyEntries
	if n <= 0 {
		n = DefaultIdempotencyEntries
	}
	s.idem = newIdemCache(IdempotencyWindow, n)
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
}

// begin authenticates the caller. A missing identity is returned as a refusal; the call is still
// audited by finish.
func (s *Service) begin(ctx context.Context, rpc policy.RPC) (*call, error) {
	c := &call{start: s.now(), rpc: rpc}
	id, err := mtls.IdentityFromContext(ctx)
	if err != nil {
		c.caller = "-"
		s.log.Warn("caller without a usable identity", "rpc", string(rpc), "err", err)
		return c, refuse(codes.Unauthenticated, reasonUnauthenticated, "client certificate carries no usable SPIFFE identity")
	}
	c.caller = id
	return c, nil
}

// finish writes the audit line for c with the outcome err, records metrics, and returns what the
// caller may see. If the audit line cannot be made durable, the answer is withheld.
func (s *Service) finish(ctx context.Context, c *call, err error) error {
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
	if aerr := s.audit.Append(ctx, rec); aerr != nil {
		s.log.Error("audit append failed; withholding the answer", "rpc", string(c.rpc), "caller", c.caller, "err", aerr)
		s.metrics.observe(string(c.rpc), "error", "audit-failed", s.now().Sub(c.start).Seconds())
		return refuse(codes.Unavailable, "audit-unavailable", "audit log unavailable").status()
	}
	decision := string(rec.Decision)
	s.metrics.observe(string(c.rpc), decision, reason, s.now().Sub(c.start).Seconds())
	return publicError(err)
}

// decide runs the policy and the rate limiter for req.
func (s *Service) decide(req policy.Request) (policy.Decision, error) {
	d := s.policy.Current().Decide(req)
	if d.Caller != "" && !s.limiter.Allow(req.Caller) {
		if d.Allow {
			return d, refuse(codes.ResourceExhausted, policy.ReasonRateLimited, "rate limit exceeded")
		}
	}
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
