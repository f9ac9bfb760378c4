package authclient_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/space"
)

func idp(context.Context) (string, error) { return "tok", nil }

func TestNew(t *testing.T) {
	const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	for _, tc := range []struct {
		name string
		cfg  authclient.Config
		err  string
	}{
		{name: "ok/human-loopback", cfg: authclient.Config{URL: "http://127.0.0.1:8081", Actor: "alice", IdPToken: idp}},
		{name: "ok/human-localhost", cfg: authclient.Config{URL: "http://localhost:8081/", Actor: "alice", IdPToken: idp}},
		{name: "ok/agent-https", cfg: authclient.Config{URL: "https://auth.example.com", Actor: "a1", Owner: owner, ActorToken: "s"}},
		{name: "fail/http-remote", cfg: authclient.Config{URL: "http://auth.example.com", Actor: "alice", IdPToken: idp}, err: "loopback"},
		{name: "fail/scheme", cfg: authclient.Config{URL: "nats://127.0.0.1", Actor: "alice", IdPToken: idp}, err: "http(s)"},
		{name: "fail/userinfo", cfg: authclient.Config{URL: "http://u:p@127.0.0.1", Actor: "alice", IdPToken: idp}, err: "user info"},
		{name: "fail/both-arms", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "alice", IdPToken: idp, Owner: owner, ActorToken: "s"}, err: "exclusive"},
		{name: "fail/no-arm", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "alice"}, err: "required"},
		{name: "fail/agent-bad-owner", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "a1", Owner: "root", ActorToken: "s"}, err: "owner"},
		{name: "fail/agent-no-token", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "a1", Owner: owner}, err: "ActorToken"},
		{name: "fail/actor", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "a.b", IdPToken: idp}, err: "actor"},
		{name: "fail/ttl-fraction", cfg: authclient.Config{URL: "http://127.0.0.1", Actor: "alice", IdPToken: idp, TTL: 1500 * time.Millisecond}, err: "whole seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := authclient.New(tc.cfg)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				// An agent's nonce is bound to its principal from the start; a human's waits for
				// the owner its first exchange derives.
				if tc.cfg.Owner == "" {
					if c.Nonce() != "" || c.InboxPrefix() != "" {
						t.Fatalf("human client bound nonce %q before knowing its owner", c.Nonce())
					}
					return
				}
				if err := space.ValidateBoundInboxNonce(c.Nonce(), tc.cfg.Owner, tc.cfg.Actor); err != nil {
					t.Fatal(err)
				}
				if c.InboxPrefix() != "_INBOX_"+c.Nonce() {
					t.Fatalf("inbox prefix %q for nonce %q", c.InboxPrefix(), c.Nonce())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("New = %v, want error containing %q", err, tc.err)
			}
		})
	}
}

func TestNewNonce(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n, err := authclient.NewNonce()
		if err != nil {
			t.Fatal(err)
		}
		if err := space.ValidateInboxNonce(n); err != nil || len(n) != 22 || seen[n] {
			t.Fatalf("nonce %q: %v (repeated %v)", n, err, seen[n])
		}
		seen[n] = true
	}
}

func TestCheckSentinel(t *testing.T) {
	akp, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	mk := func(bearer bool) string {
		uc := jwt.NewUserClaims(upub)
		uc.BearerToken = bearer
		s, err := uc.Encode(akp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := authclient.CheckSentinel(mk(true)); err != nil {
		t.Fatalf("ok/bearer: %v", err)
	}
	if err := authclient.CheckSentinel(mk(false)); err == nil || !strings.Contains(err.Error(), "not a bearer") {
		t.Fatalf("fail/not-bearer: %v", err)
	}
	if err := authclient.CheckSentinel("x.y.z"); err == nil {
		t.Fatal("fail/garbage: accepted")
	}
}
