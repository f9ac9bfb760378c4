package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lease"
)

// vanishing is the real bucket whose Create, when the key exists, purges it before returning
// ErrKeyExists: what a crashed holder's row expiring between a successor's create and its read
// looks like. With again set, each Create first puts a row back, so the key is there every time.
type vanishing struct {
	jetstream.KeyValue
	again   bool
	creates atomic.Int32
}

func (v *vanishing) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	v.creates.Add(1)
	if v.again {
		if _, err := v.KeyValue.Put(ctx, key, []byte(`{"holder":"gone","incarnation":"x","since":1,"ready":true}`)); err != nil {
			return 0, err
		}
	}
	rev, err := v.KeyValue.Create(ctx, key, value, opts...)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if perr := v.KeyValue.Purge(ctx, key); perr != nil {
			return 0, perr
		}
	}
	return rev, err
}

// TestCreateRace (issue 27's drill): a successor started while the killed holder's row expires
// finds the key on create and gone on read. It creates again (a bounded number of times) rather
// than fail its start.
func TestCreateRace(t *testing.T) {
	t.Run("ok/the-row-expires-between-create-and-read", func(t *testing.T) {
		e := setup(t, time.Minute)
		old := mustAcquire(t, e, "old")
		_ = old // killed: its row stays until it expires
		v := &vanishing{}
		defer lease.SetWrapKV(func(kv jetstream.KeyValue) jetstream.KeyValue { v.KeyValue = kv; return v })()
		l, err := e.acquire(t, "successor")
		if err != nil {
			t.Fatalf("Acquire while the row expired: %v", err)
		}
		if n := v.creates.Load(); n != 2 {
			t.Fatalf("%d creates, want 2 (the first found the row, the second made the claim)", n)
		}
		got, err := e.kv.Get(ctxT(t), "plane")
		if err != nil || !strings.Contains(string(got.Value()), `"successor"`) {
			t.Fatalf("row after the race = %v, %v; want the successor's", got, err)
		}
		_ = l
	})
	t.Run("fail/a-row-that-keeps-vanishing-is-reported-after-3-creates", func(t *testing.T) {
		e := setup(t, time.Minute)
		v := &vanishing{again: true}
		defer lease.SetWrapKV(func(kv jetstream.KeyValue) jetstream.KeyValue { v.KeyValue = kv; return v })()
		_, err := e.acquire(t, "successor")
		if err == nil || !strings.Contains(err.Error(), "exists but cannot be read") || !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("Acquire = %v, want the read's key-not-found after the last create", err)
		}
		if n := v.creates.Load(); n != 3 {
			t.Fatalf("%d creates, want 3", n)
		}
	})
}
