package authority

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/pkg/space"
)

var (
	ownerA = "u_" + strings.Repeat("a", 26)
	ownerB = "u_" + strings.Repeat("e", 26)
)

func iidOf(c string) string { return strings.Repeat(c, 26) }

// managerFixture is authoritytest.Manager; its zero Owner is ownerA.
type managerFixture = authoritytest.Manager

func writeManager(t *testing.T, s *Store, js jetstream.JetStream, iid string, f managerFixture) {
	t.Helper()
	if f.Owner == "" {
		f.Owner = ownerA
	}
	authoritytest.WriteManager(t, js, s.Names(), iid, f)
}

// localFile returns a LocalManager reading a manager-identity.json naming iid ("" writes none).
func localFile(t *testing.T, iid string) LocalManager {
	t.Helper()
	p := filepath.Join(t.TempDir(), ManagerIdentityFile)
	if iid != "" {
		authoritytest.WriteLocalIdentity(t, p, testSpace, iid)
	}
	return LocalManagerFile(p)
}

func newSelector(t *testing.T, s *Store, policy string, local LocalManager) *Selector {
	t.Helper()
	sel, err := NewSelector(SelectorConfig{Store: s, Policy: policy, Local: local})
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func wantChosen(t *testing.T, got string, err error, want string) {
	t.Helper()
	if err != nil || got != want {
		t.Fatalf("Select = %q, %v; want %q", got, err, want)
	}
}

func wantRefused(t *testing.T, got string, err error, code Code, text string) {
	t.Helper()
	if got != "" || CodeOf(err) != code || !strings.Contains(err.Error(), text) {
		t.Fatalf("Select = %q, %v; want a %s refusal containing %q", got, err, code, text)
	}
}

// TestSelectLiveness: every liveness condition, on an explicit selection (the same check every
// row of the policy uses).
func TestSelectLiveness(t *testing.T) {
	s, js, _ := provisioned(t)
	sel := newSelector(t, s, SelectRemoteFirst, nil)
	ctx := context.Background()
	for i, tc := range []struct {
		name string
		f    managerFixture
		live bool
	}{
		{"live", managerFixture{}, true},
		{"live-later-epoch", managerFixture{Epoch: 2}, true},
		{"gate-frozen", managerFixture{Frozen: true}, false},
		{"spec-epoch-differs", managerFixture{SpecEpochSkew: 1}, false},
		{"spec-revision-differs", managerFixture{StaleSpec: true}, false},
		{"lease-other-holder", managerFixture{Holder: ownerA + ".intruder"}, false},
		{"lease-absent", managerFixture{NoLease: true}, false},
		{"lease-without-registration", managerFixture{LeaseUnregistered: true}, false},
		{"lease-epoch-differs", managerFixture{LeaseEpochSkew: 1}, false},
		{"other-owner", managerFixture{Owner: ownerB}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			iid := iidOf("k") + string(rune('a'+i))
			writeManager(t, s, js, iid, tc.f)
			got, err := sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: iid})
			if tc.live {
				wantChosen(t, got, err, iid)
				return
			}
			wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
		})
	}
	t.Run("absent", func(t *testing.T) {
		got, err := sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: iidOf("z")})
		wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
	})
	t.Run("malformed", func(t *testing.T) {
		got, err := sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: "Z.z"})
		wantRefused(t, got, err, CodeBadRequest, "managerInstanceId")
	})
	t.Run("corrupt-lease", func(t *testing.T) {
		iid := iidOf("q")
		writeManager(t, s, js, iid, managerFixture{NoLease: true})
		bucket, _ := s.Names().Bucket(space.Manager)
		kv, _ := js.KeyValue(ctx, bucket)
		lkey, _ := space.ManagerLeaseKey(iid)
		if _, err := kv.Create(ctx, lkey, []byte(`{"holder":1}`)); err != nil {
			t.Fatal(err)
		}
		got, err := sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: iid})
		wantRefused(t, got, err, CodeUnavailable, "could not be read")
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("err = %v, want it to wrap ErrCorrupt", err)
		}
	})
}

// TestSelectRemoteFirst: every row of the default policy (§3.4).
func TestSelectRemoteFirst(t *testing.T) {
	ctx := context.Background()
	human := Selection{Owner: ownerA, Human: true}
	t.Run("one-live-remote-over-live-local", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{})
		writeManager(t, s, js, iidOf("l"), managerFixture{})
		writeManager(t, s, js, iidOf("o"), managerFixture{Owner: ownerB}) // another owner's: not a candidate
		writeManager(t, s, js, iidOf("d"), managerFixture{Owner: ownerB}) // another owner's: not a candidate
		got, err := newSelector(t, s, SelectRemoteFirst, localFile(t, iidOf("l"))).Select(ctx, human)
		wantChosen(t, got, err, iidOf("r"))
	})
	t.Run("two-live-remotes-refused", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{})
		writeManager(t, s, js, iidOf("s"), managerFixture{})
		got, err := newSelector(t, s, SelectRemoteFirst, nil).Select(ctx, human)
		wantRefused(t, got, err, CodeFailedPrecondition, "2 live manager instances")
	})
	t.Run("remote-gates-none-live-refused-over-live-local", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{Frozen: true})
		writeManager(t, s, js, iidOf("l"), managerFixture{})
		got, err := newSelector(t, s, SelectRemoteFirst, localFile(t, iidOf("l"))).Select(ctx, human)
		wantRefused(t, got, err, CodeFailedPrecondition, "none of the 1 registered manager instances is live")
	})
	t.Run("no-remote-live-local", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("l"), managerFixture{})
		writeManager(t, s, js, iidOf("o"), managerFixture{Owner: ownerB})
		got, err := newSelector(t, s, SelectRemoteFirst, localFile(t, iidOf("l"))).Select(ctx, human)
		wantChosen(t, got, err, iidOf("l"))
	})
	t.Run("no-remote-local-not-live", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("l"), managerFixture{NoLease: true})
		got, err := newSelector(t, s, SelectRemoteFirst, localFile(t, iidOf("l"))).Select(ctx, human)
		wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
	})
	t.Run("no-remote-no-local", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("o"), managerFixture{Owner: ownerB})
		for name, local := range map[string]LocalManager{"no-reader": nil, "no-file": localFile(t, "")} {
			got, err := newSelector(t, s, SelectRemoteFirst, local).Select(ctx, human)
			if got != "" || CodeOf(err) != CodeNotFound {
				t.Fatalf("%s: Select = %q, %v; want not-found", name, got, err)
			}
		}
	})
	t.Run("explicit-must-be-a-candidate", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{})
		writeManager(t, s, js, iidOf("s"), managerFixture{})
		writeManager(t, s, js, iidOf("o"), managerFixture{Owner: ownerB})
		sel := newSelector(t, s, SelectRemoteFirst, nil)
		got, err := sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: iidOf("s")})
		wantChosen(t, got, err, iidOf("s"))
		got, err = sel.Select(ctx, Selection{Owner: ownerA, Human: true, InstanceID: iidOf("o")})
		wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
	})
	t.Run("foreign-key-in-listing-refused", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{})
		if _, err := s.Create(ctx, space.Auth, "epgate.manager.NOT_AN_ID", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		got, err := newSelector(t, s, SelectRemoteFirst, nil).Select(ctx, human)
		wantRefused(t, got, err, CodeUnavailable, "could not be read")
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("err = %v, want it to wrap ErrCorrupt", err)
		}
	})
	t.Run("agent-arm", func(t *testing.T) {
		s, js, _ := provisioned(t)
		writeManager(t, s, js, iidOf("r"), managerFixture{})
		got, err := newSelector(t, s, SelectRemoteFirst, nil).Select(ctx, Selection{Owner: ownerA})
		wantChosen(t, got, err, iidOf("r"))
	})
}

// TestSelectLocalPrimary: an unpinned human exchange takes the live local managerd over a live
// remote one, and refuses an absent, unreadable or not-live local one, reading no remote gate
// (Store.Reads counts only the local instance's gate, spec and lease); explicit selectors and the
// agent arm keep remote-first.
func TestSelectLocalPrimary(t *testing.T) {
	ctx := context.Background()
	s, js, _ := provisioned(t)
	writeManager(t, s, js, iidOf("r"), managerFixture{})
	writeManager(t, s, js, iidOf("l"), managerFixture{})
	writeManager(t, s, js, iidOf("n"), managerFixture{Frozen: true})
	human := Selection{Owner: ownerA, Human: true}
	run := func(t *testing.T, local LocalManager, sel Selection) (string, uint64, error) {
		t.Helper()
		before := s.Reads()
		got, err := newSelector(t, s, SelectLocalPrimary, local).Select(ctx, sel)
		return got, s.Reads() - before, err
	}
	t.Run("live-local-over-live-remote", func(t *testing.T) {
		got, reads, err := run(t, localFile(t, iidOf("l")), human)
		wantChosen(t, got, err, iidOf("l"))
		if reads != 3 {
			t.Fatalf("%d reads, want 3 (the local gate, spec and lease)", reads)
		}
	})
	t.Run("absent", func(t *testing.T) {
		got, reads, err := run(t, localFile(t, ""), human)
		wantRefused(t, got, err, CodeNotFound, "no local manager")
		if reads != 0 {
			t.Fatalf("%d reads, want none", reads)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), ManagerIdentityFile)
		if err := os.WriteFile(p, []byte(`{"v":1,"space":"s2420"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		got, reads, err := run(t, LocalManagerFile(p), human)
		wantRefused(t, got, err, CodeUnavailable, "unreadable")
		if reads != 0 {
			t.Fatalf("%d reads, want none", reads)
		}
		got, reads, err = run(t, func() (ManagerIdentity, error) { return ManagerIdentity{}, fs.ErrPermission }, human)
		wantRefused(t, got, err, CodeUnavailable, "unreadable")
		if reads != 0 {
			t.Fatalf("%d reads, want none", reads)
		}
	})
	t.Run("other-space", func(t *testing.T) {
		local := func() (ManagerIdentity, error) { return ManagerIdentity{Space: "other", InstanceID: iidOf("l")}, nil }
		got, reads, err := run(t, local, human)
		wantRefused(t, got, err, CodeUnavailable, "serves space")
		if reads != 0 {
			t.Fatalf("%d reads, want none", reads)
		}
	})
	t.Run("not-live", func(t *testing.T) {
		got, reads, err := run(t, localFile(t, iidOf("n")), human)
		wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
		if reads != 1 {
			t.Fatalf("%d reads, want 1 (the local gate)", reads)
		}
	})
	t.Run("not-registered", func(t *testing.T) {
		got, reads, err := run(t, localFile(t, iidOf("x")), human)
		wantRefused(t, got, err, CodeFailedPrecondition, "is not a live manager of this owner")
		if reads != 1 {
			t.Fatalf("%d reads, want 1 (the local gate)", reads)
		}
	})
	t.Run("explicit-unchanged", func(t *testing.T) {
		got, _, err := run(t, localFile(t, iidOf("l")), Selection{Owner: ownerA, Human: true, InstanceID: iidOf("r")})
		wantChosen(t, got, err, iidOf("r"))
	})
	t.Run("agent-arm-unchanged", func(t *testing.T) {
		got, _, err := run(t, localFile(t, iidOf("l")), Selection{Owner: ownerA})
		wantChosen(t, got, err, iidOf("r"))
	})
}

func TestSelectorPolicy(t *testing.T) {
	s, _, _ := provisioned(t)
	local := func() (ManagerIdentity, error) { return ManagerIdentity{}, nil }
	for _, tc := range []struct {
		policy string
		local  LocalManager
		ok     bool
	}{
		{SelectRemoteFirst, nil, true},
		{SelectRemoteFirst, local, true},
		{SelectLocalPrimary, local, true},
		{SelectLocalPrimary, nil, false},
		{"remote-first", nil, false},
		{"Local-Primary", local, false},
	} {
		_, err := NewSelector(SelectorConfig{Store: s, Policy: tc.policy, Local: tc.local})
		if (err == nil) != tc.ok || (CheckSelectionPolicy(tc.policy, tc.local) == nil) != tc.ok {
			t.Errorf("policy %q (reader %v): NewSelector = %v, want ok %v", tc.policy, tc.local != nil, err, tc.ok)
		}
	}
	if _, err := NewSelector(SelectorConfig{}); err == nil {
		t.Error("NewSelector without a store succeeded")
	}
}

func TestDecodeManagerIdentity(t *testing.T) {
	good := `{"v":1,"space":"s2420","instanceId":"` + iidOf("b") + `"}`
	if id, err := DecodeManagerIdentity([]byte(good)); err != nil || id.Space != "s2420" || id.InstanceID != iidOf("b") {
		t.Fatalf("DecodeManagerIdentity(good) = %+v, %v", id, err)
	}
	for _, bad := range []string{
		``, `null`, `[]`, `{}`,
		`{"v":2,"space":"s2420","instanceId":"` + iidOf("b") + `"}`,
		`{"v":1,"space":" s","instanceId":"` + iidOf("b") + `"}`,
		`{"v":1,"space":"s2420","instanceId":"B"}`,
		`{"v":1,"space":"s2420"}`,
		`{"v":1,"space":"s2420","instanceId":"` + iidOf("b") + `","x":1}`,
		good + `{}`,
		`{"v":1,"space":"s2420","instanceId":"` + iidOf("b") + `","pad":"` + strings.Repeat("x", 1100) + `"}`,
	} {
		if _, err := DecodeManagerIdentity([]byte(bad)); err == nil {
			t.Errorf("DecodeManagerIdentity(%.60q) succeeded", bad)
		}
	}
}
