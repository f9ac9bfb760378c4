package server_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestRemint runs every Remint refusal and grant against one signerd whose clock a case may move.
func TestRemint(t *testing.T) {
	clock := &offsetClock{}
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}, Policy: tablePolicy, Now: clock.Now})
	manager := dialAs(t, s, managerAlpha)

	// mint returns a fresh agent credential in spaceName minted by managerd of that space.
	mint := func(t *testing.T, spaceName string, ttl time.Duration) (*signerv1.Credential, nkeys.KeyPair) {
		t.Helper()
		kp, pub := newUser(t)
		c := manager
		if spaceName == "beta" {
			c = dialAs(t, s, managerBeta)
		}
		req := agentReq(spaceName, pub)
		if ttl > 0 {
			req.Ttl = durationpb.New(ttl)
		}
		resp, err := c.Mint(ctxT(t), req)
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return resp.GetCredential(), kp
	}
	// remintReq is a correct Remint request for cred held by kp, proven now by signerd's clock.
	remintReq := func(t *testing.T, cred *signerv1.Credential, kp nkeys.KeyPair) *signerv1.RemintRequest {
		t.Helper()
		at := clock.Now().Unix()
		return &signerv1.RemintRequest{Space: "alpha", Jwt: cred.GetJwt(), ProofUnixSeconds: at, Proof: remintProof(t, kp, "alpha", cred.GetJti(), at)}
	}
	// remintAs mints an alpha agent as managerd, lets edit change the Remint request, and
	// sends it as caller id.
	remintAs := func(id string, edit func(t *testing.T, req *signerv1.RemintRequest, kp nkeys.KeyPair)) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			cred, kp := mint(t, "alpha", 0)
			req := remintReq(t, cred, kp)
			if edit != nil {
				edit(t, req, kp)
			}
			return dialAs(t, s, id).Remint(ctxT(t), req)
		}
	}

	cases := []rpcCase{
		{
			name: "fail/remint-foreign-jwt/forged-issuer",
			// Claims signerd's own data account as issuer_account but is signed by a fresh account
			// key: the signature verifies, the authority does not.
			call: remintAs(managerAlpha, func(t *testing.T, req *signerv1.RemintRequest, kp nkeys.KeyPair) {
				uc := decodeUser(t, req.Jwt)
				forger, err := nkeys.CreateAccount()
				if err != nil {
					t.Fatal(err)
				}
				if req.Jwt, err = uc.Encode(forger); err != nil {
					t.Fatal(err)
				}
				fc := decodeUser(t, req.Jwt)
				req.Proof = remintProof(t, kp, "alpha", fc.ID, req.ProofUnixSeconds)
			}),
			code:   codes.PermissionDenied,
			reason: "FOREIGN_CREDENTIAL",
			audit:  denied(managerAlpha, "Remint", "alpha", "agent", "foreign-credential"),
		},
		{
			name: "fail/remint-foreign-jwt/other-space",
			// A genuine credential of beta presented as one of alpha.
			call: func(t *testing.T) (proto.Message, error) {
				cred, kp := mint(t, "beta", 0)
				return manager.Remint(ctxT(t), remintReq(t, cred, kp))
			},
			code:   codes.PermissionDenied,
			reason: "FOREIGN_CREDENTIAL",
			audit:  denied(managerAlpha, "Remint", "alpha", "agent", "foreign-credential"),
		},
		{
			name: "fail/remint-bad-proof",
			call: remintAs(managerAlpha, func(t *testing.T, req *signerv1.RemintRequest, _ nkeys.KeyPair) {
				other, _ := newUser(t)
				req.Proof = remintProof(t, other, "alpha", decodeUser(t, req.Jwt).ID, req.ProofUnixSeconds)
			}),
			code:   codes.PermissionDenied,
			reason: "BAD_PROOF",
			audit:  denied(managerAlpha, "Remint", "alpha", "agent", "bad-proof"),
		},
		{
			name: "fail/remint-stale-proof",
			call: remintAs(managerAlpha, func(t *testing.T, req *signerv1.RemintRequest, kp nkeys.KeyPair) {
				req.ProofUnixSeconds = clock.Now().Add(-120 * time.Second).Unix()
				req.Proof = remintProof(t, kp, "alpha", decodeUser(t, req.Jwt).ID, req.ProofUnixSeconds)
			}),
			code:   codes.PermissionDenied,
			reason: "STALE_PROOF",
			audit:  denied(managerAlpha, "Remint", "alpha", "agent", "stale-proof"),
		},
		{
			name:   "fail/remint-other-callers-cred",
			call:   remintAs(renewerAlpha, nil),
			code:   codes.PermissionDenied,
			reason: "REMINT_FOREIGN_MINTER",
			audit:  denied(renewerAlpha, "Remint", "alpha", "agent", "remint-foreign-minter"),
		},
		{
			name:  "ok/remint-any",
			call:  remintAs(renewerAny, nil),
			code:  codes.OK,
			audit: granted(renewerAny, "Remint", "alpha", "agent", ""),
		},
		{
			name: "fail/remint-not-allowed",
			call: func(t *testing.T) (proto.Message, error) {
				kp, pub := newUser(t)
				resp, err := manager.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub})
				if err != nil {
					t.Fatalf("mint probe: %v", err)
				}
				return manager.Remint(ctxT(t), remintReq(t, resp.GetCredential(), kp))
			},
			code:   codes.PermissionDenied,
			reason: "REMINT_NOT_ALLOWED",
			audit:  denied(managerAlpha, "Remint", "alpha", "probe", "remint-not-allowed"),
		},
		{
			name: "fail/remint-expired",
			call: func(t *testing.T) (proto.Message, error) {
				cred, kp := mint(t, "alpha", time.Minute)
				// Two minutes on, by signerd's clock; the proof is fresh by that clock.
				clock.Set(2 * time.Minute)
				defer clock.Set(0)
				return manager.Remint(ctxT(t), remintReq(t, cred, kp))
			},
			code:   codes.PermissionDenied,
			reason: "CREDENTIAL_EXPIRED",
			audit:  denied(managerAlpha, "Remint", "alpha", "agent", "credential-expired"),
		},
		{
			name: "fail/remint-bad-user-jwt",
			call: remintAs(managerAlpha, func(_ *testing.T, req *signerv1.RemintRequest, _ nkeys.KeyPair) {
				req.Jwt = req.Jwt[:len(req.Jwt)-4] + "AAAA"
			}),
			code:   codes.InvalidArgument,
			reason: "INVALID_ARGUMENT",
			audit:  denied(managerAlpha, "Remint", "alpha", "", "invalid-argument"),
		},
	}

	var old *signerv1.Credential
	var oldKP nkeys.KeyPair
	cases = append(cases, rpcCase{
		name: "ok/remint",
		call: func(t *testing.T) (proto.Message, error) {
			old, oldKP = mint(t, "alpha", 10*time.Minute)
			req := remintReq(t, old, oldKP)
			req.Ttl = durationpb.New(5 * time.Hour)
			return manager.Remint(ctxT(t), req)
		},
		code:  codes.OK,
		audit: granted(managerAlpha, "Remint", "alpha", "agent", ""),
		check: func(t *testing.T, resp proto.Message) {
			cred := resp.(*signerv1.RemintResponse).GetCredential()
			was, now := decodeUser(t, old.GetJwt()), decodeUser(t, cred.GetJwt())
			if now.Subject != was.Subject || cred.GetUserPublicKey() != was.Subject {
				t.Fatalf("subject changed: %s -> %s", was.Subject, now.Subject)
			}
			if now.ID == was.ID || cred.GetJti() != now.ID {
				t.Fatalf("jti not renewed: old %s, new %s (response %s)", was.ID, now.ID, cred.GetJti())
			}
			if !samePerms(was, now) {
				t.Fatalf("permissions changed:\nwas %+v\nnow %+v", was.UserPermissionLimits, now.UserPermissionLimits)
			}
			if !slices.Equal(was.Tags, now.Tags) || now.Name != was.Name || now.IssuerAccount != was.IssuerAccount {
				t.Fatalf("tags/name/account changed: %v %q %s -> %v %q %s", was.Tags, was.Name, was.IssuerAccount, now.Tags, now.Name, now.IssuerAccount)
			}
			if !cred.GetTtlCapped() || cred.GetProfile() != signerv1.Profile_PROFILE_AGENT {
				t.Fatalf("ttl_capped %v profile %v, want true and agent", cred.GetTtlCapped(), cred.GetProfile())
			}
			// 5h asked, the 1h cap of the policy in force granted (not the 10m of the old one).
			wantLifetime(t, cred, policyCap)
			if now.Expires != cred.GetExpiresAt().GetSeconds() {
				t.Fatalf("JWT exp %d differs from the response's %v", now.Expires, cred.GetExpiresAt())
			}
		},
	})
	runCases(t, s, cases)

	t.Run("audit/verify", func(t *testing.T) { verifyAudit(t, s.AuditPath) })
}

// samePerms reports whether two user claims carry the same permissions, limits and flags.
func samePerms(a, b *jwt.UserClaims) bool {
	return reflect.DeepEqual(a.UserPermissionLimits, b.UserPermissionLimits)
}
