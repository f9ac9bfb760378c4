package server_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

var (
	authdAlpha = signerdtest.ID("authd", "alpha")
	authdBeta  = signerdtest.ID("authd", "beta")
	authdGamma = signerdtest.ID("authd", "gamma")
	stranger   = "spiffe://cotal.local/stranger/alpha"
)

// testIdP is the IdP issuer the tests derive owners under.
const testIdP = "https://idp.example.com"

// harnessSecrets are the secret values of one space of a test signerd, read from its signer
// directory; the tests compute known answers with them and assert that no response carries them.
type harnessSecrets struct {
	ownerSecret, macKey []byte
	issuer              ed25519.PrivateKey
}

func readHarnessSecrets(t *testing.T, s *signerdtest.Signer, name string) harnessSecrets {
	t.Helper()
	path := func(file string) string {
		return keystore.SecretPath(filepath.Join(s.Dir, setup.SignerDir), name, file, false)
	}
	b64 := func(file string) []byte {
		t.Helper()
		data, err := os.ReadFile(path(file))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
		if err != nil || len(raw) != keystore.SecretLen {
			t.Fatalf("%s: not %d bytes of base64", path(file), keystore.SecretLen)
		}
		return raw
	}
	data, err := os.ReadFile(path(keystore.FileIssuer))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path(keystore.FileIssuer))
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		t.Fatalf("%s: not an Ed25519 key", path(keystore.FileIssuer))
	}
	return harnessSecrets{ownerSecret: b64(keystore.FileOwnerSecret), macKey: b64(keystore.FileMACKey), issuer: priv}
}

// wantNoSecret fails if the wire form of resp holds any of the space's secrets, raw, hex or
// base64 (standard or URL alphabet).
func (h harnessSecrets) wantNoSecret(t *testing.T, resp proto.Message) {
	t.Helper()
	wire, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	for name, secret := range map[string][]byte{"owner secret": h.ownerSecret, "MAC key": h.macKey, "issuer seed": h.issuer.Seed()} {
		for _, form := range [][]byte{secret, []byte(hex.EncodeToString(secret)),
			[]byte(base64.StdEncoding.EncodeToString(secret)[:40]), []byte(base64.RawURLEncoding.EncodeToString(secret)[:40])} {
			if bytes.Contains(wire, form) {
				t.Fatalf("response carries the %s", name)
			}
		}
	}
}

// lastAudit returns the last audit line.
func lastAudit(t *testing.T, s *signerdtest.Signer) audit.Record {
	t.Helper()
	recs := auditRecords(t, s.AuditPath)
	if len(recs) == 0 {
		t.Fatal("audit log is empty")
	}
	return recs[len(recs)-1]
}

// wantGrantLine asserts the last audit line is a grant of rpc in alpha to authd with subject and
// no token id (DeriveOwner, Mac and GetJWKS issue nothing).
func wantGrantLine(t *testing.T, s *signerdtest.Signer, rpc, subject string) {
	t.Helper()
	r := lastAudit(t, s)
	if r.Decision != audit.Granted || r.Caller != authdAlpha || r.RPC != rpc || r.Space != "alpha" || r.Subject != subject ||
		r.JTI != "" || !r.Expiry.IsZero() || r.Reason != "" {
		t.Fatalf("audit line = %+v, want a plain %s grant for %q", r, rpc, subject)
	}
}

// refOwner computes an owner id from an HMAC input, independently of the keystore.
func refOwner(secret, msg []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	return "u_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(m.Sum(nil)[:16]))
}

// nodeVector is one IdP identity and the bytes Node's JSON.stringify made of it.
type nodeVector struct {
	Issuer, Subject string
	Message         []byte
}

// nodeVectors reads the keystore's Node-generated owner vectors: the exact bytes Node's
// JSON.stringify produced for each identity, so an owner can be recomputed under any secret.
func nodeVectors(t *testing.T) []nodeVector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "keystore", "testdata", "owner-vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Issuer     string `json:"issuer"`
			Subject    string `json:"subject"`
			MessageHex string `json:"message_hex"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var out []nodeVector
	for _, v := range file.Vectors {
		msg, err := hex.DecodeString(v.MessageHex)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, nodeVector{Issuer: v.Issuer, Subject: v.Subject, Message: msg})
	}
	if len(out) == 0 {
		t.Fatal("no owner vectors")
	}
	return out
}

func TestDeriveOwner(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	authd := dialAs(t, s, authdAlpha)
	secrets := readHarnessSecrets(t, s, "alpha")

	for i, v := range nodeVectors(t) {
		t.Run(fmt.Sprintf("ok/node-vector-%02d", i), func(t *testing.T) {
			want := refOwner(secrets.ownerSecret, v.Message)
			for range 2 {
				resp, err := authd.DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: "alpha", IdpIssuer: v.Issuer, Subject: v.Subject})
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetOwner() != want {
					t.Fatalf("owner = %s, want %s (Node's JSON under the harness secret)", resp.GetOwner(), want)
				}
				secrets.wantNoSecret(t, resp)
			}
			if err := space.ValidateDerivedOwner(want); err != nil {
				t.Fatal(err)
			}
			wantGrantLine(t, s, "DeriveOwner", want)
		})
	}
	t.Run("ok/differs-between-spaces", func(t *testing.T) {
		a, err := authd.DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: "alpha", IdpIssuer: testIdP, Subject: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := dialAs(t, s, authdBeta).DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: "beta", IdpIssuer: testIdP, Subject: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if a.GetOwner() == b.GetOwner() || space.ValidateDerivedOwner(b.GetOwner()) != nil {
			t.Fatalf("alpha %s, beta %s: want two distinct derived owners", a.GetOwner(), b.GetOwner())
		}
	})

	derive := func(id, spaceName, iss, sub string) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, id).DeriveOwner(ctxT(t), &signerv1.DeriveOwnerRequest{Space: spaceName, IdpIssuer: iss, Subject: sub})
		}
	}
	long := strings.Repeat("x", keystore.MaxOwnerInputBytes+1)
	runCases(t, s, []rpcCase{
		{name: "fail/empty-issuer", call: derive(authdAlpha, "alpha", "", "alice"), code: codes.InvalidArgument,
			reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "DeriveOwner", "alpha", "", "invalid-argument")},
		{name: "fail/empty-subject", call: derive(authdAlpha, "alpha", testIdP, ""), code: codes.InvalidArgument,
			reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "DeriveOwner", "alpha", "", "invalid-argument")},
		{name: "fail/oversize-issuer", call: derive(authdAlpha, "alpha", long, "alice"), code: codes.InvalidArgument,
			reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "DeriveOwner", "alpha", "", "invalid-argument")},
		{name: "fail/oversize-subject", call: derive(authdAlpha, "alpha", testIdP, long), code: codes.InvalidArgument,
			reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "DeriveOwner", "alpha", "", "invalid-argument")},
		{name: "fail/bad-space", call: derive(authdAlpha, "", testIdP, "alice"), code: codes.InvalidArgument,
			reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "DeriveOwner", "", "", "invalid-argument")},
		{name: "fail/rpc-not-allowed", call: derive(managerAlpha, "alpha", testIdP, "alice"), code: codes.PermissionDenied,
			reason: "RPC_NOT_ALLOWED", audit: denied(managerAlpha, "DeriveOwner", "alpha", "", "rpc-not-allowed")},
		{name: "fail/space-not-allowed", call: derive(authdAlpha, "beta", testIdP, "alice"), code: codes.PermissionDenied,
			reason: "SPACE_NOT_ALLOWED", audit: denied(authdAlpha, "DeriveOwner", "beta", "", "space-not-allowed")},
		{name: "fail/unknown-caller", call: derive(stranger, "alpha", testIdP, "alice"), code: codes.PermissionDenied,
			reason: "CALLER_UNKNOWN", audit: denied(stranger, "DeriveOwner", "alpha", "", "caller-unknown")},
		{name: "fail/unknown-space", call: derive(authdGamma, "gamma", testIdP, "alice"), code: codes.NotFound,
			reason: "UNKNOWN_SPACE", audit: denied(authdGamma, "DeriveOwner", "gamma", "", "unknown-space")},
	})

	t.Run("audit/no-idp-subject", func(t *testing.T) {
		verifyAudit(t, s.AuditPath)
		data, err := os.ReadFile(s.AuditPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, pii := range []string{"alice", "idp.example.com"} {
			if bytes.Contains(data, []byte(pii)) {
				t.Fatalf("audit log holds the IdP identity %q", pii)
			}
		}
	})
}

func TestMac(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	secrets := readHarnessSecrets(t, s, "alpha")
	known := func(payload []byte) string {
		m := hmac.New(sha256.New, secrets.macKey)
		m.Write([]byte("cotal/manager-current-registration/v1\x00"))
		m.Write(payload)
		return "sha256:" + hex.EncodeToString(m.Sum(nil))
	}
	reg := signerv1.MacDomain_MAC_DOMAIN_MANAGER_CURRENT_REGISTRATION
	payload := []byte(`{"v":1,"kind":"manager-current-registration","space":"alpha","owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa"}`)

	for _, p := range []struct {
		name    string
		payload []byte
	}{{"ok/registration", payload}, {"ok/max-payload", bytes.Repeat([]byte{'p'}, keystore.MaxMacPayloadBytes)}} {
		t.Run(p.name, func(t *testing.T) {
			resp, err := dialAs(t, s, authdAlpha).Mac(ctxT(t), &signerv1.MacRequest{Space: "alpha", Domain: reg, Payload: p.payload})
			if err != nil {
				t.Fatal(err)
			}
			if want := known(p.payload); resp.GetMac() != want {
				t.Fatalf("mac = %s, want %s", resp.GetMac(), want)
			}
			secrets.wantNoSecret(t, resp)
			wantGrantLine(t, s, "Mac", "")
		})
	}

	mac := func(id, spaceName string, domain signerv1.MacDomain, payload []byte) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, id).Mac(ctxT(t), &signerv1.MacRequest{Space: spaceName, Domain: domain, Payload: payload})
		}
	}
	runCases(t, s, []rpcCase{
		{name: "fail/unspecified-domain", call: mac(authdAlpha, "alpha", signerv1.MacDomain_MAC_DOMAIN_UNSPECIFIED, payload),
			code: codes.PermissionDenied, reason: "MAC_DOMAIN_NOT_ALLOWED", audit: denied(authdAlpha, "Mac", "alpha", "", "mac-domain-not-allowed")},
		{name: "fail/unknown-domain", call: mac(authdAlpha, "alpha", signerv1.MacDomain(7), payload),
			code: codes.PermissionDenied, reason: "MAC_DOMAIN_NOT_ALLOWED", audit: denied(authdAlpha, "Mac", "alpha", "", "mac-domain-not-allowed")},
		{name: "fail/empty-payload", call: mac(authdAlpha, "alpha", reg, nil),
			code: codes.InvalidArgument, reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "Mac", "alpha", "", "invalid-argument")},
		{name: "fail/oversize-payload", call: mac(authdAlpha, "alpha", reg, bytes.Repeat([]byte{'p'}, keystore.MaxMacPayloadBytes+1)),
			code: codes.InvalidArgument, reason: "INVALID_ARGUMENT", audit: denied(authdAlpha, "Mac", "alpha", "", "invalid-argument")},
		{name: "fail/rpc-not-allowed", call: mac(managerAlpha, "alpha", reg, payload),
			code: codes.PermissionDenied, reason: "RPC_NOT_ALLOWED", audit: denied(managerAlpha, "Mac", "alpha", "", "rpc-not-allowed")},
		{name: "fail/space-not-allowed", call: mac(authdAlpha, "beta", reg, payload),
			code: codes.PermissionDenied, reason: "SPACE_NOT_ALLOWED", audit: denied(authdAlpha, "Mac", "beta", "", "space-not-allowed")},
		{name: "fail/unknown-space", call: mac(authdGamma, "gamma", reg, payload),
			code: codes.NotFound, reason: "UNKNOWN_SPACE", audit: denied(authdGamma, "Mac", "gamma", "", "unknown-space")},
	})
	t.Run("ok/differs-between-spaces", func(t *testing.T) {
		a, err1 := dialAs(t, s, authdAlpha).Mac(ctxT(t), &signerv1.MacRequest{Space: "alpha", Domain: reg, Payload: payload})
		b, err2 := dialAs(t, s, authdBeta).Mac(ctxT(t), &signerv1.MacRequest{Space: "beta", Domain: reg, Payload: payload})
		if err1 != nil || err2 != nil || a.GetMac() == b.GetMac() {
			t.Fatalf("alpha %s, beta %s (%v, %v): want two distinct MACs", a.GetMac(), b.GetMac(), err1, err2)
		}
	})
}

// bearerParts splits and decodes a compact JWS.
type bearerParts struct {
	header, payload []byte
	signingInput    string
	sig             []byte
	claims          map[string]any
}

func splitBearer(t *testing.T, token string) bearerParts {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("bearer has %d parts, want 3", len(parts))
	}
	var p bearerParts
	var err error
	if p.header, err = base64.RawURLEncoding.DecodeString(parts[0]); err != nil {
		t.Fatal(err)
	}
	if p.payload, err = base64.RawURLEncoding.DecodeString(parts[1]); err != nil {
		t.Fatal(err)
	}
	if p.sig, err = base64.RawURLEncoding.DecodeString(parts[2]); err != nil {
		t.Fatal(err)
	}
	p.signingInput = parts[0] + "." + parts[1]
	dec := json.NewDecoder(bytes.NewReader(p.payload))
	dec.UseNumber()
	if err := dec.Decode(&p.claims); err != nil {
		t.Fatalf("bearer payload: %v", err)
	}
	return p
}

func (p bearerParts) num(t *testing.T, name string) int64 {
	t.Helper()
	n, ok := p.claims[name].(json.Number)
	if !ok {
		t.Fatalf("claim %s = %v, want a number", name, p.claims[name])
	}
	v, err := n.Int64()
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	return v
}

// derivedOwner is a well-formed derived owner for bearer requests.
const derivedOwner = "u_abcdefghijklmnopqrstuvwxyz"

func bearerReq(edit func(r *signerv1.SignBearerRequest)) *signerv1.SignBearerRequest {
	r := &signerv1.SignBearerRequest{Space: "alpha", Owner: derivedOwner, Actor: "bot", Ttl: durationpb.New(10 * time.Minute)}
	if edit != nil {
		edit(r)
	}
	return r
}

func TestSignBearer(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	authd := dialAs(t, s, authdAlpha)
	secrets := readHarnessSecrets(t, s, "alpha")
	pub := secrets.issuer.Public().(ed25519.PublicKey)
	x := base64.RawURLEncoding.EncodeToString(pub)
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	kid := base64.RawURLEncoding.EncodeToString(sum[:])

	// sign issues a bearer and checks what every bearer must be: the fixed header, a signature by
	// the issuer key, iss/aud/sub, ver 1, nbf = iat near now, exp-iat = ttl, the response's kid
	// and expiry, top-level scope equal to act.scope, and a 128-bit jti.
	sign := func(t *testing.T, req *signerv1.SignBearerRequest, ttl time.Duration) bearerParts {
		t.Helper()
		before := time.Now().Unix()
		resp, err := authd.SignBearer(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		after := time.Now().Unix()
		secrets.wantNoSecret(t, resp)
		p := splitBearer(t, resp.GetToken())
		if want := `{"alg":"EdDSA","kid":"` + kid + `","typ":"JWT"}`; string(p.header) != want {
			t.Fatalf("header %s, want %s", p.header, want)
		}
		if resp.GetKid() != kid {
			t.Fatalf("kid = %q, want the RFC 7638 thumbprint %q", resp.GetKid(), kid)
		}
		if !ed25519.Verify(pub, []byte(p.signingInput), p.sig) {
			t.Fatal("bearer signature does not verify with the issuer key")
		}
		iat, nbf, exp := p.num(t, "iat"), p.num(t, "nbf"), p.num(t, "exp")
		if iat < before || iat > after || nbf != iat || exp-iat != int64(ttl/time.Second) || resp.GetExpiresAt().AsTime().Unix() != exp {
			t.Fatalf("iat %d nbf %d exp %d (response %v), want iat in [%d,%d], nbf = iat, exp = iat+%v",
				iat, nbf, exp, resp.GetExpiresAt().AsTime(), before, after, ttl)
		}
		act, _ := p.claims["act"].(map[string]any)
		if p.claims["iss"] != "urn:cotal:auth:"+req.GetSpace() || p.claims["aud"] != req.GetSpace() || p.claims["sub"] != req.GetOwner() ||
			p.num(t, "ver") != 1 || act == nil || act["owner"] != req.GetOwner() || !reflect.DeepEqual(p.claims["scope"], act["scope"]) {
			t.Fatalf("claims %s", p.payload)
		}
		jti, _ := p.claims["jti"].(string)
		if raw, err := base64.RawURLEncoding.DecodeString(jti); err != nil || len(raw) != 16 {
			t.Fatalf("jti %q is not 128 bits of base64url", jti)
		}
		r := lastAudit(t, s)
		if r.Decision != audit.Granted || r.RPC != "SignBearer" || r.Caller != authdAlpha || r.Space != req.GetSpace() ||
			r.Subject != req.GetOwner() || r.JTI != jti || r.Expiry.Unix() != exp {
			t.Fatalf("audit line %+v, want a grant naming owner %s, jti %s and expiry %d", r, req.GetOwner(), jti, exp)
		}
		return p
	}

	t.Run("ok/all-claims", func(t *testing.T) {
		req := bearerReq(func(r *signerv1.SignBearerRequest) {
			r.Scope = []string{"spawn", "run_x", "a-1"}
			r.Parent = "u_zzzzzzzzzzzzzzzzzzzzzzzzzz.boss"
			r.LifecycleUid = uid
			r.CredentialId = "Cred_01-x"
			r.View = "manager-caller"
			r.ManagerInstanceId = strings.Repeat("b", 26)
		})
		p := sign(t, req, 10*time.Minute)
		want := map[string]any{
			"scope": []any{"spawn", "run_x", "a-1"},
			"ver":   json.Number("1"),
			"act": map[string]any{"owner": derivedOwner, "actor": "bot", "scope": []any{"spawn", "run_x", "a-1"},
				"parent": "u_zzzzzzzzzzzzzzzzzzzzzzzzzz.boss", "lifecycleUid": uid, "credentialId": "Cred_01-x", "view": "manager-caller",
				"managerInstanceId": strings.Repeat("b", 26)},
			"sub": derivedOwner, "iss": "urn:cotal:auth:alpha", "aud": "alpha",
			"iat": p.claims["iat"], "nbf": p.claims["nbf"], "exp": p.claims["exp"], "jti": p.claims["jti"],
		}
		if !reflect.DeepEqual(p.claims, want) {
			t.Fatalf("claims %s\nwant %v", p.payload, want)
		}
		// Member order follows upstream's issuer.
		if !bytes.HasPrefix(p.payload, []byte(`{"scope":[`)) || !bytes.Contains(p.payload, []byte(`"sub":"`+derivedOwner+`","iss":"urn:cotal:auth:alpha","aud":"alpha","iat":`)) {
			t.Fatalf("payload member order: %s", p.payload)
		}
	})
	t.Run("ok/minimal", func(t *testing.T) {
		p := sign(t, bearerReq(nil), 10*time.Minute)
		act := p.claims["act"].(map[string]any)
		if want := (map[string]any{"owner": derivedOwner, "actor": "bot", "scope": []any{}}); !reflect.DeepEqual(act, want) {
			t.Fatalf("act = %v, want %v", act, want)
		}
		if sc, ok := p.claims["scope"].([]any); !ok || len(sc) != 0 {
			t.Fatalf("scope = %v, want []", p.claims["scope"])
		}
	})
	t.Run("ok/ttl-capped-at-900s", func(t *testing.T) {
		sign(t, bearerReq(func(r *signerv1.SignBearerRequest) { r.Ttl = durationpb.New(time.Hour) }), 900*time.Second)
	})
	t.Run("ok/ttl-whole-seconds", func(t *testing.T) {
		sign(t, bearerReq(func(r *signerv1.SignBearerRequest) { r.Ttl = durationpb.New(90*time.Second + 900*time.Millisecond) }), 90*time.Second)
	})
	t.Run("ok/transfer-writer-capped-at-300s", func(t *testing.T) {
		sign(t, bearerReq(func(r *signerv1.SignBearerRequest) {
			r.View, r.Ttl = "transfer-writer", durationpb.New(900*time.Second)
		}), 300*time.Second)
	})
	t.Run("ok/distinct-jti", func(t *testing.T) {
		seen := map[any]bool{}
		for range 5 {
			p := sign(t, bearerReq(nil), 10*time.Minute)
			if seen[p.claims["jti"]] {
				t.Fatalf("jti %v issued twice", p.claims["jti"])
			}
			seen[p.claims["jti"]] = true
		}
	})

	signAs := func(id string, edit func(r *signerv1.SignBearerRequest)) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, id).SignBearer(ctxT(t), bearerReq(edit))
		}
	}
	bad := func(name string, edit func(r *signerv1.SignBearerRequest), spaceName string) rpcCase {
		a := denied(authdAlpha, "SignBearer", spaceName, "", "invalid-argument")
		return rpcCase{name: "fail/" + name, call: signAs(authdAlpha, edit), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT", audit: a}
	}
	badTTL := func(name string, ttl *durationpb.Duration) rpcCase {
		return rpcCase{name: "fail/" + name, call: signAs(authdAlpha, func(r *signerv1.SignBearerRequest) { r.Ttl = ttl }),
			code: codes.InvalidArgument, reason: "TTL_INVALID", audit: denied(authdAlpha, "SignBearer", "alpha", "", "ttl-invalid")}
	}
	scopes := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("w%d", i)
		}
		return out
	}
	cases := []rpcCase{
		bad("bad-space", func(r *signerv1.SignBearerRequest) { r.Space = "" }, ""),
		bad("owner-not-derived", func(r *signerv1.SignBearerRequest) { r.Owner = "alice" }, "alpha"),
		bad("owner-upper-case", func(r *signerv1.SignBearerRequest) { r.Owner = "u_ABCDEFGHIJKLMNOPQRSTUVWXYZ" }, "alpha"),
		bad("owner-empty", func(r *signerv1.SignBearerRequest) { r.Owner = "" }, "alpha"),
		bad("actor-empty", func(r *signerv1.SignBearerRequest) { r.Actor = "" }, "alpha"),
		bad("actor-dotted", func(r *signerv1.SignBearerRequest) { r.Actor = "a.b" }, "alpha"),
		bad("parent-no-dot", func(r *signerv1.SignBearerRequest) { r.Parent = derivedOwner }, "alpha"),
		bad("parent-owner-not-derived", func(r *signerv1.SignBearerRequest) { r.Parent = "alice.boss" }, "alpha"),
		bad("parent-chain", func(r *signerv1.SignBearerRequest) { r.Parent = derivedOwner + ".boss.sub" }, "alpha"),
		bad("parent-empty-actor", func(r *signerv1.SignBearerRequest) { r.Parent = derivedOwner + "." }, "alpha"),
		bad("lifecycle-uid", func(r *signerv1.SignBearerRequest) { r.LifecycleUid = "ABCDEFGHIJKLMNOPQRSTUVWXYZ" }, "alpha"),
		bad("credential-id-charset", func(r *signerv1.SignBearerRequest) { r.CredentialId = "has space" }, "alpha"),
		bad("credential-id-long", func(r *signerv1.SignBearerRequest) { r.CredentialId = strings.Repeat("c", 65) }, "alpha"),
		bad("scope-upper-case", func(r *signerv1.SignBearerRequest) { r.Scope = []string{"Spawn"} }, "alpha"),
		bad("scope-leading-digit", func(r *signerv1.SignBearerRequest) { r.Scope = []string{"1x"} }, "alpha"),
		bad("scope-empty-word", func(r *signerv1.SignBearerRequest) { r.Scope = []string{""} }, "alpha"),
		bad("scope-long-word", func(r *signerv1.SignBearerRequest) { r.Scope = []string{"a" + strings.Repeat("b", 32)} }, "alpha"),
		bad("scope-duplicate", func(r *signerv1.SignBearerRequest) { r.Scope = []string{"spawn", "run", "spawn"} }, "alpha"),
		bad("scope-too-many", func(r *signerv1.SignBearerRequest) { r.Scope = scopes(17) }, "alpha"),
		bad("view-unknown", func(r *signerv1.SignBearerRequest) { r.View = "root" }, "alpha"),
		bad("view-case", func(r *signerv1.SignBearerRequest) { r.View = "Admin" }, "alpha"),
		bad("manager-caller-unbound", func(r *signerv1.SignBearerRequest) { r.View = "manager-caller" }, "alpha"),
		bad("manager-instance-without-view", func(r *signerv1.SignBearerRequest) { r.ManagerInstanceId = strings.Repeat("b", 26) }, "alpha"),
		bad("manager-instance-other-view", func(r *signerv1.SignBearerRequest) {
			r.View, r.ManagerInstanceId = "admin", strings.Repeat("b", 26)
		}, "alpha"),
		bad("manager-instance-grammar", func(r *signerv1.SignBearerRequest) {
			r.View, r.ManagerInstanceId = "manager-caller", strings.Repeat("B", 26)
		}, "alpha"),
		badTTL("ttl-missing", nil),
		badTTL("ttl-zero", durationpb.New(0)),
		badTTL("ttl-negative", durationpb.New(-time.Second)),
		badTTL("ttl-sub-second", durationpb.New(500*time.Millisecond)),
		badTTL("ttl-malformed", &durationpb.Duration{Seconds: 1, Nanos: -1}),
		{name: "fail/rpc-not-allowed", call: signAs(managerAlpha, nil), code: codes.PermissionDenied, reason: "RPC_NOT_ALLOWED",
			audit: denied(managerAlpha, "SignBearer", "alpha", "", "rpc-not-allowed")},
		{name: "fail/space-not-allowed", call: signAs(authdAlpha, func(r *signerv1.SignBearerRequest) { r.Space = "beta" }),
			code: codes.PermissionDenied, reason: "SPACE_NOT_ALLOWED", audit: denied(authdAlpha, "SignBearer", "beta", "", "space-not-allowed")},
		{name: "fail/unknown-caller", call: signAs(stranger, nil), code: codes.PermissionDenied, reason: "CALLER_UNKNOWN",
			audit: denied(stranger, "SignBearer", "alpha", "", "caller-unknown")},
		{name: "fail/unknown-space", call: func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, authdGamma).SignBearer(ctxT(t), bearerReq(func(r *signerv1.SignBearerRequest) { r.Space = "gamma" }))
		}, code: codes.NotFound, reason: "UNKNOWN_SPACE", audit: denied(authdGamma, "SignBearer", "gamma", "", "unknown-space")},
	}
	runCases(t, s, cases)
	t.Run("ok/refusal-audit-subject", func(t *testing.T) {
		// A refused request's line names the owner only when it is well formed.
		resp, err := authd.SignBearer(ctxT(t), bearerReq(func(r *signerv1.SignBearerRequest) { r.Owner = "u_<script>" }))
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		wantNoCredential(t, resp)
		if r := lastAudit(t, s); r.Subject != "" {
			t.Fatalf("refused line carries subject %q", r.Subject)
		}
		_, err = authd.SignBearer(ctxT(t), bearerReq(func(r *signerv1.SignBearerRequest) { r.Actor = "" }))
		wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		if r := lastAudit(t, s); r.Subject != derivedOwner {
			t.Fatalf("refused line carries subject %q, want %s", r.Subject, derivedOwner)
		}
	})
	t.Run("audit/no-token", func(t *testing.T) {
		// verifyAudit refuses any "eyJ" (every JWT starts with it) and anything seed-shaped.
		sum := verifyAudit(t, s.AuditPath)
		if sum.Lines != len(auditRecords(t, s.AuditPath)) {
			t.Fatalf("Verify saw %d lines", sum.Lines)
		}
	})
}

func TestGetJWKS(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	authd := dialAs(t, s, authdAlpha)
	secrets := readHarnessSecrets(t, s, "alpha")

	t.Run("ok/verifies-a-bearer", func(t *testing.T) {
		jwks, err := authd.GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		secrets.wantNoSecret(t, jwks)
		wantGrantLine(t, s, "GetJWKS", "")
		if len(jwks.GetKeys()) != 1 {
			t.Fatalf("%d keys, want 1", len(jwks.GetKeys()))
		}
		k := jwks.GetKeys()[0]
		if k.GetKty() != "OKP" || k.GetCrv() != "Ed25519" || k.GetAlg() != "EdDSA" || k.GetUse() != "sig" {
			t.Fatalf("JWK %v", k)
		}
		x, err := base64.RawURLEncoding.DecodeString(k.GetX())
		if err != nil || len(x) != ed25519.PublicKeySize {
			t.Fatalf("x %q is not a base64url Ed25519 public key", k.GetX())
		}
		sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + k.GetX() + `"}`))
		if want := base64.RawURLEncoding.EncodeToString(sum[:]); k.GetKid() != want {
			t.Fatalf("kid %q, want the RFC 7638 thumbprint %q", k.GetKid(), want)
		}
		bearer, err := authd.SignBearer(ctxT(t), bearerReq(nil))
		if err != nil {
			t.Fatal(err)
		}
		p := splitBearer(t, bearer.GetToken())
		if !ed25519.Verify(ed25519.PublicKey(x), []byte(p.signingInput), p.sig) {
			t.Fatal("the JWKS key does not verify a bearer")
		}
		if bearer.GetKid() != k.GetKid() || !bytes.Contains(p.header, []byte(`"kid":"`+k.GetKid()+`"`)) {
			t.Fatalf("bearer kid %q (header %s), JWKS kid %q", bearer.GetKid(), p.header, k.GetKid())
		}
	})
	t.Run("ok/spaces-have-own-keys", func(t *testing.T) {
		a, err1 := authd.GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: "alpha"})
		b, err2 := dialAs(t, s, authdBeta).GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: "beta"})
		if err1 != nil || err2 != nil || len(a.GetKeys()) != 1 || len(b.GetKeys()) != 1 || a.GetKeys()[0].GetKid() == b.GetKeys()[0].GetKid() {
			t.Fatalf("alpha %v, beta %v (%v, %v): want one distinct key each", a, b, err1, err2)
		}
	})

	jwks := func(id, spaceName string) func(t *testing.T) (proto.Message, error) {
		return func(t *testing.T) (proto.Message, error) {
			return dialAs(t, s, id).GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: spaceName})
		}
	}
	runCases(t, s, []rpcCase{
		{name: "fail/bad-space", call: jwks(authdAlpha, ""), code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			audit: denied(authdAlpha, "GetJWKS", "", "", "invalid-argument")},
		{name: "fail/rpc-not-allowed", call: jwks(managerAlpha, "alpha"), code: codes.PermissionDenied, reason: "RPC_NOT_ALLOWED",
			audit: denied(managerAlpha, "GetJWKS", "alpha", "", "rpc-not-allowed")},
		{name: "fail/space-not-allowed", call: jwks(authdAlpha, "beta"), code: codes.PermissionDenied, reason: "SPACE_NOT_ALLOWED",
			audit: denied(authdAlpha, "GetJWKS", "beta", "", "space-not-allowed")},
		{name: "fail/unknown-space", call: jwks(authdGamma, "gamma"), code: codes.NotFound, reason: "UNKNOWN_SPACE",
			audit: denied(authdGamma, "GetJWKS", "gamma", "", "unknown-space")},
	})
}
