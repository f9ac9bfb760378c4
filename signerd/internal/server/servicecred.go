package server

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// Service endpoint tokens (seed 002). signerd builds the closed claim set itself from the
// request's validated coordinates; the caller (authd, by policy) names the registration and
// signerd fixes iss, aud, duty or use, ver and the times. Both kinds are signed with the space's
// bearer issuer key, so GetJWKS publishes the key that verifies them, and each carries its own
// header typ so that no token of one kind passes a verifier of another.
//
// SignServiceCredential refuses, with INVALID_ARGUMENT: a space name outside its grammar; a kind
// other than ACCESS or RENEWAL; an owner that is not a derived owner (u_ and 26 base32); a
// witness that is not w_ and the 52 lowercase base32 characters of a SHA-256; an endpoint outside
// pkg/lifecycle's EndpointToken grammar; an instance id outside space.ValidateUID; a root that is
// not r_ and the 26 lowercase base32 characters of 16 bytes; a missing not_after. With
// TTL_INVALID: a ttl missing, malformed, negative or under one second, a malformed not_after, and
// a not_after that leaves less than one whole second from now. A ttl above the kind's cap (60 s,
// 24 h) is capped silently, as SignBearer caps, and the token never lives past not_after.

// Service token lifetime caps and the audit notes of a granted line.
const (
	// MaxServiceAccessTTL caps an access bearer's lifetime.
	MaxServiceAccessTTL = serviceaccess.MaxAccessLifetime
	// MaxServiceRenewalTTL caps a renewal proof's lifetime.
	MaxServiceRenewalTTL = serviceaccess.MaxRenewalLifetime

	noteServiceAccess  = "service-access"
	noteServiceRenewal = "service-renewal"
)

// Service token id grammar: the witness is w_ and the base32 of a SHA-256 (32 bytes), the root r_
// and the base32 of 16 random bytes, both lowercase without padding.
const (
	witnessPrefix = "w_"
	witnessBytes  = 32
	rootPrefix    = "r_"
	rootBytes     = 16
)

// serviceB32 is the lowercase unpadded base32 of witnesses, roots and jtis.
var serviceB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// SignServiceCredential signs one service endpoint token: an access bearer or a renewal proof.
func (s *Service) SignServiceCredential(ctx context.Context, req *signerv1.SignServiceCredentialRequest) (*signerv1.SignServiceCredentialResponse, error) {
	c, err := s.begin(ctx, policy.RPCSignServiceCredential)
	var resp *signerv1.SignServiceCredentialResponse
	if err == nil {
		resp, err = s.signServiceCredential(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

// serviceInput is a SignServiceCredential request after validation: every coordinate fits its
// grammar, and exp is the token's expiry in whole seconds, at least one second after iat.
type serviceInput struct {
	space, owner, witness, endpoint, iid, root string
	kind                                       signerv1.ServiceCredentialKind
	iat, exp                                   int64
}

// parseServiceCredential validates a SignServiceCredential request without touching keys or
// policy; now is the instant the token is issued at. It is fuzzed (FuzzParseServiceCredential).
func parseServiceCredential(req *signerv1.SignServiceCredentialRequest, now time.Time) (*serviceInput, error) {
	in := &serviceInput{
		space: req.GetSpace(), owner: req.GetOwner(), witness: req.GetWitness(), endpoint: req.GetEndpoint(),
		iid: req.GetInstanceId(), root: req.GetRoot(), kind: req.GetKind(),
	}
	if err := space.ValidateName(in.space); err != nil {
		return nil, invalid(err.Error())
	}
	var limit time.Duration
	switch in.kind {
	case signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS:
		limit = MaxServiceAccessTTL
	case signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL:
		limit = MaxServiceRenewalTTL
	default:
		return nil, invalid(fmt.Sprintf("kind %d is not ACCESS or RENEWAL", int32(in.kind)))
	}
	if err := space.ValidateDerivedOwner(in.owner); err != nil {
		return nil, invalid(err.Error())
	}
	if !validServiceID(in.witness, witnessPrefix, witnessBytes) {
		return nil, invalid("witness is not w_ and 52 lowercase base32 characters of a SHA-256")
	}
	if _, err := lifecycle.EndpointToken(in.endpoint); err != nil {
		return nil, invalid("endpoint: " + err.Error())
	}
	if err := space.ValidateUID(in.iid); err != nil {
		return nil, invalid("instance_id: " + err.Error())
	}
	if !validServiceID(in.root, rootPrefix, rootBytes) {
		return nil, invalid("root is not r_ and 26 lowercase base32 characters of 16 bytes")
	}
	// The lifetime rule (lifetime.go) with no default: the proto makes ttl required.
	ttl, err := RequestedTTL(req.GetTtl())
	if err != nil {
		return nil, err
	}
	if ttl == 0 {
		return nil, ttlInvalid("ttl is required")
	}
	if ttl, _, err = GrantTTL(ttl, profiles.Lifetime{Max: limit}, 0); err != nil {
		return nil, err
	}
	na := req.GetNotAfter()
	if na == nil {
		return nil, invalid("not_after is required")
	}
	if err := na.CheckValid(); err != nil {
		return nil, ttlInvalid("not_after is malformed")
	}
	// Times are whole seconds: exp rounds down, so the token never outlives the requested ttl
	// or not_after; what is left must still be at least one second.
	in.iat = now.Unix()
	in.exp = min(in.iat+int64(ttl/time.Second), floorUnix(na.AsTime()))
	if in.exp-in.iat < int64(MinTTL/time.Second) {
		return nil, ttlInvalid("not_after is reached: less than one second is left")
	}
	return in, nil
}

// floorUnix is t's Unix second, rounded toward negative infinity.
func floorUnix(t time.Time) int64 { return t.Truncate(time.Second).Unix() }

// validServiceID reports whether id is prefix and the canonical lowercase unpadded base32 of
// exactly n bytes (its unused trailing bits zero).
func validServiceID(id, prefix string, n int) bool {
	body, ok := strings.CutPrefix(id, prefix)
	if !ok || len(body) != serviceB32.EncodedLen(n) {
		return false
	}
	raw, err := serviceB32.DecodeString(body)
	return err == nil && len(raw) == n && serviceB32.EncodeToString(raw) == body
}

// newServiceJTI returns 16 random bytes as 26 lowercase base32 characters (no "eyJ" can occur in
// lowercase, so the audit log never redacts one).
func newServiceJTI() string {
	var b [16]byte
	// crypto/rand.Read never fails; it aborts the process if the system cannot supply
	// randomness.
	_, _ = rand.Read(b[:])
	return serviceB32.EncodeToString(b[:])
}

// serviceClaims encodes the payload for in's kind, exactly the keys of serviceaccess's
// AccessClaims or RenewalClaims (the shared validator's closed sets), and returns its typ.
func (in *serviceInput) serviceClaims(jti string) (typ string, claims []byte, err error) {
	iss := serviceaccess.Issuer(in.space)
	if in.kind == signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS {
		claims, err = json.Marshal(serviceaccess.AccessClaims{
			Iss: iss, Aud: in.space, Sub: in.owner, Duty: serviceaccess.DutyServe,
			Wit: in.witness, Ep: in.endpoint, Iid: in.iid, Root: in.root, Ver: serviceaccess.Version,
			Iat: in.iat, Nbf: in.iat, Exp: in.exp, Jti: jti,
		})
		return keystore.TypServiceAccess, claims, err
	}
	claims, err = json.Marshal(serviceaccess.RenewalClaims{
		Iss: iss, Aud: serviceaccess.RenewalAudience(in.space), Sub: in.owner, Use: serviceaccess.UseRenew,
		Wit: in.witness, Ep: in.endpoint, Iid: in.iid, Root: in.root, Ver: serviceaccess.Version,
		Iat: in.iat, Nbf: in.iat, Exp: in.exp, Jti: jti,
	})
	return keystore.TypServiceRenewal, claims, err
}

func (s *Service) signServiceCredential(c *call, req *signerv1.SignServiceCredentialRequest) (*signerv1.SignServiceCredentialResponse, error) {
	in, err := parseServiceCredential(req, s.now())
	if err != nil {
		// Only values that fit their grammars reach the audit line.
		if space.ValidateName(req.GetSpace()) == nil {
			c.space = req.GetSpace()
		}
		if space.ValidateDerivedOwner(req.GetOwner()) == nil {
			c.subject = req.GetOwner()
		}
		return nil, err
	}
	c.space, c.subject = in.space, in.owner
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCSignServiceCredential, Space: in.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(in.space)
	if err != nil {
		return nil, err
	}
	jti := newServiceJTI()
	typ, claims, err := in.serviceClaims(jti)
	if err != nil {
		return nil, fmt.Errorf("server: encode service token claims: %w", err)
	}
	token, kid, err := sp.SignBearer(typ, claims)
	if err != nil {
		return nil, keystoreError(err)
	}
	c.jti, c.expiry, c.note = jti, time.Unix(in.exp, 0), noteServiceAccess
	if typ == keystore.TypServiceRenewal {
		c.note = noteServiceRenewal
	}
	return &signerv1.SignServiceCredentialResponse{Token: token, Kid: kid, ExpiresAt: timestamppb.New(c.expiry), Jti: jti}, nil
}
