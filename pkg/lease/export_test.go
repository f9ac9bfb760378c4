package lease

import "github.com/nats-io/nats.go/jetstream"

// SetWrapKV makes every claim acquired until restore use f(kv) for its bucket.
func SetWrapKV(f func(jetstream.KeyValue) jetstream.KeyValue) (restore func()) {
	wrapKV = f
	return func() { wrapKV = nil }
}
