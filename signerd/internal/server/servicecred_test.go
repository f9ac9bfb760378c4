package server_test

import (
	"crypto/ed25519"
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// Issue 24 item 5: SignServiceCredential, spelled out here (claim names, typ values, caps) rather
// than taken from the server or pkg/serviceaccess, so a change there breaks this test.

const (
	access  = signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS
	renewal = signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL
	svcEp   = "billing.api-v2"
	svcIID  = "ssssssssssssssssssssssssss"
)

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// svcWitness is a well-formed witness: w_ and the base32 of 32 bytes; svcRoot a well-formed root:
// r_ and the base32 of 16 bytes.
var (
	svcWitness = "w_" + b32.EncodeToString([]byte(strings.Repeat("W", 32)))
	svcRoot    = "r_" + b32.EncodeToString([]byte(strings.Repeat("R", 16)))
)

func svcReq(kind signerv1.ServiceCredentialKind, edit func(r *signerv1.SignServiceCredentialRequest)) *signerv1.SignServiceCredentialRequest {
	r := &signerv1.SignServiceCredentialRequest{
		Space: "alpha", Kind: kind, Owner: derivedOwner, Witness: svcWitness, Endpoint: svcEp,
		InstanceId: svcIID, Root: svcRoot, Ttl: durationpb.New(30 * time.Second),
		NotAfter: timestamppb.New(time.Now().Add(48 * time.Hour)),
	}
	if edit != nil {
		edit(r)
	}
	return r
}

func TestSignServiceCredential(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	authd := dialAs(t, s, authdAlpha)
	secrets := readHarnessSecrets(t, s, "alpha")

	// The issuer key as GetJWKS publishes it: the token must verify with it, under its kid.
	jwks, err := authd.GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: "alpha"})
	if err != nil || len(jwks.GetKeys()) != 1 {
		t.Fatalf("GetJWKS = %v, %v", jwks, err)
	}
	jwk := jwks.GetKeys()[0]
	x, err := base64.RawURLEncoding.DecodeString(jwk.GetX())
	if err != nil || len(x) != ed25519.PublicKeySize {
		t.Fatalf("JWKS x %q: %v", jwk.GetX(), err)
	}
	pub := ed25519.PublicKey(x)

	// sign issues a token and checks what every service token must be: the exact header, a
	// signature by the JWKS key, the exact payload (keys, order, values) for its kind, nbf = iat
	// near now, exp - iat = life, the response's kid, jti and expiry, and one audit line that
	// names owner, jti and expiry and holds no token.
	sign := func(t *testing.T, req *signerv1.SignServiceCredentialRequest, wantExp func(iat int64) int64) bearerParts {
		t.Helper()
		before := time.Now().Unix()
		lines := len(auditRecords(t, s.AuditPath))
		resp, err := authd.SignServiceCredential(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		after := time.Now().Unix()
		secrets.wantNoSecret(t, resp)
		p := splitBearer(t, resp.GetToken())
		typ, aud, use, note := "cotal-service-access+jwt", req.GetSpace(), `"duty":"serve"`, "service-access"
		if req.GetKind() == renewal {
			typ, aud, use, note = "cotal-service-renewal+jwt", "urn:cotal:service-renewal:"+req.GetSpace(), `"use":"renew"`, "service-renewal"
		}
		if want := `{"alg":"EdDSA","kid":"` + jwk.GetKid() + `","typ":"` + typ + `"}`; string(p.header) != want {
			t.Fatalf("header %s, want %s", p.header, want)
		}
		if resp.GetKid() != jwk.GetKid() {
			t.Fatalf("kid = %q, JWKS kid %q", resp.GetKid(), jwk.GetKid())
		}
		if !ed25519.Verify(pub, []byte(p.signingInput), p.sig) {
			t.Fatal("token signature does not verify with the JWKS key")
		}
		iat, exp := p.num(t, "iat"), p.num(t, "exp")
		jti, _ := p.claims["jti"].(string)
		want := `{"iss":"urn:cotal:service-access:` + req.GetSpace() + `","aud":"` + aud + `","sub":"` + req.GetOwner() + `",` + use +
			`,"wit":"` + req.GetWitness() + `","ep":"` + req.GetEndpoint() + `","iid":"` + req.GetInstanceId() + `","root":"` + req.GetRoot() +
			`","ver":1,"iat":` + strconv.FormatInt(iat, 10) + `,"nbf":` + strconv.FormatInt(iat, 10) + `,"exp":` + strconv.FormatInt(exp, 10) +
			`,"jti":"` + jti + `"}`
		if string(p.payload) != want {
			t.Fatalf("payload\n %s\nwant\n %s", p.payload, want)
		}
		if iat < before || iat > after || exp != wantExp(iat) || resp.GetExpiresAt().AsTime().Unix() != exp || resp.GetExpiresAt().AsTime().Nanosecond() != 0 {
			t.Fatalf("iat %d exp %d (response %v), want iat in [%d,%d] and exp %d", iat, exp, resp.GetExpiresAt().AsTime(), before, after, wantExp(iat))
		}
		if raw, err := b32.DecodeString(jti); err != nil || len(raw) != 16 || len(jti) != 26 || resp.GetJti() != jti {
			t.Fatalf("jti %q (response %q) is not 16 bytes of lowercase base32", jti, resp.GetJti())
		}
		recs := auditRecords(t, s.AuditPath)
		if len(recs) != lines+1 {
			t.Fatalf("audit grew by %d lines, want 1", len(recs)-lines)
		}
		r := recs[len(recs)-1]
		if r.Decision != audit.Granted || r.RPC != "SignServiceCredential" || r.Caller != authdAlpha || r.Space != req.GetSpace() ||
			r.Subject != req.GetOwner() || r.JTI != jti || r.Expiry.Unix() != exp || r.Reason != note || r.Profile != "" {
			t.Fatalf("audit line %+v, want a %s grant naming owner %s, jti %s and expiry %d", r, note, req.GetOwner(), jti, exp)
		}
		return p
	}
	life := func(d time.Duration) func(int64) int64 {
		return func(iat int64) int64 { return iat + int64(d/time.Second) }
	}

	t.Run("ok/access", func(t *testing.T) { sign(t, svcReq(access, nil), life(30*time.Second)) })
	t.Run("ok/renewal", func(t *testing.T) {
		sign(t, svcReq(renewal, func(r *signerv1.SignServiceCredentialRequest) { r.Ttl = durationpb.New(time.Hour) }), life(time.Hour))
	})
	t.Run("ok/access-capped-at-60s", func(t *testing.T) {
		sign(t, svcReq(access, func(r *signerv1.SignServiceCredentialRequest) { r.Ttl = durationpb.New(61 * time.Second) }), life(60*time.Second))
	})
	t.Run("ok/access-long-ttl-capped-at-60s", func(t *testing.T) {
		sign(t, svcReq(access, func(r *signerv1.SignServiceCredentialRequest) { r.Ttl = durationpb.New(24 * time.Hour) }), life(60*time.Second))
	})
	t.Run("ok/renewal-capped-at-24h", func(t *testing.T) {
		sign(t, svcReq(renewal, func(r *signerv1.SignServiceCredentialRequest) { r.Ttl = durationpb.New(25 * time.Hour) }), life(24*time.Hour))
	})
	t.Run("ok/ttl-whole-seconds", func(t *testing.T) {
		sign(t, svcReq(access, func(r *signerv1.SignServiceCredentialRequest) {
			r.Ttl = durationpb.New(10*time.Second + 900*time.Millisecond)
		}), life(10*time.Second))
	})
	t.Run("ok/access-capped-by-not-after", func(t *testing.T) {
		na := time.Now().Add(20*time.Second + 500*time.Millisecond)
		sign(t, svcReq(access, func(r *signerv1.SignServiceCredentialRequest) {
			r.Ttl, r.NotAfter = durationpb.New(60*time.Second), timestamppb.New(na)
		}), func(int64) int64 { return na.Unix() })
	})
	t.Run("ok/renewal-capped-by-not-after", func(t *testing.T) {
		na := time.Now().Add(2 * time.Hour)
		sign(t, svcReq(renewal, func(r *signerv1.SignServiceCredentialRequest) {
			r.Ttl, r.NotAfter = durationpb.New(24*time.Hour), timestamppb.New(na)
		}), func(int64) int64 { return na.Unix() })
	})
	t.Run("ok/distinct-jti", func(t *testing.T) {
		seen := map[any]bool{}
		for range 5 {
			p := sign(t, svcReq(access, nil), life(30*time.Second))
			if seen[p.claims["jti"]] {
				t.Fatalf("jti %v issued twice", p.claims["jti"])
			}
			seen[p.claims["jti"]] = true
		}
	})
	t.Run("ok/kinds-are-distinct-tokens", func(t *testing.T) {
		// The same registration signed as both kinds: different typ and aud, so no verifier of
		// one kind (typ exact, aud exact) can take the other.
		a := sign(t, svcReq(access, nil), life(30*time.Second))
		r := sign(t, svcReq(renewal, nil), life(30*time.Second))
		if string(a.header) == string(r.header) || a.claims["aud"] == r.claims["aud"] {
			t.Fatalf("access %s %v and renewal %s %v share a header or audience", a.header, a.claims["aud"], r.header, r.claims["aud"])
		}
	})

	signAs := func(id string, kind signerv1.ServiceCredentialKind, edit func(r *signerv1.SignServiceCredentialRequest)) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, id).SignServiceCredential(ctxT(t), svcReq(kind, edit))
		}
	}
	bad := func(name string, edit func(r *signerv1.SignServiceCredentialRequest), spaceName string) rpcCase {
		return rpcCase{name: "fail/" + name, call: signAs(authdAlpha, access, edit), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(authdAlpha, "SignServiceCredential", spaceName, "", "invalid-argument")}
	}
	badTTL := func(name string, kind signerv1.ServiceCredentialKind, edit func(r *signerv1.SignServiceCredentialRequest)) rpcCase {
		return rpcCase{name: "fail/" + name, call: signAs(authdAlpha, kind, edit), code: codes.InvalidArgument, reason: "TTL_INVALID",
			audit: denied(authdAlpha, "SignServiceCredential", "alpha", "", "ttl-invalid")}
	}
	ttl := func(d *durationpb.Duration) func(r *signerv1.SignServiceCredentialRequest) {
		return func(r *signerv1.SignServiceCredentialRequest) { r.Ttl = d }
	}
	notAfter := func(ts *timestamppb.Timestamp) func(r *signerv1.SignServiceCredentialRequest) {
		return func(r *signerv1.SignServiceCredentialRequest) { r.NotAfter = ts }
	}
	// lastChar replaces the last character of id: for a witness or root, whose last base32
	// character carries unused zero bits, "b" sets one of them.
	lastChar := func(id, c string) string { return id[:len(id)-1] + c }
	cases := []rpcCase{
		bad("space-empty", func(r *signerv1.SignServiceCredentialRequest) { r.Space = "" }, ""),
		bad("space-grammar", func(r *signerv1.SignServiceCredentialRequest) { r.Space = " alpha" }, ""),
		bad("kind-unspecified", func(r *signerv1.SignServiceCredentialRequest) { r.Kind = 0 }, "alpha"),
		bad("kind-unknown", func(r *signerv1.SignServiceCredentialRequest) { r.Kind = 3 }, "alpha"),
		bad("owner-empty", func(r *signerv1.SignServiceCredentialRequest) { r.Owner = "" }, "alpha"),
		bad("owner-not-derived", func(r *signerv1.SignServiceCredentialRequest) { r.Owner = "alice" }, "alpha"),
		bad("owner-upper-case", func(r *signerv1.SignServiceCredentialRequest) { r.Owner = "u_ABCDEFGHIJKLMNOPQRSTUVWXYZ" }, "alpha"),
		bad("witness-empty", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = "" }, "alpha"),
		bad("witness-no-prefix", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = svcWitness[2:] }, "alpha"),
		bad("witness-root-prefix", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = "r_" + svcWitness[2:] }, "alpha"),
		bad("witness-short", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = svcWitness[:len(svcWitness)-1] }, "alpha"),
		bad("witness-long", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = svcWitness + "a" }, "alpha"),
		bad("witness-upper-case", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = "w_" + strings.ToUpper(svcWitness[2:]) }, "alpha"),
		bad("witness-padded", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = svcWitness[:len(svcWitness)-4] + "====" }, "alpha"),
		bad("witness-non-canonical", func(r *signerv1.SignServiceCredentialRequest) { r.Witness = lastChar(svcWitness, "b") }, "alpha"),
		bad("endpoint-empty", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = "" }, "alpha"),
		bad("endpoint-upper-case", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = "Billing" }, "alpha"),
		bad("endpoint-empty-label", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = "billing..api" }, "alpha"),
		bad("endpoint-underscore", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = "billing_api" }, "alpha"),
		bad("endpoint-wildcard", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = "billing.*" }, "alpha"),
		bad("endpoint-long", func(r *signerv1.SignServiceCredentialRequest) { r.Endpoint = strings.Repeat("a", 65) }, "alpha"),
		bad("instance-empty", func(r *signerv1.SignServiceCredentialRequest) { r.InstanceId = "" }, "alpha"),
		bad("instance-short", func(r *signerv1.SignServiceCredentialRequest) { r.InstanceId = "abc" }, "alpha"),
		bad("instance-upper-case", func(r *signerv1.SignServiceCredentialRequest) { r.InstanceId = strings.ToUpper(svcIID) }, "alpha"),
		bad("root-empty", func(r *signerv1.SignServiceCredentialRequest) { r.Root = "" }, "alpha"),
		bad("root-no-prefix", func(r *signerv1.SignServiceCredentialRequest) { r.Root = svcRoot[2:] }, "alpha"),
		bad("root-proposal-prefix", func(r *signerv1.SignServiceCredentialRequest) { r.Root = "p_" + svcRoot[2:] }, "alpha"),
		bad("root-short", func(r *signerv1.SignServiceCredentialRequest) { r.Root = svcRoot[:len(svcRoot)-1] }, "alpha"),
		bad("root-long", func(r *signerv1.SignServiceCredentialRequest) { r.Root = svcRoot + "a" }, "alpha"),
		bad("root-upper-case", func(r *signerv1.SignServiceCredentialRequest) { r.Root = "r_" + strings.ToUpper(svcRoot[2:]) }, "alpha"),
		bad("root-non-canonical", func(r *signerv1.SignServiceCredentialRequest) { r.Root = lastChar(svcRoot, "b") }, "alpha"),
		bad("not-after-missing", notAfter(nil), "alpha"),
		badTTL("ttl-missing", access, ttl(nil)),
		badTTL("ttl-zero", access, ttl(durationpb.New(0))),
		badTTL("ttl-negative", access, ttl(durationpb.New(-time.Second))),
		badTTL("renewal-ttl-negative", renewal, ttl(durationpb.New(-time.Hour))),
		badTTL("ttl-sub-second", access, ttl(durationpb.New(500*time.Millisecond))),
		badTTL("ttl-malformed", access, ttl(&durationpb.Duration{Seconds: 1, Nanos: -1})),
		badTTL("not-after-past", access, notAfter(timestamppb.New(time.Now().Add(-time.Second)))),
		badTTL("renewal-not-after-past", renewal, notAfter(timestamppb.New(time.Now().Add(-time.Hour)))),
		badTTL("not-after-epoch", access, notAfter(&timestamppb.Timestamp{})),
		badTTL("not-after-malformed", access, notAfter(&timestamppb.Timestamp{Seconds: 1, Nanos: -1})),
		{name: "fail/rpc-not-allowed", call: signAs(managerAlpha, access, nil), code: codes.PermissionDenied, reason: "RPC_NOT_ALLOWED",
			audit: denied(managerAlpha, "SignServiceCredential", "alpha", "", "rpc-not-allowed")},
		{name: "fail/deliveryd-rpc-not-allowed", call: signAs(signerdtest.ID("deliveryd", "alpha"), renewal, nil), code: codes.PermissionDenied,
			reason: "RPC_NOT_ALLOWED", audit: denied(signerdtest.ID("deliveryd", "alpha"), "SignServiceCredential", "alpha", "", "rpc-not-allowed")},
		{name: "fail/space-not-allowed", call: signAs(authdAlpha, access, func(r *signerv1.SignServiceCredentialRequest) { r.Space = "beta" }),
			code: codes.PermissionDenied, reason: "SPACE_NOT_ALLOWED", audit: denied(authdAlpha, "SignServiceCredential", "beta", "", "space-not-allowed")},
		{name: "fail/unknown-caller", call: signAs(stranger, access, nil), code: codes.PermissionDenied, reason: "CALLER_UNKNOWN",
			audit: denied(stranger, "SignServiceCredential", "alpha", "", "caller-unknown")},
		{name: "fail/unknown-space", call: signAs(authdGamma, access, func(r *signerv1.SignServiceCredentialRequest) { r.Space = "gamma" }),
			code: codes.NotFound, reason: "UNKNOWN_SPACE", audit: denied(authdGamma, "SignServiceCredential", "gamma", "", "unknown-space")},
	}
	runCases(t, s, cases)
	t.Run("fail/not-after-within-the-second", func(t *testing.T) {
		// A not_after less than a whole second ahead leaves exp = iat: refused, never a token
		// that outlives it.
		_, err := authd.SignServiceCredential(ctxT(t), svcReq(access, notAfter(timestamppb.New(time.Now()))))
		wantRefusal(t, err, codes.InvalidArgument, "TTL_INVALID")
	})
	t.Run("ok/refusal-audit-subject", func(t *testing.T) {
		// A refused request's line names the owner only when it is well formed.
		_, err := authd.SignServiceCredential(ctxT(t), svcReq(access, func(r *signerv1.SignServiceCredentialRequest) { r.Owner = "u_<script>" }))
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		if r := lastAudit(t, s); r.Subject != "" || r.RPC != "SignServiceCredential" {
			t.Fatalf("refused line %+v carries a subject", r)
		}
		_, err = authd.SignServiceCredential(ctxT(t), svcReq(access, func(r *signerv1.SignServiceCredentialRequest) { r.Root = "" }))
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		if r := lastAudit(t, s); r.Subject != derivedOwner {
			t.Fatalf("refused line carries subject %q, want %s", r.Subject, derivedOwner)
		}
	})
	t.Run("audit/chain-verifies-and-holds-no-token", func(t *testing.T) {
		// verifyAudit refuses any "eyJ" (every JWT starts with it) and anything seed-shaped.
		sum := verifyAudit(t, s.AuditPath)
		if sum.Lines != len(auditRecords(t, s.AuditPath)) {
			t.Fatalf("Verify saw %d lines", sum.Lines)
		}
	})
}

// TestSignServiceCredentialRateLimited: SignServiceCredential is charged to the caller's rate
// like every RPC: past the burst it is refused RESOURCE_EXHAUSTED before the request is read,
// and the refusal is counted rather than audited on a line of its own.
func TestSignServiceCredentialRateLimited(t *testing.T) {
	const burst = 3
	policy := fmt.Sprintf(`version: 1
callers:
  - id: spiffe://cotal.local/authd/{space}
    rpcs: [SignServiceCredential]
    spaces: ["{space}"]
    rate: {per_second: 0.0001, burst: %d}
`, burst)
	s := signerdtest.Start(t, signerdtest.Options{Policy: policy})
	authd := dialAs(t, s, authdAlpha)
	for i := range burst {
		if _, err := authd.SignServiceCredential(ctxT(t), svcReq(access, nil)); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	lines := len(auditRecords(t, s.AuditPath))
	resp, err := authd.SignServiceCredential(ctxT(t), svcReq(access, nil))
	wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	wantNoCredential(t, resp)
	if got := len(auditRecords(t, s.AuditPath)); got != lines {
		t.Fatalf("a refusal past the rate wrote %d audit lines", got-lines)
	}
}

// serviceGrant is the grant authd's callout makes on a verified access bearer: service-serve
// for the bearer's owner, endpoint and instance, until the bearer's exp.
func serviceGrant(expires time.Time) *signerv1.CalloutGrant {
	return &signerv1.CalloutGrant{
		Profile:   signerv1.Profile_PROFILE_SERVICE_SERVE,
		Params:    &signerv1.ProfileParams{Owner: derivedOwner, ServiceEndpoint: svcEp, InstanceId: svcIID},
		ExpiresAt: timestamppb.New(expires),
	}
}

// TestServiceServeGrant: service-serve (issue 24 item 6) is minted only through
// SignCalloutResponse's grant. The user JWT holds exactly the instance's serve subscription and
// reply publication, no inbox whatever the connection name, lives until the grant's expires_at
// (the bearer's exp) and never past 60 s; Mint refuses the profile, and a grant's parameters
// must fit it.
func TestServiceServeGrant(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	authd := dialAs(t, s, authdAlpha)
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	srv := newForgedServer(t)
	const (
		serve = "cotal.alpha.sep.billing_api-v2." + svcIID + ".>"
		reply = "cotal.alpha.sep.reply.billing_api-v2." + svcIID + ".>"
	)
	grantFor := func(t *testing.T, connName string, g *signerv1.CalloutGrant) (*jwt.UserClaims, string) {
		t.Helper()
		sealed, user := srv.request(t, gs, connName, nil)
		resp, err := authd.SignCalloutResponse(ctxT(t), &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed,
			ServerXkey: srv.xkey, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: g}})
		if err != nil {
			t.Fatal(err)
		}
		rc := srv.openResponse(t, gs, resp.GetSealedResponse())
		uc, err := jwt.DecodeUserClaims(rc.Jwt)
		if err != nil {
			t.Fatal(err)
		}
		if uc.Subject != user || uc.IssuerAccount != gs.GetAccountPublicKey() || uc.ID != resp.GetUserJti() {
			t.Fatalf("user JWT = {sub %s issuer_account %s jti %s}, want %s in %s, jti %s", uc.Subject, uc.IssuerAccount, uc.ID, user, gs.GetAccountPublicKey(), resp.GetUserJti())
		}
		if !slices.Equal(uc.Sub.Allow, []string{serve}) || !slices.Equal(uc.Pub.Allow, []string{reply}) ||
			len(uc.Sub.Deny)+len(uc.Pub.Deny) != 0 || uc.Resp != nil || uc.BearerToken {
			t.Fatalf("user JWT permissions pub %+v sub %+v resp %v bearer %v, want only %s and %s", uc.Pub, uc.Sub, uc.Resp, uc.BearerToken, serve, reply)
		}
		principal := derivedOwner + ".svc_" + svcIID
		if uc.Name != derivedOwner+"-svc_"+svcIID || !slices.Contains(uc.Tags, "principal:"+principal) || !slices.Contains(uc.Tags, "profile:service-serve") {
			t.Fatalf("user JWT name %q tags %v, want principal %s", uc.Name, uc.Tags, principal)
		}
		r := lastAudit(t, s)
		if r.Decision != audit.Granted || r.RPC != "SignCalloutResponse" || r.Profile != "service-serve" || r.JTI != uc.ID || r.Expiry.Unix() != uc.Expires {
			t.Fatalf("audit line %+v, want a service-serve grant of jti %s until %d", r, uc.ID, uc.Expires)
		}
		return uc, user
	}

	t.Run("ok/expires-with-the-bearer", func(t *testing.T) {
		expires := time.Now().Add(45 * time.Second)
		uc, _ := grantFor(t, "any-connection-name", serviceGrant(expires))
		if uc.Expires > expires.Unix() || uc.Expires < expires.Unix()-1 {
			t.Fatalf("exp %d, want the grant's expires_at %d", uc.Expires, expires.Unix())
		}
	})
	t.Run("ok/capped-at-60s", func(t *testing.T) {
		uc, _ := grantFor(t, "svc", serviceGrant(time.Now().Add(10*time.Minute)))
		if life := uc.Expires - uc.IssuedAt; life > 60 || life < 58 {
			t.Fatalf("lifetime %d s, want the 60 s profile cap", life)
		}
	})
	t.Run("ok/connection-name-grants-no-inbox", func(t *testing.T) {
		// A nonce bound to the granted principal, or to another, still yields no inbox row
		// (grantFor checks the subscribe list is the serve family alone).
		grantFor(t, boundNonce(derivedOwner, "svc_"+svcIID), serviceGrant(time.Now().Add(30*time.Second)))
		grantFor(t, boundNonce("o1", "a1"), serviceGrant(time.Now().Add(30*time.Second)))
	})

	valid := func() []byte { return firstOf(srv.request(t, gs, "svc", nil)) }
	withParams := func(edit func(p *signerv1.ProfileParams)) *signerv1.CalloutGrant {
		g := serviceGrant(time.Now().Add(30 * time.Second))
		edit(g.Params)
		return g
	}
	for _, tc := range []struct {
		name  string
		grant *signerv1.CalloutGrant
	}{
		{"fail/owner-not-derived", withParams(func(p *signerv1.ProfileParams) { p.Owner = "local" })},
		{"fail/no-endpoint", withParams(func(p *signerv1.ProfileParams) { p.ServiceEndpoint = "" })},
		{"fail/no-instance", withParams(func(p *signerv1.ProfileParams) { p.InstanceId = "" })},
		{"fail/endpoint-wildcard", withParams(func(p *signerv1.ProfileParams) { p.ServiceEndpoint = "billing.>" })},
		{"fail/instance-wildcard", withParams(func(p *signerv1.ProfileParams) { p.InstanceId = "*" })},
		{"fail/actor-given", withParams(func(p *signerv1.ProfileParams) { p.Actor = "svc_" + svcIID })},
		{"fail/channels-given", withParams(func(p *signerv1.ProfileParams) { p.AllowSubscribe = []string{"general"} })},
		{"fail/agent-with-endpoint", &signerv1.CalloutGrant{Profile: signerv1.Profile_PROFILE_AGENT,
			Params:    &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, ServiceEndpoint: svcEp},
			ExpiresAt: timestamppb.New(time.Now().Add(time.Minute))}},
		{"fail/agent-with-instance", &signerv1.CalloutGrant{Profile: signerv1.Profile_PROFILE_AGENT,
			Params:    &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, InstanceId: svcIID},
			ExpiresAt: timestamppb.New(time.Now().Add(time.Minute))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := authd.SignCalloutResponse(ctxT(t), &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: valid(),
				ServerXkey: srv.xkey, Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: tc.grant}})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantNoCredential(t, resp)
		})
	}
	t.Run("fail/mint", func(t *testing.T) {
		_, pub := newUser(t)
		resp, err := authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_SERVICE_SERVE, UserPublicKey: pub,
			Params: &signerv1.ProfileParams{Owner: derivedOwner, ServiceEndpoint: svcEp, InstanceId: svcIID}})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantNoCredential(t, resp)
		if r := lastAudit(t, s); r.RPC != "Mint" || r.Decision != audit.Denied || r.Profile != "service-serve" {
			t.Fatalf("audit line %+v, want a denied service-serve Mint", r)
		}
	})
	t.Run("fail/mint-by-manager", func(t *testing.T) {
		_, pub := newUser(t)
		_, err := dialAs(t, s, managerAlpha).Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_SERVICE_SERVE,
			UserPublicKey: pub, Params: &signerv1.ProfileParams{Owner: derivedOwner, ServiceEndpoint: svcEp, InstanceId: svcIID}})
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
	})
}
