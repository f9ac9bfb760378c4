package space

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

func TestBoundInboxNonce(t *testing.T) {
	tag, err := InboxTag("u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude")
	if err != nil {
		t.Fatal(err)
	}
	if len(tag) != InboxTagLen || strings.Trim(tag, "abcdefghijklmnopqrstuvwxyz234567") != "" {
		t.Fatalf("tag %q is not %d characters of [a-z2-7]", tag, InboxTagLen)
	}
	// The tag is fixed for a principal (a golden value: clients in other languages compute it).
	if tag != "7wg5xd4fax6zakhpqe3cgf6ago" {
		t.Fatalf("tag = %q, changed: every deployed client would be refused", tag)
	}
	own, err := BoundInboxNonce("u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude", "r4nd0m-_Suffix")
	if err != nil || own != tag+"-r4nd0m-_Suffix" {
		t.Fatalf("BoundInboxNonce = %q, %v", own, err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	userKey, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := BoundInboxNonce("u_bbbbbbbbbbbbbbbbbbbbbbbbbb", "claude", "r4nd0m-_Suffix")
	if err != nil {
		t.Fatal(err)
	}
	sameOwner, err := BoundInboxNonce("u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude2", "r4nd0m-_Suffix")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, nonce string
		ok          bool
	}{
		{"ok/own", own, true},
		{"ok/shortest suffix", tag + "-12345678", true},
		{"ok/longest", tag + "-" + strings.Repeat("x", 120-InboxTagLen-1), true},
		{"fail/user key", userKey, false},
		{"fail/another owner's nonce", other, false},
		{"fail/another actor's nonce", sameOwner, false},
		{"fail/random nonce", "Zm9vYmFyYmF6cXV4cXV1eA", false},
		{"fail/tag alone", tag, false},
		{"fail/tag and dash", tag + "-", false},
		{"fail/suffix 7", tag + "-1234567", false},
		{"fail/too long", tag + "-" + strings.Repeat("x", 120-InboxTagLen), false},
		{"fail/dot in suffix", tag + "-abcd.efgh", false},
		{"fail/wildcard suffix", tag + "-abcdefg>", false},
		{"fail/upper-case tag", strings.ToUpper(tag) + "-12345678", false},
		{"fail/tag without dash", tag + "12345678", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateBoundInboxNonce(tc.nonce, "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude")
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateBoundInboxNonce(%q) = %v, want ok %v", tc.nonce, err, tc.ok)
			}
			var ne *NameError
			if err != nil && (!errors.As(err, &ne) || ne.Kind != KindInboxNonce) {
				t.Fatalf("error %v is not an inbox-nonce NameError", err)
			}
		})
	}
	for _, tc := range []struct{ name, owner, actor, suffix string }{
		{"fail/bad owner", "a.b", "claude", "12345678"},
		{"fail/bad actor", "local", "", "12345678"},
		{"fail/short suffix", "local", "claude", "1234567"},
		{"fail/suffix wildcard", "local", "claude", "1234567*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n, err := BoundInboxNonce(tc.owner, tc.actor, tc.suffix); err == nil {
				t.Fatalf("BoundInboxNonce = %q, want an error", n)
			}
		})
	}
	if err := ValidateBoundInboxNonce(tag+"-12345678", "a.b", "claude"); err == nil {
		t.Fatal("ValidateBoundInboxNonce accepted an owner outside its grammar")
	}
}

// FuzzBoundInboxNonce holds the binding's two promises for any input: a nonce bound to a
// principal is never a user nkey's shape (so never a minted credential's inbox token) and is
// bound to no other principal.
func FuzzBoundInboxNonce(f *testing.F) {
	f.Add("u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude", "local", "r4nd0m-_Suffix", "7wg5xd4fax6zakhpqe3cgf6ago-12345678")
	f.Add("local", "a", "local", "b", "UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, owner, actor, otherOwner, suffix, nonce string) {
		if n, err := BoundInboxNonce(owner, actor, suffix); err == nil {
			if err := ValidateBoundInboxNonce(n, owner, actor); err != nil {
				t.Fatalf("BoundInboxNonce(%q, %q, %q) = %q, which its validator refuses: %v", owner, actor, suffix, n, err)
			}
		}
		if ValidateBoundInboxNonce(nonce, owner, actor) != nil {
			return
		}
		if ValidateInboxNonce(nonce) != nil || !strings.Contains(nonce, "-") || strings.ToUpper(nonce) == nonce {
			t.Fatalf("bound nonce %q has a user key's shape or is no inbox nonce", nonce)
		}
		if otherOwner != owner && ValidateOwner(otherOwner) == nil && ValidateBoundInboxNonce(nonce, otherOwner, actor) == nil {
			t.Fatalf("nonce %q is bound to both %q and %q", nonce, owner, otherOwner)
		}
	})
}

// BenchmarkValidateBoundInboxNonce is the per-connect cost of the binding: a callout grant checks
// it four times (authd's responder, signerd's SignCalloutResponse, profiles.Build and Claims).
//
//	go test -run '^$' -bench BenchmarkValidateBoundInboxNonce ./pkg/space/
func BenchmarkValidateBoundInboxNonce(b *testing.B) {
	n, err := BoundInboxNonce("u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude", "Zm9vYmFyYmF6cXV4cXV1eA")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateBoundInboxNonce(n, "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "claude"); err != nil {
			b.Fatal(err)
		}
	}
}
