package server

import (
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
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
	if err := space.ValidateName(req.GetSpace()); err != nil {
		return nil, invalid(err.Error())
	}
	c.space = req.GetSpace()
	// The policy first, on the caller, the RPC and the space alone: a caller it does not know, or
	// does not allow to Remint here, must not learn from UNKNOWN_SPACE or BAD_PROOF which spaces
	// exist or what a credential holds.
	if err := s.admit(policy.Request{Caller: c.caller, RPC: policy.RPCRemint, Space: c.space}); err != nil {
		return nil, err
	}
	token := req.GetJwt()
	if token == "" || len(token) > MaxJWTBytes {
		return nil, invalid("jwt is required and at most 64 KiB")
	}
	if !compactJWT(token) {
		return nil, invalid("jwt is not three base64url segments")
	}
	if len(req.GetProof()) != ed25519.SignatureSize {
		return nil, invalid("proof must be a 64-byte Ed25519 signature")
	}
	requested, err := RequestedTTL(req.GetTtl())
	if err != nil {
		return nil, err
	}
	// DecodeUserClaims verifies the signature against the issuer the token names; whether that
	// issuer is one of ours is checked next.
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, invalid("jwt is not a valid user JWT")
	}
	// A signer before the canonical-key check could have issued a credential to "U…\r\n…";
	// it is not renewed.
	if err := nkey.CheckUser(uc.Subject); err != nil {
		return nil, invalid("credential subject is " + err.Error())
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
	if name.Account() == profiles.AccountSystem {
		// A $SYS credential is short and minted anew (deliveryd mints its observer again and its
		// evictor per eviction); it is never renewed in place.
		return nil, invalid("a " + string(name) + " credential is not renewable; mint a new one")
	}
	if name.CalloutOnly() {
		// A service-serve credential lives as long as the access bearer it was granted on; the
		// service renews by connecting again with a fresh bearer, through the callout.
		return nil, invalid("a " + string(name) + " credential is granted only through the auth callout and is not renewable")
	}
	key, account := s.accountKey(sp, name.Account())
	signers := sp.Trust.DataSigningKeys()
	if name.Account() == profiles.AccountAuth {
		signers = sp.Trust.AuthSigningKeys()
	}
	// Every credential this signer issues names its minter, which "remint: own" needs.
	minterTag := minterTagOf(uc.Tags)
	if key == nil || uc.IssuerAccount != account || !slices.Contains(signers, uc.Issuer) || minterTag == "" {
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

	// Rebuild, not copy: the parameters the credential was minted with go through the profile
	// and the policy in force, exactly as a Mint of them would, so a narrowed rule or a fixed
	// profile reaches the renewed credential.
	params, err := paramsFromTags(uc.Tags)
	if err != nil {
		if errors.Is(err, errNoParams) {
			return nil, invalid("credential was minted before signerd recorded its parameters and cannot be rebuilt; mint a new one")
		}
		return nil, invalid("credential parameters: " + err.Error())
	}
	spec, err := profiles.Build(c.space, name, params)
	if err != nil {
		return nil, invalid("credential parameters no longer fit the profile: " + err.Error())
	}
	if !calloutUserOK(sp, name, uc.Subject) {
		return nil, invalid("credential subject is no longer a registered callout user of this space")
	}
	minter := "(another caller)"
	if minterTag == MinterTag(c.caller) {
		minter = c.caller
	}
	d, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCRemint, Space: c.space, Profile: name, TTL: requested,
		Params: params, Minter: minter})
	if err != nil {
		return nil, err
	}
	// The subject and the minter stay; the name, permissions, tags and lifetime are rebuilt.
	cred, err := s.sign(sp, spec, params, uc.Subject, now, requested, d.TTLCap, minterTag)
	if err != nil {
		return nil, err
	}
	c.jti, c.expiry = cred.GetJti(), cred.GetExpiresAt().AsTime()
	return &signerv1.RemintResponse{Credential: cred}, nil
}

// calloutUserOK reports whether subject may hold a credential of profile in sp: the
// callout-service profile means something only for a key the AUTH account lists in auth_users
// (any other key would be sent through the callout itself), so Mint and Remint refuse it.
func calloutUserOK(sp *keystore.Space, profile profiles.Name, subject string) bool {
	return profile != profiles.AuthCallout || slices.Contains(sp.Trust.CalloutUsers(), subject)
}

// compactJWT reports whether s is three non-empty segments of the unpadded base64url alphabet
// joined by '.', the only form signerd issues. The jwt decoder's base64 skips CR and LF, so
// without this a credential could be presented in many spellings that decode alike.
func compactJWT(s string) bool {
	segments, n := 1, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if n == 0 {
				return false
			}
			segments, n = segments+1, 0
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			n++
		default:
			return false
		}
	}
	return segments == 3 && n > 0
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
