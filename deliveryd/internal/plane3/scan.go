package plane3

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Scan calls f for the current value of every key of kv (deletes and purges skipped): one watch
// of the bucket, its initial values only.
func Scan(ctx context.Context, kv jetstream.KeyValue, f func(jetstream.KeyValueEntry)) error {
	wt, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("scan %s: %w", kv.Bucket(), err)
	}
	defer func() { _ = wt.Stop() }()
	for {
		select {
		case e, ok := <-wt.Updates():
			if !ok {
				return fmt.Errorf("scan %s: watch closed", kv.Bucket())
			}
			if e == nil {
				return nil
			}
			f(e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
