package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// Cotal user bearer (upstream issuer.ts; verified by authd as auth.md §3 checks 9-12 describe).
const (
	// BearerVersion is the bearer's ver claim.
	BearerVersion = 1
	// BearerIssuerPrefix starts the bearer's iss claim; the space name follows.
	BearerIssuerPrefix = "urn:cotal:auth:"
	// MaxBearerTTL caps a bearer's lifetime; verifiers refuse exp-iat above it.
	MaxBearerTTL = 900 * time.Second
	// MaxTransferWriterBearerTTL caps a bearer with the transfer-writer view, which verifiers
	// hold to 300 seconds.
	MaxTransferWriterBearerTTL = 300 * time.Second
	// MaxBearerScopes bounds the scope words of one bearer.
	MaxBearerScopes = space.MaxScopeWords
)

// viewTransferWriter is the one view with a shorter lifetime cap; viewManagerCaller the one view
// bound to a manager instance (act.managerInstanceId, upstream token.ts).
const (
	viewTransferWriter = "transfer-writer"
	viewManagerCaller  = "manager-caller"
)

// bearerViews is the closed set of views a bearer may carry (auth.md §3 check 12).
var bearerViews = []string{
	"admin", "purger", "channel-purger", "channel-writer", viewTransferWriter, "deployer",
	"manager-service", viewManagerCaller, "session-caller",
}

// macDomains maps each frozen proto MAC domain to its domain string. A domain not listed here is
// refused with mac-domain-not-allowed.
var macDomains = map[signerv1.MacDomain]string{
	signerv1.MacDomain_MAC_DOMAIN_MANAGER_CURRENT_REGISTRATION: keystore.MacDomainManagerCurrentRegistration,
}

// SignBearer issues a Cotal user bearer: an EdDSA JWT signed with the space's issuer key.
func (s *Service) SignBearer(ctx context.Context, req *signerv1.SignBearerRequest) (*signerv1.SignBearerResponse, error) {
	c, err := s.begin(ctx, policy.RPCSignBearer)
	var resp *signerv1.SignBearerResponse
	if err == nil {
		resp, err = s.signBearer(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

// bearerInput is a SignBearer request after validation: every value fits its grammar and the
// lifetime is whole seconds within the cap.
type bearerInput struct {
	space, owner, actor, parent, lifecycleUID, credentialID, view string
	managerInstanceID                                             string
	scope                                                         []string
	ttl                                                           time.Duration
}

// parseSignBearer validates a SignBearer request without touching keys, policy or clock. It is
// fuzzed (FuzzParseSignBearer).
func parseSignBearer(req *signerv1.SignBearerRequest) (*bearerInput, error) {
	in := &bearerInput{
		space: req.GetSpace(), owner: req.GetOwner(), actor: req.GetActor(), parent: req.GetParent(),
		lifecycleUID: req.GetLifecycleUid(), credentialID: req.GetCredentialId(), view: req.GetView(),
		managerInstanceID: req.GetManagerInstanceId(),
	}
	if err := space.ValidateName(in.space); err != nil {
		return nil, invalid(err.Error())
	}
	if err := space.ValidateDerivedOwner(in.owner); err != nil {
		return nil, invalid(err.Error())
	}
	if err := space.ValidateActor(in.actor); err != nil {
		return nil, invalid(err.Error())
	}
	if in.parent != "" {
		o, a, ok := strings.Cut(in.parent, ".")
		if !ok || space.ValidateDerivedOwner(o) != nil || space.ValidateActor(a) != nil {
			return nil, invalid(`parent is not "<derived owner>.<actor>"`)
		}
	}
	if in.lifecycleUID != "" {
		if err := space.ValidateUID(in.lifecycleUID); err != nil {
			return nil, invalid(err.Error())
		}
	}
	if in.credentialID != "" && !space.IsCredentialID(in.credentialID) {
		return nil, invalid(fmt.Sprintf("credential_id is not 1 to %d characters of [A-Za-z0-9_-]", space.MaxCredentialIDLen))
	}
	if in.view != "" && !slices.Contains(bearerViews, in.view) {
		return nil, invalid(fmt.Sprintf("view %.40q is not one of %s", in.view, strings.Join(bearerViews, ", ")))
	}
	// A manager-caller bearer is bound to exactly one manager instance, and only it carries one:
	// verifiers refuse either without the other (upstream token.ts).
	if (in.managerInstanceID != "") != (in.view == viewManagerCaller) {
		return nil, invalid("manager_instance_id comes with view manager-caller, and only with it")
	}
	if in.managerInstanceID != "" {
		if err := space.ValidateUID(in.managerInstanceID); err != nil {
			return nil, invalid("manager_instance_id: " + err.Error())
		}
	}
	scope := req.GetScope()
	if len(scope) > MaxBearerScopes {
		return nil, invalid(fmt.Sprintf("more than %d scope words", MaxBearerScopes))
	}
	in.scope = make([]string, 0, len(scope))
	for i, w := range scope {
		if !space.IsScopeWord(w) {
			return nil, invalid(fmt.Sprintf("scope[%d] is not a scope word ([a-z][a-z0-9_-]{0,%d})", i, space.MaxScopeWordLen-1))
		}
		if slices.Contains(in.scope, w) {
			return nil, invalid(fmt.Sprintf("scope[%d] %q is a duplicate", i, w))
		}
		in.scope = append(in.scope, w)
	}
	// The lifetime rule (lifetime.go), with no default: the proto makes ttl required.
	ttl, err := RequestedTTL(req.GetTtl())
	if err != nil {
		return nil, err
	}
	if ttl == 0 {
		return nil, ttlInvalid("ttl is required")
	}
	limit := MaxBearerTTL
	if in.view == viewTransferWriter {
		limit = MaxTransferWriterBearerTTL
	}
	if ttl, _, err = GrantTTL(ttl, profiles.Lifetime{Max: limit}, 0); err != nil {
		return nil, err
	}
	// A bearer's times are whole seconds; rounding down never grants more than was asked, and
	// the rule has already refused anything under one second.
	in.ttl = ttl.Truncate(time.Second)
	return in, nil
}

func (s *Service) signBearer(c *call, req *signerv1.SignBearerRequest) (*signerv1.SignBearerResponse, error) {
	in, err := parseSignBearer(req)
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
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCSignBearer, Space: in.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(in.space)
	if err != nil {
		return nil, err
	}
	jti := newBearerID()
	iat := s.now().Unix()
	exp := iat + int64(in.ttl/time.Second)
	claims, err := json.Marshal(in.claims(iat, exp, jti))
	if err != nil {
		return nil, fmt.Errorf("server: encode bearer claims: %w", err)
	}
	token, kid, err := sp.SignBearer(keystore.TypUser, claims)
	if err != nil {
		return nil, keystoreError(err)
	}
	c.jti, c.expiry = jti, time.Unix(exp, 0)
	return &signerv1.SignBearerResponse{Token: token, Kid: kid, ExpiresAt: timestamppb.New(c.expiry)}, nil
}

// bearerAct is the bearer's act claim. Scope is always present and equal to the top-level scope,
// because verifiers require the two to be equal and an absent act.scope would not equal [].
type bearerAct struct {
	Owner        string   `json:"owner"`
	Actor        string   `json:"actor"`
	Scope        []string `json:"scope"`
	Parent       string   `json:"parent,omitempty"`
	LifecycleUID string   `json:"lifecycleUid,omitempty"`
	CredentialID string   `json:"credentialId,omitempty"`
	View         string   `json:"view,omitempty"`
	// ManagerInstanceID is the one manager instance a manager-caller bearer may address.
	ManagerInstanceID string `json:"managerInstanceId,omitempty"`
}

// bearerClaims is the bearer payload in upstream's member order, plus a jti so that every bearer
// is distinct and its audit line names it.
type bearerClaims struct {
	Scope []string  `json:"scope"`
	Ver   int       `json:"ver"`
	Act   bearerAct `json:"act"`
	Sub   string    `json:"sub"`
	Iss   string    `json:"iss"`
	Aud   string    `json:"aud"`
	Iat   int64     `json:"iat"`
	Nbf   int64     `json:"nbf"`
	Exp   int64     `json:"exp"`
	Jti   string    `json:"jti"`
}

// claims builds the payload. The server owns iss, aud, sub, ver and the times; the caller's
// values fill only act.
func (in *bearerInput) claims(iat, exp int64, jti string) bearerClaims {
	return bearerClaims{
		Scope: in.scope, Ver: BearerVersion,
		Act: bearerAct{Owner: in.owner, Actor: in.actor, Scope: in.scope, Parent: in.parent,
			LifecycleUID: in.lifecycleUID, CredentialID: in.credentialID, View: in.view,
			ManagerInstanceID: in.managerInstanceID},
		Sub: in.owner, Iss: BearerIssuerPrefix + in.space, Aud: in.space,
		Iat: iat, Nbf: iat, Exp: exp, Jti: jti,
	}
}

// newBearerID returns 128 random bits, base64url without padding. An id containing "eyJ" is
// drawn again: the audit log redacts any value with that JWT-header prefix, and a redacted jti
// could not be matched to its bearer (it happens about once in 13,000 ids and costs nothing
// measurable in entropy).
func newBearerID() string {
	var b [16]byte
	for {
		// crypto/rand.Read never fails; it aborts the process if the system cannot supply
		// randomness.
		_, _ = rand.Read(b[:])
		if id := base64.RawURLEncoding.EncodeToString(b[:]); !strings.Contains(id, "eyJ") {
			return id
		}
	}
}

// GetJWKS returns the public keys of a space's bearer issuer, the active key first.
func (s *Service) GetJWKS(ctx context.Context, req *signerv1.GetJWKSRequest) (*signerv1.GetJWKSResponse, error) {
	c, err := s.begin(ctx, policy.RPCGetJWKS)
	var resp *signerv1.GetJWKSResponse
	if err == nil {
		resp, err = s.getJWKS(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Service) getJWKS(c *call, req *signerv1.GetJWKSRequest) (*signerv1.GetJWKSResponse, error) {
	if err := space.ValidateName(req.GetSpace()); err != nil {
		return nil, invalid(err.Error())
	}
	c.space = req.GetSpace()
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCGetJWKS, Space: c.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	keys, err := sp.IssuerJWKs()
	if err != nil {
		return nil, keystoreError(err)
	}
	resp := &signerv1.GetJWKSResponse{Keys: make([]*signerv1.JWK, 0, len(keys))}
	for _, k := range keys {
		resp.Keys = append(resp.Keys, &signerv1.JWK{Kty: k.Kty, Crv: k.Crv, X: k.X, Kid: k.Kid, Alg: k.Alg, Use: k.Use})
	}
	return resp, nil
}

// DeriveOwner returns the owner id of an IdP identity under the space's owner secret.
func (s *Service) DeriveOwner(ctx context.Context, req *signerv1.DeriveOwnerRequest) (*signerv1.DeriveOwnerResponse, error) {
	c, err := s.begin(ctx, policy.RPCDeriveOwner)
	var resp *signerv1.DeriveOwnerResponse
	if err == nil {
		resp, err = s.deriveOwner(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

// deriveOwner never puts the IdP issuer or subject into the audit line or an error (they are
// personal data); a granted line names the derived owner instead.
func (s *Service) deriveOwner(c *call, req *signerv1.DeriveOwnerRequest) (*signerv1.DeriveOwnerResponse, error) {
	if err := space.ValidateName(req.GetSpace()); err != nil {
		return nil, invalid(err.Error())
	}
	c.space = req.GetSpace()
	if err := keystore.CheckOwnerInput(req.GetIdpIssuer(), req.GetSubject()); err != nil {
		return nil, keystoreError(err)
	}
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCDeriveOwner, Space: c.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	owner, err := sp.DeriveOwner(req.GetIdpIssuer(), req.GetSubject())
	if err != nil {
		return nil, keystoreError(err)
	}
	c.subject = owner
	return &signerv1.DeriveOwnerResponse{Owner: owner}, nil
}

// Mac returns a registration MAC in a frozen domain under the space's MAC key.
func (s *Service) Mac(ctx context.Context, req *signerv1.MacRequest) (*signerv1.MacResponse, error) {
	c, err := s.begin(ctx, policy.RPCMac)
	var resp *signerv1.MacResponse
	if err == nil {
		resp, err = s.mac(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Service) mac(c *call, req *signerv1.MacRequest) (*signerv1.MacResponse, error) {
	if err := space.ValidateName(req.GetSpace()); err != nil {
		return nil, invalid(err.Error())
	}
	c.space = req.GetSpace()
	domain, ok := macDomains[req.GetDomain()]
	if !ok {
		return nil, refuse(codes.PermissionDenied, reasonMacDomainForbidden, fmt.Sprintf("MAC domain %d is not a frozen domain", int32(req.GetDomain())))
	}
	if err := keystore.CheckMacInput(domain, req.GetPayload()); err != nil {
		return nil, keystoreError(err)
	}
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCMac, Space: c.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	sum, err := sp.Mac(domain, req.GetPayload())
	if err != nil {
		return nil, keystoreError(err)
	}
	return &signerv1.MacResponse{Mac: sum}, nil
}

// keystoreError turns a keystore input refusal into INVALID_ARGUMENT; anything else (a closed
// store) stays internal, and finish logs it without telling the caller.
func keystoreError(err error) error {
	var ie *keystore.InputError
	if errors.As(err, &ie) {
		return invalid(ie.Field + " " + ie.Reason)
	}
	return err
}
