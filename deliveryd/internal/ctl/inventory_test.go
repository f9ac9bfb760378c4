package ctl_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// inventory sends lifecycleMemberships {owner, actor, lifecycleUid} (args as given) as
// local.<actor> on the delivery-admin lane over nc and returns the reply.
func inventory(t *testing.T, nc *nats.Conn, actor string, args any) reply {
	t.Helper()
	r, ok := send(t, nc, space.CtlServiceDeliveryAdmin, actor, body(t, ctl.OpLifecycleMemberships, args, plane3test.Owner+"."+actor), "", 20*time.Second)
	if !ok {
		t.Fatal("lifecycleMemberships: no reply")
	}
	return r
}

func of(actor, uid string) map[string]any {
	return map[string]any{"owner": plane3test.Owner, "actor": actor, "lifecycleUid": uid}
}

// TestLifecycleMemberships covers the footprint inventory on the delivery-admin lane, asked by
// authd's real auth-plane credential (local.authd, minted by signerd) and by a supervisor: the
// channel of every key the lifecycle holds in the members bucket (open rows, tombstones, a row
// on a channel its grant does not name, a row that does not decode), nothing of another
// lifecycle, complete:false when the bucket cannot be read, the closed argument decoder, and
// local.authd refused every other admin op.
func TestLifecycleMemberships(t *testing.T) {
	var fault atomic.Bool
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetListFault(r, func() error {
			if fault.Load() {
				return errors.New("members bucket unreachable (test fault)")
			}
			return nil
		})
	})
	authd := f.e.Conn(t, mtls.KindAuthd, signerv1.Profile_PROFILE_AUTH_PLANE, nil)
	sup := f.e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "local", Actor: "manager"})
	a1 := f.e.Agent(t, "a1", uid1)
	a2 := f.e.Agent(t, "a2", uid2)
	ask := func(t *testing.T, nc *nats.Conn, actor, of string, uid string) ctl.LifecycleMemberships {
		t.Helper()
		got := data[ctl.LifecycleMemberships](t, inventory(t, nc, actor, map[string]any{"owner": "local", "actor": of, "lifecycleUid": uid}))
		if got.Owner != "local" || got.Actor != of || got.LifecycleUID != uid || got.Channels == nil {
			t.Fatalf("answer %+v does not name local.%s.%s with a channel list", got, of, uid)
		}
		return got
	}

	t.Run("ok/none: a lifecycle without rows lists no channel, completely", func(t *testing.T) {
		got := ask(t, authd, "authd", "a1", uid1)
		if len(got.Channels) != 0 || !got.Complete {
			t.Fatalf("answer %+v, want no channel, complete", got)
		}
	})

	kv, err := f.djs.KeyValue(plane3test.Ctx(t), "cotal_members_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ok/lists a lifecycle's channels: open rows, tombstones, rows off its grant, rows that do not decode", func(t *testing.T) {
		for _, ch := range []string{"general", "team.backend"} {
			if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": ch}); !r.OK {
				t.Fatal(r.Error)
			}
		}
		if r := call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "team.backend", "generation": 1, "lifecycleUid": uid1}); !r.OK {
			t.Fatal(r.Error)
		}
		// A row on a channel the grant does not name (what a family or wildcard grant leaves).
		f.putMember(t, plane3.Member{Channel: "proj.x.y", Owner: "local.a1", LifecycleUID: uid1, State: ctl.StateActive,
			JoinCursor: 1, Generation: 1, WriterIdentity: "other"}, "a1")
		junk, _ := space.MemberKey("junk", "local", "a1", uid1)
		if _, err := kv.Put(plane3test.Ctx(t), junk, []byte("not json")); err != nil {
			t.Fatal(err)
		}
		// Other lifecycles' rows: another alias, and another uid of the same alias.
		if r := call(t, a2, "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"}); !r.OK {
			t.Fatal(r.Error)
		}
		f.putMember(t, plane3.Member{Channel: "ops", Owner: "local.a1", LifecycleUID: uid3, State: ctl.StateActive,
			JoinCursor: 1, Generation: 1, WriterIdentity: "other"}, "a1")

		got := ask(t, authd, "authd", "a1", uid1)
		if strings.Join(got.Channels, " ") != "general junk proj.x.y team.backend" || !got.Complete {
			t.Fatalf("answer %+v, want general junk proj.x.y team.backend, complete", got)
		}
		if got := ask(t, authd, "authd", "a1", uid3); strings.Join(got.Channels, " ") != "ops" || !got.Complete {
			t.Fatalf("local.a1.%s: %+v, want ops", uid3, got)
		}
		if got := ask(t, authd, "authd", "a2", uid2); strings.Join(got.Channels, " ") != "general" || !got.Complete {
			t.Fatalf("local.a2.%s: %+v, want general", uid2, got)
		}
	})
	t.Run("ok/a purged row is gone from the list at once", func(t *testing.T) {
		if err := kv.Purge(plane3test.Ctx(t), "junk/local.a1."+uid1); err != nil {
			t.Fatal(err)
		}
		got := ask(t, authd, "authd", "a1", uid1)
		if strings.Join(got.Channels, " ") != "general proj.x.y team.backend" || !got.Complete {
			t.Fatalf("answer %+v, want general proj.x.y team.backend", got)
		}
	})
	t.Run("ok/a supervisor may ask it too", func(t *testing.T) {
		got := ask(t, sup, "manager", "a2", uid2)
		if strings.Join(got.Channels, " ") != "general" || !got.Complete {
			t.Fatalf("answer %+v, want general", got)
		}
	})
	t.Run("fail/complete-false when the members bucket cannot be read", func(t *testing.T) {
		fault.Store(true)
		defer fault.Store(false)
		got := ask(t, authd, "authd", "a1", uid1)
		if got.Complete || len(got.Channels) != 0 {
			t.Fatalf("answer %+v, want complete:false and no channel", got)
		}
	})
	for name, args := range map[string]any{
		"unknown field":      map[string]any{"owner": "local", "actor": "a1", "lifecycleUid": uid1, "channel": "general"},
		"bad uid":            of("a1", "not-a-uid"),
		"no actor":           map[string]any{"owner": "local", "lifecycleUid": uid1},
		"owner not a string": map[string]any{"owner": 7, "actor": "a1", "lifecycleUid": uid1},
		"owner not an owner": map[string]any{"owner": "UABCDEFG", "actor": "a1", "lifecycleUid": uid1},
		"actor with a dot":   map[string]any{"owner": "local", "actor": "a.1", "lifecycleUid": uid1},
		"no args":            nil,
	} {
		t.Run("fail/closed decoder: "+name, func(t *testing.T) {
			wantRefusal(t, inventory(t, authd, "authd", args), ctl.OpLifecycleMemberships+":")
		})
	}
	for _, op := range []string{ctl.OpReloadCreds, ctl.OpReloadStoreIdentity, ctl.OpEvictPrincipal, ctl.OpPrincipalLiveness, ctl.OpPlaneConnLiveness, "dropAll"} {
		t.Run("fail/local.authd may not ask "+op, func(t *testing.T) {
			r, ok := send(t, authd, space.CtlServiceDeliveryAdmin, "authd", body(t, op, map[string]any{"principal": "local.a1"}, "local.authd"), "", 20*time.Second)
			if !ok {
				t.Fatalf("%s: no reply", op)
			}
			wantRefusal(t, r, "local.authd may ask only lifecycleMemberships")
		})
	}
	// Last: it ends the index for good.
	t.Run("fail/complete-false, with what it held, when the index can no longer follow the bucket", func(t *testing.T) {
		ctl.StopIndex(f.r)
		got := ask(t, authd, "authd", "a2", uid2)
		if got.Complete || strings.Join(got.Channels, " ") != "general" {
			t.Fatalf("answer %+v, want complete:false with what the index held (general)", got)
		}
	})
}

// TestFencedJoin: a lifecycle whose ACL row grants no reads (pkg/provision's fence, the first
// step of its teardown) keeps no membership row: its join removes its own row on the channel
// and is refused. A join that read the ACL before a teardown fenced it and read the inventory,
// and committed its row after both, finds the fence on its second read and removes the row it
// wrote, so the row the inventory missed does not outlive the teardown.
func TestFencedJoin(t *testing.T) {
	var before, after atomic.Pointer[func() error]
	var hookErr atomic.Pointer[error]
	run := func(p *atomic.Pointer[func() error]) func() {
		return func() {
			if g := p.Load(); g != nil {
				if err := (*g)(); err != nil {
					hookErr.Store(&err)
				}
			}
		}
	}
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetBeforeCommit(r, run(&before))
		ctl.SetAfterCommit(r, run(&after))
	})
	authd := f.e.Conn(t, mtls.KindAuthd, signerv1.Profile_PROFILE_AUTH_PLANE, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	a2 := f.e.Agent(t, "a2", uid2)
	a0 := f.e.Agent(t, "a0", uid0)
	acl, err := f.pjs.KeyValue(plane3test.Ctx(t), "cotal_acl_"+f.e.N.Token())
	if err != nil {
		t.Fatal(err)
	}
	// fence writes the empty-read ACL row, as a teardown's FenceLifecycleACL does.
	fence := func(actor, uid string) error {
		key, err := space.ACLKey("local", actor, uid)
		if err != nil {
			return err
		}
		b, err := provision.ACL{AllowSubscribe: []string{}, Revision: 2, UpdatedAt: 1}.Encode()
		if err != nil {
			return err
		}
		_, err = acl.Put(plane3test.Ctx(t), key, b)
		return err
	}
	listed := func(t *testing.T, actor, uid string) string {
		t.Helper()
		got := data[ctl.LifecycleMemberships](t, inventory(t, authd, "authd", of(actor, uid)))
		if !got.Complete {
			t.Fatalf("inventory incomplete: %+v", got)
		}
		return strings.Join(got.Channels, " ")
	}
	checkHook := func(t *testing.T) {
		t.Helper()
		if p := hookErr.Load(); p != nil {
			t.Fatal(*p)
		}
	}

	t.Run("ok/a fenced lifecycle's join removes its own row and is refused", func(t *testing.T) {
		for _, ch := range []string{"general", "team.backend"} {
			if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": ch}); !r.OK {
				t.Fatal(r.Error)
			}
		}
		if got := listed(t, "a1", uid1); got != "general team.backend" {
			t.Fatalf("before the fence: %q", got)
		}
		if err := fence("a1", uid1); err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}), "is fenced")
		if m := f.member(t, "general", "a1", uid1); m != nil {
			t.Fatalf("general row %+v survived the fenced join", m)
		}
		// Its own row on that channel only: the teardown removes the rest by the inventory.
		if got := listed(t, "a1", uid1); got != "team.backend" {
			t.Fatalf("after the fenced join: %q, want team.backend", got)
		}
	})
	t.Run("ok/a fenced lifecycle's join of a channel without a row writes none", func(t *testing.T) {
		wantRefusal(t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}), "keeps no membership")
		if m := f.member(t, "general", "a1", uid1); m != nil {
			t.Fatalf("a fenced join wrote %+v", m)
		}
	})
	t.Run("ok/a join committing after the fence and the inventory removes the row the inventory missed", func(t *testing.T) {
		var seen atomic.Pointer[string]
		g := func() error {
			if err := fence("a2", uid2); err != nil {
				return err
			}
			s, err := rawInventory(authd, "a2", uid2)
			seen.Store(&s)
			return err
		}
		before.Store(&g)
		r := call(t, a2, "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"})
		before.Store(nil)
		checkHook(t)
		if s := seen.Load(); s == nil || *s != "" {
			t.Fatalf("the teardown's inventory before the commit listed %v, want nothing", s)
		}
		wantRefusal(t, r, "is fenced")
		if m := f.member(t, "general", "a2", uid2); m != nil {
			t.Fatalf("row %+v survived a join that found the fence after its commit", m)
		}
		if got := listed(t, "a2", uid2); got != "" {
			t.Fatalf("inventory after the join: %q, want none", got)
		}
	})
	t.Run("ok/an unfenced lifecycle still joins, reading its ACL twice", func(t *testing.T) {
		g := func() error { return nil }
		after.Store(&g)
		defer after.Store(nil)
		got := data[ctl.JoinResult](t, call(t, a0, "a0", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		checkHook(t)
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
		if m := f.member(t, "general", "a0", uid0); m == nil || !m.Activated {
			t.Fatalf("row = %+v", m)
		}
	})
}

// rawInventory asks lifecycleMemberships as local.authd on nc and returns the listed channels
// joined by spaces; an incomplete or refused answer is an error. It never calls t.Fatal, so a
// request handler's test hook may use it.
func rawInventory(nc *nats.Conn, actor, uid string) (string, error) {
	b, err := json.Marshal(map[string]any{"op": ctl.OpLifecycleMemberships, "args": of(actor, uid), "from": map[string]string{"id": "local.authd"}})
	if err != nil {
		return "", err
	}
	subj := "cotal." + plane3test.Space + ".ctl.delivery-admin.local.authd"
	replyTo := subj + ".reply.0123456789abcdef0123456789abcdef"
	sub, err := nc.SubscribeSync(replyTo)
	if err != nil {
		return "", err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Reply: replyTo, Data: b}); err != nil {
		return "", err
	}
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		return "", err
	}
	var r struct {
		OK    bool                     `json:"ok"`
		Data  ctl.LifecycleMemberships `json:"data"`
		Error string                   `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return "", err
	}
	if !r.OK || !r.Data.Complete {
		return "", fmt.Errorf("inventory refused or incomplete: %s", m.Data)
	}
	return strings.Join(r.Data.Channels, " "), nil
}

// TestInventoryClient: pkg/dlvclient.LifecycleMemberships, the caller side of the inventory,
// against the real responder as authd's auth-plane credential: it lists the lifecycle's
// channels; a complete:false answer comes back with ErrIncomplete; an op the lane refuses is a
// RefusedError; with the responder unbound it fails with ErrNoResponders.
func TestInventoryClient(t *testing.T) {
	var fault atomic.Bool
	f := setup(t, nil, func(_ *fixture, r *ctl.Responders) {
		ctl.SetListFault(r, func() error {
			if fault.Load() {
				return errors.New("members bucket unreachable (test fault)")
			}
			return nil
		})
	})
	authd := f.e.Conn(t, mtls.KindAuthd, signerv1.Profile_PROFILE_AUTH_PLANE, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	for _, ch := range []string{"team.backend", "general"} {
		if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": ch}); !r.OK {
			t.Fatal(r.Error)
		}
	}
	inv := func() (dlvclient.Inventory, error) {
		return dlvclient.LifecycleMemberships(plane3test.Ctx(t), authd, f.e.N, "local", "authd", "local", "a1", uid1)
	}
	t.Run("ok/lists the lifecycle's channels", func(t *testing.T) {
		got, err := inv()
		if err != nil || !got.Complete || strings.Join(got.Channels, " ") != "general team.backend" || got.LifecycleUID != uid1 {
			t.Fatalf("inventory: %+v, %v", got, err)
		}
	})
	t.Run("fail/an incomplete answer is ErrIncomplete", func(t *testing.T) {
		fault.Store(true)
		defer fault.Store(false)
		got, err := inv()
		if !errors.Is(err, dlvclient.ErrIncomplete) || got.Complete || got.LifecycleUID != uid1 {
			t.Fatalf("inventory: %+v, %v; want ErrIncomplete", got, err)
		}
	})
	t.Run("fail/a refusal is a RefusedError", func(t *testing.T) {
		// An owner the owner grammar admits but that is no principal owner (neither local nor a
		// derived u_ owner): the client sends it, deliveryd's closed decoder refuses it.
		_, err := dlvclient.LifecycleMemberships(plane3test.Ctx(t), authd, f.e.N, "local", "authd", "nkeyowner", "a1", uid1)
		var re *dlvclient.RefusedError
		if !errors.As(err, &re) || !strings.Contains(re.Message, "not a principal owner") {
			t.Fatalf("inventory of a non-principal owner: %v, want deliveryd's refusal", err)
		}
	})
	t.Run("fail/no responder", func(t *testing.T) {
		f.r.Stop()
		if err := f.dc.Flush(); err != nil { // the broker has processed the unsubscriptions
			t.Fatal(err)
		}
		if _, err := inv(); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("inventory without a responder: %v, want ErrNoResponders", err)
		}
	})
}
