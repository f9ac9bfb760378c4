package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestLifetimeRule is finding 2 of issue 7: one lifetime rule for every RPC that takes a TTL.
// Negative or under one second is TTL_INVALID (Remint with 500 ms was granted with exp = iat,
// Mint with 500 ms was refused as INVALID_ARGUMENT); zero or absent is the default; above the cap
// is capped and says so.
func TestLifetimeRule(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: keysPolicy})
	manager := dial(t, s.Addr, s.ClientFor(t, mtls.KindManagerd, "alpha"))
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	managerID := signerdtest.ID(mtls.KindManagerd, "alpha")
	authdID := signerdtest.ID(mtls.KindAuthd, "alpha")
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}

	mintTTL := func(ttl *durationpb.Duration) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			_, pub := newUser(t)
			req := agentReq("alpha", pub)
			req.Ttl = ttl
			return manager.Mint(ctxT(t), req)
		}
	}
	remintTTL := func(ttl *durationpb.Duration) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			kp, pub := newUser(t)
			resp, err := manager.Mint(ctxT(t), agentReq("alpha", pub))
			if err != nil {
				t.Fatalf("mint: %v", err)
			}
			cred := resp.GetCredential()
			at := time.Now().Unix()
			return manager.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: cred.GetJwt(), ProofUnixSeconds: at,
				Proof: remintProof(t, kp, "alpha", cred.GetJti(), at), Ttl: ttl})
		}
	}
	bearerTTL := func(ttl *durationpb.Duration) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return authd.SignBearer(ctxT(t), bearerReq(func(r *signerv1.SignBearerRequest) { r.Ttl = ttl }))
		}
	}
	calloutIn := func(d time.Duration) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			srv := newForgedServer(t)
			sealed, _ := srv.request(t, gs, newNonce(), nil)
			return authd.SignCalloutResponse(ctxT(t), &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey,
				Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: agentGrant(time.Now().Add(d))}})
		}
	}
	lifetime := func(want time.Duration, capped bool) func(t *testing.T, resp proto.Message) {
		return func(t *testing.T, resp proto.Message) {
			cred := resp.(interface{ GetCredential() *signerv1.Credential }).GetCredential()
			wantLifetime(t, cred, want)
			if cred.GetTtlCapped() != capped {
				t.Fatalf("ttl_capped = %v, want %v", cred.GetTtlCapped(), capped)
			}
		}
	}
	ms500 := durationpb.New(500 * time.Millisecond)

	runCases(t, s, []rpcCase{
		{name: "fail/mint-500ms", call: mintTTL(ms500), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(managerID, "Mint", "alpha", "agent", "ttl-invalid")},
		{name: "fail/mint-negative", call: mintTTL(durationpb.New(-time.Second)), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(managerID, "Mint", "alpha", "agent", "ttl-invalid")},
		{name: "fail/mint-1ns", call: mintTTL(durationpb.New(time.Nanosecond)), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(managerID, "Mint", "alpha", "agent", "ttl-invalid")},
		{name: "fail/mint-malformed", call: mintTTL(&durationpb.Duration{Seconds: 1, Nanos: -1}), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(managerID, "Mint", "alpha", "agent", "ttl-invalid")},
		{name: "fail/mint-sentinel-with-ttl", call: func(t *testing.T) (proto.Message, error) {
			_, pub := newUser(t)
			return authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_SENTINEL, UserPublicKey: pub, Ttl: durationpb.New(time.Hour)})
		}, code: codes.InvalidArgument, reason: "TTL_INVALID", audit: denied(authdID, "Mint", "alpha", "sentinel", "ttl-invalid")},
		{name: "ok/mint-one-second", call: mintTTL(durationpb.New(time.Second)), code: codes.OK,
			audit: granted(managerID, "Mint", "alpha", "agent", ""), check: lifetime(time.Second, false)},
		{name: "ok/mint-zero-is-default", call: mintTTL(durationpb.New(0)), code: codes.OK,
			// The agent default (1h) within DefaultPolicy's 1h cap.
			audit: granted(managerID, "Mint", "alpha", "agent", ""), check: lifetime(time.Hour, false)},
		{name: "ok/mint-over-cap-capped", call: mintTTL(durationpb.New(5 * time.Hour)), code: codes.OK,
			audit: granted(managerID, "Mint", "alpha", "agent", ""), check: lifetime(time.Hour, true)},

		{name: "fail/remint-500ms", call: remintTTL(ms500), code: codes.InvalidArgument, reason: "TTL_INVALID",
			// Refused before the credential is read, so the line names no profile.
			audit: denied(managerID, "Remint", "alpha", "", "ttl-invalid")},
		{name: "fail/remint-negative", call: remintTTL(durationpb.New(-time.Minute)), code: codes.InvalidArgument, reason: "TTL_INVALID",
			// Refused before the credential is read, so the line names no profile.
			audit: denied(managerID, "Remint", "alpha", "", "ttl-invalid")},
		{name: "ok/remint-one-second", call: remintTTL(durationpb.New(time.Second)), code: codes.OK,
			audit: granted(managerID, "Remint", "alpha", "agent", ""), check: lifetime(time.Second, false)},
		{name: "ok/remint-over-cap-capped", call: remintTTL(durationpb.New(5 * time.Hour)), code: codes.OK,
			audit: granted(managerID, "Remint", "alpha", "agent", ""), check: lifetime(time.Hour, true)},

		{name: "fail/bearer-500ms", call: bearerTTL(ms500), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdID, "SignBearer", "alpha", "", "ttl-invalid")},
		{name: "fail/bearer-negative", call: bearerTTL(durationpb.New(-time.Second)), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdID, "SignBearer", "alpha", "", "ttl-invalid")},
		{name: "fail/bearer-absent", call: bearerTTL(nil), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdID, "SignBearer", "alpha", "", "ttl-invalid")},
		{name: "ok/bearer-over-cap-capped", call: bearerTTL(durationpb.New(time.Hour)), code: codes.OK,
			audit: granted(authdID, "SignBearer", "alpha", "", ""),
			check: func(t *testing.T, resp proto.Message) {
				r := resp.(*signerv1.SignBearerResponse)
				if left := time.Until(r.GetExpiresAt().AsTime()); left > 900*time.Second || left < 890*time.Second {
					t.Fatalf("bearer lives %v more, want the 900 s cap", left)
				}
			}},

		{name: "fail/callout-500ms", call: calloutIn(500 * time.Millisecond), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdID, "SignCalloutResponse", "alpha", "agent", "ttl-invalid")},
		{name: "fail/callout-past", call: calloutIn(-time.Minute), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdID, "SignCalloutResponse", "alpha", "agent", "ttl-invalid")},
	})
}
