package server_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// tablePolicy serves the refusal tables: managerd mints a narrow agent rule (owner o1 only) and a
// probe for its own space; other entries exist to be refused or to renew.
const tablePolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h, owners: [o1], channels: ["general", "team.*", "ops.>"], roles: [reviewer], capabilities: [spawn]}
      probe: {ttl_max: 1m, remint: none}
  - id: spiffe://cotal.local/getspace-only/{space}
    rpcs: [GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
  - id: spiffe://cotal.local/limited
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 0.001, burst: 2}
    profiles:
      probe: {ttl_max: 1m}
  - id: spiffe://cotal.local/renewer/{space}
    rpcs: [Remint]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h}
  - id: spiffe://cotal.local/renewer-any/{space}
    rpcs: [Remint]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      # Remint re-checks the credential's parameters, so the renewer is allowed managerd's.
      agent: {ttl_max: 1h, remint: any, owners: [o1], channels: ["general"]}
`

// policyCap is tablePolicy's agent ttl_max.
const policyCap = time.Hour

var (
	managerAlpha = signerdtest.ID("managerd", "alpha")
	managerBeta  = signerdtest.ID("managerd", "beta")
	managerGamma = signerdtest.ID("managerd", "gamma")
	renewerAlpha = signerdtest.ID("renewer", "alpha")
	renewerAny   = signerdtest.ID("renewer-any", "alpha")
	getSpaceOnly = signerdtest.ID("getspace-only", "alpha")
	limitedID    = "spiffe://cotal.local/limited"
)

// agentParams are parameters tablePolicy allows managerd to mint.
func agentParams() *signerv1.ProfileParams {
	return &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, AllowPublish: []string{"general"}}
}

func agentReq(spaceName, userPub string) *signerv1.MintRequest {
	return &signerv1.MintRequest{Space: spaceName, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: userPub, Params: agentParams()}
}

// rpcCase is one row of a refusal table. call makes the request(s); the last request's outcome
// is asserted: its gRPC code, its ErrorInfo reason (empty: none), and for refusals that no
// credential came back. audit is what the last audit line must say; nil asserts the call added
// no audit line at all.
type rpcCase struct {
	name   string
	call   func(t *testing.T) (proto.Message, error)
	code   codes.Code
	reason string
	audit  *auditWant
	// check inspects a granted response.
	check func(t *testing.T, resp proto.Message)
}

func runCases(t *testing.T, s *signerdtest.Signer, cases []rpcCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(auditRecords(t, s.AuditPath))
			resp, err := tc.call(t)
			if tc.code == codes.OK {
				if err != nil {
					t.Fatalf("call refused: %v", err)
				}
				if tc.check != nil {
					tc.check(t, resp)
				}
			} else {
				wantRefusal(t, err, tc.code, tc.reason)
				wantNoCredential(t, resp)
			}
			recs := auditRecords(t, s.AuditPath)
			if tc.audit == nil {
				if len(recs) != before {
					t.Fatalf("audit grew from %d to %d lines; want no decision audited: %+v", before, len(recs), recs[before:])
				}
				return
			}
			if len(recs) <= before {
				t.Fatalf("no audit line written (still %d lines)", len(recs))
			}
			tc.audit.check(t, recs[len(recs)-1])
		})
	}
}

func denied(caller, rpc, spaceName, profile, reason string) *auditWant {
	return &auditWant{caller: caller, rpc: rpc, space: spaceName, profile: profile, decision: audit.Denied, reason: reason}
}

func granted(caller, rpc, spaceName, profile, reason string) *auditWant {
	return &auditWant{caller: caller, rpc: rpc, space: spaceName, profile: profile, decision: audit.Granted, reason: reason}
}

// TestMint runs every Mint refusal (and the grants that share their rules) against one signerd
// serving alpha and beta, then verifies the audit chain they left.
func TestMint(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}, Policy: tablePolicy})
	manager := dialAs(t, s, managerAlpha)

	// mintWith dials with files and mints an agent for a fresh key in alpha.
	mintWith := func(files mtls.ClientFiles) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			_, pub := newUser(t)
			return dial(t, s.Addr, files).Mint(ctxT(t), agentReq("alpha", pub))
		}
	}
	// mintAs mints req (built for a fresh user key) as caller id.
	mintAs := func(id string, req func(pub string) *signerv1.MintRequest) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			_, pub := newUser(t)
			return dialAs(t, s, id).Mint(ctxT(t), req(pub))
		}
	}
	// agentWith is an alpha agent request with edited parameters.
	agentWith := func(edit func(p *signerv1.ProfileParams)) func(pub string) *signerv1.MintRequest {
		return func(pub string) *signerv1.MintRequest {
			r := agentReq("alpha", pub)
			edit(r.Params)
			return r
		}
	}
	probe := func(spaceName string) func(pub string) *signerv1.MintRequest {
		return func(pub string) *signerv1.MintRequest {
			return &signerv1.MintRequest{Space: spaceName, Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub}
		}
	}

	cases := []rpcCase{
		{
			name: "fail/no-client-cert",
			call: func(t *testing.T) (proto.Message, error) {
				_, pub := newUser(t)
				return dialTLS(t, s.Addr, noCertTLS(t, s)).Mint(ctxT(t), agentReq("alpha", pub))
			},
			code: codes.Unavailable,
		},
		{
			name: "fail/wrong-ca",
			call: mintWith(foreignCAClient(t, s, managerAlpha)),
			code: codes.Unavailable,
		},
		{
			name: "fail/expired-cert",
			call: mintWith(s.ClientSpec(t, mtls.LeafSpec{URIs: []string{managerAlpha},
				NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})),
			code: codes.Unavailable,
		},
		{
			name:  "fail/no-uri-san",
			call:  mintWith(s.ClientSpec(t, mtls.LeafSpec{CommonName: managerAlpha})),
			code:  codes.Unauthenticated,
			audit: &auditWant{caller: "-", rpc: "Mint", decision: audit.Denied, reason: "unauthenticated"},
		},
		{
			name:   "fail/unknown-caller",
			call:   mintWith(s.Client(t, "spiffe://cotal.local/stranger/alpha")),
			code:   codes.PermissionDenied,
			reason: "CALLER_UNKNOWN",
			audit:  denied("spiffe://cotal.local/stranger/alpha", "Mint", "alpha", "agent", "caller-unknown"),
		},
		{
			name:   "fail/rpc-not-allowed",
			call:   mintAs(getSpaceOnly, agentWith(func(*signerv1.ProfileParams) {})),
			code:   codes.PermissionDenied,
			reason: "RPC_NOT_ALLOWED",
			audit:  denied(getSpaceOnly, "Mint", "alpha", "agent", "rpc-not-allowed"),
		},
		{
			name: "fail/profile-not-allowed",
			call: mintAs(managerAlpha, func(pub string) *signerv1.MintRequest {
				return &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_DELIVERY, UserPublicKey: pub}
			}),
			code:   codes.PermissionDenied,
			reason: "PROFILE_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "delivery", "profile-not-allowed"),
		},
		{
			name:   "fail/space-not-allowed",
			call:   mintAs(managerAlpha, func(pub string) *signerv1.MintRequest { return agentReq("beta", pub) }),
			code:   codes.PermissionDenied,
			reason: "SPACE_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "beta", "agent", "space-not-allowed"),
		},
		{
			name: "fail/ttl-capped",
			call: mintAs(managerAlpha, func(pub string) *signerv1.MintRequest {
				r := agentReq("alpha", pub)
				r.Ttl = durationpb.New(3 * time.Hour)
				return r
			}),
			code:  codes.OK,
			audit: granted(managerAlpha, "Mint", "alpha", "agent", ""),
			check: func(t *testing.T, resp proto.Message) {
				cred := resp.(*signerv1.MintResponse).GetCredential()
				if !cred.GetTtlCapped() {
					t.Fatal("ttl_capped = false for a 3h request under a 1h cap")
				}
				wantLifetime(t, cred, policyCap)
				uc := decodeUser(t, cred.GetJwt())
				if uc.Expires != cred.GetExpiresAt().GetSeconds() || uc.IssuedAt != cred.GetIssuedAt().GetSeconds() {
					t.Fatalf("JWT iat/exp %d/%d differ from the response's %v/%v", uc.IssuedAt, uc.Expires, cred.GetIssuedAt(), cred.GetExpiresAt())
				}
			},
		},
		{
			name: "ok/wildcard-channel/covered-by-policy",
			call: mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) {
				p.AllowPublish, p.AllowSubscribe, p.Subscribe = []string{"ops.*"}, []string{"ops.>"}, []string{"ops.a"}
			})),
			code:  codes.OK,
			audit: granted(managerAlpha, "Mint", "alpha", "agent", ""),
			check: func(t *testing.T, resp proto.Message) {
				uc := decodeUser(t, resp.(*signerv1.MintResponse).GetCredential().GetJwt())
				if !slices.Contains(uc.Pub.Allow, "cotal.alpha.chat.o1.a1.ops.*") || !slices.Contains(uc.Sub.Allow, "cotal.alpha.chat.*.*.ops.>") {
					t.Fatalf("ops.* / ops.> grants missing: pub %v sub %v", uc.Pub.Allow, uc.Sub.Allow)
				}
			},
		},
		{
			name:   "fail/wildcard-channel/wider-than-policy",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.AllowPublish = []string{"team.>"} })),
			code:   codes.PermissionDenied,
			reason: "CHANNEL_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "channel-not-allowed"),
		},
		{
			// team.* reaches team.> on the broker (space.ChannelReach), which the rule's team.*
			// does not cover; the rule's team.* still grants concrete team.<x> channels.
			name:   "fail/wildcard-channel/trailing-star-reaches-subtree",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.AllowPublish = []string{"team.*"} })),
			code:   codes.PermissionDenied,
			reason: "CHANNEL_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "channel-not-allowed"),
		},
		{
			name:   "fail/wildcard-channel/gt",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.AllowPublish = []string{">"} })),
			code:   codes.PermissionDenied,
			reason: "CHANNEL_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "channel-not-allowed"),
		},
		{
			name:   "fail/wildcard-channel/partial-token",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.AllowPublish = []string{"team.a*"} })),
			code:   codes.InvalidArgument,
			reason: "INVALID_ARGUMENT",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "invalid-argument"),
		},
		{
			name:   "fail/owner-not-allowed",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.Owner = "o2" })),
			code:   codes.PermissionDenied,
			reason: "OWNER_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "owner-not-allowed"),
		},
		{
			name:   "fail/channel-not-allowed",
			call:   mintAs(managerAlpha, agentWith(func(p *signerv1.ProfileParams) { p.AllowPublish = []string{"general", "random"} })),
			code:   codes.PermissionDenied,
			reason: "CHANNEL_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "channel-not-allowed"),
		},
		{
			name: "fail/rate-limited",
			call: func(t *testing.T) (proto.Message, error) {
				c := dialAs(t, s, limitedID)
				for i := range 2 {
					_, pub := newUser(t)
					if _, err := c.Mint(ctxT(t), probe("alpha")(pub)); err != nil {
						t.Fatalf("call %d within the burst of 2 refused: %v", i+1, err)
					}
				}
				_, pub := newUser(t)
				return c.Mint(ctxT(t), probe("alpha")(pub))
			},
			code:   codes.ResourceExhausted,
			reason: "RATE_LIMITED",
			// The last line is the second grant: the refusal is counted, not audited on a line
			// of its own (TestRateLimitKnownCallerAuditedInAggregate).
			audit: granted(limitedID, "Mint", "alpha", "probe", ""),
		},
		{
			name:   "fail/unknown-space",
			call:   mintAs(managerGamma, probe("gamma")),
			code:   codes.NotFound,
			reason: "UNKNOWN_SPACE",
			audit:  denied(managerGamma, "Mint", "gamma", "probe", "unknown-space"),
		},
		{
			name: "fail/bad-user-key",
			call: func(t *testing.T) (proto.Message, error) {
				acc, err := nkeys.CreateAccount()
				if err != nil {
					t.Fatal(err)
				}
				accPub, _ := acc.PublicKey()
				return manager.Mint(ctxT(t), agentReq("alpha", accPub))
			},
			code:   codes.InvalidArgument,
			reason: "INVALID_ARGUMENT",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "invalid-argument"),
		},
		{
			name: "fail/request-id-conflict",
			call: func(t *testing.T) (proto.Message, error) {
				_, pub := newUser(t)
				first := agentReq("alpha", pub)
				first.RequestId = "conflict-1"
				if _, err := manager.Mint(ctxT(t), first); err != nil {
					t.Fatalf("first request refused: %v", err)
				}
				_, other := newUser(t)
				second := agentReq("alpha", other)
				second.RequestId = "conflict-1"
				return manager.Mint(ctxT(t), second)
			},
			code:   codes.AlreadyExists,
			reason: "REQUEST_ID_CONFLICT",
			audit:  denied(managerAlpha, "Mint", "alpha", "agent", "request-id-conflict"),
		},
		{
			name: "ok/request-id-replay",
			call: func(t *testing.T) (proto.Message, error) {
				_, pub := newUser(t)
				req := agentReq("alpha", pub)
				req.RequestId = "replay-1"
				first, err := manager.Mint(ctxT(t), req)
				if err != nil {
					t.Fatalf("first request refused: %v", err)
				}
				second, err := manager.Mint(ctxT(t), proto.Clone(req).(*signerv1.MintRequest))
				if err != nil {
					return nil, err
				}
				a, b := first.GetCredential(), second.GetCredential()
				if a.GetJwt() == "" || a.GetJwt() != b.GetJwt() || a.GetJti() != b.GetJti() {
					t.Fatalf("replay returned a different credential: jti %q vs %q", a.GetJti(), b.GetJti())
				}
				return second, nil
			},
			code:  codes.OK,
			audit: granted(managerAlpha, "Mint", "alpha", "agent", "replay"),
		},
		{
			name: "ok/mint",
			call: mintAs(managerAlpha, agentWith(func(*signerv1.ProfileParams) {})),
			code: codes.OK,
			check: func(t *testing.T, resp proto.Message) {
				cred := resp.(*signerv1.MintResponse).GetCredential()
				uc := decodeUser(t, cred.GetJwt())
				if uc.Subject != cred.GetUserPublicKey() || uc.ID != cred.GetJti() || uc.IssuerAccount != cred.GetIssuerAccount() ||
					uc.Issuer != cred.GetSigningKey() || cred.GetProfile() != signerv1.Profile_PROFILE_AGENT || cred.GetTtlCapped() {
					t.Fatalf("credential facts disagree with its JWT: %+v", cred)
				}
				// No TTL asked: the profile default (a standing day) is cut to the policy cap, which
				// is not "capping" the caller's request.
				wantLifetime(t, cred, policyCap)
			},
			audit: granted(managerAlpha, "Mint", "alpha", "agent", ""),
		},
	}
	runCases(t, s, cases)

	t.Run("audit/verify", func(t *testing.T) {
		sum := verifyAudit(t, s.AuditPath)
		recs := auditRecords(t, s.AuditPath)
		if sum.Lines != len(recs) {
			t.Fatalf("Verify saw %d lines, file has %d", sum.Lines, len(recs))
		}
		var grants, denials int
		for _, r := range recs {
			switch r.Decision {
			case audit.Granted:
				grants++
			case audit.Denied:
				denials++
			}
		}
		if grants == 0 || denials == 0 || grants+denials != len(recs) {
			t.Fatalf("audit holds %d grants and %d denials of %d lines; want a mix", grants, denials, len(recs))
		}
	})
}

// decodeUser decodes and verifies a user JWT.
func decodeUser(t *testing.T, token string) *jwt.UserClaims {
	t.Helper()
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatalf("decode user JWT: %v", err)
	}
	return uc
}
