package keystore_test

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
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// ownerVectorsFile holds owner ids computed by Node's crypto.createHmac and JSON.stringify, the
// primitives upstream's derive.ts uses. `go test -run TestOwnerVectors -update` regenerates it by
// running nodeOwnerVectors with the machine's node.
var ownerVectorsFile = filepath.Join("testdata", "owner-vectors.json")

// nodeOwnerVectors is the Node program (run as `node -e`) that wrote ownerVectorsFile: a fixed
// 32-byte secret (bytes 0..31) and identities whose JSON.stringify differs from a naive Go
// encoding ('&' '<' '>', U+2028/U+2029, quotes, backslashes, control characters, DEL, non-ASCII,
// a literal "\u2028" text, the 1 KiB limit). message_hex is the exact HMAC input.
const nodeOwnerVectors = `const c=require("crypto"),k=Buffer.from([...Array(32).keys()]),A="abcdefghijklmnopqrstuvwxyz234567",
b32=b=>{let n=0,v=0,o="";for(const x of b){v=((v<<8)|x)&0xffff;n+=8;while(n>=5){o+=A[(v>>>(n-5))&31];n-=5}}return n?o+A[(v<<(5-n))&31]:o},
I="https://idp.example.com",
V=[[I,"alice"],[I,"a&b<c>d"],[I,"line\u2028sep\u2029para"],[I,"say \"hi\""],[I,"back\\slash"],[I,"ctl\u0000\u0001\u001f\u007f"],
[I,"ws\b\t\n\f\r"],[I,"h\u00e9llo \u65e5\u672c \ud83d\ude00"],[I,"lit\\u2028 \\u003c"],[I,"\ufeff\ufffd"],["https://idp.example.com/<&>","\u2028"],
["http://127.0.0.1:8080","sub/with/slashes"],[I,"x".repeat(1024)]];
process.stdout.write(JSON.stringify({secret_b64:k.toString("base64"),vectors:V.map(([i,s])=>{const m="cotal-owner-v1:"+JSON.stringify([i,s]);
return{issuer:i,subject:s,message_hex:Buffer.from(m,"utf8").toString("hex"),owner:"u_"+b32(c.createHmac("sha256",k).update(m,"utf8").digest().subarray(0,16))}})},null,1)+"\n")`

// The "update" flag may also be registered by another test file of this package; registering it
// twice would panic, so it is looked up rather than held.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files under testdata/")
	}
}

func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// ownerVectors is the content of ownerVectorsFile.
type ownerVectors struct {
	SecretB64 string `json:"secret_b64"`
	Vectors   []struct {
		Issuer     string `json:"issuer"`
		Subject    string `json:"subject"`
		MessageHex string `json:"message_hex"`
		Owner      string `json:"owner"`
	} `json:"vectors"`
}

func readOwnerVectors(t testing.TB) (ownerVectors, []byte) {
	t.Helper()
	var v ownerVectors
	if err := json.Unmarshal(readFile(t, ownerVectorsFile), &v); err != nil {
		t.Fatalf("%s: %v", ownerVectorsFile, err)
	}
	secret, err := base64.StdEncoding.DecodeString(v.SecretB64)
	if err != nil || len(secret) != keystore.SecretLen || len(v.Vectors) == 0 {
		t.Fatalf("%s: want a %d-byte secret and vectors", ownerVectorsFile, keystore.SecretLen)
	}
	return v, secret
}

// testMACKey is the fixed MAC key the keystore tests install.
var testMACKey = bytes.Repeat([]byte{0x5a}, keystore.SecretLen)

// bearerSpace opens alpha from a fresh init directory after replacing its owner secret and MAC
// key with the fixed test values, so results can be checked against known answers.
func bearerSpace(t testing.TB, ownerSecret []byte) (*keystore.Space, fixture) {
	t.Helper()
	f := newFixture(t, "alpha")
	writeFile(t, f.secret("alpha", keystore.FileOwnerSecret), []byte(base64.StdEncoding.EncodeToString(ownerSecret)+"\n"))
	writeFile(t, f.secret("alpha", keystore.FileMACKey), []byte(base64.StdEncoding.EncodeToString(testMACKey)+"\n"))
	sp, ok := open(t, f.config()).Space("alpha")
	if !ok {
		t.Fatal("alpha not loaded")
	}
	return sp, f
}

func TestOwnerVectors(t *testing.T) {
	if updating() {
		out, err := exec.Command("node", "-e", nodeOwnerVectors).Output()
		if err != nil {
			t.Fatalf("node: %v", err)
		}
		writeFile(t, ownerVectorsFile, out)
	}
	vec, secret := readOwnerVectors(t)
	sp, _ := bearerSpace(t, secret)
	for i, v := range vec.Vectors {
		t.Run(fmt.Sprintf("ok/vector-%02d", i), func(t *testing.T) {
			msg, err := hex.DecodeString(v.MessageHex)
			if err != nil {
				t.Fatal(err)
			}
			// The stored message is what Node hashed; the reference HMAC over it must give Node's
			// owner, or the vector file itself is corrupt.
			if got := refOwner(secret, msg); got != v.Owner {
				t.Fatalf("vector %d: HMAC of message_hex = %s, file says %s", i, got, v.Owner)
			}
			if got := string(refOwnerMessage(v.Issuer, v.Subject)); got != string(msg) {
				t.Fatalf("vector %d: reference JSON %q, Node %q", i, got, msg)
			}
			for range 2 {
				got, err := sp.DeriveOwner(v.Issuer, v.Subject)
				if err != nil {
					t.Fatalf("DeriveOwner: %v", err)
				}
				if got != v.Owner {
					t.Fatalf("DeriveOwner = %s, Node = %s", got, v.Owner)
				}
			}
			if err := space.ValidateDerivedOwner(v.Owner); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestDeriveOwner(t *testing.T) {
	_, secret := readOwnerVectors(t)
	sp, _ := bearerSpace(t, secret)
	const iss = "https://idp.example.com"
	long := strings.Repeat("x", keystore.MaxOwnerInputBytes+1)
	cases := []struct {
		name, iss, sub, field string
	}{
		{"fail/empty-issuer", "", "alice", "idp_issuer"},
		{"fail/empty-subject", iss, "", "subject"},
		{"fail/long-issuer", long, "alice", "idp_issuer"},
		{"fail/long-subject", iss, long, "subject"},
		{"fail/invalid-utf8", iss, "secret-subject\xff", "subject"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sp.DeriveOwner(tc.iss, tc.sub)
			var ie *keystore.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field || got != "" {
				t.Fatalf("DeriveOwner = %q, %v; want an InputError on %s", got, err, tc.field)
			}
			if tc.sub != "" && strings.Contains(err.Error(), tc.sub[:5]) {
				t.Fatalf("error %q quotes the subject", err)
			}
			if keystore.CheckOwnerInput(tc.iss, tc.sub) == nil {
				t.Fatal("CheckOwnerInput accepts what DeriveOwner refuses")
			}
		})
	}
	t.Run("ok/issuer-separates", func(t *testing.T) {
		a, err1 := sp.DeriveOwner("https://a.example", "alice")
		b, err2 := sp.DeriveOwner("https://b.example", "alice")
		// The JSON array keeps the boundary: ["a","bc"] and ["ab","c"] differ.
		c, err3 := sp.DeriveOwner("https://a.example\",\"x", "y")
		d, err4 := sp.DeriveOwner("https://a.example", "x\",\"y")
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		if a == b || c == d {
			t.Fatalf("owners collide: %s %s %s %s", a, b, c, d)
		}
	})
	t.Run("ok/differs-by-secret", func(t *testing.T) {
		other, _ := bearerSpace(t, bytes.Repeat([]byte{1}, keystore.SecretLen))
		a, _ := sp.DeriveOwner(iss, "alice")
		b, err := other.DeriveOwner(iss, "alice")
		if err != nil || a == b {
			t.Fatalf("owners under different secrets: %s %s (%v)", a, b, err)
		}
	})
}

func TestMac(t *testing.T) {
	sp, _ := bearerSpace(t, bytes.Repeat([]byte{3}, keystore.SecretLen))
	const domain = keystore.MacDomainManagerCurrentRegistration
	if domain != "cotal/manager-current-registration/v1" {
		t.Fatalf("frozen domain changed: %q", domain)
	}
	known := func(payload []byte) string {
		m := hmac.New(sha256.New, testMACKey)
		m.Write([]byte("cotal/manager-current-registration/v1\x00"))
		m.Write(payload)
		return "sha256:" + hex.EncodeToString(m.Sum(nil))
	}
	payload := []byte(`{"v":1,"kind":"manager-current-registration","space":"alpha"}`)
	for _, tc := range []struct {
		name, domain string
		payload      []byte
		field        string
	}{
		{"ok/registration", domain, payload, ""},
		{"ok/max-payload", domain, bytes.Repeat([]byte{'p'}, keystore.MaxMacPayloadBytes), ""},
		{"ok/binary-payload", domain, []byte{0, 1, 2, 0xff}, ""},
		{"fail/empty-domain", "", payload, "domain"},
		{"fail/other-domain", "cotal/manager-current-registration/v2", payload, "domain"},
		{"fail/domain-prefix-trick", domain + "\x00", payload, "domain"},
		{"fail/empty-payload", domain, nil, "payload"},
		{"fail/long-payload", domain, bytes.Repeat([]byte{'p'}, keystore.MaxMacPayloadBytes+1), "payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sp.Mac(tc.domain, tc.payload)
			if tc.field != "" {
				var ie *keystore.InputError
				if !errors.As(err, &ie) || ie.Field != tc.field || got != "" {
					t.Fatalf("Mac = %q, %v; want an InputError on %s", got, err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := known(tc.payload); got != want {
				t.Fatalf("Mac = %s, want %s", got, want)
			}
		})
	}
}

func TestIssuer(t *testing.T) {
	sp, f := bearerSpace(t, bytes.Repeat([]byte{3}, keystore.SecretLen))
	pub := issuerPublic(t, f.secret("alpha", keystore.FileIssuer))
	x := base64.RawURLEncoding.EncodeToString(pub)
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	kid := base64.RawURLEncoding.EncodeToString(sum[:])

	t.Run("ok/jwks", func(t *testing.T) {
		keys, err := sp.IssuerJWKs()
		if err != nil {
			t.Fatal(err)
		}
		want := keystore.JWK{Kty: "OKP", Crv: "Ed25519", X: x, Kid: kid, Alg: "EdDSA", Use: "sig"}
		if len(keys) != 1 || keys[0] != want {
			t.Fatalf("IssuerJWKs = %+v, want [%+v]", keys, want)
		}
	})
	// The closed typ set, each spelled out so a change to the constants breaks this test.
	for _, typ := range []string{"JWT", "cotal-service-access+jwt", "cotal-service-renewal+jwt"} {
		t.Run("ok/sign-"+typ, func(t *testing.T) {
			claims := []byte(`{"sub":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","ver":1}`)
			token, gotKID, err := sp.SignBearer(typ, claims)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.Split(token, ".")
			if gotKID != kid || len(parts) != 3 {
				t.Fatalf("kid %q (want %q), %d parts", gotKID, kid, len(parts))
			}
			header, err1 := base64.RawURLEncoding.DecodeString(parts[0])
			body, err2 := base64.RawURLEncoding.DecodeString(parts[1])
			sig, err3 := base64.RawURLEncoding.DecodeString(parts[2])
			if err := errors.Join(err1, err2, err3); err != nil {
				t.Fatal(err)
			}
			if want := `{"alg":"EdDSA","kid":"` + kid + `","typ":"` + typ + `"}`; string(header) != want {
				t.Fatalf("header %s, want %s", header, want)
			}
			if !bytes.Equal(body, claims) {
				t.Fatalf("payload %s, want %s", body, claims)
			}
			if !ed25519.Verify(pub, []byte(parts[0]+"."+parts[1]), sig) {
				t.Fatal("signature does not verify with the issuer public key")
			}
		})
	}
	for _, typ := range []string{"", "jwt", "JWT ", "at+jwt", "cotal-service-access+JWT", `JWT","jku":"x`} {
		t.Run(fmt.Sprintf("fail/typ-%q", typ), func(t *testing.T) {
			token, kid, err := sp.SignBearer(typ, []byte(`{"sub":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa"}`))
			var ie *keystore.InputError
			if !errors.As(err, &ie) || ie.Field != "typ" || token != "" || kid != "" {
				t.Fatalf("SignBearer = %q, %q, %v; want an InputError on typ", token, kid, err)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		claims []byte
	}{
		{"fail/empty", nil},
		{"fail/array", []byte(`["x"]`)},
		{"fail/not-json", []byte(`{"a":`)},
		{"fail/leading-space", []byte(` {"a":1}`)},
		{"fail/too-long", []byte(`{"a":"` + strings.Repeat("x", keystore.MaxBearerClaimsBytes) + `"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			token, kid, err := sp.SignBearer(keystore.TypUser, tc.claims)
			var ie *keystore.InputError
			if !errors.As(err, &ie) || ie.Field != "claims" || token != "" || kid != "" {
				t.Fatalf("SignBearer = %q, %q, %v; want an InputError on claims", token, kid, err)
			}
		})
	}
}

// TestBearerOpsAfterClose checks that Close leaves nothing usable: every operation refuses with
// ErrSpaceClosed instead of computing with zeroed keys.
func TestBearerOpsAfterClose(t *testing.T) {
	f := newFixture(t, "alpha")
	st, err := keystore.Open(f.config())
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := st.Space("alpha")
	if _, err := sp.DeriveOwner("https://idp.example.com", "alice"); err != nil {
		t.Fatalf("before Close: %v", err)
	}
	st.Close()
	for _, tc := range []struct {
		name string
		call func() (string, error)
	}{
		{"fail/derive-owner", func() (string, error) { return sp.DeriveOwner("https://idp.example.com", "alice") }},
		{"fail/mac", func() (string, error) { return sp.Mac(keystore.MacDomainManagerCurrentRegistration, []byte("p")) }},
		{"fail/sign-bearer", func() (string, error) { tok, _, err := sp.SignBearer(keystore.TypUser, []byte(`{}`)); return tok, err }},
		{"fail/jwks", func() (string, error) {
			keys, err := sp.IssuerJWKs()
			if len(keys) != 0 {
				return "keys", err
			}
			return "", err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.call()
			if !errors.Is(err, keystore.ErrSpaceClosed) || got != "" {
				t.Fatalf("after Close: %q, %v; want ErrSpaceClosed", got, err)
			}
		})
	}
}

// FuzzDeriveOwner checks DeriveOwner against a reference built differently: encoding/json one
// rune at a time with HTML escaping off, U+2028 and U+2029 kept raw. Whatever DeriveOwner accepts
// must match it and be a derived owner; whatever it refuses, CheckOwnerInput refuses too.
func FuzzDeriveOwner(f *testing.F) {
	_, secret := readOwnerVectors(f)
	sp, _ := bearerSpace(f, secret)
	for _, s := range [][2]string{
		{"https://idp.example.com", "alice"}, {"https://x", "a&b<c>d\u2028\u2029"}, {"i", "\"\\\b\f\n\r\t\x00\x1f\x7f"},
		{"i", `lit\u2028`}, {"i", "h\u00e9llo \U0001F600"}, {"", "x"}, {"i", "\xff"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, iss, sub string) {
		got, err := sp.DeriveOwner(iss, sub)
		if err != nil {
			if keystore.CheckOwnerInput(iss, sub) == nil {
				t.Fatalf("DeriveOwner refused input CheckOwnerInput accepts: %v", err)
			}
			return
		}
		if want := refOwner(secret, refOwnerMessage(iss, sub)); got != want {
			t.Fatalf("DeriveOwner(%q, %q) = %s, reference %s", iss, sub, got, want)
		}
		if err := space.ValidateDerivedOwner(got); err != nil {
			t.Fatal(err)
		}
	})
}

// refOwnerMessage is "cotal-owner-v1:" + JSON.stringify([iss, sub]) built from encoding/json.
func refOwnerMessage(iss, sub string) []byte {
	str := func(s string) string {
		var out strings.Builder
		for _, r := range s {
			if r == '\u2028' || r == '\u2029' {
				out.WriteRune(r)
				continue
			}
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(string(r)); err != nil {
				panic(err)
			}
			out.WriteString(strings.TrimSuffix(strings.TrimSuffix(b.String(), "\n"), `"`)[1:])
		}
		return `"` + out.String() + `"`
	}
	if !utf8.ValidString(iss) || !utf8.ValidString(sub) {
		return nil
	}
	return []byte("cotal-owner-v1:[" + str(iss) + "," + str(sub) + "]")
}

// refOwner is the owner id for an HMAC input.
func refOwner(secret, msg []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	return "u_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(m.Sum(nil)[:16]))
}

// issuerPublic reads the issuer's public key from its PKCS#8 file.
func issuerPublic(t testing.TB, path string) ed25519.PublicKey {
	t.Helper()
	block, _ := pem.Decode(readFile(t, path))
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		t.Fatalf("%s: not Ed25519", path)
	}
	return priv.Public().(ed25519.PublicKey)
}
