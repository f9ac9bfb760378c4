package serve

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzGrantCheck feeds Check arbitrary bearer text: it never panics, a refusal is a
// *GrantError or a *ServiceAccessNotYetValidError and holds no token text, and what passes is
// a bearer for the grant's own instance.
func FuzzGrantCheck(f *testing.F) {
	fx := newFixture(f)
	g, err := AuthorizeGuestServeGrant(fx.input(fx.claims(fx.now, time.Minute)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fx.token(fx.claims(fx.now, time.Minute)))
	f.Add(fx.token(fx.claims(fx.now.Add(6*time.Second), time.Minute)))
	c := fx.claims(fx.now, time.Minute)
	c["wit"] = "w_" + "a"
	f.Add(fx.token(c))
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, tok string) {
		err := g.Check(tok)
		if err == nil {
			cl, err := g.check(tok)
			if err != nil || cl.Wit != fx.witness || cl.Ep != fx.endpoint || cl.Iid != fx.instance || cl.Sub != fx.owner || cl.Root != fx.root {
				t.Fatalf("accepted a bearer for another instance: %+v %v", cl, err)
			}
			return
		}
		var ge *GrantError
		var nyv *ServiceAccessNotYetValidError
		if !errors.As(err, &ge) && !errors.As(err, &nyv) {
			t.Fatalf("refusal %T %v", err, err)
		}
		if strings.HasPrefix(tok, "eyJ") { // compact JWS text; arbitrary input may spell a fixed sentence
			noTokenText(t, err, tok)
		}
	})
}
