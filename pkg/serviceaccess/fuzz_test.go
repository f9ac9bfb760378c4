package serviceaccess_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// FuzzParseEnvelope: arbitrary bodies never panic; what parses is closed and re-parses to the
// same request (its encoding is a fixed point), its body digest is stable, and every refusal is
// an *Error.
func FuzzParseEnvelope(f *testing.F) {
	for _, b := range envelopes(f) {
		f.Add([]byte(b))
	}
	f.Add([]byte(`{"request":{"kind":"status"},"proof":{"kind":"operator"}}`))
	f.Add([]byte(`{"request":null,"proof":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := serviceaccess.ParseEnvelope(b)
		if err != nil {
			var pe *serviceaccess.Error
			if e != nil || !errors.As(err, &pe) {
				t.Fatalf("envelope %v, err %v", e, err)
			}
			return
		}
		if !serviceaccess.ValidKind(e.Request.Kind) || (e.Request.Kind != serviceaccess.KindStatus && !serviceaccess.ValidRequestID(e.Request.RequestID)) {
			t.Fatalf("accepted request %+v", e.Request)
		}
		if e.Request.Contract != nil {
			if _, err := e.Request.Contract.Check(e.Request.Endpoint); err != nil {
				t.Fatalf("accepted a contract Check refuses: %v", err)
			}
		}
		again, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		e2, err := serviceaccess.ParseEnvelope(again)
		if err != nil {
			t.Fatalf("the encoding of an accepted envelope does not parse: %v\n%s", err, again)
		}
		d1, err1 := serviceaccess.BodyDigest(&e.Request)
		d2, err2 := serviceaccess.BodyDigest(&e2.Request)
		if err1 != nil || err2 != nil || d1 != d2 || e.Proof != e2.Proof {
			t.Fatalf("round trip changed the request: %s != %s (%v, %v)", d1, d2, err1, err2)
		}
	})
}

// FuzzParseAnswer: arbitrary answers never panic; what parses re-encodes (Marshal) to bytes
// that parse to the same answer, and its status is a known one.
func FuzzParseAnswer(f *testing.F) {
	for _, b := range answers(f) {
		f.Add([]byte(b))
	}
	f.Add([]byte(`{"kind":"status"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := serviceaccess.ParseAnswer(b)
		if err != nil {
			var pe *serviceaccess.Error
			if a != nil || !errors.As(err, &pe) {
				t.Fatalf("answer %v, err %v", a, err)
			}
			return
		}
		if s := a.HTTPStatus(); s < 200 || s >= 500 && s != 503 {
			t.Fatalf("status %d for an accepted answer", s)
		}
		out, err := a.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		a2, err := serviceaccess.ParseAnswer(out)
		if err != nil {
			t.Fatalf("the encoding of an accepted answer does not parse: %v\n%s", err, out)
		}
		out2, _ := a2.Marshal()
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the answer:\n%s\n%s", out, out2)
		}
	})
}

// FuzzValidator: random bytes as a token never panic and never pass, as either kind; TypOf
// never panics either. A valid token with one byte changed never passes.
func FuzzValidator(f *testing.F) {
	s := newSigner(f, "kid-1")
	v := validator(s, testNow)
	good := s.sign(f, serviceaccess.TypAccess, claimsMap(serviceaccess.TypAccess))
	f.Add(good, 0, byte(0))
	renewal := s.sign(f, serviceaccess.TypRenewal, claimsMap(serviceaccess.TypRenewal))
	f.Add(renewal, 10, byte('x'))
	f.Add("", 0, byte(0))
	f.Add("a.b.c", 1, byte('.'))
	f.Add(b64(`{"alg":"EdDSA","kid":"kid-1","typ":"`+serviceaccess.TypAccess+`"}`)+".e30.", 3, byte('A'))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, tok string, at int, b byte) {
		_, _ = serviceaccess.TypOf(tok)
		if tok != good && tok != renewal {
			if c, err := v.Access(ctx, tok); err == nil || c != nil {
				// Only a token our key signed can pass; the fuzzer cannot forge one.
				t.Fatalf("a fuzzed token passed as access: %+v", c)
			}
			if c, err := v.Renewal(ctx, tok); err == nil || c != nil {
				t.Fatalf("a fuzzed token passed as renewal: %+v", c)
			}
		}
		if at < 0 || at >= len(good) || good[at] == b {
			return
		}
		mut := good[:at] + string(b) + good[at+1:]
		// Strict base64url refuses spare bits set in a segment's last character, so no other text
		// decodes to the same token.
		if c, err := v.Access(ctx, mut); err == nil {
			t.Fatalf("a mutated token passed at %d: %+v", at, c)
		} else {
			var te *serviceaccess.TokenError
			if !errors.As(err, &te) || strings.Contains(err.Error(), mut[:min(len(mut), 12)]) {
				t.Fatalf("refusal %v is not a TokenError free of token text", err)
			}
		}
	})
}

// FuzzContractCheck: arbitrary manifests and closure lists never panic; an accepted contract
// has the endpoint's closure, sorted digests and only ephemeral commands and ungoverned traits.
func FuzzContractCheck(f *testing.F) {
	f.Add(manifestJSON(testEP), manifestJSON("ledger"), testEP, false)
	f.Add(`{"v":1,"root":{"urn":"ep","kind":"endpoint"},"members":[{"urn":"x","kind":"trait","governed":true}]}`, "", "ep", true)
	f.Add(`{"v":1,"root":{"urn":"ep","kind":"endpoint"},"members":[{"urn":"x","kind":"command","lifetime":"durable"}]}`, "{}", "ep", false)
	f.Fuzz(func(t *testing.T, m1, m2, endpoint string, shuffle bool) {
		ms := []string{m1}
		if m2 != "" {
			ms = append(ms, m2)
		}
		c := contractOf(ms...)
		if shuffle && len(c.Closures) == 2 {
			c.Closures[0], c.Closures[1] = c.Closures[1], c.Closures[0]
		}
		got, err := c.Check(endpoint)
		if err != nil {
			var pe *serviceaccess.Error
			if got != nil || !errors.As(err, &pe) {
				t.Fatalf("manifests %v, err %v", got, err)
			}
			return
		}
		own := 0
		for _, m := range got {
			own += map[bool]int{true: 1}[m.Root.URN == endpoint]
			for _, mem := range m.Members {
				if mem.Kind == "command" && mem.Lifetime != "ephemeral" || mem.Kind == "trait" && mem.Governed {
					t.Fatalf("accepted member %+v", mem)
				}
			}
		}
		if own != 1 || len(got) != len(c.Closures) {
			t.Fatalf("accepted %d own closures of %d", own, len(got))
		}
		for i := 1; i < len(c.Closures); i++ {
			if c.Closures[i-1] >= c.Closures[i] {
				t.Fatal("accepted unsorted closures")
			}
		}
		// The contract survives its wire form (and a snapshot of it its canonical form).
		snap := serviceaccess.Snapshot{V: 1, Account: testAccount, Space: testSpace, Owner: testOwner, Endpoint: endpoint,
			Instance: testIID, Generation: 1, Contract: *c}
		canon, err := snap.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		back, err := serviceaccess.ParseSnapshot(canon)
		if err != nil {
			t.Fatalf("the canonical snapshot of an accepted contract does not parse: %v", err)
		}
		again, _ := back.Canonical()
		if !bytes.Equal(again, canon) {
			t.Fatal("canonical bytes changed on a round trip")
		}
	})
}

// FuzzParseInfo: arbitrary GET answers never panic; an accepted one yields a key source with one
// key per published key.
func FuzzParseInfo(f *testing.F) {
	s := newSigner(f, "x")
	f.Add([]byte(infoJSON(s.priv.Public().(ed25519.PublicKey))))
	f.Add([]byte(`{"v":1,"account":"","space":"","issuer":"","keys":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := serviceaccess.ParseInfo(b)
		if err != nil {
			var pe *serviceaccess.Error
			if in != nil || !errors.As(err, &pe) {
				t.Fatalf("info %v, err %v", in, err)
			}
			return
		}
		ks, err := serviceaccess.KeysOf(in)
		if err != nil || len(ks) != len(in.Keys) || in.Issuer != serviceaccess.Issuer(in.Space) {
			t.Fatalf("accepted info %+v gives keys %v, %v", in, ks, err)
		}
	})
}
