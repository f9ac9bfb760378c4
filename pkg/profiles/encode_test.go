package profiles

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// mxEncodeBoth encodes two equal claims, one with nats-io/jwt's UserClaims.Encode and one with
// encodeUserClaims at the wall-clock second the library read, and fails unless the tokens are
// byte-equal and the claims were changed alike. It returns the token.
func mxEncodeBoth(t testing.TB, mk func() *jwt.UserClaims, kp nkeys.KeyPair) string {
	t.Helper()
	lib, ours := mk(), mk()
	want, err := lib.Encode(kp)
	if err != nil {
		t.Fatalf("library Encode: %v", err)
	}
	// The library stamps iat from the wall clock; encode ours at the same second.
	got, err := encodeUserClaims(ours, kp, time.Unix(lib.IssuedAt, 0))
	if err != nil {
		t.Fatalf("encodeUserClaims: %v", err)
	}
	if got != want {
		t.Fatalf("token differs from the library's:\n got %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(lib, ours) {
		t.Fatalf("claims changed differently:\n got %+v\nwant %+v", ours, lib)
	}
	return got
}

// mxSigningAccount is a fixed account key pair (seed from zero bytes), so fuzz cases repeat.
func mxSigningAccount(t testing.TB) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreatePairWithRand(nkeys.PrefixByteAccount, bytes.NewReader(make([]byte, 64)))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// TestEncodeUserClaimsMatchesLibrary: for every profile, with signerd's extra tags, the hand-built
// encoding is byte-for-byte the library's, and the token decodes and validates as user claims
// signed by the account key.
func TestEncodeUserClaimsMatchesLibrary(t *testing.T) {
	k := mxKeys(t)
	kp, issuer := mxSigningAccount(t)
	for _, name := range All() {
		t.Run("ok/"+string(name), func(t *testing.T) {
			s := mxSpec(t, name, mxGoldenParams[name])
			ttl, err := name.Lifetime().TTL(0)
			if err != nil {
				t.Fatal(err)
			}
			mk := func() *jwt.UserClaims {
				uc, err := s.Claims(k.userPub, k.acPub, mxNow, ttl)
				if err != nil {
					t.Fatalf("Claims: %v", err)
				}
				// What signerd appends (paramTags, MinterTag), with characters encoding/json
				// escapes (HTML and U+2028) to prove the escaping is the library's.
				uc.Tags = append(uc.Tags, "owner-param:a<b>&c", "x:\u2028\"\\", "minter:0123456789abcdef")
				return uc
			}
			tok := mxEncodeBoth(t, mk, kp)
			uc, err := jwt.DecodeUserClaims(tok)
			if err != nil {
				t.Fatalf("DecodeUserClaims: %v", err)
			}
			vr := jwt.CreateValidationResults()
			uc.Validate(vr)
			if vr.IsBlocking(false) { // mxNow is a fixed date: the times are not judged here
				t.Fatalf("decoded claims do not validate: %v", vr.Errors())
			}
			if uc.Issuer != issuer || uc.Subject != k.userPub || uc.IssuerAccount != k.acPub || uc.Name != s.JWTName {
				t.Fatalf("decoded iss %s sub %s account %s name %s", uc.Issuer, uc.Subject, uc.IssuerAccount, uc.Name)
			}
			if uc.Expires != 0 && uc.Expires != mxNow.Add(ttl).Unix() {
				t.Fatalf("exp %d, want %d", uc.Expires, mxNow.Add(ttl).Unix())
			}
		})
	}
}

// TestEncodeUserClaimsRefusals: the library's refusals stay: a subject that is not a user key, no
// key pair, and a signer that is not an account key.
func TestEncodeUserClaimsRefusals(t *testing.T) {
	k := mxKeys(t)
	kp, _ := mxSigningAccount(t)
	for _, tc := range []struct {
		name string
		sub  string
		kp   nkeys.KeyPair
	}{
		{"fail/subject-not-user", k.acPub, kp},
		{"fail/no-keypair", k.userPub, nil},
		{"fail/user-signer", k.userPub, k.user},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uc := jwt.NewUserClaims(tc.sub)
			_, libErr := uc.Encode(tc.kp)
			tok, err := EncodeUserClaims(jwt.NewUserClaims(tc.sub), tc.kp)
			if err == nil || libErr == nil || tok != "" {
				t.Fatalf("got token %q err %v, library err %v; want both refused", tok, err, libErr)
			}
		})
	}
}

// FuzzEncodeUserClaims: for arbitrary names, tags, subjects and limits the hand-built encoding is
// the library's, byte for byte.
func FuzzEncodeUserClaims(f *testing.F) {
	f.Add("agent", "profile:agent", "$JS.API.INFO", "_INBOX_x.>", "q <&>", int64(3600), true, int64(1))
	f.Add("", "", "", "", "", int64(0), false, int64(-1))
	f.Add("a\u2028b\x00\"", "\xff\xfe", "a.*", "b >", "\\", int64(-5), false, int64(1<<40))
	kp, _ := mxSigningAccount(f)
	user, err := nkeys.CreatePairWithRand(nkeys.PrefixByteUser, bytes.NewReader(make([]byte, 64)))
	if err != nil {
		f.Fatal(err)
	}
	userPub, err := user.PublicKey()
	if err != nil {
		f.Fatal(err)
	}
	_, account := mxSigningAccount(f)
	f.Fuzz(func(t *testing.T, name, tag, pub, sub, aud string, exp int64, bearer bool, subs int64) {
		mk := func() *jwt.UserClaims {
			uc := jwt.NewUserClaims(userPub)
			uc.Name, uc.Audience, uc.Expires, uc.IssuerAccount = name, aud, exp, account
			uc.Tags = jwt.TagList{tag, name}
			uc.Pub.Allow = jwt.StringList{pub}
			uc.Sub.Deny = jwt.StringList{sub, pub}
			uc.BearerToken = bearer
			uc.Subs = subs
			if exp > 0 {
				uc.Resp = &jwt.ResponsePermission{MaxMsgs: int(exp % 1000), Expires: time.Duration(exp)}
			}
			return uc
		}
		tok := mxEncodeBoth(t, mk, kp)
		if _, err := jwt.DecodeUserClaims(tok); err != nil {
			t.Fatalf("DecodeUserClaims: %v", err)
		}
	})
}
