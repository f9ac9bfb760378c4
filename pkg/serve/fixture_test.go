package serve

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// fixture is one registered, activated endpoint instance under a local issuer key: the test
// plays the authority (signing with a real Ed25519 key) and the service (its embedded
// registration).
type fixture struct {
	t        testing.TB
	key      ed25519.PrivateKey
	kid      string
	account  string
	space    string
	info     *serviceaccess.Info
	endpoint string
	instance string
	owner    string
	contract serviceaccess.Contract
	snapshot []byte
	witness  string
	root     string
	now      time.Time
}

const (
	testSpace    = "acme"
	testEndpoint = "billing.api"
	testInstance = "0123456789abcdefghijklmnop"
	testOwner    = "u_abcdefghijklmnopqrstuvwxyz"
	testRoot     = "r_abcdefghijklmnopqrstuvwxyz"
)

func seedKey(label string) ed25519.PrivateKey {
	s := sha256.Sum256([]byte(label))
	return ed25519.NewKeyFromSeed(s[:])
}

func jwkOf(pub ed25519.PublicKey) serviceaccess.JWK {
	x := base64.RawURLEncoding.EncodeToString(pub)
	return serviceaccess.JWK{Kty: "OKP", Crv: "Ed25519", X: x, Kid: serviceaccess.Thumbprint(x), Alg: "EdDSA", Use: "sig"}
}

func accountKey(t testing.TB) string {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// contractOf is a valid contract of one closure rooted at endpoint with the given commands.
func contractOf(t testing.TB, endpoint string, commands ...string) serviceaccess.Contract {
	t.Helper()
	m := serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: endpoint, Kind: serviceaccess.MemberEndpoint}, Members: []serviceaccess.Member{}}
	for _, c := range commands {
		m.Members = append(m.Members, serviceaccess.Member{URN: c, Kind: serviceaccess.MemberCommand, Lifetime: serviceaccess.LifetimeEphemeral})
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	d := serviceaccess.Digest(b)
	c := serviceaccess.Contract{Closures: []string{d}, Artifacts: []serviceaccess.Artifact{{Digest: d, Bytes: b}}}
	if _, err := c.Check(endpoint); err != nil {
		t.Fatalf("fixture contract: %v", err)
	}
	return c
}

func snapshotOf(t testing.TB, account, spaceName, owner, endpoint, instance string, c serviceaccess.Contract) []byte {
	t.Helper()
	b, err := serviceaccess.Snapshot{V: 1, Account: account, Space: spaceName, Owner: owner, Endpoint: endpoint,
		Instance: instance, Generation: 1, Contract: c}.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{t: t, key: seedKey("issuer"), account: accountKey(t), space: testSpace, endpoint: testEndpoint,
		instance: testInstance, owner: testOwner, root: testRoot, now: time.Unix(1_800_000_000, 0)}
	jwk := jwkOf(f.key.Public().(ed25519.PublicKey))
	f.kid = jwk.Kid
	f.info = &serviceaccess.Info{V: 1, Account: f.account, Space: f.space, Issuer: serviceaccess.Issuer(f.space), Keys: []serviceaccess.JWK{jwk}}
	f.contract = contractOf(t, f.endpoint, "billing.api.charge")
	f.snapshot = snapshotOf(t, f.account, f.space, f.owner, f.endpoint, f.instance, f.contract)
	f.witness = serviceaccess.WitnessOf(f.snapshot)
	return f
}

// claims are an access bearer's claims for the fixture, iat = nbf = at, exp = at+life.
func (f *fixture) claims(at time.Time, life time.Duration) map[string]any {
	return map[string]any{
		"iss": serviceaccess.Issuer(f.space), "aud": f.space, "sub": f.owner, "duty": serviceaccess.DutyServe,
		"wit": f.witness, "ep": f.endpoint, "iid": f.instance, "root": f.root, "ver": 1,
		"iat": at.Unix(), "nbf": at.Unix(), "exp": at.Add(life).Unix(), "jti": jtiOf(at),
	}
}

func jtiOf(at time.Time) string {
	s := sha256.Sum256([]byte(at.String()))
	const alpha = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 26)
	for i := range b {
		b[i] = alpha[s[i]%32]
	}
	return string(b)
}

// sign is a compact JWS of claims under key with header {alg, kid, typ}.
func sign(t testing.TB, key ed25519.PrivateKey, kid, typ string, claims map[string]any) string {
	t.Helper()
	h, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}{"EdDSA", kid, typ})
	if err != nil {
		t.Fatal(err)
	}
	p, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(in)))
}

func (f *fixture) token(claims map[string]any) string {
	return sign(f.t, f.key, f.kid, serviceaccess.TypAccess, claims)
}

func (f *fixture) result(token string, exp int64) *serviceaccess.Answer {
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerCredential, RequestID: "req-activate-1", Witness: f.witness,
		Root: f.root, Access: &serviceaccess.Token{Token: token, Exp: exp}, ApprovalExpiresAt: f.now.Add(24 * time.Hour).Unix()}
}

func (f *fixture) authenticity() Authenticity {
	f.t.Helper()
	a, err := ServeAuthenticityOf(f.info)
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

// input is a grant input that passes, with the access bearer signed from c.
func (f *fixture) input(c map[string]any) GrantInput {
	tok := f.token(c)
	return GrantInput{
		AccountPublicKey: f.account,
		Result:           f.result(tok, c["exp"].(int64)),
		Registration:     Registration{Endpoint: f.endpoint, Instance: f.instance, Contract: f.contract, Snapshot: f.snapshot},
		Authenticity:     f.authenticity(),
		Now:              func() time.Time { return f.now },
	}
}

// noTokenText fails t if err's text holds any part of tok.
func noTokenText(t testing.TB, err error, tok string) {
	t.Helper()
	if err == nil || tok == "" {
		return
	}
	for _, seg := range strings.Split(tok, ".") {
		if len(seg) >= 8 && strings.Contains(err.Error(), seg) {
			t.Fatalf("error text holds token material: %v", err)
		}
	}
}
