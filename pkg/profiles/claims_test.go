package profiles

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

type mxKeyset struct {
	user, account  nkeys.KeyPair
	userPub, acPub string
}

func mxKeys(t testing.TB) mxKeyset {
	t.Helper()
	u, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	a, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	up, err := u.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	ap, err := a.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return mxKeyset{user: u, account: a, userPub: up, acPub: ap}
}

func mxSpec(t *testing.T, name Name, p Params) *Spec {
	t.Helper()
	s, err := Build(mxSpace, name, p)
	if err != nil {
		t.Fatalf("Build(%s): %v", name, err)
	}
	return s
}

var mxNow = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

func TestClaimsEveryProfile(t *testing.T) {
	k := mxKeys(t)
	for _, name := range All() {
		t.Run("ok/"+string(name), func(t *testing.T) {
			s := mxSpec(t, name, mxGoldenParams[name])
			ttl, err := name.Lifetime().TTL(0)
			if err != nil {
				t.Fatal(err)
			}
			uc, err := s.Claims(k.userPub, k.acPub, mxNow, ttl)
			if err != nil {
				t.Fatalf("Claims: %v", err)
			}
			if uc.Subject != k.userPub || uc.IssuerAccount != k.acPub || uc.Name != s.JWTName ||
				uc.BearerToken != s.Bearer || uc.IssuedAt != mxNow.Unix() || uc.Resp != nil {
				t.Fatalf("claims header fields wrong: %+v", uc)
			}
			if uc.Pub.Empty() || uc.Sub.Empty() {
				t.Fatalf("empty permission would allow everything: pub %+v sub %+v", uc.Pub, uc.Sub)
			}
			if name.Lifetime().NoExpiry {
				if uc.Expires != 0 {
					t.Fatalf("exp = %d, want none", uc.Expires)
				}
			} else if uc.Expires != mxNow.Add(ttl).Unix() {
				t.Fatalf("exp = %d, want %d", uc.Expires, mxNow.Add(ttl).Unix())
			}
			// Data- and system-account users get exactly one private inbox row, first; AUTH users
			// and service-serve none.
			var inboxes []string
			for _, sub := range uc.Sub.Allow {
				if strings.HasPrefix(sub, "_INBOX") {
					inboxes = append(inboxes, sub)
				}
			}
			if name.HasInbox() != (name.Account() != AccountAuth && name != ServiceServe) {
				t.Fatalf("%s: HasInbox() = %v", name, name.HasInbox())
			}
			if name.HasInbox() {
				tok := s.InboxNonce
				if tok == "" {
					tok = k.userPub
				}
				want := "_INBOX_" + tok + ".>"
				if len(inboxes) != 1 || uc.Sub.Allow[0] != want {
					t.Fatalf("inbox rows %v (first %q), want exactly %q first", inboxes, uc.Sub.Allow[0], want)
				}
			} else if len(inboxes) != 0 {
				t.Fatalf("%s user got inbox rows %v", name, inboxes)
			}
			// The spec is not aliased: mutating the claims leaves it untouched.
			before := mxSpecJSON(t, s)
			uc.Pub.Allow = append(uc.Pub.Allow[:0], "x")
			uc.Tags[0] = "x"
			if string(mxSpecJSON(t, s)) != string(before) {
				t.Fatal("Claims aliases the spec's slices")
			}
		})
	}
}

func TestClaimsRoundTripKeepsTagCase(t *testing.T) {
	k := mxKeys(t)
	s := mxSpec(t, Agent, mxWith(mxAgent(), func(p *Params) { p.Owner = "Local"; p.Actor = "BoB" }))
	uc, err := s.Claims(k.userPub, k.acPub, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := uc.Encode(k.account)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	back, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := []string{"owner:Local", "actor:BoB", "principal:Local.BoB", "profile:agent"}
	if !reflect.DeepEqual([]string(back.Tags), want) {
		t.Fatalf("decoded tags %v, want %v", back.Tags, want)
	}
	if !reflect.DeepEqual(back.Pub, uc.Pub) || !reflect.DeepEqual(back.Sub, uc.Sub) || back.Expires != uc.Expires {
		t.Fatal("decoded permissions or exp differ from the claims")
	}
	// This is why Claims assigns the tag list: the library's Add folds case, so "Local.BoB" and
	// "local.bob" would become one principal.
	var tl jwt.TagList
	tl.Add("principal:Local.BoB")
	if tl[0] != "principal:local.bob" {
		t.Fatalf("jwt.TagList.Add no longer lower-cases (%q); revisit Claims", tl[0])
	}
}

func TestClaimsRefusals(t *testing.T) {
	k := mxKeys(t)
	agent := func() *Spec { return mxSpec(t, Agent, mxAgent()) }
	tampered := func(f func(*Spec)) *Spec { s := agent(); f(s); return s }
	tests := []struct {
		name   string
		spec   *Spec
		user   string
		issuer string
		ttl    time.Duration
		field  string // the ParamError field; "" for another error containing want
		want   string
	}{
		{"fail/user is an account key", agent(), k.acPub, k.acPub, time.Hour, "userPub", "not a user public nkey"},
		{"fail/user empty", agent(), "", k.acPub, time.Hour, "userPub", ""},
		{"fail/user garbage", agent(), "UABC", k.acPub, time.Hour, "userPub", ""},
		{"fail/issuer is a user key", agent(), k.userPub, k.userPub, time.Hour, "issuerAccount", ""},
		{"fail/issuer empty", agent(), k.userPub, "", time.Hour, "issuerAccount", "not an account public nkey"},
		{"fail/ttl zero", agent(), k.userPub, k.acPub, 0, "ttl", ""},
		{"fail/ttl negative", agent(), k.userPub, k.acPub, -time.Hour, "ttl", ""},
		{"fail/ttl under a second", agent(), k.userPub, k.acPub, 500 * time.Millisecond, "ttl", "shorter than one second"},
		{"fail/ttl over max", agent(), k.userPub, k.acPub, 24*time.Hour + time.Second, "ttl", "exceeds the profile maximum"},
		{"fail/probe ttl over 60s", mxSpec(t, Probe, Params{}), k.userPub, k.acPub, 61 * time.Second, "ttl", ""},
		{"fail/sentinel with ttl", mxSpec(t, Sentinel, Params{}), k.userPub, k.acPub, time.Hour, "ttl", "carries no exp"},
		{"fail/spec lifetime widened", tampered(func(s *Spec) { s.Lifetime.Max = 365 * 24 * time.Hour }), k.userPub, k.acPub, time.Hour, "spec", "differ from the profile matrix"},
		{"fail/spec no expiry forged", tampered(func(s *Spec) { s.Lifetime = Lifetime{NoExpiry: true} }), k.userPub, k.acPub, 0, "spec", ""},
		{"fail/spec bearer forged", tampered(func(s *Spec) { s.Bearer = true }), k.userPub, k.acPub, time.Hour, "spec", ""},
		{"fail/spec account forged", tampered(func(s *Spec) { s.Account = AccountAuth }), k.userPub, k.acPub, time.Hour, "spec", ""},
		{"fail/spec emptied pub", mxSpec(t, Probe, Params{}), k.userPub, k.acPub, time.Minute, "spec", "allow everything"},
		{"fail/spec bad inbox nonce", tampered(func(s *Spec) { s.InboxNonce = ">" }), k.userPub, k.acPub, time.Hour, "InboxNonce", ""},
		{"fail/spec unknown profile", tampered(func(s *Spec) { s.Profile = "manager" }), k.userPub, k.acPub, time.Hour, "", `unknown profile "manager"`},
		{"fail/spec invalid subject", tampered(func(s *Spec) { s.Pub.Allow = append(s.Pub.Allow, "a b c") }), k.userPub, k.acPub, time.Hour, "", "do not validate"},
		{"fail/nil spec", nil, k.userPub, k.acPub, time.Hour, "", "nil spec"},
	}
	// Emptying the probe's deny list would make its publish permission allow-all.
	tests[15].spec.Pub.Deny = nil
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			uc, err := tc.spec.Claims(tc.user, tc.issuer, mxNow, tc.ttl)
			if uc != nil || err == nil {
				t.Fatalf("got %v, %v; want a refusal", uc, err)
			}
			var pe *ParamError
			if tc.field == "" {
				if errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want a non-parameter error containing %q", err, tc.want)
				}
				return
			}
			if !errors.As(err, &pe) || pe.Field != tc.field || !strings.Contains(pe.Reason, tc.want) {
				t.Fatalf("got %v, want *ParamError on %s containing %q", err, tc.field, tc.want)
			}
		})
	}
}

// mxNonce is a nonce bound to owner.actor, as a callout client presents it.
func mxNonce(t testing.TB, owner, actor string) string {
	t.Helper()
	n, err := space.BoundInboxNonce(owner, actor, "test-suffix-0001")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestClaimsReachNoOtherInbox is the property of issue 20 item 1 over every profile: the claims'
// subscribe allow list reaches no _INBOX_ token but the credential's own (its user key when
// minted, its bound nonce on the callout path), whatever other credential's key or nonce is
// named; and a callout nonce equal to a user key never builds.
func TestClaimsReachNoOtherInbox(t *testing.T) {
	k, other := mxKeys(t), mxKeys(t)
	otherNonce := mxNonce(t, "u_zzzzzzzzzzzzzzzzzzzzzzzzzz", "victim")
	for _, name := range All() {
		variants := map[string]Params{"minted": mxGoldenParams[name]}
		if p := mxGoldenParams[name]; matrix[name].accepts&fInboxNonce != 0 && p.Owner != "" && !matrix[name].target {
			p.InboxNonce = mxNonce(t, p.Owner, p.Actor)
			variants["callout"] = p
			p.InboxNonce = other.userPub
			if _, err := Build(mxSpace, name, p); err == nil {
				t.Fatalf("%s: a user key was accepted as inbox nonce", name)
			}
		}
		for vname, p := range variants {
			t.Run("ok/"+string(name)+"/"+vname, func(t *testing.T) {
				s := mxSpec(t, name, p)
				ttl, err := name.Lifetime().TTL(0)
				if err != nil {
					t.Fatal(err)
				}
				uc, err := s.Claims(k.userPub, k.acPub, mxNow, ttl)
				if err != nil {
					t.Fatal(err)
				}
				own := "_INBOX_" + k.userPub + ".>"
				if p.InboxNonce != "" {
					own = "_INBOX_" + p.InboxNonce + ".>"
				}
				for _, sub := range uc.Sub.Allow {
					if sub == own && name.Account() == AccountData {
						continue
					}
					for _, foreign := range []string{other.userPub, otherNonce, mxNonce(t, "u_yyyyyyyyyyyyyyyyyyyyyyyyyy", "x"), k.userPub} {
						target := "_INBOX_" + foreign + ".>"
						if target == own {
							continue
						}
						if space.PatternsIntersect(space.ChannelReach(sub), target) {
							t.Fatalf("subscribe row %q reaches %s", sub, target)
						}
					}
				}
			})
		}
	}
}
