package serve

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

func TestServeAuthenticityOf(t *testing.T) {
	f := newFixture(t)
	t.Run("ok/pins issuer and keys", func(t *testing.T) {
		second := jwkOf(seedKey("second").Public().(ed25519.PublicKey))
		info := *f.info
		info.Keys = append([]serviceaccess.JWK{}, f.info.Keys[0], second)
		a, err := ServeAuthenticityOf(&info)
		if err != nil {
			t.Fatal(err)
		}
		if a.Issuer() != "urn:cotal:service-access:acme" || a.Space() != testSpace || a.Account() != f.account {
			t.Fatalf("pinned %q %q %q", a.Issuer(), a.Space(), a.Account())
		}
		if kids := a.Kids(); len(kids) != 2 || !(kids[0] == f.kid || kids[1] == f.kid) || !(kids[0] == second.Kid || kids[1] == second.Kid) {
			t.Fatalf("kids %v", kids)
		}
	})
	bad := func(mut func(*serviceaccess.Info)) *serviceaccess.Info {
		info := *f.info
		info.Keys = append([]serviceaccess.JWK{}, f.info.Keys...)
		mut(&info)
		return &info
	}
	seventeen := make([]serviceaccess.JWK, 17)
	for i := range seventeen {
		seventeen[i] = jwkOf(seedKey(fmt.Sprint("k", i)).Public().(ed25519.PublicKey))
	}
	for _, tc := range []struct {
		name        string
		info        *serviceaccess.Info
		unpublished bool
	}{
		{"fail/nil", nil, false},
		{"fail/version 2", bad(func(i *serviceaccess.Info) { i.V = 2 }), false},
		{"fail/no issuer published", bad(func(i *serviceaccess.Info) { i.Issuer = "" }), true},
		{"fail/no keys published", bad(func(i *serviceaccess.Info) { i.Keys = nil }), true},
		{"fail/issuer of another space", bad(func(i *serviceaccess.Info) { i.Issuer = serviceaccess.Issuer("other") }), false},
		{"fail/issuer not the service issuer", bad(func(i *serviceaccess.Info) { i.Issuer = "https://idp.example" }), false},
		{"fail/space empty", bad(func(i *serviceaccess.Info) { i.Space, i.Issuer = "", serviceaccess.Issuer("") }), false},
		{"fail/account not an account key", bad(func(i *serviceaccess.Info) { i.Account = "UABC" }), false},
		{"fail/kid not the thumbprint", bad(func(i *serviceaccess.Info) { i.Keys[0].Kid = serviceaccess.Thumbprint("AAAA") }), false},
		{"fail/x not 32 bytes", bad(func(i *serviceaccess.Info) { i.Keys[0].X = "AAAA"; i.Keys[0].Kid = serviceaccess.Thumbprint("AAAA") }), false},
		{"fail/x padded", bad(func(i *serviceaccess.Info) { i.Keys[0].X += "="; i.Keys[0].Kid = serviceaccess.Thumbprint(i.Keys[0].X) }), false},
		{"fail/kty RSA", bad(func(i *serviceaccess.Info) { i.Keys[0].Kty = "RSA" }), false},
		{"fail/alg", bad(func(i *serviceaccess.Info) { i.Keys[0].Alg = "ES256" }), false},
		{"fail/use enc", bad(func(i *serviceaccess.Info) { i.Keys[0].Use = "enc" }), false},
		{"fail/kid twice", bad(func(i *serviceaccess.Info) { i.Keys = append(i.Keys, i.Keys[0]) }), false},
		{"fail/17 keys", bad(func(i *serviceaccess.Info) { i.Keys = seventeen }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ServeAuthenticityOf(tc.info)
			if err == nil {
				t.Fatalf("pinned %q", a.Issuer())
			}
			if got := errors.Is(err, ErrNotPublished); got != tc.unpublished {
				t.Fatalf("errors.Is(ErrNotPublished) = %v: %v", got, err)
			}
			if a.Issuer() != "" || len(a.Kids()) != 0 {
				t.Fatalf("a refused answer left an authenticity: %q %v", a.Issuer(), a.Kids())
			}
			// A refused authenticity brands nothing.
			in := f.input(f.claims(f.now, time.Minute))
			in.Authenticity = a
			if _, err := AuthorizeGuestServeGrant(in); !isRefusal(err, RefuseAuthenticity) {
				t.Fatalf("grant on a refused authenticity: %v", err)
			}
		})
	}
}

func isRefusal(err error, refusal string) bool {
	var ge *GrantError
	return errors.As(err, &ge) && ge.Refusal == refusal
}

func TestAuthorizeGuestServeGrant(t *testing.T) {
	f := newFixture(t)
	otherContract := contractOf(t, f.endpoint, "billing.api.refund")

	t.Run("ok/grant", func(t *testing.T) {
		f := newFixture(t) // its clock moves
		c := f.claims(f.now, time.Minute)
		g, err := AuthorizeGuestServeGrant(f.input(c))
		if err != nil {
			t.Fatal(err)
		}
		if g.Endpoint() != testEndpoint || g.Instance() != testInstance || g.Owner() != testOwner ||
			g.Witness() != f.witness || g.Root() != testRoot || g.Space() != testSpace || !g.Exp().Equal(f.now.Add(time.Minute)) {
			t.Fatalf("grant %q %q %q %q %q %q %v", g.Endpoint(), g.Instance(), g.Owner(), g.Witness(), g.Root(), g.Space(), g.Exp())
		}
		// A later bearer for the same instance passes Check once the clock reaches it; one for
		// another witness does not.
		f.now = f.now.Add(30 * time.Second)
		later := f.claims(f.now, time.Minute)
		if err := g.Check(f.token(later)); err != nil {
			t.Fatalf("Check(later): %v", err)
		}
		later["wit"] = serviceaccess.WitnessOf([]byte("another registration"))
		if err := g.Check(f.token(later)); !isRefusal(err, RefuseWitness) {
			t.Fatalf("Check(another witness) = %v", err)
		}
	})
	t.Run("ok/iat 5 s ahead", func(t *testing.T) {
		if _, err := AuthorizeGuestServeGrant(f.input(f.claims(f.now.Add(5*time.Second), time.Minute))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ok/exp one second after now", func(t *testing.T) {
		if _, err := AuthorizeGuestServeGrant(f.input(f.claims(f.now.Add(-59*time.Second), time.Minute))); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("fail/iat 6 s ahead is ServiceAccessNotYetValidError", func(t *testing.T) {
		in := f.input(f.claims(f.now.Add(6*time.Second), time.Minute))
		g, err := AuthorizeGuestServeGrant(in)
		if g != nil {
			t.Fatal("granted")
		}
		var nyv *ServiceAccessNotYetValidError
		if !errors.As(err, &nyv) {
			t.Fatalf("error %T %v, want *ServiceAccessNotYetValidError", err, err)
		}
		var env *EpEnvelopeError
		if !errors.As(err, &env) || env.Code != serviceaccess.CodePermissionDenied {
			t.Fatalf("EpEnvelopeError = %+v, want code permission-denied", env)
		}
		if !errors.Is(err, serviceaccess.ErrNotYetValid) {
			t.Fatalf("not ErrNotYetValid: %v", err)
		}
		var ge *GrantError
		if errors.As(err, &ge) {
			t.Fatalf("the clock refusal is also a GrantError %q", ge.Refusal)
		}
		noTokenText(t, err, in.Result.Access.Token)
	})
	t.Run("fail/nbf 6 s ahead is ServiceAccessNotYetValidError", func(t *testing.T) {
		c := f.claims(f.now, time.Minute)
		c["nbf"] = f.now.Add(6 * time.Second).Unix()
		var nyv *ServiceAccessNotYetValidError
		if _, err := AuthorizeGuestServeGrant(f.input(c)); !errors.As(err, &nyv) {
			t.Fatalf("error %v", err)
		}
	})

	claimsWith := func(k string, v any) map[string]any {
		c := f.claims(f.now, time.Minute)
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	otherKey := seedKey("other issuer")
	for _, tc := range []struct {
		name    string
		in      func() GrantInput
		refusal string
		check   string // the TokenError step, when the validator refused
	}{
		{"fail/zero authenticity", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Authenticity = Authenticity{}
			return in
		}, RefuseAuthenticity, ""},
		{"fail/another account", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.AccountPublicKey = accountKey(t)
			return in
		}, RefuseAccount, ""},
		{"fail/registration of another account", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = snapshotOf(t, accountKey(t), f.space, f.owner, f.endpoint, f.instance, f.contract)
			return in
		}, RefuseAccount, ""},
		{"fail/registration of another space", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = snapshotOf(t, f.account, "other", f.owner, f.endpoint, f.instance, f.contract)
			return in
		}, RefuseSpace, ""},
		{"fail/authority of another space", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			info := *f.info
			info.Space, info.Issuer = "other", serviceaccess.Issuer("other")
			a, err := ServeAuthenticityOf(&info)
			if err != nil {
				t.Fatal(err)
			}
			in.Authenticity = a
			return in
		}, RefuseSpace, ""},
		{"fail/bearer from another issuer", func() GrantInput {
			return f.input(claimsWith("iss", serviceaccess.Issuer("other")))
		}, RefuseIssuer, serviceaccess.CheckIss},
		{"fail/bearer for another space", func() GrantInput { return f.input(claimsWith("aud", "other")) }, RefuseSpace, serviceaccess.CheckAud},
		{"fail/bearer for another subject", func() GrantInput {
			return f.input(claimsWith("sub", "u_zzzzzzzzzzzzzzzzzzzzzzzzzz"))
		}, RefuseSubject, ""},
		{"fail/bearer subject not an owner", func() GrantInput { return f.input(claimsWith("sub", "alice")) }, RefuseSubject, serviceaccess.CheckSub},
		{"fail/bearer under a kid not published", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			c := f.claims(f.now, time.Minute)
			tok := sign(t, otherKey, jwkOf(otherKey.Public().(ed25519.PublicKey)).Kid, serviceaccess.TypAccess, c)
			in.Result = f.result(tok, c["exp"].(int64))
			return in
		}, RefuseKey, serviceaccess.CheckKID},
		{"fail/bearer signed by another key under the published kid", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			c := f.claims(f.now, time.Minute)
			tok := sign(t, otherKey, f.kid, serviceaccess.TypAccess, c)
			in.Result = f.result(tok, c["exp"].(int64))
			return in
		}, RefuseKey, serviceaccess.CheckSignature},
		{"fail/bearer names another witness", func() GrantInput {
			return f.input(claimsWith("wit", serviceaccess.WitnessOf([]byte("another"))))
		}, RefuseWitness, ""},
		{"fail/result names another witness", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Result.Witness = serviceaccess.WitnessOf([]byte("another"))
			return in
		}, RefuseWitness, ""},
		{"fail/registration re-registered with another owner", func() GrantInput {
			// The authority's witness is another registration's; the embedded one hashes apart.
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = snapshotOf(t, f.account, f.space, "u_zzzzzzzzzzzzzzzzzzzzzzzzzz", f.endpoint, f.instance, f.contract)
			return in
		}, RefuseWitness, ""},
		{"fail/bearer with another duty", func() GrantInput { return f.input(claimsWith("duty", "read")) }, RefuseDuty, serviceaccess.CheckPurpose},
		{"fail/bearer with no duty", func() GrantInput { return f.input(claimsWith("duty", nil)) }, RefuseBearer, serviceaccess.CheckPayload},
		{"fail/bearer for another endpoint", func() GrantInput { return f.input(claimsWith("ep", "billing.other")) }, RefuseEndpoint, ""},
		{"fail/bearer for another instance", func() GrantInput {
			return f.input(claimsWith("iid", "zzzzzzzzzzzzzzzzzzzzzzzzzz"))
		}, RefuseEndpoint, ""},
		{"fail/bearer under another root", func() GrantInput {
			in := f.input(claimsWith("root", "r_zzzzzzzzzzzzzzzzzzzzzzzzzz"))
			return in
		}, RefuseRoot, ""},
		{"fail/closure set not the embedded one", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Contract = otherContract
			return in
		}, RefuseClosures, ""},
		{"fail/artifact not the embedded one", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			tampered := serviceaccess.Contract{Closures: f.contract.Closures, Artifacts: []serviceaccess.Artifact{{
				Digest: f.contract.Artifacts[0].Digest, Bytes: append([]byte(nil), otherContract.Artifacts[0].Bytes...)}}}
			in.Registration.Snapshot = snapshotOf(t, f.account, f.space, f.owner, f.endpoint, f.instance, tampered)
			return in
		}, RefuseArtifact, ""},
		{"fail/closure does not read at its digest", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			bad := serviceaccess.Contract{Closures: f.contract.Closures, Artifacts: []serviceaccess.Artifact{{
				Digest: f.contract.Artifacts[0].Digest, Bytes: otherContract.Artifacts[0].Bytes}}}
			in.Registration.Contract = bad
			return in
		}, RefuseClosureDigest, ""},
		{"fail/registration for another endpoint", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Endpoint = "billing.other"
			return in
		}, RefuseEndpoint, ""},
		{"fail/registration with no snapshot", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = nil
			return in
		}, RefuseRegistration, ""},
		{"fail/registration snapshot not canonical", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = append(append([]byte{}, f.snapshot...), '\n')
			return in
		}, RefuseRegistration, ""},
		{"fail/registration snapshot with an unknown key", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Registration.Snapshot = append([]byte(`{"extra":1,`), f.snapshot[1:]...)
			return in
		}, RefuseRegistration, ""},
		{"fail/result not a credential", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Result.Kind = serviceaccess.AnswerReady
			return in
		}, RefuseResult, ""},
		{"fail/result without access", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Result.Access = nil
			return in
		}, RefuseResult, ""},
		{"fail/result expiry not the bearer's", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Result.Access.Exp++
			return in
		}, RefuseResult, ""},
		{"fail/result root not the bearer's", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			in.Result.Root = "r_zzzzzzzzzzzzzzzzzzzzzzzzzz"
			return in
		}, RefuseRoot, ""},
		{"fail/exp == now", func() GrantInput { return f.input(f.claims(f.now.Add(-time.Minute), time.Minute)) }, RefuseBearer, serviceaccess.CheckExp},
		{"fail/lifetime over 60 s", func() GrantInput { return f.input(f.claims(f.now, 61*time.Second)) }, RefuseBearer, serviceaccess.CheckLifetime},
		{"fail/renewal proof as access bearer", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			c := f.claims(f.now, time.Minute)
			delete(c, "duty")
			c["use"], c["aud"] = serviceaccess.UseRenew, serviceaccess.RenewalAudience(f.space)
			tok := sign(t, f.key, f.kid, serviceaccess.TypRenewal, c)
			in.Result = f.result(tok, c["exp"].(int64))
			return in
		}, RefuseBearer, serviceaccess.CheckTyp},
		{"fail/user bearer typ", func() GrantInput {
			in := f.input(f.claims(f.now, time.Minute))
			c := f.claims(f.now, time.Minute)
			tok := sign(t, f.key, f.kid, serviceaccess.TypUser, c)
			in.Result = f.result(tok, c["exp"].(int64))
			return in
		}, RefuseBearer, serviceaccess.CheckTyp},
		{"fail/unknown claim", func() GrantInput { return f.input(claimsWith("scope", "all")) }, RefuseBearer, serviceaccess.CheckPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in()
			g, err := AuthorizeGuestServeGrant(in)
			if g != nil || err == nil {
				t.Fatalf("granted: %v", err)
			}
			var ge *GrantError
			if !errors.As(err, &ge) || ge.Refusal != tc.refusal {
				t.Fatalf("error %v, want refusal %q", err, tc.refusal)
			}
			if tc.check != "" {
				var te *serviceaccess.TokenError
				if !errors.As(err, &te) || te.Check != tc.check {
					t.Fatalf("error %v, want token check %q", err, tc.check)
				}
			}
			var nyv *ServiceAccessNotYetValidError
			if errors.As(err, &nyv) {
				t.Fatalf("a %q refusal is a clock refusal", tc.refusal)
			}
			if in.Result != nil && in.Result.Access != nil {
				noTokenText(t, err, in.Result.Access.Token)
			}
		})
	}
}

func TestGrantCheck(t *testing.T) {
	f := newFixture(t)
	g, err := AuthorizeGuestServeGrant(f.input(f.claims(f.now, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("fail/zero grant", func(t *testing.T) {
		var z *Grant
		if err := z.Check(f.token(f.claims(f.now, time.Minute))); !isRefusal(err, RefuseAuthenticity) {
			t.Fatalf("Check on a nil grant: %v", err)
		}
		if err := (&Grant{}).Check(f.token(f.claims(f.now, time.Minute))); !isRefusal(err, RefuseAuthenticity) {
			t.Fatalf("Check on a zero grant: %v", err)
		}
	})
	for _, tc := range []struct {
		name, key string
		v         any
		refusal   string
	}{
		{"fail/another subject", "sub", "u_zzzzzzzzzzzzzzzzzzzzzzzzzz", RefuseSubject},
		{"fail/another endpoint", "ep", "billing.other", RefuseEndpoint},
		{"fail/another instance", "iid", "zzzzzzzzzzzzzzzzzzzzzzzzzz", RefuseEndpoint},
		{"fail/another root", "root", "r_zzzzzzzzzzzzzzzzzzzzzzzzzz", RefuseRoot},
		{"fail/another issuer", "iss", serviceaccess.Issuer("other"), RefuseIssuer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := f.claims(f.now, time.Minute)
			c[tc.key] = tc.v
			tok := f.token(c)
			err := g.Check(tok)
			if !isRefusal(err, tc.refusal) {
				t.Fatalf("Check = %v, want %q", err, tc.refusal)
			}
			noTokenText(t, err, tok)
		})
	}
	t.Run("fail/garbage", func(t *testing.T) {
		err := g.Check("not-a-token-at-all")
		if !isRefusal(err, RefuseBearer) {
			t.Fatalf("Check = %v", err)
		}
		noTokenText(t, err, "not-a-token-at-all")
	})
}
