package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// These tests run DeprovisionAgent and FenceLifecycleACL on credentials signerd mints from the
// profile matrix, against a real broker. A competing caller is a second real credential; where a
// test needs it to act at one exact point (between this caller's read and its write), hookJS runs
// it there: hookJS only interleaves calls on the real JetStream connection, it answers nothing
// itself.

// lcOf is one test lifecycle of owner "local": its actor and a uid made of one letter.
type lcOf struct{ actor, uid string }

func lifecycle(actor string, letter byte) lcOf {
	return lcOf{actor: actor, uid: strings.Repeat(string(letter), 26)}
}

func (l lcOf) dm() string  { return "dm_local-" + l.actor + "-" + l.uid }
func (l lcOf) dlv() string { return "dlv_local-" + l.actor + "-" + l.uid }
func (l lcOf) key() string { return "local." + l.actor + "." + l.uid }
func (l lcOf) member(ch string) string {
	return ch + "/" + l.key()
}

// provisionLC provisions l, of role reviewer (the shared svc_reviewer queue), reading general and
// team.backend.
func provisionLC(t *testing.T, e *agentEnv, l lcOf) {
	t.Helper()
	if _, err := provision.RunProvisionAgent(testCtx(t), e.cfg, provision.Agent{
		Owner: "local", Actor: l.actor, LifecycleUID: l.uid, Role: "reviewer", AllowSubscribe: []string{"general", "team.backend"},
	}); err != nil {
		t.Fatal(err)
	}
}

// deliveryKV opens the members bucket on a delivery credential, the profile of the rows' writer.
func deliveryKV(t *testing.T, e *agentEnv) jetstream.KeyValue {
	t.Helper()
	djs, _, _ := e.conn(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_DELIVERY, nil)
	kv, err := djs.KeyValue(testCtx(t), "cotal_members_alpha")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// aclKV opens the ACL bucket on a provisioner credential, the rows' writer.
func aclKV(t *testing.T, e *agentEnv) jetstream.KeyValue {
	t.Helper()
	kv, err := e.provisioner(t).KeyValue(testCtx(t), "cotal_acl_alpha")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// putMember writes l's open membership row on ch (deliveryd's row shape) and returns its revision.
func putMember(t *testing.T, kv jetstream.KeyValue, l lcOf, ch string, gen int) uint64 {
	t.Helper()
	body := fmt.Sprintf(`{"channel":%q,"owner":"local","lifecycleUid":%q,"state":"active","joinCursor":1,"generation":%d,"activated":true,"writerIdentity":"test","updatedAt":1}`, ch, l.uid, gen)
	rev, err := kv.Put(testCtx(t), l.member(ch), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// row reads key from kv: its value, or "" when absent (never written, deleted or purged).
func row(t *testing.T, kv jetstream.KeyValue, key string) string {
	t.Helper()
	en, err := kv.Get(testCtx(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(en.Value())
}

// deprovisioner connects with a deprovisioner credential for l and member channels.
func (e *agentEnv) deprovisioner(t *testing.T, l lcOf, members ...string) (jetstream.JetStream, *nats.Conn, *asyncErrs) {
	t.Helper()
	return e.conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_DEPROVISIONER,
		&signerv1.ProfileParams{Owner: "local", Actor: l.actor, LifecycleUid: l.uid, MemberChannels: members})
}

func intp(n int) *int { return &n }

// sameResult fails unless got is want, field by field (Deleted by value, nil meaning unknown).
func sameResult(t *testing.T, got, want provision.Result) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("result\n got %+v (%s)\nwant %+v (%s)", got, got, want, want)
	}
}

// hookJS runs a competing action once at an exact point of a real JetStream connection: after
// the first INFO or the DELETE of a named consumer, or after the first read of a named key.
type hookJS struct {
	jetstream.JetStream
	afterInfo, afterDelete, afterGet map[string]func()
	mu                               sync.Mutex
	fired                            map[string]bool
}

func (h *hookJS) once(hooks map[string]func(), kind, name string) {
	h.mu.Lock()
	f, done := hooks[name], h.fired[kind+" "+name]
	if h.fired == nil {
		h.fired = map[string]bool{}
	}
	h.fired[kind+" "+name] = true
	h.mu.Unlock()
	if f != nil && !done {
		f()
	}
}

func (h *hookJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	c, err := h.JetStream.Consumer(ctx, stream, name)
	h.once(h.afterInfo, "info", name)
	return c, err
}

func (h *hookJS) DeleteConsumer(ctx context.Context, stream, name string) error {
	err := h.JetStream.DeleteConsumer(ctx, stream, name)
	h.once(h.afterDelete, "delete", name)
	return err
}

func (h *hookJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := h.JetStream.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	return &hookKV{KeyValue: kv, h: h}, nil
}

type hookKV struct {
	jetstream.KeyValue
	h *hookJS
}

func (k *hookKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	en, err := k.KeyValue.Get(ctx, key)
	k.h.once(k.h.afterGet, "get", key)
	return en, err
}

// TestDeprovisionAgentResult counts each slot of a teardown on the real broker: a fresh agent's
// two consumers, ACL row and member rows (acknowledged, deleted) and a repeat that finds only
// absence; a consumer already gone and a member row never written (absent); a competing deleter
// winning each slot between this caller's read and its delete (disappeared, deleted unknown);
// competitors racing on real goroutines (each slot settled exactly once); a live replacement
// after the read (refused, a *DeprovisionError) then settled by a retry; a slot the credential
// does not reach (a partial failure); and bad member channels (nothing touched).
func TestDeprovisionAgentResult(t *testing.T) {
	e := newAgentEnv(t, true)
	members, acls := deliveryKV(t, e), aclKV(t, e)

	t.Run("ok/a fresh agent: acknowledged and deleted, then a repeat counts only absence", func(t *testing.T) {
		l := lifecycle("f1", 'f')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		putMember(t, members, l, "team.backend", 1)
		res, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, []string{"team.backend", "general", "general"})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, res, provision.Result{
			Examined: 5, Acknowledged: 2, Deleted: intp(5),
			Consumers: provision.ConsumerCounts{Examined: 2, Acknowledged: 2, Deleted: intp(2)},
			ACL:       provision.KVCounts{Examined: 1, Deleted: 1},
			Members:   provision.KVCounts{Examined: 2, Deleted: 2},
			Removed:   []string{l.dm(), l.dlv(), l.key(), l.member("team.backend"), l.member("general")},
		})
		for _, c := range e.consumers(t) {
			if strings.Contains(c, l.uid) {
				t.Fatalf("broker still holds %s", c)
			}
		}
		if !slices.Contains(e.consumers(t), "TASK_alpha/svc_reviewer") {
			t.Fatal("the shared role queue is gone")
		}
		if got := row(t, acls, l.key()) + row(t, members, l.member("general")) + row(t, members, l.member("team.backend")); got != "" {
			t.Fatalf("rows left: %s", got)
		}

		again, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, []string{"general", "team.backend"})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, again, provision.Result{
			Examined: 5, Absent: 5, Deleted: intp(0),
			Consumers: provision.ConsumerCounts{Examined: 2, Absent: 2, Deleted: intp(0)},
			ACL:       provision.KVCounts{Examined: 1, Absent: 1},
			Members:   provision.KVCounts{Examined: 2, Absent: 2},
		})
	})

	t.Run("ok/a consumer already gone and a member row never written are absent", func(t *testing.T) {
		l := lifecycle("g1", 'g')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		djs, _, _ := e.deprovisioner(t, l)
		if err := djs.DeleteConsumer(testCtx(t), "DLV_alpha", l.dlv()); err != nil {
			t.Fatal(err)
		}
		res, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, []string{"general", "ops"})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, res, provision.Result{
			Examined: 5, Absent: 2, Acknowledged: 1, Deleted: intp(3),
			Consumers: provision.ConsumerCounts{Examined: 2, Absent: 1, Acknowledged: 1, Deleted: intp(1)},
			ACL:       provision.KVCounts{Examined: 1, Deleted: 1},
			Members:   provision.KVCounts{Examined: 2, Absent: 1, Deleted: 1},
			Removed:   []string{l.dm(), l.key(), l.member("general")},
		})
	})

	t.Run("ok/a competing deleter wins between the read and the delete: disappeared, deleted unknown", func(t *testing.T) {
		l := lifecycle("c1", 'c')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		rival, _, _ := e.deprovisioner(t, l, "general")
		rivalACL, err := rival.KeyValue(testCtx(t), "cotal_acl_alpha")
		if err != nil {
			t.Fatal(err)
		}
		rivalMembers, err := rival.KeyValue(testCtx(t), "cotal_members_alpha")
		if err != nil {
			t.Fatal(err)
		}
		must := func(err error) {
			if err != nil {
				t.Error(err)
			}
		}
		djs, _, _ := e.deprovisioner(t, l, "general")
		h := &hookJS{JetStream: djs,
			afterInfo: map[string]func(){l.dm(): func() { must(rival.DeleteConsumer(testCtx(t), "DM_alpha", l.dm())) }},
			afterGet: map[string]func(){
				l.key():             func() { must(rivalACL.Purge(testCtx(t), l.key())) },
				l.member("general"): func() { must(rivalMembers.Purge(testCtx(t), l.member("general"))) },
			},
		}
		res, err := provision.DeprovisionAgent(testCtx(t), h, e.n, "local", l.actor, l.uid, []string{"general"})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, res, provision.Result{
			Examined: 4, Acknowledged: 1, Disappeared: 3, Deleted: nil,
			Consumers: provision.ConsumerCounts{Examined: 2, Acknowledged: 1, Disappeared: 1, Deleted: nil},
			ACL:       provision.KVCounts{Examined: 1, Disappeared: 1},
			Members:   provision.KVCounts{Examined: 1, Disappeared: 1},
			Removed:   []string{l.dlv()},
		})
		if !strings.Contains(res.String(), "deleted unknown") {
			t.Fatalf("String() = %q, want the unknown deletion spelled out", res.String())
		}
	})

	t.Run("ok/concurrent deprovisioners on real goroutines settle each slot once", func(t *testing.T) {
		l := lifecycle("r1", 'r')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		const callers = 4
		results := make([]provision.Result, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, []string{"general"})
			})
		}
		close(start)
		wg.Wait()
		removedBy := map[string]int{}
		aclDeleted, membersDeleted := 0, 0
		for i, res := range results {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			c := res.Consumers
			consumersRemoved := 0
			for _, name := range res.Removed {
				removedBy[name]++
				if name == l.dm() || name == l.dlv() {
					consumersRemoved++
				}
			}
			if c.Examined != 2 || c.Refused != 0 || c.Absent+c.Disappeared+consumersRemoved != 2 {
				t.Fatalf("caller %d consumers %+v, removed %v: slots not settled exactly once", i, c, res.Removed)
			}
			if (c.Disappeared > 0) != (c.Deleted == nil) || (c.Deleted != nil && *c.Deleted != consumersRemoved) {
				t.Fatalf("caller %d consumers %+v: Deleted must be nil exactly when one disappeared", i, c)
			}
			for _, kc := range []provision.KVCounts{res.ACL, res.Members} {
				if kc.Examined != 1 || kc.Refused != 0 || kc.Absent+kc.Deleted+kc.Disappeared != 1 {
					t.Fatalf("caller %d key counts %+v: not settled exactly once", i, kc)
				}
			}
			aclDeleted += res.ACL.Deleted
			membersDeleted += res.Members.Deleted
		}
		// A conditional purge has one winner; a consumer was removed by at least one
		// acknowledged DELETE (nobody else deletes it).
		if aclDeleted != 1 || membersDeleted != 1 || removedBy[l.key()] != 1 || removedBy[l.member("general")] != 1 {
			t.Fatalf("ACL deleted by %d callers, member row by %d (removed %v); want exactly one each", aclDeleted, membersDeleted, removedBy)
		}
		if removedBy[l.dm()] < 1 || removedBy[l.dlv()] < 1 {
			t.Fatalf("removed %v: each consumer needs one acknowledged remover", removedBy)
		}
		for _, c := range e.consumers(t) {
			if strings.Contains(c, l.uid) {
				t.Fatalf("broker still holds %s", c)
			}
		}
		if got := row(t, acls, l.key()) + row(t, members, l.member("general")); got != "" {
			t.Fatalf("rows left: %s", got)
		}
	})

	t.Run("fail/a live replacement after the read is refused, and a retry settles it", func(t *testing.T) {
		l := lifecycle("l1", 'l')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		pjs := e.provisioner(t)
		replacement, _ := provision.ACL{AllowSubscribe: []string{"general"}, Revision: 2, UpdatedAt: 2}.Encode()
		must := func(err error) {
			if err != nil {
				t.Error(err)
			}
		}
		djs, _, _ := e.deprovisioner(t, l, "general")
		h := &hookJS{JetStream: djs,
			afterDelete: map[string]func(){l.dlv(): func() { must(provision.EnsureDlvDurable(testCtx(t), pjs, e.n, "local", l.actor, l.uid)) }},
			afterGet: map[string]func(){
				l.key(): func() {
					_, err := acls.Put(testCtx(t), l.key(), replacement)
					must(err)
				},
				l.member("general"): func() { putMember(t, members, l, "general", 2) },
			},
		}
		res, err := provision.DeprovisionAgent(testCtx(t), h, e.n, "local", l.actor, l.uid, []string{"general"})
		want := provision.Result{
			Examined: 4, Acknowledged: 2, Refused: 3, Deleted: intp(1),
			Consumers: provision.ConsumerCounts{Examined: 2, Acknowledged: 2, Deleted: intp(1), Refused: 1},
			ACL:       provision.KVCounts{Examined: 1, Refused: 1},
			Members:   provision.KVCounts{Examined: 1, Refused: 1},
			Removed:   []string{l.dm()},
		}
		sameResult(t, res, want)
		var de *provision.DeprovisionError
		if !errors.As(err, &de) {
			t.Fatalf("err = %v, want a *DeprovisionError", err)
		}
		sameResult(t, de.Result, want)
		var slots []string
		for _, f := range de.Failures {
			slots = append(slots, f.Slot)
		}
		if wantSlots := []string{"consumer DLV_alpha/" + l.dlv(), "acl " + l.key(), "member " + l.member("general")}; de.Lifecycle != l.key() || !slices.Equal(slots, wantSlots) {
			t.Fatalf("lifecycle %s failures %v, want %s %v", de.Lifecycle, slots, l.key(), wantSlots)
		}
		if msg := err.Error(); !strings.Contains(msg, "3 of 4 slots refused") || !strings.Contains(msg, "live replacement") {
			t.Fatalf("error text %q", msg)
		}
		// Each replacement is still there, untouched.
		if got := row(t, acls, l.key()); got != string(replacement) {
			t.Fatalf("ACL row %q, want the replacement %s", got, replacement)
		}
		if got := row(t, members, l.member("general")); !strings.Contains(got, `"generation":2`) {
			t.Fatalf("member row %q, want the replacement", got)
		}
		if !slices.Contains(e.consumers(t), "DLV_alpha/"+l.dlv()) {
			t.Fatal("the recreated dlv_ is gone")
		}

		retry, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, []string{"general"})
		if err != nil {
			t.Fatal(err)
		}
		sameResult(t, retry, provision.Result{
			Examined: 4, Absent: 1, Acknowledged: 1, Deleted: intp(3),
			Consumers: provision.ConsumerCounts{Examined: 2, Absent: 1, Acknowledged: 1, Deleted: intp(1)},
			ACL:       provision.KVCounts{Examined: 1, Deleted: 1},
			Members:   provision.KVCounts{Examined: 1, Deleted: 1},
			Removed:   []string{l.dlv(), l.key(), l.member("general")},
		})
	})

	t.Run("fail/a slot the credential does not reach is a partial failure", func(t *testing.T) {
		l := lifecycle("p1", 'p')
		provisionLC(t, e, l)
		putMember(t, members, l, "general", 1)
		putMember(t, members, l, "secret", 1)
		djs, nc, errs := e.deprovisioner(t, l, "general") // not "secret"
		// The refused read gets no answer: this call's deadline ends it.
		ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
		defer cancel()
		res, err := provision.DeprovisionAgent(ctx, djs, e.n, "local", l.actor, l.uid, []string{"general", "secret"})
		var de *provision.DeprovisionError
		if !errors.As(err, &de) || len(de.Failures) != 1 || de.Failures[0].Slot != "member "+l.member("secret") {
			t.Fatalf("err = %v, want a *DeprovisionError for the secret row only", err)
		}
		sameResult(t, res, provision.Result{
			Examined: 5, Acknowledged: 2, Refused: 1, Deleted: intp(4),
			Consumers: provision.ConsumerCounts{Examined: 2, Acknowledged: 2, Deleted: intp(2)},
			ACL:       provision.KVCounts{Examined: 1, Deleted: 1},
			Members:   provision.KVCounts{Examined: 2, Deleted: 1, Refused: 1},
			Removed:   []string{l.dm(), l.dlv(), l.key(), l.member("general")},
		})
		errs.wait(t, nc, testkit.PublishViolation("$JS.API.DIRECT.GET.KV_cotal_members_alpha.$KV.cotal_members_alpha."+l.member("secret")))
		if got := row(t, members, l.member("secret")); got == "" {
			t.Fatal("the secret row is gone")
		}
	})

	t.Run("fail/bad member channels touch nothing", func(t *testing.T) {
		l := lifecycle("b1", 'b')
		provisionLC(t, e, l)
		tooMany := make([]string, provision.MaxMemberChannels+1)
		for i := range tooMany {
			tooMany[i] = fmt.Sprintf("c%d", i)
		}
		for _, chans := range [][]string{{"general", "team.>"}, {"team.*"}, {""}, {"a/b"}, tooMany} {
			_, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, chans)
			var se *provision.StepError
			if !errors.As(err, &se) || se.Step != provision.StepValidate || se.Lifecycle != l.key() {
				t.Fatalf("member channels %.40q: err = %v, want a validation StepError", chans, err)
			}
		}
		if got := e.consumers(t); !slices.Contains(got, "DM_alpha/"+l.dm()) || !slices.Contains(got, "DLV_alpha/"+l.dlv()) {
			t.Fatalf("broker holds %v, want b1's consumers kept", got)
		}
		if row(t, acls, l.key()) == "" {
			t.Fatal("b1's ACL row is gone")
		}
	})

	t.Run("fail/one lifecycle's deprovisioner reaches nothing of another", func(t *testing.T) {
		a, b := lifecycle("x1", 'x'), lifecycle("y1", 'y')
		provisionLC(t, e, a)
		provisionLC(t, e, b)
		putMember(t, members, b, "general", 1)
		js, nc, errs := e.deprovisioner(t, a, "general")
		ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
		defer cancel()
		res, err := provision.DeprovisionAgent(ctx, js, e.n, "local", b.actor, b.uid, []string{"general"})
		var de *provision.DeprovisionError
		if !errors.As(err, &de) || res.Refused != res.Examined || res.Examined != 4 || res.Acknowledged != 0 || len(res.Removed) != 0 {
			t.Fatalf("result %+v, err %v: want every slot refused", res, err)
		}
		errs.wait(t, nc, testkit.PublishViolation("$JS.API.CONSUMER.INFO.DM_alpha."+b.dm()))
		if got := e.consumers(t); !slices.Contains(got, "DM_alpha/"+b.dm()) || !slices.Contains(got, "DLV_alpha/"+b.dlv()) {
			t.Fatalf("broker holds %v, want B's consumers kept", got)
		}
		if row(t, acls, b.key()) == "" || row(t, members, b.member("general")) == "" {
			t.Fatal("B's ACL or member row is gone")
		}
	})
}

// TestFenceLifecycleACL: the fence narrows a provisioned lifecycle's ACL row to no reads (revision
// bumped, conditioned on the KV revision read), leaves a fenced row as it is, creates no row for
// an absent lifecycle, writes again over a concurrent rewrite, and cannot reach another
// lifecycle's row; DeprovisionAgent then purges the fenced row.
func TestFenceLifecycleACL(t *testing.T) {
	e := newAgentEnv(t, true)
	acls := aclKV(t, e)

	t.Run("ok/fence, fence again, then deprovision", func(t *testing.T) {
		l := lifecycle("f1", 'f')
		provisionLC(t, e, l)
		fence, err := provision.RunFenceLifecycleACL(testCtx(t), e.cfg, "local", l.actor, l.uid)
		if err != nil {
			t.Fatal(err)
		}
		en, err := acls.Get(testCtx(t), l.key())
		if err != nil {
			t.Fatal(err)
		}
		got, ok := provision.DecodeACL(en.Value())
		if fence.State != provision.FenceWritten || fence.Revision != en.Revision() ||
			!ok || len(got.AllowSubscribe) != 0 || got.Revision != 2 || got.UpdatedAt <= 0 {
			t.Fatalf("fence %+v, row %s at %d", fence, en.Value(), en.Revision())
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(en.Value(), &raw); err != nil || string(raw["allowSubscribe"]) != "[]" {
			t.Fatalf("row %s: want allowSubscribe written as []", en.Value())
		}
		again, err := provision.RunFenceLifecycleACL(testCtx(t), e.cfg, "local", l.actor, l.uid)
		if err != nil || again != (provision.Fence{State: provision.FenceAlready, Revision: en.Revision()}) {
			t.Fatalf("second fence %+v, %v", again, err)
		}
		res, err := provision.RunDeprovisionAgent(testCtx(t), e.cfg, "local", l.actor, l.uid, nil)
		if err != nil || res.ACL != (provision.KVCounts{Examined: 1, Deleted: 1}) || res.Members != (provision.KVCounts{}) {
			t.Fatalf("deprovision after the fence: %+v, %v", res, err)
		}
	})

	t.Run("ok/an absent row stays absent", func(t *testing.T) {
		l := lifecycle("n1", 'n')
		fence, err := provision.RunFenceLifecycleACL(testCtx(t), e.cfg, "local", l.actor, l.uid)
		if err != nil || fence != (provision.Fence{State: provision.FenceAbsent}) {
			t.Fatalf("fence %+v, %v", fence, err)
		}
		if got := row(t, acls, l.key()); got != "" {
			t.Fatalf("fence created %s", got)
		}
	})

	t.Run("ok/a rewrite between the read and the write is read again", func(t *testing.T) {
		l := lifecycle("w1", 'w')
		provisionLC(t, e, l)
		rewrite, _ := provision.ACL{AllowSubscribe: []string{"general"}, Revision: 7, UpdatedAt: 7}.Encode()
		djs, _, _ := e.deprovisioner(t, l)
		h := &hookJS{JetStream: djs, afterGet: map[string]func(){l.key(): func() {
			if _, err := acls.Put(testCtx(t), l.key(), rewrite); err != nil {
				t.Error(err)
			}
		}}}
		fence, err := provision.FenceLifecycleACL(testCtx(t), h, e.n, "local", l.actor, l.uid)
		if err != nil || fence.State != provision.FenceWritten {
			t.Fatalf("fence %+v, %v", fence, err)
		}
		got, ok := provision.DecodeACL([]byte(row(t, acls, l.key())))
		if !ok || len(got.AllowSubscribe) != 0 || got.Revision != 8 {
			t.Fatalf("row %+v: want the rewrite (revision 7) fenced at revision 8", got)
		}
	})

	t.Run("fail/another lifecycle's row is out of reach", func(t *testing.T) {
		a, b := lifecycle("x1", 'x'), lifecycle("y1", 'y')
		provisionLC(t, e, b)
		before := row(t, acls, b.key())
		js, nc, errs := e.deprovisioner(t, a)
		ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
		defer cancel()
		_, err := provision.FenceLifecycleACL(ctx, js, e.n, "local", b.actor, b.uid)
		var se *provision.StepError
		if !errors.As(err, &se) || se.Step != provision.StepFenceACL {
			t.Fatalf("err = %v, want a refusal at %q", err, provision.StepFenceACL)
		}
		errs.wait(t, nc, testkit.PublishViolation("$JS.API.DIRECT.GET.KV_cotal_acl_alpha.$KV.cotal_acl_alpha."+b.key()))
		if got := row(t, acls, b.key()); got != before || got == "" {
			t.Fatalf("B's row %q, want %q", got, before)
		}
	})
}
