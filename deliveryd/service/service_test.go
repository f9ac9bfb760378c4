package service_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// members provisions bob and carol (dlv_ durables, ACL rows on general) and joins both to
// general as durable members, as managerd and durableJoin would.
func members(t *testing.T, e *plane3test.Env) {
	t.Helper()
	pjs := e.Provisioner(t)
	e.AddLifecycle(t, pjs, "bob", uidBob, []string{"general"})
	e.AddLifecycle(t, pjs, "carol", uidCarol, []string{"general"})
	djs := plane3test.JS(t, e.Delivery(t))
	e.Join(t, djs, "general", "bob", uidBob, 0, 1)
	e.Join(t, djs, "general", "carol", uidCarol, 0, 1)
}

// TestDurableMembersExactlyOnce (a): two durable members of general each receive every message
// alice posts exactly once, in their own DLV subject, through a started deliveryd.
func TestDurableMembersExactlyOnce(t *testing.T) {
	e := plane3test.New(t)
	members(t, e)
	var logs logBuffer
	svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
	row := servicetest.WaitReady(t, servicetest.DeliveryKV(t, e), "deliveryd-a", 5*time.Second)
	if row.Incarnation != svc.Row().Incarnation {
		t.Fatalf("lease row %+v is not the service's %+v", row, svc.Row())
	}
	bob, carol := plane3test.Receive(t, e, "bob", uidBob), plane3test.Receive(t, e, "carol", uidCarol)
	ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
	want := servicetest.Seq("m", 1, 25)
	for i, id := range want {
		e.Post(t, ajs, "alice", id, fmt.Sprint("hello ", i))
	}
	pjs := e.Provisioner(t)
	eventually(t, 10*time.Second, func() error {
		for name, b := range map[string]*plane3test.Inbox{"bob": bob, "carol": carol} {
			if err := servicetest.Exactly(b.IDs(), want); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	for actor, uid := range map[string]string{"bob": uidBob, "carol": uidCarol} {
		if n := servicetest.DLVCount(t, e, pjs, actor, uid); n != uint64(len(want)) {
			t.Errorf("DLV holds %d messages for %s, want %d", n, actor, len(want))
		}
	}
	if strings.Contains(logs.String(), "eyJ") {
		t.Fatalf("a JWT reached the log:\n%s", logs.String())
	}
}

// TestSecondInstanceRefused (b, in process): a second deliveryd for the space is refused with
// LEASE_HELD naming the first's holder, writes the refusal file, and leaves the first serving.
func TestSecondInstanceRefused(t *testing.T) {
	e := plane3test.New(t)
	var logs logBuffer
	first := start(t, servicetest.Config(t, e, "deliveryd-first"), &logs)
	cfg := servicetest.Config(t, e, "deliveryd-second")
	_, err := service.Start(ctx(t), service.Inputs{Config: cfg}, service.RuntimeOptions{Getenv: noEnv})
	var se *service.StartError
	if !errors.As(err, &se) || se.Code != service.CodeLeaseHeld || se.Details["holder"] != "deliveryd-first" || !strings.Contains(err.Error(), `"deliveryd-first"`) {
		t.Fatalf("second start = %v; want LEASE_HELD naming deliveryd-first", err)
	}
	var re *daemon.RefusedError
	if _, err := daemon.Ready(ctx(t), cfg.StateDir, service.FileName, os.Getpid()); !errors.As(err, &re) || re.Refusal.Code != service.CodeLeaseHeld || re.Refusal.Details["holder"] != "deliveryd-first" {
		t.Fatalf("Ready = %v; want the LEASE_HELD refusal naming deliveryd-first", err)
	}
	kv := servicetest.DeliveryKV(t, e)
	row, _, err := servicetest.LeaseRow(ctx(t), kv)
	if err != nil || row.Holder != "deliveryd-first" || row.Incarnation != first.Row().Incarnation || !row.Ready {
		t.Fatalf("lease row after the refused second = %+v, %v", row, err)
	}
	select {
	case <-first.Done():
		t.Fatalf("the first stopped: %v", first.Err())
	default:
	}
	// Close releases the row.
	if err := first.Close(ctx(t)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if _, _, err := servicetest.LeaseRow(ctx(t), kv); !errors.Is(err, servicetest.ErrNoRow) {
		t.Fatalf("lease row after Close: %v; want none", err)
	}
	if !errors.Is(first.Err(), daemon.ErrStopped) {
		t.Fatalf("Err after Close = %v", first.Err())
	}
}
