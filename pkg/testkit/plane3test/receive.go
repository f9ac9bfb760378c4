package plane3test

import (
	"context"
	"sync"
	"testing"

	"github.com/cotalgo/cotal/pkg/dlvclient"
)

// Inbox is one member's dlvclient, recording every id it was handed.
type Inbox struct {
	mu  sync.Mutex
	ids []string
}

// IDs is what the member was handed, in order.
func (b *Inbox) IDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.ids...)
}

// Receive runs local.<actor>'s dlvclient for lifecycle uid until the test ends.
func Receive(t testing.TB, e *Env, actor, uid string) *Inbox {
	t.Helper()
	c, err := dlvclient.New(Ctx(t), JS(t, e.Agent(t, actor, uid)),
		dlvclient.Config{Space: Space, Owner: Owner, Actor: actor, LifecycleUID: uid})
	if err != nil {
		t.Fatal(err)
	}
	b := &Inbox{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(_ context.Context, d dlvclient.Delivery) error {
			b.mu.Lock()
			b.ids = append(b.ids, d.ID)
			b.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dlvclient %s: %v", actor, err)
		}
	})
	return b
}
