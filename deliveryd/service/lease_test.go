package service_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestLeaseWatch (d): the mandatory watch on lease.0 acts on what it sees.
func TestLeaseWatch(t *testing.T) {
	t.Run("ok/deleted-key-quiesces-and-recovers", func(t *testing.T) {
		e := plane3test.New(t)
		members(t, e)
		var logs logBuffer
		svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
		kv := servicetest.DeliveryKV(t, e)
		servicetest.WaitReady(t, kv, "deliveryd-a", 5*time.Second)
		inc := svc.Row().Incarnation
		bob := plane3test.Receive(t, e, "bob", uidBob)
		ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
		e.Post(t, ajs, "alice", "before", "before the delete")
		eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"before"}) })

		if err := kv.Delete(ctx(t), space.DeliveryLeaseKey); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, func() error {
			if !logs.has(`"msg":"quiesced"`) || !logs.has(`"msg":"resumed"`) {
				return errors.New("no quiesce and resume logged yet")
			}
			row, _, err := servicetest.LeaseRow(ctx(t), kv)
			if err != nil {
				return err
			}
			if row.Holder != "deliveryd-a" || row.Incarnation != inc || !row.Ready {
				return fmt.Errorf("row %+v", row)
			}
			return nil
		})
		if svc.Quiesced() {
			t.Fatal("still quiesced after the row was created again")
		}
		e.Post(t, ajs, "alice", "after", "after the delete")
		eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"before", "after"}) })
	})
	t.Run("fail/foreign-row-stops-without-releasing", func(t *testing.T) {
		e := plane3test.New(t)
		var logs logBuffer
		svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
		kv := servicetest.DeliveryKV(t, e)
		servicetest.WaitReady(t, kv, "deliveryd-a", 5*time.Second)
		foreign, _ := json.Marshal(lease.Row{Holder: "intruder", Incarnation: "0123456789abcdef", Since: time.Now().UTC(), Ready: true})
		if _, err := kv.Put(ctx(t), space.DeliveryLeaseKey, foreign); err != nil {
			t.Fatal(err)
		}
		err := stopped(t, svc, 10*time.Second, &logs)
		if !errors.Is(err, service.ErrLeaseTaken) {
			t.Fatalf("Err = %v; want ErrLeaseTaken\n%s", err, logs.String())
		}
		if !svc.Quiesced() || !logs.has(`"msg":"quiesced"`) {
			t.Fatal("stopped without quiescing")
		}
		row, _, err := servicetest.LeaseRow(ctx(t), kv)
		if err != nil || row.Holder != "intruder" || row.Incarnation != "0123456789abcdef" {
			t.Fatalf("lease row after the stop = %+v, %v; want the foreign row left in place", row, err)
		}
	})
	t.Run("ok/rejected-foreign-write-ignored", func(t *testing.T) {
		// A competing create is published to lease.0 and rejected by the stream; the watch sees
		// it, reads the key, finds its own row and keeps serving.
		e := plane3test.New(t)
		var logs logBuffer
		svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
		kv := servicetest.DeliveryKV(t, e)
		servicetest.WaitReady(t, kv, "deliveryd-a", 5*time.Second)
		other, _ := json.Marshal(lease.Row{Holder: "other", Incarnation: "fedcba9876543210", Since: time.Now().UTC()})
		if _, err := kv.Create(ctx(t), space.DeliveryLeaseKey, other); err == nil {
			t.Fatal("a competing create succeeded over a live lease")
		}
		eventually(t, 10*time.Second, func() error {
			if !logs.has("the row is still ours") {
				return errors.New("the watch has not checked the rejected write yet")
			}
			return nil
		})
		row, _, err := servicetest.LeaseRow(ctx(t), kv)
		if err != nil || row.Holder != "deliveryd-a" || !row.Ready || svc.Quiesced() {
			t.Fatalf("row %+v %v, quiesced %v", row, err, svc.Quiesced())
		}
		if logs.has(`"msg":"quiesced"`) {
			t.Fatalf("a rejected foreign write quiesced the service:\n%s", logs.String())
		}
	})
}
