package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const owner = "u_abcdefghijklmnopqrstuvwxyz"

type run struct {
	out, errOut bytes.Buffer
	err         error
}

func env(dir string, r *run) admin.Env {
	return admin.Env{Stdout: &r.out, Stderr: &r.errOut, StateDir: dir, Now: func() time.Time { return time.Unix(1_800_000_000, 0) }}
}

func actor(t *testing.T, dir string, args ...string) *run {
	t.Helper()
	r := &run{}
	r.err = admin.Actor(context.Background(), args, env(dir, r))
	return r
}

func stateDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "state")
}

func TestActorGrant(t *testing.T) {
	dir := stateDir(t)
	r := actor(t, dir, "grant", "--owner", owner, "--actor", "alice", "--scope", "admin,spawn",
		"--allow-subscribe", "general,team.a,ops.>", "--allow-publish", "general,team.*", "--role", "reviewer", "--label", "Alice")
	if r.err != nil {
		t.Fatalf("grant: %v", r.err)
	}
	l, err := ledger.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	row, kind, err := l.Get(owner, "alice")
	if err != nil || kind != ledger.Interactive {
		t.Fatalf("Get = %v %v", kind, err)
	}
	if !slices.Equal(row.Scope, []string{"admin", "spawn"}) || !slices.Equal(row.AllowSubscribe, []string{"general", "team.a", "ops.>"}) ||
		!slices.Equal(row.AllowPublish, []string{"general", "team.*"}) || row.Role != "reviewer" || row.Label != "Alice" ||
		row.GrantedAt != 1_800_000_000_000 || space.ValidateUID(row.LifecycleUID) != nil || row.TokenHash != "" {
		t.Fatalf("row = %+v", row)
	}
	if !strings.Contains(r.out.String(), "granted "+owner+".alice") || !strings.Contains(r.out.String(), row.LifecycleUID) {
		t.Fatalf("grant printed %q", r.out.String())
	}

	t.Run("ok/regrant-rotates-uid-and-replaces-row", func(t *testing.T) {
		if r := actor(t, dir, "grant", "--owner", owner, "--actor", "alice"); r.err != nil {
			t.Fatal(r.err)
		}
		again, _, err := l.Get(owner, "alice")
		if err != nil || again.LifecycleUID == row.LifecycleUID || len(again.Scope) != 0 || len(again.AllowSubscribe) != 0 || again.Role != "" {
			t.Fatalf("re-granted row = %+v, %v; want a fresh uid and only what the flags say", again, err)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		err  string
		use  bool
	}{
		{name: "fail/no-owner", args: []string{"grant", "--actor", "bob"}, err: "one of --owner and --subject", use: true},
		{name: "fail/bad-owner", args: []string{"grant", "--owner", "root", "--actor", "bob"}, err: "owner"},
		{name: "fail/bad-actor", args: []string{"grant", "--owner", owner, "--actor", "b.o.b"}, err: "actor"},
		{name: "fail/malformed-channel-pattern", args: []string{"grant", "--owner", owner, "--actor", "bob", "--allow-publish", "team.>.x"}, err: "allowPublish"},
		{name: "fail/self-parent", args: []string{"grant", "--owner", owner, "--actor", "bob", "--parent", owner + ".bob"}, err: "parent"},
		{name: "fail/unknown-flag", args: []string{"grant", "--owner", owner, "--actor", "bob", "--token-hash", "x"}, err: "token-hash", use: true},
		{name: "fail/extra-arg", args: []string{"grant", "--owner", owner, "--actor", "bob", "extra"}, err: "unexpected argument", use: true},
		{name: "fail/unknown-subcommand", args: []string{"promote"}, err: "unknown subcommand", use: true},
		{name: "fail/no-subcommand", args: nil, err: "subcommand is required", use: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := actor(t, dir, tc.args...)
			var ue *admin.UsageError
			if r.err == nil || !strings.Contains(r.err.Error(), tc.err) || errors.As(r.err, &ue) != tc.use {
				t.Fatalf("actor %v = %v, want error containing %q (usage error %v)", tc.args, r.err, tc.err, tc.use)
			}
		})
	}
	t.Run("fail/no-state-dir", func(t *testing.T) {
		if r := actor(t, "", "list"); r.err == nil || !strings.Contains(r.err.Error(), "--state-dir") {
			t.Fatalf("list without a state dir = %v", r.err)
		}
	})
	t.Run("fail/loose-state-dir", func(t *testing.T) {
		loose := stateDir(t)
		if err := os.Mkdir(loose, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(loose, 0o755); err != nil {
			t.Fatal(err)
		}
		if r := actor(t, loose, "grant", "--owner", owner, "--actor", "bob"); r.err == nil || !strings.Contains(r.err.Error(), loose) {
			t.Fatalf("grant into a 0755 state dir = %v, want an error naming it", r.err)
		}
	})
}

// TestActorGrantScope: `authd actor grant --scope` takes capability words (the bearer grammar
// signerd signs) and role:<role> delegation tokens; anything else is refused at grant time with a
// sentence naming both forms, and no row is written (it used to be written and then fail every
// exchange with 502 when signerd refused to sign its scope).
func TestActorGrantScope(t *testing.T) {
	dir := stateDir(t)
	l, err := ledger.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ok/words-and-role", func(t *testing.T) {
		if r := actor(t, dir, "grant", "--owner", owner, "--actor", "carol", "--scope", "spawn,role:reviewer,supervise"); r.err != nil {
			t.Fatal(r.err)
		}
		row, _, err := l.Get(owner, "carol")
		if err != nil || !slices.Equal(row.Scope, []string{"spawn", "role:reviewer", "supervise"}) || !slices.Equal(row.BearerScope(), []string{"spawn", "supervise"}) {
			t.Fatalf("row %+v (bearer scope %q), %v", row, row.BearerScope(), err)
		}
	})
	for _, tc := range []struct{ name, scope, err string }{
		{"fail/upper-case", "spawn,Admin", `scope entry "Admin" is neither a capability word ([a-z][a-z0-9_-]{0,31}, carried in the bearer) nor role:<role>`},
		{"fail/leading-digit", "9lives", `scope entry "9lives" is neither a capability word`},
		{"fail/unknown-prefix", "team:x", `scope entry "team:x" is neither a capability word`},
		{"fail/too-long", "a" + strings.Repeat("b", 32), "is neither a capability word"},
		{"fail/role-grammar", "role:a:b", `scope entry "role:a:b" is not role:<role>`},
		{"fail/role-empty", "role:", `scope entry "role:" is not role:<role>`},
		{"fail/too-many-words", strings.Join(func() []string {
			var w []string
			for i := 0; i <= ledger.MaxCapabilities; i++ {
				w = append(w, fmt.Sprintf("w%d", i))
			}
			return w
		}(), ","), "17 capability words in scope, more than the 16 a bearer carries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := actor(t, dir, "grant", "--owner", owner, "--actor", "bob", "--scope", tc.scope)
			if r.err == nil || !strings.Contains(r.err.Error(), "authd actor grant") || !strings.Contains(r.err.Error(), tc.err) {
				t.Fatalf("grant --scope %q = %v, want an error containing %q", tc.scope, r.err, tc.err)
			}
			if _, _, err := l.Get(owner, "bob"); !errors.Is(err, ledger.ErrNoRow) {
				t.Fatalf("refused grant left a row: %v", err)
			}
		})
	}
}

func TestActorRevokeAndList(t *testing.T) {
	dir := stateDir(t)
	if r := actor(t, dir, "grant", "--owner", owner, "--actor", "alice", "--scope", "spawn"); r.err != nil {
		t.Fatal(r.err)
	}
	l, err := ledger.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, hash, _ := ledger.NewActorToken()
	if err := l.Put(ledger.Managed, ledger.Row{Ver: 1, Owner: owner, Actor: "worker", Scope: []string{}, AllowSubscribe: []string{}, AllowPublish: []string{},
		Parent: owner + ".alice", TokenHash: hash, LifecycleUID: "abcdefghijklmnopqrstuvwxyz", GrantedAt: 1}); err != nil {
		t.Fatal(err)
	}
	t.Run("ok/list-table", func(t *testing.T) {
		r := actor(t, dir, "list")
		if r.err != nil || !strings.Contains(r.out.String(), "actors") || !strings.Contains(r.out.String(), owner+".alice") ||
			!strings.Contains(r.out.String(), "managed-actors") || strings.Contains(r.out.String(), hash) {
			t.Fatalf("list = %v\n%s", r.err, r.out.String())
		}
	})
	t.Run("ok/list-json", func(t *testing.T) {
		r := actor(t, dir, "list", "--json")
		lines := strings.Split(strings.TrimSpace(r.out.String()), "\n")
		if r.err != nil || len(lines) != 2 || strings.Contains(r.out.String(), hash) {
			t.Fatalf("list --json = %v\n%s", r.err, r.out.String())
		}
		var first map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first["space"] != "actors" || first["actor"] != "alice" {
			t.Fatalf("first line %s: %v", lines[0], err)
		}
	})
	t.Run("fail/revoke-managed-without-flag", func(t *testing.T) {
		if r := actor(t, dir, "revoke", "--owner", owner, "--actor", "worker"); !errors.Is(r.err, ledger.ErrNoRow) {
			t.Fatalf("revoke of a managed row without --managed = %v, want ErrNoRow", r.err)
		}
	})
	t.Run("ok/revoke-managed", func(t *testing.T) {
		if r := actor(t, dir, "revoke", "--owner", owner, "--actor", "worker", "--managed"); r.err != nil {
			t.Fatal(r.err)
		}
		if _, _, err := l.Get(owner, "worker"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("Get after revoke = %v", err)
		}
	})
	t.Run("ok/revoke", func(t *testing.T) {
		r := actor(t, dir, "revoke", "--owner", owner, "--actor", "alice")
		if r.err != nil || !strings.Contains(r.out.String(), "revoked") {
			t.Fatalf("revoke = %v %q", r.err, r.out.String())
		}
		if _, _, err := l.Get(owner, "alice"); !errors.Is(err, ledger.ErrNoRow) {
			t.Fatalf("Get after revoke = %v", err)
		}
	})
	t.Run("fail/revoke-twice", func(t *testing.T) {
		if r := actor(t, dir, "revoke", "--owner", owner, "--actor", "alice"); !errors.Is(r.err, ledger.ErrNoRow) {
			t.Fatalf("second revoke = %v, want ErrNoRow", r.err)
		}
	})
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(admin.Env) error
		want string
	}{
		{name: "ok/actor", call: func(e admin.Env) error { return admin.Actor(context.Background(), []string{"--help"}, e) }, want: "authd actor grant"},
		{name: "ok/actor-grant", call: func(e admin.Env) error { return admin.Actor(context.Background(), []string{"grant", "--help"}, e) }, want: "-allow-publish"},
		{name: "ok/actor-revoke", call: func(e admin.Env) error { return admin.Actor(context.Background(), []string{"revoke", "-h"}, e) }, want: "-managed"},
		{name: "ok/actor-list", call: func(e admin.Env) error { return admin.Actor(context.Background(), []string{"list", "--help"}, e) }, want: "-json"},
		{name: "ok/idp", call: func(e admin.Env) error { return admin.IdP(context.Background(), []string{"--help"}, e) }, want: "authd idp pin URL"},
		{name: "ok/idp-pin", call: func(e admin.Env) error { return admin.IdP(context.Background(), []string{"pin", "--help"}, e) }, want: "pinned once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{}
			err := tc.call(env("", r))
			if !errors.Is(err, admin.ErrHelp) || !strings.Contains(r.out.String(), tc.want) {
				t.Fatalf("help = %v, printed %q; want %q", err, r.out.String(), tc.want)
			}
		})
	}
}

func TestIdPPin(t *testing.T) {
	fake := idptest.Start(t)
	pin := func(dir string, args ...string) *run {
		r := &run{}
		r.err = admin.IdP(context.Background(), args, env(dir, r))
		return r
	}
	t.Run("ok/pin-url-first", func(t *testing.T) {
		dir := stateDir(t)
		r := pin(dir, "pin", fake.URL)
		if r.err != nil || !strings.Contains(r.out.String(), "pinned IdP "+fake.URL) {
			t.Fatalf("pin = %v %q", r.err, r.out.String())
		}
		if p, err := idp.Load(dir); err != nil || p.Issuer != fake.URL {
			t.Fatalf("Load = %+v %v", p, err)
		}
	})
	t.Run("ok/pin-flag-first", func(t *testing.T) {
		dir := stateDir(t)
		if r := pin("", "pin", "--state-dir", dir, fake.URL); r.err != nil {
			t.Fatal(r.err)
		}
		if _, err := idp.Load(dir); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("fail/repin", func(t *testing.T) {
		dir := stateDir(t)
		if r := pin(dir, "pin", fake.URL); r.err != nil {
			t.Fatal(r.err)
		}
		other := idptest.Start(t)
		if r := pin(dir, "pin", other.URL); !errors.Is(r.err, idp.ErrRepin) {
			t.Fatalf("re-pin = %v", r.err)
		}
	})
	t.Run("fail/jwks-down", func(t *testing.T) {
		down := idptest.Start(t)
		down.SetDown(true)
		dir := stateDir(t)
		if r := pin(dir, "pin", down.URL); r.err == nil || !strings.Contains(r.err.Error(), "probe") {
			t.Fatalf("pin with the JWKS down = %v", r.err)
		}
		if _, err := idp.Load(dir); !errors.Is(err, idp.ErrNotPinned) {
			t.Fatalf("Load after a failed pin = %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{name: "fail/no-url", args: []string{"pin"}, err: "URL is required"},
		{name: "fail/two-urls", args: []string{"pin", fake.URL, "http://127.0.0.1:1"}, err: "unexpected argument"},
		{name: "fail/http-remote", args: []string{"pin", "http://idp.example.com"}, err: "loopback"},
		{name: "fail/unknown-subcommand", args: []string{"unpin"}, err: "unknown subcommand"},
		{name: "fail/no-subcommand", args: nil, err: "subcommand is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := pin(stateDir(t), tc.args...); r.err == nil || !strings.Contains(r.err.Error(), tc.err) {
				t.Fatalf("idp %v = %v, want error containing %q", tc.args, r.err, tc.err)
			}
		})
	}
}

// TestActorGrantBySubject: --subject derives the owner through a real signerd under the pinned
// IdP's issuer, the same derivation the exchange's human arm makes.
func TestActorGrantBySubject(t *testing.T) {
	ctx := context.Background()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha"}})
	client, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, "authd", "alpha")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	derive := admin.SignerDeriveOwner(client, "alpha")
	fake := idptest.Start(t)
	dir := stateDir(t)
	if _, err := idp.PinURL(ctx, dir, fake.URL, nil); err != nil {
		t.Fatal(err)
	}
	grantWith := func(dir string, d func(context.Context, string, string) (string, error), args ...string) *run {
		r := &run{}
		e := env(dir, r)
		e.DeriveOwner = d
		r.err = admin.Actor(ctx, args, e)
		return r
	}
	t.Run("ok/subject", func(t *testing.T) {
		if r := grantWith(dir, derive, "grant", "--subject", "alice@example.com", "--actor", "alice"); r.err != nil {
			t.Fatal(r.err)
		}
		want, err := derive(ctx, fake.URL, "alice@example.com")
		if err != nil {
			t.Fatal(err)
		}
		l, _ := ledger.Open(dir)
		if row, _, err := l.Get(want, "alice"); err != nil || row.Owner != want {
			t.Fatalf("row for the derived owner %s: %+v %v", want, row, err)
		}
		if r := grantWith(dir, derive, "revoke", "--subject", "alice@example.com", "--actor", "alice"); r.err != nil {
			t.Fatalf("revoke by subject: %v", r.err)
		}
	})
	for _, tc := range []struct {
		name   string
		dir    string
		derive func(context.Context, string, string) (string, error)
		args   []string
		err    string
	}{
		{name: "fail/owner-and-subject", dir: dir, derive: derive, args: []string{"grant", "--owner", owner, "--subject", "s", "--actor", "a"}, err: "one of --owner and --subject"},
		{name: "fail/no-signer", dir: dir, args: []string{"grant", "--subject", "s", "--actor", "a"}, err: "needs signerd"},
		{name: "fail/not-pinned", dir: stateDir(t), derive: derive, args: []string{"grant", "--subject", "s", "--actor", "a"}, err: "pinned"},
		{name: "fail/no-actor", dir: dir, derive: derive, args: []string{"grant", "--subject", "s"}, err: "--actor is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := grantWith(tc.dir, tc.derive, tc.args...); r.err == nil || !strings.Contains(r.err.Error(), tc.err) {
				t.Fatalf("%v = %v, want error containing %q", tc.args, r.err, tc.err)
			}
		})
	}
}
