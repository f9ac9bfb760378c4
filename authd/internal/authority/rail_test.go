package authority

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// The rail's caller: a remote manager's serve principal and the manager instance it serves.
var (
	cOwner = "u_" + strings.Repeat("m", 26)
	cUID   = strings.Repeat("g", 26)
	mIID   = strings.Repeat("h", 26)
)

const cActor = "mgr"

// serveGate writes the endpoint gate epgate.manager.<iid> as a registration leaves it.
func serveGate(t *testing.T, s *Store, iid string, g lifecycle.EndpointGate) {
	t.Helper()
	b, err := lifecycle.EncodeEndpointGate(g)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := lifecycle.EndpointGateKey(lifecycle.ManagerEndpoint, iid)
	if _, err := s.Create(context.Background(), space.Auth, key, b); err != nil {
		t.Fatal(err)
	}
}

func openGate(principal string, epoch uint64) lifecycle.EndpointGate {
	return lifecycle.EndpointGate{State: lifecycle.GateOpen, Principal: principal, ProcessEpoch: epoch, RegistrationRevision: 1, Generation: 1}
}

// railSubject is a request subject of the caller cOwner.cActor for target owner.actor at uid.
func railSubject(t *testing.T, s *Store, owner, actor, uid string) string {
	t.Helper()
	subj, err := s.Names().RetireLifecycle(space.RetireRail{TargetOwner: owner, TargetActor: actor, TargetUID: uid,
		CallerOwner: cOwner, CallerActor: cActor, CallerUID: cUID, Nonce: "n0nce123"})
	if err != nil {
		t.Fatal(err)
	}
	return subj
}

func railBody(opID, iid string, epoch uint64) []byte {
	return fmt.Appendf(nil, `{"v":1,"opId":%q,"serveEndpoint":"manager","serveInstanceId":%q,"serveEpoch":%d}`, opID, iid, epoch)
}

// TestRetireRail: every refusal in the rail's order, the wrong opId before any read, and the
// idempotent success.
func TestRetireRail(t *testing.T) {
	s, _, _ := provisioned(t)
	a := testAuthority(t, s, nil)
	ctx := ctxT(t)
	activate(t, s, tOwner, tActor, tUID)
	serveGate(t, s, mIID, openGate(cOwner+"."+cActor, 3))
	retiredIID, otherIID, frozenIID := strings.Repeat("i", 26), strings.Repeat("j", 26), strings.Repeat("k", 26)
	serveGate(t, s, retiredIID, lifecycle.EndpointGate{State: lifecycle.GateRetired, Principal: cOwner + "." + cActor, ProcessEpoch: 3,
		RegistrationRevision: 1, Generation: 1, Op: &lifecycle.Op{OpID: strings.Repeat("0", 26), Kind: lifecycle.OpRetirement}})
	serveGate(t, s, otherIID, openGate(cOwner+".someone", 3))
	// A registration's freeze carries its opId: SHA-256("register:manager.<iid>:<epoch>"), first
	// 26 hex characters (lifecycle.RegistrationOpID, once it is merged, checks it on decode).
	regSum := sha256.Sum256([]byte("register:manager." + frozenIID + ":3"))
	serveGate(t, s, frozenIID, lifecycle.EndpointGate{State: lifecycle.GateFrozen, Principal: cOwner + "." + cActor, ProcessEpoch: 3,
		RegistrationRevision: 1, Generation: 1, Op: &lifecycle.Op{OpID: hex.EncodeToString(regSum[:])[:26], Kind: lifecycle.OpRegistration}})
	op, _ := lifecycle.ManagedRetirementOpID(tUID)
	op2, _ := lifecycle.ManagedRetirementOpID(tUID2)
	// An alias whose gate is still frozen by its activation: a foreign op to the retirement.
	actOwner, actUID := "u_"+strings.Repeat("b", 26), strings.Repeat("e", 26)
	activating(t, s, actOwner, tActor, actUID)
	actOp, _ := lifecycle.ManagedRetirementOpID(actUID)

	subj := railSubject(t, s, tOwner, tActor, tUID)
	for _, tc := range []struct {
		name    string
		subject string
		body    []byte
		want    Code
		noReads bool
	}{
		{name: "fail/subject", subject: strings.Replace(subj, tUID, "C", 1), body: railBody(op, mIID, 3), want: CodeBadRequest, noReads: true},
		{name: "fail/body-unknown-field", subject: subj, body: []byte(`{"v":1,"opId":"` + op + `","serveEndpoint":"manager","serveInstanceId":"` + mIID + `","serveEpoch":3,"x":1}`), want: CodeBadRequest, noReads: true},
		{name: "fail/body-v2", subject: subj, body: []byte(`{"v":2,"opId":"` + op + `","serveEndpoint":"manager","serveInstanceId":"` + mIID + `","serveEpoch":3}`), want: CodeBadRequest, noReads: true},
		{name: "fail/wrong-opid-no-read", subject: subj, body: railBody(op2, mIID, 3), want: CodePermissionDenied, noReads: true},
		{name: "fail/endpoint-absent", subject: subj, body: railBody(op, strings.Repeat("z", 26), 3), want: CodeFailedPrecondition},
		{name: "fail/endpoint-retired", subject: subj, body: railBody(op, retiredIID, 3), want: CodeFailedPrecondition},
		{name: "fail/endpoint-frozen", subject: subj, body: railBody(op, frozenIID, 3), want: CodeFailedPrecondition},
		{name: "fail/endpoint-other-principal", subject: subj, body: railBody(op, otherIID, 3), want: CodePermissionDenied},
		{name: "fail/epoch", subject: subj, body: railBody(op, mIID, 2), want: CodeExpired},
		{name: "fail/head-absent", subject: railSubject(t, s, tOwner, "nobody", tUID), body: railBody(op, mIID, 3), want: CodeFailedPrecondition},
		{name: "fail/head-at-another-uid", subject: railSubject(t, s, tOwner, tActor, tUID2), body: railBody(op2, mIID, 3), want: CodeExpired},
		{name: "fail/gate-frozen-by-a-foreign-op", subject: railSubject(t, s, actOwner, tActor, actUID), body: railBody(actOp, mIID, 3), want: CodeConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w := s.Reads(), s.Writes()
			rep := a.HandleRetireRail(ctx, tc.subject, tc.body)
			if rep.OK || rep.Code != string(tc.want) || rep.Error == "" {
				t.Fatalf("reply %+v, want %s", rep, tc.want)
			}
			if s.Writes() != w {
				t.Fatalf("%d writes", s.Writes()-w)
			}
			if tc.noReads && s.Reads() != r {
				t.Fatalf("%d reads before the refusal, want none", s.Reads()-r)
			}
		})
	}
	t.Run("ok/retires", func(t *testing.T) {
		rep := a.HandleRetireRail(ctx, subj, railBody(op, mIID, 3))
		if !rep.OK || rep.Result.LifecycleUID != tUID || rep.Result.OpID != op ||
			fmt.Sprint(rep.Result.EvictedPrincipals) != "["+tOwner+"."+tActor+"]" {
			t.Fatalf("reply %+v", rep)
		}
		retiredAt(t, s, tOwner, tActor, tUID)
	})
	t.Run("ok/already-retired", func(t *testing.T) {
		w := s.Writes()
		rep := a.HandleRetireRail(ctx, subj, railBody(op, mIID, 3))
		b, _ := lifecycle.EncodeRetireLifecycleReply(rep)
		if want := `{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"` + tUID + `","opId":"` + op + `","evictedPrincipals":[]}}`; string(b) != want || s.Writes() != w {
			t.Fatalf("reply %s, want %s", b, want)
		}
	})
	t.Run("fail/store-unavailable", func(t *testing.T) {
		s2, _, nc2 := provisioned(t)
		down := testAuthority(t, s2, nil)
		nc2.Close()
		if rep := down.HandleRetireRail(ctx, subj, railBody(op, mIID, 3)); rep.Code != string(CodeUnavailable) || strings.Contains(rep.Error, "nats:") {
			t.Fatalf("reply %+v, want unavailable without the cause", rep)
		}
	})
}

// TestOneFreeze: door calls and a rail request for one lifecycle at once run one barrier: one
// freeze, every caller answered retired. The rail answers only on <request>.reply, never on the
// reply subject the request names.
func TestOneFreeze(t *testing.T) {
	b, s, _, nc := provisionedBroker(t)
	a := testAuthority(t, s, nil)
	activate(t, s, tOwner, tActor, tUID)
	serveGate(t, s, mIID, openGate(cOwner+"."+cActor, 0))
	if _, err := a.ServeRetireRail(ctxT(t), nc); err != nil {
		t.Fatal(err)
	}
	jwt, kp := b.Space(testSpace).MintUnlimited(t)
	caller, err := b.Connect(t, jwt, kp)
	if err != nil {
		t.Fatal(err)
	}
	subj := railSubject(t, s, tOwner, tActor, tUID)
	replies, err := caller.SubscribeSync(space.RailReply(subj))
	if err != nil {
		t.Fatal(err)
	}
	decoy, err := caller.SubscribeSync("decoy.inbox")
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.Flush(); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	a.afterStep = func(n int) error {
		if n == stepFreeze {
			<-release
		}
		return nil
	}
	const doors = 8
	h := a.RetireDoor([]byte(doorCap))
	var wg sync.WaitGroup
	statuses := make(chan string, doors)
	started := make(chan struct{}, doors+1)
	for range doors {
		wg.Go(func() {
			started <- struct{}{}
			code, body := doorPost(t, h, http.MethodPost, coordJSON(tOwner, tActor, tUID))
			statuses <- fmt.Sprint(code, " ", body)
		})
	}
	op, _ := lifecycle.ManagedRetirementOpID(tUID)
	wg.Go(func() {
		started <- struct{}{}
		if err := caller.PublishRequest(subj, "decoy.inbox", railBody(op, mIID, 0)); err != nil {
			t.Error(err)
		}
	})
	for range doors + 1 {
		<-started
	}
	// Every caller reaches the flight while its freeze is held.
	testkit.Eventually(t, 30*time.Second, func() error {
		if n := a.flights.calls.Load(); n != doors+1 {
			return fmt.Errorf("%d of %d callers in the flight", n, doors+1)
		}
		return nil
	})
	close(release)
	wg.Wait()
	close(statuses)
	for st := range statuses {
		if st != `200 {"retired":true,"lifecycleUid":"`+tUID+`"}` {
			t.Fatalf("a door call answered %s", st)
		}
	}
	m, err := replies.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no rail reply on %s: %v", space.RailReply(subj), err)
	}
	rep, err := lifecycle.DecodeRetireLifecycleReply(m.Data)
	if err != nil || !rep.OK || rep.Result.OpID != op || rep.Result.LifecycleUID != tUID {
		t.Fatalf("rail reply %s (%v)", m.Data, err)
	}
	if m, err := decoy.NextMsg(200 * time.Millisecond); err != nats.ErrTimeout {
		t.Fatalf("the rail answered the request's own reply subject: %v %v", m, err)
	}
	if a.freezes.Load() != 1 {
		t.Fatalf("%d freezes, want 1", a.freezes.Load())
	}
	retiredAt(t, s, tOwner, tActor, tUID)
}

// TestResumeGarbled: an intent that does not decode refuses the boot resume; an intent whose
// gate is open is not owed.
func TestResumeGarbled(t *testing.T) {
	s, _, _ := provisioned(t)
	a := testAuthority(t, s, nil)
	ctx := ctxT(t)
	activate(t, s, tOwner, tActor, tUID)
	op, _ := lifecycle.ManagedRetirementOpID(tUID)
	st, _ := lifecycle.EncodeStage(lifecycle.Stage{Kind: lifecycle.OpRetirement, Owner: tOwner, Actor: tActor, LifecycleUID: tUID, FromGeneration: 1})
	key, _ := lifecycle.StageKey(op)
	if _, err := s.Create(ctx, space.Auth, key, st); err != nil {
		t.Fatal(err)
	}
	if owed, err := a.Resume(ctx); err != nil || len(owed) != 0 {
		t.Fatalf("an intent with an open gate: owed %v, %v", owed, err)
	}
	for name, value := range map[string]string{
		"garbled":     `{"v":1,"kind":"retirement"`,
		"another-uid": strings.Replace(string(st), tUID, tUID2, 1),
	} {
		t.Run("fail/"+name, func(t *testing.T) {
			s2, _, _ := provisioned(t)
			a2 := testAuthority(t, s2, nil)
			if _, err := s2.Create(ctx, space.Auth, key, []byte(value)); err != nil {
				t.Fatal(err)
			}
			if owed, err := a2.Resume(ctx); err == nil || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("Resume = %v, %v; want a corrupt-intent error", owed, err)
			}
		})
	}
	t.Run("fail/not-an-opid", func(t *testing.T) {
		s2, _, _ := provisioned(t)
		a2 := testAuthority(t, s2, nil)
		if _, err := s2.Create(ctx, space.Auth, "stage.NOT_AN_OPID", st); err != nil {
			t.Fatal(err)
		}
		if _, err := a2.Resume(ctx); err == nil {
			t.Fatal("Resume accepted stage.NOT_AN_OPID")
		}
	})
}
