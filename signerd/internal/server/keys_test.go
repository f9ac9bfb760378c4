package server_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// keysPolicy adds a sentinel rule to authd's entry (nothing else in the tests mints one).
var keysPolicy = strings.Replace(signerdtest.DefaultPolicy, "      auth-callout: {ttl_max: 24h}\n",
	"      auth-callout: {ttl_max: 24h}\n      sentinel: {ttl_max: 1h}\n", 1)

// wantMessage asserts a refusal's status message contains want.
func wantMessage(t *testing.T, err error, want string) {
	t.Helper()
	if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
		t.Fatalf("refusal message %q does not contain %q", msg, want)
	}
}

// TestNonCanonicalUserKeyRefused is finding 1 of issue 7: nkeys.IsValidPublicUserKey accepts CR
// and LF anywhere in a key (Go's base32 decoder skips them), so signerd signed JWTs whose subject
// was "U…\r\n…" or "\nU…": a different string from the key a revocation would name. Every path
// that reads a key from a caller or a request must accept only the canonical spelling.
func TestNonCanonicalUserKeyRefused(t *testing.T) {
	if !strings.Contains(keysPolicy, "sentinel: {ttl_max: 1h}") {
		t.Fatal("DefaultPolicy changed shape; update keysPolicy")
	}
	s := signerdtest.Start(t, signerdtest.Options{Policy: keysPolicy})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	manager := dial(t, s.Addr, s.ClientFor(t, mtls.KindManagerd, "alpha"))
	authdID := signerdtest.ID(mtls.KindAuthd, "alpha")
	managerID := signerdtest.ID(mtls.KindManagerd, "alpha")
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	_, k := newUser(t)
	crlf := k[:20] + "\r\n" + k[20:]
	lf := "\n" + k

	sentinel := func(key string) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_SENTINEL, UserPublicKey: key})
		}
	}
	agent := func(key string) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			resp, err := manager.Mint(ctxT(t), agentReq("alpha", key))
			if err != nil {
				// Refused for the key, not by accident further on (finding 1 saw "invalid inbox
				// nonce" for a request that sent none).
				wantMessage(t, err, "user_public_key")
			}
			return resp, err
		}
	}
	runCases(t, s, []rpcCase{
		{
			name: "ok/mint-sentinel-canonical", call: sentinel(k), code: codes.OK,
			audit: &auditWant{caller: authdID, rpc: "Mint", space: "alpha", profile: "sentinel", decision: "granted"},
			check: func(t *testing.T, resp proto.Message) {
				if sub := decodeUser(t, resp.(*signerv1.MintResponse).GetCredential().GetJwt()).Subject; sub != k {
					t.Fatalf("subject %q, want %q", sub, k)
				}
			},
		},
		{name: "fail/mint-sentinel-crlf-inside", call: sentinel(crlf), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(authdID, "Mint", "alpha", "sentinel", "invalid-argument")},
		{name: "fail/mint-sentinel-lf-leading", call: sentinel(lf), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(authdID, "Mint", "alpha", "sentinel", "invalid-argument")},
		{name: "fail/mint-sentinel-lower-case", call: sentinel(strings.ToLower(k)), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(authdID, "Mint", "alpha", "sentinel", "invalid-argument")},
		{name: "fail/mint-agent-crlf-inside", call: agent(crlf), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(managerID, "Mint", "alpha", "agent", "invalid-argument")},
		{name: "fail/mint-agent-lf-leading", call: agent(lf), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(managerID, "Mint", "alpha", "agent", "invalid-argument")},
	})

	t.Run("audit/no-non-canonical-subject", func(t *testing.T) {
		for _, r := range auditRecords(t, s.AuditPath) {
			if r.Subject != "" && r.Subject != k && strings.ContainsAny(r.Subject, "\r\n") {
				t.Fatalf("audit line names subject %q", r.Subject)
			}
		}
	})

	srv := newForgedServer(t)
	for _, tc := range []struct{ name, key string }{
		{"lf-leading", lf},
		{"crlf-inside", crlf},
	} {
		sealed, user := srv.request(t, gs, newNonce(), func(ac *jwt.AuthorizationRequestClaims) { ac.UserNkey = tc.key })
		if user != tc.key {
			t.Fatalf("forged request carries user_nkey %q, want %q", user, tc.key)
		}
		t.Run("fail/open-callout-user-nkey-"+tc.name, func(t *testing.T) {
			resp, err := authd.OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantMessage(t, err, "user_nkey")
			if resp.GetUserNkey() != "" {
				t.Fatalf("opened a request for user_nkey %q", resp.GetUserNkey())
			}
		})
		t.Run("fail/sign-callout-user-nkey-"+tc.name, func(t *testing.T) {
			resp, err := authd.SignCalloutResponse(ctxT(t), &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey,
				Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: agentGrant(time.Now().Add(10 * time.Minute))}})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantMessage(t, err, "user_nkey")
			if len(resp.GetSealedResponse()) != 0 || resp.GetUserJti() != "" {
				t.Fatal("signed a response for a non-canonical user_nkey")
			}
		})
	}

	// The jwt decoder's base64 skips CR and LF, so the same credential could be presented in many
	// spellings; signerd takes only the compact form it issued.
	t.Run("fail/remint-jwt-with-lf", func(t *testing.T) {
		kp, pub := newUser(t)
		good, err := manager.Mint(ctxT(t), agentReq("alpha", pub))
		if err != nil {
			t.Fatal(err)
		}
		cred := good.GetCredential()
		token := cred.GetJwt()
		token = token[:len(token)-10] + "\n" + token[len(token)-10:]
		at := time.Now().Unix()
		resp, err := manager.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: token, ProofUnixSeconds: at,
			Proof: remintProof(t, kp, "alpha", cred.GetJti(), at)})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantMessage(t, err, "base64url")
		wantNoCredential(t, resp)
	})

	// A credential that an unfixed signerd issued to "\nU…" (forged here with the space's real
	// data signing key) must not be renewed either.
	t.Run("fail/remint-non-canonical-subject", func(t *testing.T) {
		seed, err := creds.ReadSeedFile(keystore.SecretPath(filepath.Join(s.Dir, setup.SignerDir), "alpha", keystore.FileDataSigning, false))
		if err != nil {
			t.Fatal(err)
		}
		defer seed.Wipe()
		skp, err := seed.KeyPair()
		if err != nil {
			t.Fatal(err)
		}
		defer skp.Wipe()
		kp, pub := newUser(t)
		good, err := manager.Mint(ctxT(t), agentReq("alpha", pub))
		if err != nil {
			t.Fatal(err)
		}
		uc := decodeUser(t, good.GetCredential().GetJwt())
		uc.Subject = "\n" + pub
		token, err := uc.Encode(skp)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now().Unix()
		resp, err := manager.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: token, ProofUnixSeconds: at,
			Proof: remintProof(t, kp, "alpha", decodeUser(t, token).ID, at)})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantMessage(t, err, "subject")
		wantNoCredential(t, resp)
	})
}
