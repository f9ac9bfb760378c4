package server

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/jwt/v2"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// The auth-callout RPCs. authd receives each authorization request the broker publishes on
// $SYS.REQ.USER.AUTH, sealed to the space's callout xkey, which only signerd holds. authd asks
// OpenCalloutRequest to open and verify it, judges the bearer inside, and asks
// SignCalloutResponse for the sealed answer it publishes as the reply.
//
// Choices made here:
//
//   - SignCalloutResponse takes the sealed request again, not the opened fields, and opens and
//     verifies it exactly as OpenCalloutRequest does. The user nkey, server id and server xkey
//     the answer is bound to come from the server-signed request only, never from authd
//     (STYLE 9: tie every response to its request). The claims OpenCalloutRequest verified are
//     kept briefly under the SHA-256 of the sealed bytes (openedCache), so the usual
//     open-then-sign pair decrypts and verifies once; the same bytes are the same request.
//   - OpenCalloutRequest answers once its audit line is written to the file, not once it is
//     fsynced (audit.Log.AppendWritten): it signs nothing, the line survives signerd's death,
//     and the SignCalloutResponse that acts on the request waits for its own line, which
//     follows the open's in the chain. One fsync wait per connect instead of two: measured
//     0.64x to 0.9x of an in-process responder's connects/s (BENCHMARKS.md, issue 9).
//   - The policy is asked before the xkey is used, so a caller the policy does not allow cannot
//     use signerd to learn whether a box opens. The policy therefore sees the grant's params
//     without the inbox nonce; the nonce is the client's connection token, not a policy fact,
//     and it is checked against its grammar before anything is signed.
//   - A grant whose request carries a connection name that is not a valid inbox nonce is refused
//     with INVALID_ARGUMENT, like every other request-shape failure: signerd signs nothing, and
//     authd either answers with an error decision or sends nothing and lets the server time out,
//     as upstream does for malformed requests.
//   - A refusal (decision error) is a signed, sealed answer: its audit line says granted, with
//     reason "callout-refusal", no profile and no jti, because signerd did what authd asked.
//   - Besides what upstream checks, the request must be addressed to this space's callout
//     account (sub) as an authorization request (aud "nats-authorization-request"), and carry an exp not more than
//     CalloutClockSkew in the past. The nats-server sets all three; the last bounds how long a
//     captured request can be answered.

// Limits of the callout RPCs.
const (
	// MaxSealedRequestBytes bounds a sealed authorization request. The broker limits a client's
	// CONNECT (which the request carries) to max_control_line, 64 KiB in Cotal's configuration.
	MaxSealedRequestBytes = 64 << 10
	// MaxCalloutErrorLen bounds the refusal reason authd may put into a response, in bytes.
	MaxCalloutErrorLen = 256
	// CalloutClockSkew is how long after its exp an authorization request is still answered,
	// allowing for clock differences between the broker and signerd. The nats-server sets exp to
	// its own clock plus its auth_timeout (2 s by default) and stops waiting for the answer then,
	// so past exp an answer serves nobody but whoever captured the request: the skew is kept to
	// what hosts on NTP stay within, not a replay window (it was 60 s).
	CalloutClockSkew = 5 * time.Second
)

// calloutRequestAudience is the aud of every authorization request a nats-server signs
// (server.AuthRequestSubject; spelled out to keep the broker out of signerd's imports).
const calloutRequestAudience = "nats-authorization-request"

// reasonCalloutRefusal qualifies the granted audit line of a signed refusal response.
const reasonCalloutRefusal = "callout-refusal"

// OpenCalloutRequest opens a sealed authorization request with the space's xkey, verifies that
// the server that sealed it signed it, and returns its claims. It refuses a missing or oversized
// box, a server_xkey that is not a curve key, a box that does not open, and a request that does
// not verify or is not bound to server_xkey (INVALID_ARGUMENT).
func (s *Service) OpenCalloutRequest(ctx context.Context, req *signerv1.OpenCalloutRequestRequest) (*signerv1.OpenCalloutRequestResponse, error) {
	c, err := s.begin(ctx, policy.RPCOpenCalloutRequest)
	var resp *signerv1.OpenCalloutRequestResponse
	if err == nil {
		resp, err = s.openCallout(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Service) openCallout(c *call, req *signerv1.OpenCalloutRequestRequest) (*signerv1.OpenCalloutRequestResponse, error) {
	if err := space.ValidateName(req.GetSpace()); err != nil {
		return nil, invalid(err.Error())
	}
	c.space = req.GetSpace()
	if err := checkSealed(req.GetSealedRequest(), req.GetServerXkey()); err != nil {
		return nil, err
	}
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCOpenCalloutRequest, Space: c.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	ac, err := s.openRequest(sp, req.GetSealedRequest(), req.GetServerXkey())
	if err != nil {
		return nil, err
	}
	s.opened.put(openedKeyOf(sp, req.GetSealedRequest(), req.GetServerXkey()), ac, len(req.GetSealedRequest()), s.now())
	c.subject = ac.UserNkey
	claimsJSON, err := json.Marshal(ac)
	if err != nil {
		return nil, fmt.Errorf("server: marshal authorization request claims: %w", err)
	}
	return &signerv1.OpenCalloutRequestResponse{
		UserNkey: ac.UserNkey, ServerId: ac.Server.ID, ServerName: ac.Server.Name, ServerXkey: ac.Server.XKey,
		AuthToken: ac.ConnectOptions.Token, ConnectionName: ac.ConnectOptions.Name,
		ClientHost: ac.ClientInformation.Host, ClientJwt: ac.ConnectOptions.JWT,
		RequestClaimsJson: claimsJSON,
	}, nil
}

// SignCalloutResponse answers a sealed authorization request with authd's decision: for a grant,
// a user JWT of a data-account profile for the request's user nkey, signed by the data signing
// key, living until the grant's expires_at capped by the profile maximum and the policy; for an
// error, the refusal reason. The authorization response is signed with the callout signing key
// and sealed to the server's xkey. It refuses what OpenCalloutRequest refuses, a missing
// decision, a grant of a profile outside the data account or of one the policy does not allow,
// an expires_at not in the future, a connection name that is not an inbox nonce, and a refusal
// reason that is empty, longer than MaxCalloutErrorLen bytes or not printable.
func (s *Service) SignCalloutResponse(ctx context.Context, req *signerv1.SignCalloutResponseRequest) (*signerv1.SignCalloutResponseResponse, error) {
	c, err := s.begin(ctx, policy.RPCSignCalloutResponse)
	var resp *signerv1.SignCalloutResponseResponse
	if err == nil {
		resp, err = s.signCallout(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

// calloutInput is a SignCalloutResponse request after validation.
type calloutInput struct {
	space, serverXKey string
	sealed            []byte
	// profile is empty for a refusal; params and ttl are set only for a grant.
	profile profiles.Name
	params  profiles.Params
	ttl     time.Duration
	refusal string
}

// parseSignCallout validates a SignCalloutResponse request without touching keys or policy. now
// is the instant the grant's lifetime is measured from. It is fuzzed (FuzzParseSignCallout).
func parseSignCallout(req *signerv1.SignCalloutResponseRequest, now time.Time) (*calloutInput, error) {
	in := &calloutInput{space: req.GetSpace(), sealed: req.GetSealedRequest(), serverXKey: req.GetServerXkey()}
	if err := space.ValidateName(in.space); err != nil {
		return nil, invalid(err.Error())
	}
	if err := checkSealed(in.sealed, in.serverXKey); err != nil {
		return nil, err
	}
	switch d := req.GetDecision().(type) {
	case *signerv1.SignCalloutResponseRequest_Grant:
		return in, parseGrant(in, d.Grant, now)
	case *signerv1.SignCalloutResponseRequest_Error:
		in.refusal = d.Error
		return in, checkRefusal(in.refusal)
	default:
		return nil, invalid("decision is required: grant or error")
	}
}

// parseGrant validates a grant into in. The profile is built here (without the inbox nonce,
// which only the opened request knows) so the policy judges values that fit their grammars.
func parseGrant(in *calloutInput, g *signerv1.CalloutGrant, now time.Time) error {
	name, err := ProfileName(g.GetProfile())
	if err != nil {
		return invalid("grant: " + err.Error())
	}
	if name.Account() != profiles.AccountData {
		return invalid(fmt.Sprintf("grant: profile %s is not a data-account profile", name))
	}
	in.profile = name
	exp := g.GetExpiresAt()
	if exp == nil {
		return invalid("grant: expires_at is required")
	}
	if err := exp.CheckValid(); err != nil {
		return ttlInvalid("grant: expires_at is malformed")
	}
	// The JWT's exp is whole seconds from now (rounded down), so it never outlives expires_at.
	// expires_at is required, so a lifetime of zero is not a request for the default.
	if in.ttl = exp.AsTime().Sub(now); in.ttl == 0 || CheckTTL(in.ttl) != nil {
		return ttlInvalid("grant: expires_at is not at least one second in the future")
	}
	in.params = paramsOf(g.GetParams())
	if _, err := profiles.Build(in.space, name, in.params); err != nil {
		return invalid("grant: " + err.Error())
	}
	return nil
}

// checkRefusal accepts a refusal reason of 1 to MaxCalloutErrorLen bytes of printable UTF-8.
func checkRefusal(r string) error {
	if r == "" || len(r) > MaxCalloutErrorLen {
		return invalid(fmt.Sprintf("error must be 1 to %d bytes", MaxCalloutErrorLen))
	}
	if !utf8.ValidString(r) {
		return invalid("error is not valid UTF-8")
	}
	for _, ch := range r {
		if !unicode.IsPrint(ch) {
			return invalid("error may hold only printable characters")
		}
	}
	return nil
}

// recordCallout copies into the audit record only the request values that fit their grammars.
func recordCallout(c *call, req *signerv1.SignCalloutResponseRequest) {
	if space.ValidateName(req.GetSpace()) == nil {
		c.space = req.GetSpace()
	}
	if n, err := ProfileName(req.GetGrant().GetProfile()); err == nil {
		c.profile = string(n)
	}
}

func (s *Service) signCallout(c *call, req *signerv1.SignCalloutResponseRequest) (*signerv1.SignCalloutResponseResponse, error) {
	now := s.now()
	in, err := parseSignCallout(req, now)
	if err != nil {
		recordCallout(c, req)
		return nil, err
	}
	c.space, c.profile = in.space, string(in.profile)
	d, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCSignCalloutResponse, Space: in.space,
		Profile: in.profile, TTL: in.ttl, Params: in.params})
	if err != nil {
		return nil, err
	}
	sp, err := s.space(in.space)
	if err != nil {
		return nil, err
	}
	ac, err := s.openedRequest(sp, in.sealed, in.serverXKey, now)
	if err != nil {
		return nil, err
	}
	c.subject = ac.UserNkey

	if in.profile == "" {
		sealed, err := sealResponse(sp, ac, "", in.refusal)
		if err != nil {
			return nil, err
		}
		c.note = reasonCalloutRefusal
		return &signerv1.SignCalloutResponseResponse{SealedResponse: sealed}, nil
	}

	// The client chose the nonce, sent it as its connection name and uses _INBOX_<nonce> as its
	// inbox prefix. It must be bound to the principal the grant names (space.ValidateBoundInboxNonce):
	// the grammar alone would let a client name a minted credential's _INBOX_<user key> or
	// another principal's nonce, and so read their replies. A profile without an inbox
	// (service-serve) takes no nonce, so its connection name is not read.
	params := in.params
	if in.profile.HasInbox() {
		nonce := ac.ConnectOptions.Name
		if err := space.ValidateBoundInboxNonce(nonce, params.Owner, params.Actor); err != nil {
			return nil, invalid("the request's connection name is not an inbox nonce bound to the granted principal (<tag>-<suffix>, pkg/space)")
		}
		params.InboxNonce = nonce
	}
	spec, err := profiles.Build(in.space, in.profile, params)
	if err != nil {
		return nil, invalid("grant: " + err.Error())
	}
	cred, err := s.sign(sp, spec, params, ac.UserNkey, now, in.ttl, d.TTLCap, MinterTag(c.caller))
	if err != nil {
		return nil, err
	}
	sealed, err := sealResponse(sp, ac, cred.GetJwt(), "")
	if err != nil {
		return nil, err
	}
	c.jti, c.expiry = cred.GetJti(), cred.GetExpiresAt().AsTime()
	return &signerv1.SignCalloutResponseResponse{SealedResponse: sealed, UserJti: cred.GetJti()}, nil
}

// checkSealed validates the sealed request and server xkey fields.
func checkSealed(sealed []byte, serverXKey string) error {
	switch {
	case len(sealed) == 0:
		return invalid("sealed_request is required")
	case len(sealed) > MaxSealedRequestBytes:
		return invalid(fmt.Sprintf("sealed_request is longer than %d bytes", MaxSealedRequestBytes))
	case serverXKey == "":
		return invalid("server_xkey is required")
	case !nkey.IsCurve(serverXKey):
		return invalid("server_xkey is not a canonical curve (X) public key")
	}
	return nil
}

// openRequest opens a sealed request with the space's xkey and verifies it.
func (s *Service) openRequest(sp *keystore.Space, sealed []byte, serverXKey string) (*jwt.AuthorizationRequestClaims, error) {
	data, err := sp.OpenCallout(sealed, serverXKey)
	if err != nil {
		return nil, invalid("sealed_request does not open with this space's xkey from server_xkey")
	}
	return verifyCalloutRequest(data, serverXKey, sp.Trust.AuthAccountPublicKey(), s.now())
}

// openedRequest takes the claims OpenCalloutRequest cached for these sealed bytes, checking their
// expiry again, or opens and verifies the request when there are none.
func (s *Service) openedRequest(sp *keystore.Space, sealed []byte, serverXKey string, now time.Time) (*jwt.AuthorizationRequestClaims, error) {
	ac := s.opened.take(openedKeyOf(sp, sealed, serverXKey), now)
	if ac == nil {
		return s.openRequest(sp, sealed, serverXKey)
	}
	if calloutRequestExpired(ac, now) {
		return nil, invalid("authorization request has expired")
	}
	return ac, nil
}

// calloutRequestExpired reports whether now is more than CalloutClockSkew past ac's exp.
func calloutRequestExpired(ac *jwt.AuthorizationRequestClaims, now time.Time) bool {
	return now.After(time.Unix(ac.Expires, 0).Add(CalloutClockSkew))
}

// verifyCalloutRequest decodes an opened authorization request and checks that the server named
// in it signed it for authAccount and sealed it with serverXKey, and that it has not expired.
// Details never quote the request: it carries the client's bearer token. It is fuzzed
// (FuzzVerifyCalloutRequest).
func verifyCalloutRequest(data []byte, serverXKey, authAccount string, now time.Time) (*jwt.AuthorizationRequestClaims, error) {
	if !compactJWT(string(data)) {
		return nil, invalid("sealed_request does not hold a compact JWT")
	}
	ac, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, invalid("sealed_request does not hold a signed authorization request")
	}
	vr := jwt.CreateValidationResults()
	ac.Validate(vr)
	switch {
	case ac.UserNkey == "":
		return nil, invalid("authorization request carries no user_nkey")
	case !nkey.IsUser(ac.UserNkey):
		// Before Validate, whose nkeys check accepts CR and LF inside the key.
		return nil, invalid("authorization request user_nkey is not a canonical user public nkey")
	case vr.IsBlocking(false):
		return nil, invalid("authorization request does not validate")
	case ac.Server.ID == "":
		return nil, invalid("authorization request carries no server_id.id")
	case !nkey.IsServer(ac.Server.ID):
		return nil, invalid("server_id.id is not a canonical server (N) public key")
	case ac.Issuer != ac.Server.ID:
		return nil, invalid("authorization request is not signed by server_id.id")
	case ac.Server.XKey != serverXKey:
		return nil, invalid("server_id.xkey differs from server_xkey")
	case ac.Subject != authAccount:
		return nil, invalid("authorization request is not for this space's callout account")
	case ac.Audience != calloutRequestAudience:
		return nil, invalid("authorization request audience is not " + calloutRequestAudience)
	case ac.Expires == 0:
		return nil, invalid("authorization request carries no expiry")
	case calloutRequestExpired(ac, now):
		return nil, invalid("authorization request has expired")
	}
	return ac, nil
}

// sealResponse signs the authorization response for ac (exactly one of userJWT and refusal set)
// with the callout signing key and seals it to the server's xkey.
func sealResponse(sp *keystore.Space, ac *jwt.AuthorizationRequestClaims, userJWT, refusal string) ([]byte, error) {
	resp := jwt.NewAuthorizationResponseClaims(ac.UserNkey)
	resp.Audience = ac.Server.ID
	resp.Jwt = userJWT
	resp.Error = refusal
	resp.IssuerAccount = sp.Trust.AuthAccountPublicKey()
	token, err := resp.Encode(sp.AuthSigning)
	if err != nil {
		return nil, fmt.Errorf("server: encode authorization response: %w", err)
	}
	sealed, err := sp.SealCallout([]byte(token), ac.Server.XKey)
	if err != nil {
		return nil, fmt.Errorf("server: seal authorization response: %w", err)
	}
	return sealed, nil
}
