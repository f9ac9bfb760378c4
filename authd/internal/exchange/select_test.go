package exchange_test

// manager-caller on both arms: the exchange binds the bearer to the instance a real
// authority.Selector picks from rows on a provisioned broker, answers it, and signerd signs it
// into act.managerInstanceId, which authd's own bearer verifier accepts.

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/pkg/space"
)

// selectEnv is an exchange whose selector reads a provisioned broker.
type selectEnv struct {
	*env
	js    jetstream.JetStream
	names space.Names
	store *authority.Store
}

func newSelectEnv(t *testing.T, policy string, local authority.LocalManager) *selectEnv {
	t.Helper()
	sp := authoritytest.Provisioned(t, spaceName)
	js, n := sp.JS, sp.Names
	store, err := authority.NewStore(sp.Conn, n, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := authority.NewSelector(authority.SelectorConfig{Store: store, Policy: policy, Local: local})
	if err != nil {
		t.Fatal(err)
	}
	return &selectEnv{env: newEnv(t, envOpts{selector: sel}), js: js, names: n, store: store}
}

func (e *selectEnv) manager(owner, iid string, m authoritytest.Manager) {
	e.t.Helper()
	m.Owner = owner
	authoritytest.WriteManager(e.t, e.js, e.names, iid, m)
}

// verified checks a granted answer: 200, managerInstanceId answered, and the bearer verifying
// under authd's verifier with act.managerInstanceId and view manager-caller.
func (e *env) verified(a answer, iid string) *bearer.Claims {
	e.t.Helper()
	if a.status != http.StatusOK {
		e.t.Fatalf("exchange = %d %s, want 200", a.status, a.body)
	}
	if got := a.json(e.t)["managerInstanceId"]; got != iid {
		e.t.Fatalf("answered managerInstanceId %v, want %s", got, iid)
	}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: spaceName, Signer: e.client.API()})
	if err != nil {
		e.t.Fatal(err)
	}
	v, err := bearer.NewVerifier(spaceName, cache, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := v.Verify(context.Background(), a.json(e.t)["token"].(string))
	if err != nil {
		e.t.Fatalf("authd's verifier refuses the bearer: %v", err)
	}
	if c.View != "manager-caller" || c.ManagerInstanceID != iid {
		e.t.Fatalf("bearer view %q instance %q, want manager-caller bound to %s", c.View, c.ManagerInstanceID, iid)
	}
	return c
}

func iid(c string) string { return strings.Repeat(c, 26) }

func TestManagerCaller(t *testing.T) {
	e := newSelectEnv(t, authority.SelectRemoteFirst, nil)
	owner := e.owner("person")
	e.grant(owner, "cli")
	_, tok := e.spawn(owner, "agent1")
	other := e.owner("other")
	e.grant(other, "cli")
	e.manager(owner, iid("r"), authoritytest.Manager{})
	e.manager(other, iid("o"), authoritytest.Manager{})
	human := func(extra map[string]any) answer {
		req := map[string]any{"idpToken": e.idpToken("person", time.Hour), "actor": "cli", "view": "manager-caller"}
		for k, v := range extra {
			req[k] = v
		}
		return e.exchange(req)
	}

	t.Run("ok/human-one-live-remote", func(t *testing.T) {
		c := e.verified(human(nil), iid("r"))
		if c.Owner != owner || c.Actor != "cli" {
			t.Fatalf("bearer %s.%s", c.Owner, c.Actor)
		}
	})
	t.Run("ok/agent-arm", func(t *testing.T) {
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok, "view": "manager-caller"})
		e.verified(a, iid("r"))
	})
	t.Run("ok/explicit", func(t *testing.T) {
		e.verified(human(map[string]any{"managerInstanceId": iid("r")}), iid("r"))
	})
	t.Run("fail/explicit-other-owner", func(t *testing.T) {
		a := human(map[string]any{"managerInstanceId": iid("o")})
		b := human(map[string]any{"managerInstanceId": iid("z")})
		if a.status != http.StatusConflict || !strings.Contains(a.errorText(t), "is not a live manager of this owner") {
			t.Fatalf("another owner's instance = %d %s, want 409", a.status, a.body)
		}
		if b.status != http.StatusConflict || strings.Replace(b.errorText(t), iid("z"), iid("o"), 1) != a.errorText(t) {
			t.Fatalf("an absent instance = %d %s, want the same refusal as another owner's", b.status, b.body)
		}
	})
	t.Run("fail/two-live-remotes", func(t *testing.T) {
		e.manager(owner, iid("s"), authoritytest.Manager{})
		a := human(nil)
		if a.status != http.StatusConflict || !strings.Contains(a.errorText(t), "name one with managerInstanceId") {
			t.Fatalf("ambiguous = %d %s, want 409", a.status, a.body)
		}
		e.verified(human(map[string]any{"managerInstanceId": iid("s")}), iid("s"))
	})
	t.Run("fail/no-manager", func(t *testing.T) {
		a := e.exchange(map[string]any{"idpToken": e.idpToken("other", time.Hour), "actor": "cli", "view": "manager-caller"})
		if a.status != http.StatusOK {
			t.Fatalf("other owner with its live manager = %d %s", a.status, a.body)
		}
		third := e.owner("third")
		e.grant(third, "cli")
		a = e.exchange(map[string]any{"idpToken": e.idpToken("third", time.Hour), "actor": "cli", "view": "manager-caller"})
		if a.status != http.StatusNotFound || !strings.Contains(a.errorText(t), "no manager instance") {
			t.Fatalf("no manager = %d %s, want 404", a.status, a.body)
		}
	})
	for _, tc := range []struct {
		name, want string
		req        map[string]any
	}{
		{"fail/instance-without-view", "comes only with view manager-caller",
			map[string]any{"idpToken": "x", "actor": "cli", "managerInstanceId": iid("r")}},
		{"fail/instance-other-view", "comes only with view manager-caller",
			map[string]any{"idpToken": "x", "actor": "cli", "view": "admin", "managerInstanceId": iid("r")}},
		{"fail/instance-grammar", "is not an instance id",
			map[string]any{"idpToken": "x", "actor": "cli", "view": "manager-caller", "managerInstanceId": "R.r"}},
		{"fail/instance-empty", "is not an instance id",
			map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok, "view": "manager-caller", "managerInstanceId": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.store.Reads()
			a := e.exchange(tc.req)
			if a.status != http.StatusBadRequest || !strings.Contains(a.errorText(t), tc.want) {
				t.Fatalf("exchange = %d %s, want 400 containing %q", a.status, a.body, tc.want)
			}
			if e.store.Reads() != before {
				t.Fatal("a malformed request read the store")
			}
		})
	}
	t.Run("fail/unauthorized-reads-nothing", func(t *testing.T) {
		before := e.store.Reads()
		a := e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": "wrong", "view": "manager-caller"})
		if a.status != http.StatusUnauthorized || e.store.Reads() != before {
			t.Fatalf("refused agent = %d %s after %d reads, want 401 and none", a.status, a.body, e.store.Reads()-before)
		}
	})
}

// TestManagerCallerLocalPrimary: the human arm's unpinned exchange gets the live local manager
// over a live remote one; the agent arm and an explicit selector keep remote-first.
func TestManagerCallerLocalPrimary(t *testing.T) {
	p := filepath.Join(t.TempDir(), authority.ManagerIdentityFile)
	e := newSelectEnv(t, authority.SelectLocalPrimary, authority.LocalManagerFile(p))
	owner := e.owner("person")
	e.grant(owner, "cli")
	_, tok := e.spawn(owner, "agent1")
	e.manager(owner, iid("r"), authoritytest.Manager{})
	e.manager(owner, iid("l"), authoritytest.Manager{})
	human := map[string]any{"idpToken": e.idpToken("person", time.Hour), "actor": "cli", "view": "manager-caller"}

	if a := e.exchange(human); a.status != http.StatusNotFound || !strings.Contains(a.errorText(t), "no local manager") {
		t.Fatalf("no local identity = %d %s, want 404", a.status, a.body)
	}
	authoritytest.WriteLocalIdentity(t, p, spaceName, iid("l"))
	e.verified(e.exchange(human), iid("l"))
	e.verified(e.exchange(map[string]any{"owner": owner, "actor": "agent1", "actorToken": tok, "view": "manager-caller"}), iid("r"))
	e.verified(e.exchange(map[string]any{"idpToken": e.idpToken("person", time.Hour), "actor": "cli", "view": "manager-caller",
		"managerInstanceId": iid("r")}), iid("r"))
}
