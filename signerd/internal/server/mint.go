package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// MaxRequestIDLen bounds a Mint request_id.
const MaxRequestIDLen = 128

// Mint signs a user JWT for the caller's user public key with the named profile.
func (s *Service) Mint(ctx context.Context, req *signerv1.MintRequest) (*signerv1.MintResponse, error) {
	c, err := s.begin(ctx, policy.RPCMint)
	var resp *signerv1.MintResponse
	if err == nil {
		resp, err = s.mint(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

// mintInput is a Mint request after validation: every value fits its grammar and the profile
// has been built from the parameters.
type mintInput struct {
	space, subject, requestID string
	profile                   profiles.Name
	ttl                       time.Duration
	params                    profiles.Params
	spec                      *profiles.Spec
}

// parseMint validates a Mint request without touching keys, policy or clock. It is the first
// thing that reads caller bytes, and it is fuzzed (FuzzParseMint).
func parseMint(req *signerv1.MintRequest) (*mintInput, error) {
	in := &mintInput{space: req.GetSpace(), subject: req.GetUserPublicKey(), requestID: req.GetRequestId()}
	if err := validRequestID(in.requestID); err != nil {
		return nil, err
	}
	if err := space.ValidateName(in.space); err != nil {
		return nil, invalid(err.Error())
	}
	name, err := ProfileName(req.GetProfile())
	if err != nil {
		return nil, invalid(err.Error())
	}
	in.profile = name
	if name.CalloutOnly() {
		// service-serve follows a verified service access bearer: only authd's callout grant
		// (SignCalloutResponse) may carry it.
		return nil, invalid(fmt.Sprintf("profile %s is granted only through SignCalloutResponse", name))
	}
	if err := nkey.CheckUser(in.subject); err != nil {
		return nil, invalid("user_public_key is " + err.Error())
	}
	if in.ttl, err = RequestedTTL(req.GetTtl()); err != nil {
		return nil, err
	}
	in.params = paramsOf(req.GetParams())
	if name.Account() == profiles.AccountSystem {
		// A $SYS profile takes no caller parameter; its one value, the space's data account,
		// comes from the space's verified facts once the space is loaded (systemSpec).
		if setParams(in.params) {
			return nil, invalid(fmt.Sprintf("profile %s takes no parameters", name))
		}
		return in, nil
	}
	// Build before the policy is asked: the policy judges values known to fit the grammars. A
	// channel pattern ("team.>") fits them; the policy then grants it only where one of the
	// caller's channel patterns covers it and it reaches no excluded channel.
	if in.spec, err = profiles.Build(in.space, name, in.params); err != nil {
		return nil, invalid(err.Error())
	}
	return in, nil
}

func (s *Service) mint(c *call, req *signerv1.MintRequest) (*signerv1.MintResponse, error) {
	in, err := parseMint(req)
	if err != nil {
		recordWellFormed(c, req)
		return nil, err
	}
	c.space, c.subject, c.requestID, c.profile = in.space, in.subject, in.requestID, string(in.profile)
	d, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCMint, Space: in.space, Profile: in.profile, TTL: in.ttl, Params: in.params})
	if err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	if in.spec == nil {
		if in.spec, in.params, err = systemSpec(sp, in.profile, in.params); err != nil {
			return nil, err
		}
	}
	// The callout-service profile means something only for a key the AUTH account lists in
	// auth_users; any other key would be sent through the callout itself. Refuse it here
	// rather than sign a credential that cannot be what it claims.
	if !calloutUserOK(sp, in.profile, in.subject) {
		return nil, invalid("user_public_key is not a registered callout user of this space")
	}

	var digest [32]byte
	if c.requestID != "" {
		digest = requestDigest(req)
		if prev, same, found := s.idem.get(idemKey{c.caller, c.requestID}, digest, d.PolicyDigest, s.now()); found {
			return s.replay(c, prev, same)
		}
	}

	cred, err := s.sign(sp, in.spec, in.params, c.subject, s.now(), in.ttl, d.TTLCap, MinterTag(c.caller))
	if err != nil {
		return nil, err
	}
	resp := &signerv1.MintResponse{Credential: cred}
	if c.requestID != "" {
		stored, same := s.idem.put(idemKey{c.caller, c.requestID}, digest, d.PolicyDigest, resp, s.now())
		if stored != proto.Message(resp) {
			return s.replay(c, stored, same)
		}
	}
	c.jti, c.expiry = cred.GetJti(), cred.GetExpiresAt().AsTime()
	return resp, nil
}

// recordWellFormed copies into the audit record only the request values that fit their
// grammars, so a refused request cannot put arbitrary bytes into the audit log.
func recordWellFormed(c *call, req *signerv1.MintRequest) {
	if space.ValidateName(req.GetSpace()) == nil {
		c.space = req.GetSpace()
	}
	if nkey.IsUser(req.GetUserPublicKey()) {
		c.subject = req.GetUserPublicKey()
	}
	if validRequestID(req.GetRequestId()) == nil {
		c.requestID = req.GetRequestId()
	}
	if n, err := ProfileName(req.GetProfile()); err == nil {
		c.profile = string(n)
	}
}

// replay answers a repeated request_id: the same answer for the same request, ALREADY_EXISTS
// for a different one.
func (s *Service) replay(c *call, prev proto.Message, same bool) (*signerv1.MintResponse, error) {
	if !same {
		return nil, refuse(codes.AlreadyExists, reasonRequestIDConflict, "request_id was already used for a different request")
	}
	resp := prev.(*signerv1.MintResponse)
	c.replay = true
	c.jti, c.expiry = resp.GetCredential().GetJti(), resp.GetCredential().GetExpiresAt().AsTime()
	return resp, nil
}

// sign builds the claims from spec for subject, caps the lifetime, adds the tags that record
// params (spec was built from them; Remint reads them back) and the minter tag, and signs with
// the key of the profile's account.
func (s *Service) sign(sp *keystore.Space, spec *profiles.Spec, params profiles.Params, subject string, now time.Time, requested, policyCap time.Duration, minterTag string) (*signerv1.Credential, error) {
	ttl, capped, err := GrantTTL(requested, spec.Lifetime, policyCap)
	if err != nil {
		return nil, err
	}
	key, account := s.accountKey(sp, spec.Account)
	if key == nil {
		return nil, fmt.Errorf("server: profile %s has no signing account", spec.Profile)
	}
	uc, err := spec.Claims(subject, account, now, ttl)
	if err != nil {
		var pe *profiles.ParamError
		if errors.As(err, &pe) {
			return nil, invalid(err.Error())
		}
		return nil, err
	}
	// One allocation for the profile's tags, the parameter tags and the minter tag.
	tags := make(jwt.TagList, 0, len(uc.Tags)+maxParamTags+1)
	tags = append(tags, uc.Tags...)
	tags = appendParamTags(tags, params)
	uc.Tags = append(tags, minterTag)
	return s.encode(uc, key, spec.Profile, capped)
}

// encode signs uc with key and describes the result. profiles.EncodeUserClaims gives the bytes
// uc.Encode would, with a fraction of its allocations.
func (s *Service) encode(uc *jwt.UserClaims, key *keystore.SigningKey, profile profiles.Name, capped bool) (*signerv1.Credential, error) {
	token, err := profiles.EncodeUserClaims(uc, key)
	if err != nil {
		return nil, fmt.Errorf("server: encode user JWT: %w", err)
	}
	cred := &signerv1.Credential{
		Jwt: token, Jti: uc.ID, UserPublicKey: uc.Subject, IssuerAccount: uc.IssuerAccount,
		SigningKey: key.Public(), IssuedAt: timestamppb.New(time.Unix(uc.IssuedAt, 0)),
		TtlCapped: capped, Profile: ProfileEnum(profile),
	}
	if uc.Expires != 0 {
		cred.ExpiresAt = timestamppb.New(time.Unix(uc.Expires, 0))
	}
	return cred, nil
}

// accountKey returns the signing key and account public key for a profile's account.
func (s *Service) accountKey(sp *keystore.Space, kind profiles.AccountKind) (*keystore.SigningKey, string) {
	switch kind {
	case profiles.AccountData:
		return sp.DataSigning, sp.Trust.DataAccountPublicKey()
	case profiles.AccountAuth:
		return sp.AuthSigning, sp.Trust.AuthAccountPublicKey()
	case profiles.AccountSystem:
		if sp.SystemSigning == nil {
			return nil, ""
		}
		return sp.SystemSigning, sp.SystemAccount
	default:
		return nil, ""
	}
}

// systemSpec builds a $SYS profile for sp: its rows name sp's data account, from the space's
// verified facts. A signer without the system account's signing key refuses it.
func systemSpec(sp *keystore.Space, name profiles.Name, p profiles.Params) (*profiles.Spec, profiles.Params, error) {
	if sp.SystemSigning == nil {
		return nil, p, refuse(codes.FailedPrecondition, reasonSystemKeyMissing,
			"this signer holds no system-account signing key ("+keystore.FileSystemSigning+"), so it mints no "+string(name))
	}
	p.DataAccount = sp.Trust.DataAccountPublicKey()
	spec, err := profiles.Build(sp.Name, name, p)
	if err != nil {
		return nil, p, invalid(err.Error())
	}
	return spec, p, nil
}

// setParams reports whether any caller parameter is set.
func setParams(p profiles.Params) bool {
	return p.Owner != "" || p.Actor != "" || p.LifecycleUID != "" || p.Role != "" || p.InboxNonce != "" ||
		len(p.Subscribe) > 0 || len(p.AllowSubscribe) > 0 || len(p.AllowPublish) > 0 || len(p.Capabilities) > 0 ||
		p.Target != nil || p.ServiceEndpoint != "" || p.InstanceID != "" || len(p.MemberChannels) > 0
}

// paramsOf copies a request's parameters. A target message that is present counts as set even
// with every field empty, so a profile that takes no target refuses it (profiles.Build) and the
// retirement requester refuses its empty fields.
func paramsOf(p *signerv1.ProfileParams) profiles.Params {
	out := profiles.Params{
		Owner: p.GetOwner(), Actor: p.GetActor(), LifecycleUID: p.GetLifecycleUid(), Role: p.GetRole(),
		Subscribe: p.GetSubscribe(), AllowSubscribe: p.GetAllowSubscribe(), AllowPublish: p.GetAllowPublish(),
		Capabilities: p.GetCapabilities(), ServiceEndpoint: p.GetServiceEndpoint(), InstanceID: p.GetInstanceId(),
		MemberChannels: p.GetMemberChannels(),
	}
	if t := p.GetTarget(); t != nil {
		out.Target = &profiles.RetirementTarget{Owner: t.GetOwner(), Actor: t.GetActor(), LifecycleUID: t.GetLifecycleUid()}
	}
	return out
}

func validRequestID(id string) error {
	if id == "" {
		return nil
	}
	if len(id) > MaxRequestIDLen {
		return invalid(fmt.Sprintf("request_id is longer than %d bytes", MaxRequestIDLen))
	}
	for i := 0; i < len(id); i++ {
		ch := id[i]
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == ':' || ch == '-'
		if !ok {
			return invalid("request_id may hold only [A-Za-z0-9_.:-]")
		}
	}
	return nil
}

// requestDigest hashes the request deterministically, request_id included.
func requestDigest(req proto.Message) [32]byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		// A message that cannot be marshalled cannot match any stored digest.
		return sha256.Sum256([]byte(err.Error()))
	}
	return sha256.Sum256(b)
}
