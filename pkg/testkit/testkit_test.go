package testkit_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/testkit"
)

func TestStartBroker(t *testing.T) {
	b := testkit.StartBroker(t, "alpha", "beta")
	if !strings.HasPrefix(b.URL, "nats://127.0.0.1:") {
		t.Fatalf("URL %q is not loopback", b.URL)
	}
	if err := b.Operator.Verify(b.Trust); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alpha", "beta"} {
		sp := b.Space(name)
		if err := sp.Signing.Verify(sp.Trust); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cpub, err := sp.Callout.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if got := sp.Trust.CalloutUsers(); len(got) != 1 || got[0] != cpub {
			t.Fatalf("%s: callout users %v, want [%s]", name, got, cpub)
		}
	}
	if b.Space("alpha").Trust.DataAccountPublicKey() == b.Space("beta").Trust.DataAccountPublicKey() {
		t.Fatal("spaces share a data account")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Space of an unknown name did not panic")
		}
	}()
	b.Space("gamma")
}

func TestMintUserAndConnect(t *testing.T) {
	b := testkit.StartBroker(t, "alpha")
	sp := b.Space("alpha")
	p := profiles.Params{Owner: "o1", Actor: "a1", LifecycleUID: "abcdefghijklmnopqrstuvwxyz", AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}}
	tok, kp := sp.MintUser(t, profiles.Agent, p, time.Minute)
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	switch {
	case uc.Subject != pub:
		t.Fatalf("subject %s, want %s", uc.Subject, pub)
	case uc.IssuerAccount != sp.Trust.DataAccountPublicKey():
		t.Fatalf("issuer account %s", uc.IssuerAccount)
	case uc.Issuer != sp.Trust.DataSigningKeys()[0]:
		t.Fatalf("issuer %s, want the data signing key", uc.Issuer)
	case uc.Expires == 0 || uc.Expires > time.Now().Add(time.Minute+5*time.Second).Unix():
		t.Fatalf("exp %d does not follow the ttl", uc.Expires)
	}
	nc, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	// The agent may not publish to another owner's chat subject: the broker says so.
	denied := "cotal.alpha.chat.o2.a2.general"
	if err := nc.Publish(denied, []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := b.WaitAsyncError(t, nc, testkit.PublishViolation(denied))
	if !errors.Is(got, nats.ErrPermissionViolation) {
		t.Fatalf("async error %v is not a permission violation", got)
	}

	t.Run("fail/user of another broker", func(t *testing.T) {
		other := testkit.StartBroker(t, "alpha")
		tok, kp := other.Space("alpha").MintUser(t, profiles.Agent, p, time.Minute)
		if nc, err := b.Connect(t, tok, kp); err == nil {
			nc.Close()
			t.Fatal("connected with a foreign user")
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("err = %v, want authorization violation", err)
		}
	})
	t.Run("ok/auth callout user is the registered key", func(t *testing.T) {
		_, kp := sp.MintUser(t, profiles.AuthCallout, profiles.Params{}, 0)
		if kp != sp.Callout {
			t.Fatal("auth-callout user did not get the registered callout key")
		}
	})
}

// fakeTB records Fatalf (the first, where a real test would stop) and Errorf instead of failing
// the test, to test the helpers' failure paths.
type fakeTB struct {
	testing.TB
	failed string
	errors []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	if f.failed == "" {
		f.failed = fmt.Sprintf(format, args...)
	}
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func TestEventually(t *testing.T) {
	t.Run("ok/becomes true", func(t *testing.T) {
		n := 0
		testkit.Eventually(t, 5*time.Second, func() error {
			if n++; n < 3 {
				return fmt.Errorf("n=%d", n)
			}
			return nil
		})
		if n != 3 {
			t.Fatalf("f called %d times, want 3", n)
		}
	})
	t.Run("fail/deadline reports the last error", func(t *testing.T) {
		f := &fakeTB{TB: t}
		start := time.Now()
		testkit.Eventually(f, 50*time.Millisecond, func() error { return errors.New("still false") })
		if !strings.Contains(f.failed, "still false") {
			t.Fatalf("failure %q does not carry the last error", f.failed)
		}
		if el := time.Since(start); el < 50*time.Millisecond || el > 5*time.Second {
			t.Fatalf("returned after %v", el)
		}
	})
}

func TestRuns(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"a"}, "a"},
		{[]string{"a", "a", "b", "c", "c", "c"}, "a ×2, b, c ×3"},
		{[]string{"a", "b", "a"}, "a, b, a"},
	} {
		if got := testkit.Runs(tc.in); got != tc.want {
			t.Errorf("Runs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDocBlock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "page.md")
	page := "# t\n\n```sh\nmake run\n```\n\n```yaml\na: 1\nb: [x]\n```\n"
	if err := os.WriteFile(p, []byte(page), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := testkit.DocBlock(t, p, "yaml"); got != "a: 1\nb: [x]\n" {
		t.Fatalf("DocBlock = %q", got)
	}
	if got := testkit.DocBlock(t, p, "sh"); got != "make run\n" {
		t.Fatalf("DocBlock(sh) = %q", got)
	}
}
