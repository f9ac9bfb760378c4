package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

const (
	ownerA = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	uid1   = "lifecycle0000000000000000001"
	uid2   = "lifecycle0000000000000000002"
)

func newLedger(t *testing.T) *Ledger {
	t.Helper()
	l, err := Open(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func interactiveRow(owner, actor string) Row {
	return Row{
		Owner: owner, Actor: actor, Scope: []string{"spawn"},
		AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
		LifecycleUID: uid1, GrantedAt: 1700000000000,
	}
}

func managedRow(owner, actor, parent string) Row {
	r := interactiveRow(owner, actor)
	r.Scope = []string{}
	r.Parent = parent
	r.TokenHash = HashActorToken("secret-" + actor)
	return r
}

func mustPut(t *testing.T, l *Ledger, k Kind, r Row) {
	t.Helper()
	if err := l.Put(k, r); err != nil {
		t.Fatalf("Put %s %s: %v", k, r.Principal(), err)
	}
}

func wantErr(t *testing.T, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err %T is not a *ledger.Error", err)
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	l := newLedger(t)
	r := interactiveRow(ownerA, "laptop")
	r.Role = "reviewer"
	r.Label = "david laptop"
	mustPut(t, l, Interactive, r)
	got, kind, err := l.Get(ownerA, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	r.Ver = Version
	if kind != Interactive || !reflect.DeepEqual(got, r) {
		t.Fatalf("Get = %+v %s, want %+v actors", got, kind, r)
	}
	path := filepath.Join(l.Dir(), "actors", ownerA+".laptop.json")
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700, l.Dir(): 0o700} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	m := managedRow(ownerA, "worker", "")
	mustPut(t, l, Managed, m)
	if _, kind, err := l.Get(ownerA, "worker"); err != nil || kind != Managed {
		t.Fatalf("Get managed = %s, %v", kind, err)
	}
}

func TestAuthorizeConnect(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	t.Run("ok/scope within row", func(t *testing.T) {
		r, err := l.AuthorizeConnect(ownerA, "laptop", []string{"spawn"}, uid1)
		if err != nil || r.LifecycleUID != uid1 {
			t.Fatalf("AuthorizeConnect = %+v, %v", r, err)
		}
	})
	t.Run("ok/empty scope", func(t *testing.T) {
		if _, err := l.AuthorizeConnect(ownerA, "laptop", nil, uid1); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name         string
		owner, actor string
		scope        []string
		uid          string
		want         error
	}{
		{"fail/no row", ownerA, "other", nil, uid1, ErrNoRow},
		{"fail/other owner", ownerB, "laptop", nil, uid1, ErrNoRow},
		{"fail/scope widening", ownerA, "laptop", []string{"spawn", "admin"}, uid1, ErrScopeWidened},
		{"fail/uid mismatch", ownerA, "laptop", nil, uid2, ErrLifecycleMismatch},
		{"fail/no uid", ownerA, "laptop", nil, "", ErrLifecycleMismatch},
		{"fail/owner grammar", "u_x", "laptop", nil, uid1, ErrInvalidRow},
		{"fail/actor traversal", ownerA, "../x", nil, uid1, ErrInvalidRow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.AuthorizeConnect(tc.owner, tc.actor, tc.scope, tc.uid)
			wantErr(t, err, tc.want)
		})
	}
}

func TestRevokeBitesAtNextLookup(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	if _, err := l.AuthorizeConnect(ownerA, "laptop", nil, uid1); err != nil {
		t.Fatal(err)
	}
	if err := l.Revoke(Interactive, ownerA, "laptop"); err != nil {
		t.Fatal(err)
	}
	_, err := l.AuthorizeConnect(ownerA, "laptop", nil, uid1)
	wantErr(t, err, ErrNoRow)
	wantErr(t, l.Revoke(Interactive, ownerA, "laptop"), ErrNoRow)
	wantErr(t, l.Revoke(Managed, ownerA, "laptop"), ErrNoRow)
}

// A narrowing written by another process (another Ledger on the same directory) is seen at once.
func TestNarrowingSeenWithoutReopen(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	other, err := Open(l.Dir())
	if err != nil {
		t.Fatal(err)
	}
	narrowed := interactiveRow(ownerA, "laptop")
	narrowed.Scope = []string{}
	mustPut(t, other, Interactive, narrowed)
	_, err = l.AuthorizeConnect(ownerA, "laptop", []string{"spawn"}, uid1)
	wantErr(t, err, ErrScopeWidened)
	regranted := interactiveRow(ownerA, "laptop")
	regranted.LifecycleUID = uid2
	mustPut(t, other, Interactive, regranted)
	_, err = l.AuthorizeConnect(ownerA, "laptop", nil, uid1)
	wantErr(t, err, ErrLifecycleMismatch)
}

func TestBothSpacesDenied(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Managed, managedRow(ownerA, "worker", ""))
	// The writers refuse the second row, so plant it as tampering would.
	r := interactiveRow(ownerA, "worker")
	r.Ver = Version
	data, err := encodeRow(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(l.Dir(), "actors"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Dir(), "actors", ownerA+".worker.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = l.Get(ownerA, "worker")
	wantErr(t, err, ErrBothSpaces)
	_, err = l.AuthorizeConnect(ownerA, "worker", nil, uid1)
	wantErr(t, err, ErrBothSpaces)
	_, err = l.AuthorizeGrant(ownerA, "worker")
	wantErr(t, err, ErrBothSpaces)
	_, err = l.List()
	wantErr(t, err, ErrBothSpaces)
}

func TestPutRefusesOtherSpace(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	wantErr(t, l.Put(Managed, managedRow(ownerA, "laptop", "")), ErrOtherSpace)
	mustPut(t, l, Managed, managedRow(ownerA, "worker", ""))
	wantErr(t, l.Put(Interactive, interactiveRow(ownerA, "worker")), ErrOtherSpace)
	if _, err := os.Stat(filepath.Join(l.Dir(), "managed-actors", ownerA+".laptop.json")); !os.IsNotExist(err) {
		t.Fatalf("refused row was written: %v", err)
	}
}

func TestPutValidates(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "spawner"))
	for _, tc := range []struct {
		name string
		kind Kind
		edit func(*Row)
	}{
		{"fail/unknown kind", Kind("../x"), func(*Row) {}},
		{"fail/version 2", Interactive, func(r *Row) { r.Ver = 2 }},
		{"fail/plain owner", Interactive, func(r *Row) { r.Owner = "alice" }},
		{"fail/actor with dot", Interactive, func(r *Row) { r.Actor = "a.b" }},
		{"fail/actor empty", Interactive, func(r *Row) { r.Actor = "" }},
		{"fail/scope space", Interactive, func(r *Row) { r.Scope = []string{"a b"} }},
		{"fail/scope empty token", Interactive, func(r *Row) { r.Scope = []string{""} }},
		{"fail/scope duplicate", Interactive, func(r *Row) { r.Scope = []string{"spawn", "spawn"} }},
		{"fail/too many scopes", Interactive, func(r *Row) { r.Scope = manyTokens("role:s", MaxScope+1) }},
		{"fail/too many capability words", Interactive, func(r *Row) { r.Scope = manyTokens("s", MaxCapabilities+1) }},
		{"fail/scope upper-case word", Interactive, func(r *Row) { r.Scope = []string{"Spawn"} }},
		{"fail/scope word leading digit", Interactive, func(r *Row) { r.Scope = []string{"1spawn"} }},
		{"fail/scope word too long", Interactive, func(r *Row) { r.Scope = []string{"a" + strings.Repeat("b", 32)} }},
		{"fail/scope unknown prefix", Interactive, func(r *Row) { r.Scope = []string{"team:x"} }},
		{"fail/scope role empty", Interactive, func(r *Row) { r.Scope = []string{"role:"} }},
		{"fail/scope role colon", Interactive, func(r *Row) { r.Scope = []string{"role:a:b"} }},
		{"fail/scope role too long", Interactive, func(r *Row) { r.Scope = []string{"role:" + strings.Repeat("r", 65)} }},
		{"fail/channel '>' not last", Interactive, func(r *Row) { r.AllowSubscribe = []string{"team.>.x"} }},
		{"fail/channel partial wildcard", Interactive, func(r *Row) { r.AllowPublish = []string{"team*"} }},
		{"fail/channel empty token", Interactive, func(r *Row) { r.AllowPublish = []string{"team..x"} }},
		{"fail/channel space", Interactive, func(r *Row) { r.AllowSubscribe = []string{"team x"} }},
		{"fail/channel duplicate", Interactive, func(r *Row) { r.AllowPublish = []string{"a", "a"} }},
		{"fail/too many channels", Interactive, func(r *Row) { r.AllowSubscribe = manyTokens("c", 129) }},
		{"fail/role dot", Interactive, func(r *Row) { r.Role = "a.b" }},
		{"fail/parent not principal", Interactive, func(r *Row) { r.Parent = "alice" }},
		{"fail/parent three parts", Interactive, func(r *Row) { r.Parent = ownerA + ".a.b" }},
		{"fail/parent plain owner", Interactive, func(r *Row) { r.Parent = "alice.a" }},
		{"fail/parent itself", Interactive, func(r *Row) { r.Parent = ownerA + ".x" }},
		{"fail/label control", Interactive, func(r *Row) { r.Label = "a\nb" }},
		{"fail/label long", Interactive, func(r *Row) { r.Label = strings.Repeat("a", MaxLabelLen+1) }},
		{"fail/label invalid utf8", Interactive, func(r *Row) { r.Label = "\xff" }},
		{"fail/interactive token hash", Interactive, func(r *Row) { r.TokenHash = HashActorToken("x") }},
		{"fail/managed no hash", Managed, func(r *Row) { r.TokenHash = "" }},
		{"fail/managed upper hash", Managed, func(r *Row) { r.TokenHash = strings.ToUpper(HashActorToken("x")) }},
		{"fail/no uid", Interactive, func(r *Row) { r.LifecycleUID = "" }},
		{"fail/uid upper", Interactive, func(r *Row) { r.LifecycleUID = strings.ToUpper(uid1) }},
		{"fail/granted at zero", Interactive, func(r *Row) { r.GrantedAt = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := interactiveRow(ownerA, "x")
			if tc.kind == Managed {
				r = managedRow(ownerA, "x", "")
			}
			tc.edit(&r)
			wantErr(t, l.Put(tc.kind, r), ErrInvalidRow)
			if _, _, err := l.Get(ownerA, "x"); !errors.Is(err, ErrNoRow) && !errors.Is(err, ErrInvalidRow) {
				t.Fatalf("after refused Put, Get = %v", err)
			}
		})
	}
	t.Run("ok/nil lists written as empty", func(t *testing.T) {
		r := interactiveRow(ownerA, "nils")
		r.Scope, r.AllowSubscribe, r.AllowPublish = nil, nil, nil
		mustPut(t, l, Interactive, r)
		got, _, err := l.Get(ownerA, "nils")
		if err != nil || got.Scope == nil || len(got.AllowPublish) != 0 {
			t.Fatalf("Get = %+v, %v", got, err)
		}
	})
}

// TestScopeKinds: a scope entry is a capability word (it rides the bearer) or role:<role> (it
// stays in the ledger); BearerScope keeps the words in row order, and a decoded row written by
// upstream (role:default beside spawn) reads back with the same split.
func TestScopeKinds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		scope []string
		want  []string
	}{
		{"ok/empty", []string{}, []string{}},
		{"ok/words", []string{"spawn", "admin", "a" + strings.Repeat("z", 31)}, []string{"spawn", "admin", "a" + strings.Repeat("z", 31)}},
		{"ok/roles dropped", []string{"role:default", "spawn", "role:Re-view_2"}, []string{"spawn"}},
		{"ok/capability cap with roles", append(manyTokens("s", MaxCapabilities), manyTokens("role:r", MaxScope-MaxCapabilities)...), manyTokens("s", MaxCapabilities)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger(t)
			r := interactiveRow(ownerA, "x")
			r.Scope = tc.scope
			mustPut(t, l, Interactive, r)
			got, _, err := l.Get(ownerA, "x")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Scope, tc.scope) || !slices.Equal(got.BearerScope(), tc.want) {
				t.Fatalf("scope %q, BearerScope %q; want %q, %q", got.Scope, got.BearerScope(), tc.scope, tc.want)
			}
			for _, w := range got.BearerScope() {
				if !space.IsScopeWord(w) {
					t.Fatalf("BearerScope holds %q, outside the bearer grammar", w)
				}
			}
		})
	}
	t.Run("fail/message names both forms", func(t *testing.T) {
		err := ValidateScopeToken("role-reviewer:x")
		if err == nil || !strings.Contains(err.Error(), "capability word") || !strings.Contains(err.Error(), "role:<role>") {
			t.Fatalf("ValidateScopeToken = %v", err)
		}
	})
}

// TestChannelPatterns: allowSubscribe and allowPublish take channel patterns (they become the
// agent profile's channel params), round-trip as written, and the spawner chain judges them by
// broker reach.
func TestChannelPatterns(t *testing.T) {
	l := newLedger(t)
	r := interactiveRow(ownerA, "lead")
	r.Scope = []string{"spawn"}
	r.AllowSubscribe = []string{"general", "team.>", "ops.*"}
	r.AllowPublish = []string{"team.>", "proj.*.notes"}
	mustPut(t, l, Interactive, r)
	got, _, err := l.Get(ownerA, "lead")
	if err != nil || !slices.Equal(got.AllowSubscribe, r.AllowSubscribe) || !slices.Equal(got.AllowPublish, r.AllowPublish) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name     string
		sub, pub []string
		ok       bool
	}{
		{"ok/concrete under a subtree", []string{"team.x"}, []string{"team.x.y"}, true},
		{"ok/same pattern", []string{"team.>"}, []string{"team.>"}, true},
		{"ok/level under a subtree", []string{"team.*"}, []string{"team.*"}, true},
		{"ok/subtree within a trailing-star level (same reach)", []string{"ops.>"}, nil, true},
		{"ok/deeper under a trailing-star level", []string{"ops.a.b"}, nil, true},
		{"ok/pattern within a middle-star pattern", nil, []string{"proj.x.notes"}, true},
		{"fail/subtree over a concrete channel", []string{"general.>"}, nil, false},
		{"fail/root subtree", []string{">"}, nil, false},
		{"fail/other subtree", nil, []string{"ops.>"}, false},
		{"fail/middle star widened", nil, []string{"proj.*.*"}, false},
		{"fail/publish beyond", nil, []string{"general"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := managedRow(ownerA, "kid", ownerA+".lead")
			c.Scope = []string{"spawn"}
			c.AllowSubscribe, c.AllowPublish = tc.sub, tc.pub
			err := l.Put(Managed, c)
			if tc.ok && err != nil {
				t.Fatalf("Put child sub %q pub %q under the lead = %v", tc.sub, tc.pub, err)
			}
			if !tc.ok {
				wantErr(t, err, ErrSpawnerChain)
			}
			_ = l.Revoke(Managed, ownerA, "kid")
		})
	}
}

func manyTokens(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
	}
	return out
}

// Files the ledger did not write the way it writes them deny their actor and fail List.
func TestBrokenFilesFailClosed(t *testing.T) {
	good := interactiveRow(ownerA, "laptop")
	good.Ver = Version
	goodBytes, err := encodeRow(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path string)
	}{
		{"fail/mode 0644", func(t *testing.T, path string) {
			writeRaw(t, path, goodBytes)
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"fail/dir mode 0755", func(t *testing.T, path string) {
			writeRaw(t, path, goodBytes)
			if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"fail/symlink", func(t *testing.T, path string) {
			target := filepath.Join(filepath.Dir(path), "target.txt")
			writeRaw(t, target, goodBytes)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"fail/another principal's row", func(t *testing.T, path string) {
			other := interactiveRow(ownerB, "laptop")
			other.Ver = Version
			b, err := encodeRow(other)
			if err != nil {
				t.Fatal(err)
			}
			writeRaw(t, path, b)
		}},
		{"fail/garbage", func(t *testing.T, path string) { writeRaw(t, path, []byte("{")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger(t)
			path := filepath.Join(l.Dir(), "actors", ownerA+".laptop.json")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, path)
			_, err := l.AuthorizeConnect(ownerA, "laptop", nil, uid1)
			wantErr(t, err, ErrInvalidRow)
			if !strings.Contains(err.Error(), "actors") {
				t.Errorf("error %q does not name the path", err)
			}
			if _, err := l.List(); err == nil {
				t.Fatal("List accepted a broken row")
			}
		})
	}
}

func writeRaw(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeRow(t *testing.T) {
	const base = `"ver":1,"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"laptop","scope":["spawn"],"allowSubscribe":["general"],"allowPublish":[],"lifecycleUid":"lifecycle0000000000000000001","grantedAt":1700000000000`
	t.Run("ok/minimal", func(t *testing.T) {
		r, err := decodeRow(Interactive, []byte("{"+base+"}"))
		if err != nil || r.Actor != "laptop" || r.GrantedAt != 1700000000000 {
			t.Fatalf("decodeRow = %+v, %v", r, err)
		}
	})
	t.Run("ok/every field", func(t *testing.T) {
		in := "{" + base + `,"role":"r","parent":"u_bbbbbbbbbbbbbbbbbbbbbbbbbb.boss","label":"x","tokenHash":"` + HashActorToken("t") + `"}`
		if _, err := decodeRow(Managed, []byte(in)); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct{ name, in string }{
		{"fail/empty", ``},
		{"fail/array", `[]`},
		{"fail/unknown field", `{` + base + `,"admin":true}`},
		{"fail/case-folded key", `{` + strings.Replace(base, `"owner"`, `"Owner"`, 1) + `}`},
		{"fail/duplicate key", `{` + base + `,"scope":["admin"]}`},
		{"fail/missing scope", `{` + strings.Replace(base, `"scope":["spawn"],`, ``, 1) + `}`},
		{"fail/null allowPublish", `{` + strings.Replace(base, `"allowPublish":[]`, `"allowPublish":null`, 1) + `}`},
		{"fail/missing uid", `{` + strings.Replace(base, `"lifecycleUid":"lifecycle0000000000000000001",`, ``, 1) + `}`},
		{"fail/missing ver", `{` + strings.Replace(base, `"ver":1,`, ``, 1) + `}`},
		{"fail/ver 2", `{` + strings.Replace(base, `"ver":1`, `"ver":2`, 1) + `}`},
		{"fail/ver string", `{` + strings.Replace(base, `"ver":1`, `"ver":"1"`, 1) + `}`},
		{"fail/empty role", `{` + base + `,"role":""}`},
		{"fail/trailing data", `{` + base + `} {}`},
		{"fail/scope not strings", `{` + strings.Replace(base, `"scope":["spawn"]`, `"scope":[1]`, 1) + `}`},
		{"fail/too big", `{` + base + `,"label":"` + strings.Repeat("a", MaxRowBytes) + `"}`},
		{"fail/token hash interactive", `{` + base + `,"tokenHash":"` + HashActorToken("t") + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRow(Interactive, []byte(tc.in))
			wantErr(t, err, ErrInvalidRow)
		})
	}
}

func TestList(t *testing.T) {
	l := newLedger(t)
	if got, err := l.List(); err != nil || len(got) != 0 {
		t.Fatalf("empty List = %v, %v", got, err)
	}
	mustPut(t, l, Interactive, interactiveRow(ownerB, "b"))
	mustPut(t, l, Interactive, interactiveRow(ownerA, "a"))
	mustPut(t, l, Managed, managedRow(ownerA, "m", ""))
	// A temporary of the atomic writer is not a row.
	writeRaw(t, filepath.Join(l.Dir(), "actors", "."+ownerA+".x.json.tmp-1"), []byte("{"))
	got, err := l.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range got {
		names = append(names, string(e.Kind)+"/"+e.Row.Principal())
	}
	want := []string{"actors/" + ownerA + ".a", "actors/" + ownerB + ".b", "managed-actors/" + ownerA + ".m"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("List = %v, want %v", names, want)
	}
}

func TestOpenRefusesLooseStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Open of a 0755 dir = %v, want an error naming it", err)
	}
}

func TestAuthorizeGrant(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	mustPut(t, l, Managed, managedRow(ownerA, "worker", ""))
	if r, err := l.AuthorizeGrant(ownerA, "laptop"); err != nil || r.Actor != "laptop" {
		t.Fatalf("AuthorizeGrant = %+v, %v", r, err)
	}
	_, err := l.AuthorizeGrant(ownerA, "worker")
	wantErr(t, err, ErrManagedActor)
	_, err = l.AuthorizeGrant(ownerA, "nobody")
	wantErr(t, err, ErrNoRow)

	// An interactive row with a parent must sit within that parent's grant.
	child := interactiveRow(ownerA, "child")
	child.Parent = ownerA + ".laptop"
	mustPut(t, l, Interactive, child)
	if _, err := l.AuthorizeGrant(ownerA, "child"); err != nil {
		t.Fatal(err)
	}
	if err := l.Revoke(Interactive, ownerA, "laptop"); err != nil {
		t.Fatal(err)
	}
	_, err = l.AuthorizeGrant(ownerA, "child")
	wantErr(t, err, ErrSpawnerChain)
}

func TestAuthorizeAgentExchange(t *testing.T) {
	l := newLedger(t)
	mustPut(t, l, Interactive, interactiveRow(ownerA, "laptop"))
	mustPut(t, l, Managed, managedRow(ownerA, "worker", ownerA+".laptop"))
	compares := 0
	countCompares(t, &compares)
	if r, err := l.AuthorizeAgentExchange(ownerA, "worker", "secret-worker"); err != nil || r.Actor != "worker" || compares != 1 {
		t.Fatalf("AuthorizeAgentExchange = %+v, %v (%d hash compares)", r, err, compares)
	}
	// Every refusal before the secret matched is the same sentence and does the same work: one
	// SHA-256 of the token and one constant-time compare (against the dummy hash when there is no
	// managed row), so neither the answer nor the work tells a missing row from a wrong secret.
	for _, tc := range []struct{ name, owner, actor, token string }{
		{"fail/wrong secret", ownerA, "worker", "secret-other"},
		{"fail/no row", ownerA, "nobody", "secret-nobody"},
		{"fail/no row, the dummy's own preimage", ownerA, "nobody", "cotal authd: no managed row: dummy token hash"},
		{"fail/interactive row", ownerA, "laptop", "secret-laptop"},
		{"fail/bad owner", "alice", "worker", "secret-worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			compares = 0
			_, err := l.AuthorizeAgentExchange(tc.owner, tc.actor, tc.token)
			wantErr(t, err, ErrAgentExchange)
			if err.(*Error).Err.Error() != ErrAgentExchange.Error() {
				t.Fatalf("sentence differs: %v", err)
			}
			if compares != 1 {
				t.Fatalf("%d constant-time hash compares, want 1 (the same work as a wrong secret)", compares)
			}
		})
	}
	t.Run("fail/spawner narrowed since spawn", func(t *testing.T) {
		narrowed := interactiveRow(ownerA, "laptop")
		narrowed.AllowPublish = []string{}
		mustPut(t, l, Interactive, narrowed)
		_, err := l.AuthorizeAgentExchange(ownerA, "worker", "secret-worker")
		wantErr(t, err, ErrSpawnerChain)
	})
}

// countCompares makes constantTimeCompare count its calls into *n until the test ends.
func countCompares(t *testing.T, n *int) {
	t.Helper()
	orig := constantTimeCompare
	constantTimeCompare = func(x, y []byte) int {
		*n++
		return orig(x, y)
	}
	t.Cleanup(func() { constantTimeCompare = orig })
}

func TestSpawnerChain(t *testing.T) {
	spawner := func(owner, actor string, scope ...string) Row {
		r := interactiveRow(owner, actor)
		r.Scope = append([]string{}, scope...)
		return r
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, l *Ledger)
		child Row
		want  error // nil: the Put succeeds
	}{
		{"ok/within parent", func(t *testing.T, l *Ledger) { mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn")) },
			managedRow(ownerA, "w", ownerA+".boss"), nil},
		{"ok/two links", func(t *testing.T, l *Ledger) {
			mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn"))
			mid := managedRow(ownerA, "mid", ownerA+".boss")
			mid.Scope = []string{"spawn"}
			mustPut(t, l, Managed, mid)
		}, managedRow(ownerA, "w", ownerA+".mid"), nil},
		{"ok/admin parent of another owner", func(t *testing.T, l *Ledger) {
			mustPut(t, l, Interactive, spawner(ownerB, "root", "admin"))
		}, func() Row { r := managedRow(ownerA, "w", ownerB+".root"); r.AllowPublish = []string{"x"}; return r }(), nil},
		{"fail/missing spawner", func(*testing.T, *Ledger) {}, managedRow(ownerA, "w", ownerA+".boss"), ErrSpawnerChain},
		{"fail/cross owner", func(t *testing.T, l *Ledger) { mustPut(t, l, Interactive, spawner(ownerB, "boss", "spawn")) },
			managedRow(ownerA, "w", ownerB+".boss"), ErrSpawnerChain},
		{"fail/scope beyond", func(t *testing.T, l *Ledger) { mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn")) },
			func() Row { r := managedRow(ownerA, "w", ownerA+".boss"); r.Scope = []string{"run"}; return r }(), ErrSpawnerChain},
		{"fail/channel beyond", func(t *testing.T, l *Ledger) { mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn")) },
			func() Row {
				r := managedRow(ownerA, "w", ownerA+".boss")
				r.AllowSubscribe = []string{"secret"}
				return r
			}(), ErrSpawnerChain},
		{"fail/role without role scope", func(t *testing.T, l *Ledger) { mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn")) },
			func() Row { r := managedRow(ownerA, "w", ownerA+".boss"); r.Role = "review"; return r }(), ErrSpawnerChain},
		{"ok/role with role scope", func(t *testing.T, l *Ledger) {
			mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn", "role:review"))
		}, func() Row { r := managedRow(ownerA, "w", ownerA+".boss"); r.Role = "review"; return r }(), nil},
		{"fail/grandparent revoked", func(t *testing.T, l *Ledger) {
			mustPut(t, l, Interactive, spawner(ownerA, "boss", "spawn"))
			mid := managedRow(ownerA, "mid", ownerA+".boss")
			mustPut(t, l, Managed, mid)
			if err := l.Revoke(Interactive, ownerA, "boss"); err != nil {
				t.Fatal(err)
			}
		}, managedRow(ownerA, "w", ownerA+".mid"), ErrSpawnerChain},
		{"fail/cycle", func(t *testing.T, l *Ledger) {
			a := managedRow(ownerA, "a", "")
			mustPut(t, l, Managed, a)
			b := managedRow(ownerA, "b", ownerA+".a")
			mustPut(t, l, Managed, b)
			a.Parent = ownerA + ".b"
			// Plant the loop directly: Put would refuse it already.
			a.Ver = Version
			data, err := encodeRow(a)
			if err != nil {
				t.Fatal(err)
			}
			writeRaw(t, filepath.Join(l.Dir(), "managed-actors", ownerA+".a.json"), data)
		}, managedRow(ownerA, "w", ownerA+".b"), ErrSpawnerChain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger(t)
			tc.setup(t, l)
			// Check decides what Put decides, and writes nothing.
			cerr := l.Check(Managed, tc.child)
			if (cerr == nil) != (tc.want == nil) || tc.want != nil && !errors.Is(cerr, tc.want) {
				t.Fatalf("Check = %v, want %v", cerr, tc.want)
			}
			if _, _, err := l.Get(tc.child.Owner, tc.child.Actor); !errors.Is(err, ErrNoRow) {
				t.Fatalf("a row after Check: %v", err)
			}
			err := l.Put(Managed, tc.child)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want)
		})
	}
}

func TestNewActorToken(t *testing.T) {
	tok, hash, err := NewActorToken()
	if err != nil {
		t.Fatal(err)
	}
	tok2, _, err := NewActorToken()
	if err != nil || tok == tok2 || len(tok) != 43 || hash != HashActorToken(tok) || !isSHA256Hex(hash) {
		t.Fatalf("NewActorToken = %q %q %q (%v)", tok, tok2, hash, err)
	}
}
