package server

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// RemintProofMessage is what a Remint proof signs:
// "cotal-remint/v1" NUL space NUL jti NUL decimal unix seconds.
func RemintProofMessage(spaceName, jti string, unixSeconds int64) []byte {
	return []byte(RemintContext + "\x00" + spaceName + "\x00" + jti + "\x00" + strconv.FormatInt(unixSeconds, 10))
}

// Remint renews a credential this signerd issued, after checking its authority, its expiry, the
// holder's proof and the caller's policy.
func (s *Service) Remint(ctx context.Context, req *signerv1.RemintRequest) (*signerv1.RemintResponse, error) {
	c, err := s.begin(ctx, policy.RPCRemint)
	var resp *signerv1.RemintResponse
	if err == nil {
		resp, err = s.remint(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Service) remint(c *call, req *signerv1.RemintRequest) (*signerv1.RemintResponse, error) {
	c.space = req.GetSpace()
	if err := space.ValidateName(c.space); err != nil {
		return nil, invalid(err.Error())
	}
	token := req.GetJwt()
	if token == "" || len(token) > MaxJWTBytes {
		return nil, invalid("jwt is required and at most 16 KiB")
	}
	if len(req.GetProof()) != ed25519.SignatureSize {
		return nil, invalid("proof must be a 64-byte Ed25519 signature")
	}
	requested, err := durationOf(req.GetTtl())
	if err != nil {
		return nil, err
	}
	// DecodeUserClaims verifies the signature against the issuer the token names; whether that
	// issuer is one of ours is checked next.
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, invalid("jwt is not a valid user JWT")
	}
	c.subject = uc.Subject
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	name, ok := profileTag(uc.Tags)
	if !ok {
		return nil, refuse(codes.PermissionDenied, reasonForeignCredential, "credential was not issued by this signer for this space")
	}
	c.profile = string(name)
	key, account := s.accountKey(sp, name.Account())
	signers := sp.Trust.DataSigningKeys()
	if name.Account() == profiles.AccountAuth {
		signers = sp.Trust.AuthSigningKeys()
	}
	if key == nil || uc.IssuerAccount != account || !slices.Contains(signers, uc.Issuer) {
		return nil, refuse(codes.PermissionDenied, reasonForeignCredential, "credential was not issued by this signer for this space")
	}
	now := s.now()
	if uc.Expires == 0 {
		return nil, invalid("credential carries no expiry and is not renewable")
	}
	if !now.Before(time.Unix(uc.Expires, 0)) {
		return nil, refuse(codes.PermissionDenied, reasonCredentialExpired, "credential has expired")
	}
	proofAt := time.Unix(req.GetProofUnixSeconds(), 0)
	if d := now.Sub(proofAt); d > ProofWindow || d < -ProofWindow {
		return nil, refuse(codes.PermissionDenied, reasonStaleProof, "proof timestamp is outside the accepted window")
	}
	holder, err := nkeys.FromPublicKey(uc.Subject)
	if err != nil {
		return nil, invalid("credential subject is not a public nkey")
	}
	if holder.Verify(RemintProofMessage(c.space, uc.ID, req.GetProofUnixSeconds()), req.GetProof()) != nil {
		return nil, refuse(codes.PermissionDenied, reasonBadProof, "proof does not verify against the credential's subject")
	}
	minter := "(another caller)"
	if slices.Contains(uc.Tags, MinterTag(c.caller)) {
		minter = c.caller
	}
	d, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCRemint, Space: c.space, Profile: name, TTL: requested, Minter: minter})
	if err != nil {
		return nil, err
	}

	// Re-issue the same subject, name, permissions, limits and tags (the minter tag included):
	// the credential was built by this signer from its profile, so its permissions are ours.
	ttl, capped := GrantTTL(requested, name.Lifetime(), d.TTLCap)
	if ttl <= 0 {
		return nil, invalid("profile has no renewable lifetime")
	}
	nc := jwt.NewUserClaims(uc.Subject)
	nc.User = uc.User
	nc.Tags = slices.Clone(uc.Tags)
	nc.IssuerAccount = account
	nc.Name = uc.Name
	nc.IssuedAt = now.Unix()
	nc.Expires = now.Add(ttl).Unix()
	cred, err := s.encode(nc, key, name, capped)
	if err != nil {
		return nil, err
	}
	c.jti, c.expiry = cred.GetJti(), cred.GetExpiresAt().AsTime()
	return &signerv1.RemintResponse{Credential: cred}, nil
}

// profileTag finds the profile named in a credential's tags.
func profileTag(tags jwt.TagList) (profiles.Name, bool) {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, ProfileTagPrefix); ok {
			n, err := profiles.Parse(v)
			return n, err == nil
		}
	}
	return "", false
}
