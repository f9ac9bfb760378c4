package serviceaccess_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

const (
	testSpace   = "acme space"
	testOwner   = "u_abcdefghijklmnopqrstuvwxyz"
	testWitness = "w_abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
	testRoot    = "r_abcdefghijklmnopqrstuvwxyz"
	testIID     = "01jd8x9y0z1a2b3c4d5e6f7g8h"
	testEP      = "billing.invoices"
	testJTI     = "abcdefghijklmnopqrstuvwx23"
)

var testNow = time.Unix(1_800_000_000, 0)

type mapKeys map[string]ed25519.PublicKey

func (m mapKeys) Key(_ context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok := m[kid]; ok {
		return k, nil
	}
	return nil, errors.New("unknown kid")
}

type signer struct {
	kid  string
	priv ed25519.PrivateKey
}

func newSigner(t testing.TB, kid string) *signer {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, kid)
	return &signer{kid: kid, priv: ed25519.NewKeyFromSeed(seed)}
}

func (s *signer) keys() mapKeys { return mapKeys{s.kid: s.priv.Public().(ed25519.PublicKey)} }

// signRaw signs a header and payload given as raw JSON text.
func (s *signer) signRaw(header, payload string) string {
	in := b64(header) + "." + b64(payload)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.priv, []byte(in)))
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func (s *signer) header(typ string) string {
	return `{"alg":"EdDSA","kid":"` + s.kid + `","typ":"` + typ + `"}`
}

// claimsMap is a valid payload of the kind typ, iat = nbf = now, exp = now + 30 s.
func claimsMap(typ string) map[string]any {
	m := map[string]any{
		"iss": serviceaccess.Issuer(testSpace), "aud": testSpace, "sub": testOwner, "duty": "serve",
		"wit": testWitness, "ep": testEP, "iid": testIID, "root": testRoot, "ver": 1,
		"iat": testNow.Unix(), "nbf": testNow.Unix(), "exp": testNow.Unix() + 30, "jti": testJTI,
	}
	if typ == serviceaccess.TypRenewal {
		delete(m, "duty")
		m["use"] = "renew"
		m["aud"] = serviceaccess.RenewalAudience(testSpace)
	}
	return m
}

func (s *signer) sign(t testing.TB, typ string, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return s.signRaw(s.header(typ), string(b))
}

func validator(s *signer, now time.Time) *serviceaccess.Validator {
	return &serviceaccess.Validator{Space: testSpace, Keys: s.keys(), Now: func() time.Time { return now }}
}

func TestValidatorOK(t *testing.T) {
	s := newSigner(t, "kid-1")
	v := validator(s, testNow)
	ctx := context.Background()

	t.Run("ok/access", func(t *testing.T) {
		c, err := v.Access(ctx, s.sign(t, serviceaccess.TypAccess, claimsMap(serviceaccess.TypAccess)))
		if err != nil {
			t.Fatal(err)
		}
		want := serviceaccess.AccessClaims{Iss: "urn:cotal:service-access:" + testSpace, Aud: testSpace, Sub: testOwner,
			Duty: "serve", Wit: testWitness, Ep: testEP, Iid: testIID, Root: testRoot, Ver: 1,
			Iat: testNow.Unix(), Nbf: testNow.Unix(), Exp: testNow.Unix() + 30, Jti: testJTI}
		if *c != want {
			t.Fatalf("claims %+v, want %+v", *c, want)
		}
	})
	t.Run("ok/renewal", func(t *testing.T) {
		c, err := v.Renewal(ctx, s.sign(t, serviceaccess.TypRenewal, claimsMap(serviceaccess.TypRenewal)))
		if err != nil {
			t.Fatal(err)
		}
		want := serviceaccess.RenewalClaims{Iss: "urn:cotal:service-access:" + testSpace, Aud: "urn:cotal:service-renewal:" + testSpace,
			Sub: testOwner, Use: "renew", Wit: testWitness, Ep: testEP, Iid: testIID, Root: testRoot, Ver: 1,
			Iat: testNow.Unix(), Nbf: testNow.Unix(), Exp: testNow.Unix() + 30, Jti: testJTI}
		if *c != want {
			t.Fatalf("claims %+v, want %+v", *c, want)
		}
	})
	t.Run("ok/access lifetime exactly 60 s", func(t *testing.T) {
		m := claimsMap(serviceaccess.TypAccess)
		m["exp"] = testNow.Unix() + 60
		if _, err := v.Access(ctx, s.sign(t, serviceaccess.TypAccess, m)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ok/renewal lifetime exactly 24 h", func(t *testing.T) {
		m := claimsMap(serviceaccess.TypRenewal)
		m["exp"] = testNow.Unix() + 24*3600
		if _, err := v.Renewal(ctx, s.sign(t, serviceaccess.TypRenewal, m)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ok/exp one second after now", func(t *testing.T) {
		m := claimsMap(serviceaccess.TypAccess)
		m["iat"], m["nbf"], m["exp"] = testNow.Unix()-59, testNow.Unix()-59, testNow.Unix()+1
		if _, err := v.Access(ctx, s.sign(t, serviceaccess.TypAccess, m)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestValidatorIssuedAtTolerance is the seed's clock rule: iat 5 s ahead passes, 6 s ahead is
// ErrNotYetValid; exp == now fails with no tolerance.
func TestValidatorIssuedAtTolerance(t *testing.T) {
	s := newSigner(t, "kid-1")
	v := validator(s, testNow)
	ctx := context.Background()
	for _, typ := range []string{serviceaccess.TypAccess, serviceaccess.TypRenewal} {
		verify := func(tok string) error {
			if typ == serviceaccess.TypAccess {
				_, err := v.Access(ctx, tok)
				return err
			}
			_, err := v.Renewal(ctx, tok)
			return err
		}
		t.Run("ok/"+typ+"/iat +5 s", func(t *testing.T) {
			m := claimsMap(typ)
			m["iat"], m["nbf"], m["exp"] = testNow.Unix()+5, testNow.Unix()+5, testNow.Unix()+35
			if err := verify(s.sign(t, typ, m)); err != nil {
				t.Fatal(err)
			}
		})
		for _, k := range []string{"iat", "nbf"} {
			t.Run("fail/"+typ+"/"+k+" +6 s", func(t *testing.T) {
				m := claimsMap(typ)
				m[k] = testNow.Unix() + 6
				if k == "iat" {
					m["nbf"] = testNow.Unix() + 6
				}
				m["exp"] = testNow.Unix() + 36
				err := verify(s.sign(t, typ, m))
				if !errors.Is(err, serviceaccess.ErrNotYetValid) {
					t.Fatalf("err %v, want ErrNotYetValid", err)
				}
				var te *serviceaccess.TokenError
				if !errors.As(err, &te) || te.Check != k {
					t.Fatalf("err %v, want a TokenError with check %s", err, k)
				}
			})
		}
		t.Run("fail/"+typ+"/exp == now", func(t *testing.T) {
			m := claimsMap(typ)
			m["iat"], m["nbf"], m["exp"] = testNow.Unix()-30, testNow.Unix()-30, testNow.Unix()
			err := verify(s.sign(t, typ, m))
			var te *serviceaccess.TokenError
			if !errors.As(err, &te) || te.Check != serviceaccess.CheckExp || errors.Is(err, serviceaccess.ErrNotYetValid) {
				t.Fatalf("err %v, want check exp", err)
			}
		})
		t.Run("fail/"+typ+"/exp == now with a sub-second clock", func(t *testing.T) {
			m := claimsMap(typ)
			m["iat"], m["nbf"], m["exp"] = testNow.Unix()-30, testNow.Unix()-30, testNow.Unix()
			v := validator(s, testNow.Add(400*time.Millisecond))
			var err error
			if typ == serviceaccess.TypAccess {
				_, err = v.Access(ctx, s.sign(t, typ, m))
			} else {
				_, err = v.Renewal(ctx, s.sign(t, typ, m))
			}
			var te *serviceaccess.TokenError
			if !errors.As(err, &te) || te.Check != serviceaccess.CheckExp {
				t.Fatalf("err %v, want check exp", err)
			}
		})
	}
}

func TestValidatorFail(t *testing.T) {
	s := newSigner(t, "kid-1")
	other := newSigner(t, "kid-2")
	v := validator(s, testNow)
	ctx := context.Background()
	acc := serviceaccess.TypAccess
	with := func(typ string, f func(m map[string]any)) string {
		m := claimsMap(typ)
		f(m)
		return s.sign(t, typ, m)
	}
	good := s.sign(t, acc, claimsMap(acc))
	payloadJSON := func(typ string, f func(m map[string]any)) string {
		m := claimsMap(typ)
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	nop := func(map[string]any) {}
	cases := []struct {
		name, token, check string
	}{
		{"fail/empty", "", serviceaccess.CheckFormat},
		{"fail/two segments", "a.b", serviceaccess.CheckFormat},
		{"fail/four segments", good + ".x", serviceaccess.CheckFormat},
		{"fail/padded base64", strings.Replace(good, ".", "=.", 1), serviceaccess.CheckFormat},
		{"fail/too long", good + strings.Repeat("A", serviceaccess.MaxTokenBytes), serviceaccess.CheckFormat},
		{"fail/header not object", s.signRaw(`[]`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/header trailing data", s.signRaw(s.header(acc)+`{}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/header duplicate typ", s.signRaw(`{"alg":"EdDSA","kid":"kid-1","typ":"`+acc+`","typ":"`+acc+`"}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/header extra jwk", s.signRaw(`{"alg":"EdDSA","kid":"kid-1","typ":"`+acc+`","jwk":{}}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/header no typ", s.signRaw(`{"alg":"EdDSA","kid":"kid-1"}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/header re-cased Typ", s.signRaw(`{"alg":"EdDSA","kid":"kid-1","Typ":"`+acc+`"}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/alg none", s.signRaw(`{"alg":"none","kid":"kid-1","typ":"`+acc+`"}`, payloadJSON(acc, nop)), serviceaccess.CheckHeader},
		{"fail/typ JWT", s.signRaw(s.header("JWT"), payloadJSON(acc, nop)), serviceaccess.CheckTyp},
		{"fail/typ renewal", s.signRaw(s.header(serviceaccess.TypRenewal), payloadJSON(acc, nop)), serviceaccess.CheckTyp},
		{"fail/typ re-cased", s.signRaw(s.header(strings.ToUpper(acc)), payloadJSON(acc, nop)), serviceaccess.CheckTyp},
		{"fail/typ number", s.signRaw(`{"alg":"EdDSA","kid":"kid-1","typ":1}`, payloadJSON(acc, nop)), serviceaccess.CheckTyp},
		{"fail/kid empty", s.signRaw(`{"alg":"EdDSA","kid":"","typ":"`+acc+`"}`, payloadJSON(acc, nop)), serviceaccess.CheckKID},
		{"fail/kid unknown", s.signRaw(`{"alg":"EdDSA","kid":"kid-9","typ":"`+acc+`"}`, payloadJSON(acc, nop)), serviceaccess.CheckKID},
		{"fail/signed by another key under our kid", other.signRaw(s.header(acc), payloadJSON(acc, nop)), serviceaccess.CheckSignature},
		{"fail/signature flipped", good[:len(good)-2] + flip(good[len(good)-2:]), serviceaccess.CheckSignature},
		{"fail/signature short", good[:strings.LastIndex(good, ".")+1] + "AAAA", serviceaccess.CheckSignature},
		{"fail/payload not object", s.signRaw(s.header(acc), `"x"`), serviceaccess.CheckPayload},
		{"fail/payload trailing", s.signRaw(s.header(acc), payloadJSON(acc, nop)+` 1`), serviceaccess.CheckPayload},
		{"fail/payload duplicate key", s.signRaw(s.header(acc), strings.Replace(payloadJSON(acc, nop), `{`, `{"sub":"`+testOwner+`",`, 1)), serviceaccess.CheckPayload},
		{"fail/payload re-cased key", s.signRaw(s.header(acc), strings.Replace(payloadJSON(acc, nop), `"sub"`, `"Sub"`, 1)), serviceaccess.CheckPayload},
		{"fail/payload unknown key", with(acc, func(m map[string]any) { m["scope"] = "x" }), serviceaccess.CheckPayload},
		{"fail/payload missing jti", with(acc, func(m map[string]any) { delete(m, "jti") }), serviceaccess.CheckPayload},
		{"fail/payload renewal use in access", with(acc, func(m map[string]any) { delete(m, "duty"); m["use"] = "renew" }), serviceaccess.CheckPayload},
		{"fail/payload null sub", with(acc, func(m map[string]any) { m["sub"] = nil }), serviceaccess.CheckPayload},
		{"fail/iss other space", with(acc, func(m map[string]any) { m["iss"] = serviceaccess.Issuer("other") }), serviceaccess.CheckIss},
		{"fail/iss user bearer", with(acc, func(m map[string]any) { m["iss"] = "urn:cotal:auth:" + testSpace }), serviceaccess.CheckIss},
		{"fail/aud other space", with(acc, func(m map[string]any) { m["aud"] = "other" }), serviceaccess.CheckPayload + "|" + serviceaccess.CheckAud},
		{"fail/aud list", with(acc, func(m map[string]any) { m["aud"] = []string{testSpace} }), serviceaccess.CheckPayload},
		{"fail/aud renewal audience on access", with(acc, func(m map[string]any) { m["aud"] = serviceaccess.RenewalAudience(testSpace) }), serviceaccess.CheckAud},
		{"fail/sub not derived", with(acc, func(m map[string]any) { m["sub"] = "alice" }), serviceaccess.CheckSub},
		{"fail/ver 2", with(acc, func(m map[string]any) { m["ver"] = 2 }), serviceaccess.CheckVer},
		{"fail/ver string", with(acc, func(m map[string]any) { m["ver"] = "1" }), serviceaccess.CheckVer},
		{"fail/duty other", with(acc, func(m map[string]any) { m["duty"] = "call" }), serviceaccess.CheckPurpose},
		{"fail/wit bad", with(acc, func(m map[string]any) { m["wit"] = "w_x" }), serviceaccess.CheckClaims},
		{"fail/ep bad", with(acc, func(m map[string]any) { m["ep"] = "Billing" }), serviceaccess.CheckClaims},
		{"fail/iid bad", with(acc, func(m map[string]any) { m["iid"] = "short" }), serviceaccess.CheckClaims},
		{"fail/root bad", with(acc, func(m map[string]any) { m["root"] = "p_abcdefghijklmnopqrstuvwxyz" }), serviceaccess.CheckClaims},
		{"fail/jti bad", with(acc, func(m map[string]any) { m["jti"] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ" }), serviceaccess.CheckClaims},
		{"fail/iat fraction", s.signRaw(s.header(acc), strings.Replace(payloadJSON(acc, nop), `"iat":1800000000`, `"iat":1800000000.5`, 1)), serviceaccess.CheckTimes},
		{"fail/exp string", with(acc, func(m map[string]any) { m["exp"] = "1800000030" }), serviceaccess.CheckTimes},
		{"fail/exp negative", with(acc, func(m map[string]any) { m["exp"] = -1 }), serviceaccess.CheckTimes},
		{"fail/exp past", with(acc, func(m map[string]any) {
			m["iat"], m["nbf"], m["exp"] = testNow.Unix()-40, testNow.Unix()-40, testNow.Unix()-1
		}), serviceaccess.CheckExp},
		{"fail/access lifetime 61 s", with(acc, func(m map[string]any) { m["exp"] = testNow.Unix() + 61 }), serviceaccess.CheckLifetime},
		{"fail/exp before iat", with(acc, func(m map[string]any) {
			m["iat"], m["nbf"] = testNow.Unix()+4, testNow.Unix()+4
			m["exp"] = testNow.Unix() + 3
		}), serviceaccess.CheckLifetime},
		{"fail/exp == iat", with(acc, func(m map[string]any) {
			m["iat"], m["nbf"] = testNow.Unix()+4, testNow.Unix()+4
			m["exp"] = testNow.Unix() + 4
		}), serviceaccess.CheckLifetime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Access(ctx, tc.token)
			var te *serviceaccess.TokenError
			if c != nil || !errors.As(err, &te) {
				t.Fatalf("claims %v, err %v: want a TokenError", c, err)
			}
			if !strings.Contains("|"+tc.check+"|", "|"+te.Check+"|") {
				t.Fatalf("check %q (%v), want %q", te.Check, err, tc.check)
			}
			if tc.token != "" && strings.Contains(err.Error(), tc.token[:min(len(tc.token), 16)]) {
				t.Fatalf("the error holds token text: %v", err)
			}
		})
	}
	rcases := []struct {
		name, token, check string
	}{
		{"fail/renewal lifetime 24 h + 1 s", with(serviceaccess.TypRenewal, func(m map[string]any) { m["exp"] = testNow.Unix() + 24*3600 + 1 }), serviceaccess.CheckLifetime},
		{"fail/renewal aud the space", with(serviceaccess.TypRenewal, func(m map[string]any) { m["aud"] = testSpace }), serviceaccess.CheckAud},
		{"fail/renewal use other", with(serviceaccess.TypRenewal, func(m map[string]any) { m["use"] = "serve" }), serviceaccess.CheckPurpose},
		{"fail/renewal carrying duty", with(serviceaccess.TypRenewal, func(m map[string]any) { m["duty"] = "serve" }), serviceaccess.CheckPayload},
		{"fail/access token as renewal", good, serviceaccess.CheckTyp},
	}
	for _, tc := range rcases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Renewal(ctx, tc.token)
			var te *serviceaccess.TokenError
			if c != nil || !errors.As(err, &te) || te.Check != tc.check {
				t.Fatalf("claims %v, err %v: want a TokenError with check %s", c, err, tc.check)
			}
		})
	}
}

func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

// TestValidatorKindsApart: no token kind passes as another. A user bearer (typ JWT) passes as
// neither, an access bearer is no renewal proof and a renewal proof no access bearer, even when
// its payload is rewritten for the other kind and signed under the issuer's key with its own typ.
func TestValidatorKindsApart(t *testing.T) {
	s := newSigner(t, "kid-1")
	v := validator(s, testNow)
	ctx := context.Background()
	user := s.sign(t, "JWT", map[string]any{"iss": "urn:cotal:auth:" + testSpace, "aud": testSpace, "sub": testOwner,
		"ver": 1, "iat": testNow.Unix(), "nbf": testNow.Unix(), "exp": testNow.Unix() + 30, "jti": testJTI,
		"act": map[string]any{"owner": testOwner, "actor": "cli"}, "scope": []string{"x"}})
	access := s.sign(t, serviceaccess.TypAccess, claimsMap(serviceaccess.TypAccess))
	renewal := s.sign(t, serviceaccess.TypRenewal, claimsMap(serviceaccess.TypRenewal))
	accessPayloadAsRenewal := s.sign(t, serviceaccess.TypRenewal, claimsMap(serviceaccess.TypAccess))
	renewalPayloadAsAccess := s.sign(t, serviceaccess.TypAccess, claimsMap(serviceaccess.TypRenewal))
	userPayloadAsAccess := s.signRaw(s.header(serviceaccess.TypAccess), `{"iss":"urn:cotal:auth:`+testSpace+`","aud":"`+testSpace+`","sub":"`+testOwner+`","ver":1,"iat":1800000000,"nbf":1800000000,"exp":1800000030,"jti":"`+testJTI+`"}`)

	for _, tc := range []struct {
		name, token string
		access      bool
	}{
		{"fail/user bearer as access", user, true},
		{"fail/user bearer as renewal", user, false},
		{"fail/renewal as access", renewal, true},
		{"fail/access as renewal", access, false},
		{"fail/access payload under renewal typ", accessPayloadAsRenewal, false},
		{"fail/renewal payload under access typ", renewalPayloadAsAccess, true},
		{"fail/user payload under access typ", userPayloadAsAccess, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.access {
				var c *serviceaccess.AccessClaims
				c, err = v.Access(ctx, tc.token)
				if c != nil {
					t.Fatal("claims returned")
				}
			} else {
				var c *serviceaccess.RenewalClaims
				c, err = v.Renewal(ctx, tc.token)
				if c != nil {
					t.Fatal("claims returned")
				}
			}
			var te *serviceaccess.TokenError
			if !errors.As(err, &te) {
				t.Fatalf("err %v, want a TokenError", err)
			}
		})
	}
	t.Run("ok/TypOf", func(t *testing.T) {
		for tok, want := range map[string]string{user: "JWT", access: serviceaccess.TypAccess, renewal: serviceaccess.TypRenewal,
			s.signRaw(`{"alg":"EdDSA","kid":"k"}`, `{}`): ""} {
			if got, err := serviceaccess.TypOf(tok); err != nil || got != want {
				t.Fatalf("TypOf = %q, %v; want %q", got, err, want)
			}
		}
	})
	t.Run("fail/TypOf", func(t *testing.T) {
		for _, tok := range []string{"", "a.b", "!!.e30.AA", b64(`[]`) + ".e30.AA", s.signRaw(`{"typ":1}`, `{}`), s.signRaw(`{"typ":"a"} x`, `{}`)} {
			if got, err := serviceaccess.TypOf(tok); err == nil {
				t.Fatalf("TypOf(%q) = %q, want an error", tok, got)
			}
		}
	})
	t.Run("fail/validator without a space", func(t *testing.T) {
		v := &serviceaccess.Validator{Keys: s.keys(), Now: func() time.Time { return testNow }}
		var te *serviceaccess.TokenError
		if _, err := v.Access(ctx, access); !errors.As(err, &te) || te.Check != serviceaccess.CheckIss {
			t.Fatalf("err %v, want check iss", err)
		}
	})
	t.Run("fail/no key source", func(t *testing.T) {
		v := &serviceaccess.Validator{Space: testSpace}
		if _, err := v.Access(ctx, access); err == nil {
			t.Fatal("passed")
		}
	})
}
