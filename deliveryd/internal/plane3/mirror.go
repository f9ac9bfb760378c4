package plane3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// SyncWait bounds one Mirror.Sync: how long a pass waits for its bucket's watch to catch up
// before its rows count as unreadable (the pass's read failure: its entries are deferred).
const SyncWait = 5 * time.Second

// Mirror is a bucket's current rows kept in memory by one watch that lives as long as its loop
// (an ordered consumer on the bucket's stream, from the last value of each key), so a pass reads
// its rows without a request per row or a scan of the bucket per pass.
//
// A read is as fresh as a get made at the same point: Sync reads the sequence of the bucket's
// newest message from the store (last) and returns once the watch has applied it, the watch
// applying in stream order. So after Sync every write the broker answered before Sync's request
// is in the mirror, as a get after that point would see it, and a loop that calls Sync after its
// pass's messages were delivered sees every change committed before they reached it (the
// reader's ACL re-check at delivery time). A write stored after the request may or may not be
// seen; a get has the same race.
//
// The watch sees what a KV client writes: a put, and a delete or purge as its marker. A message
// removed without a marker (a stream purge or message delete through the raw JetStream API, which
// no Cotal profile grants; registry buckets have no max age) stays in the mirror until the watch
// is opened again.
type Mirror struct {
	bucket string
	prefix string // $KV.<bucket>.
	get    string // $JS.API.STREAM.MSG.GET.KV_<bucket> (last)
	nc     *nats.Conn
	sub    *nats.Subscription

	mu      sync.Mutex
	rows    map[string]Row
	applied uint64        // the stream sequence of the last message applied
	moved   chan struct{} // closed (and replaced) each time applied grows
}

// Row is one key's current value and its revision (the stream sequence that stored it).
type Row struct {
	Value    []byte
	Revision uint64
}

// OpenMirror starts kv's watch on js's connection: the push ordered consumer a KV watch runs
// (nats.go's WatchAll; the delivery profile's watch rows), from the last value of each key. An
// error if the broker does not create it. Close stops it.
func OpenMirror(js jetstream.JetStream, kv jetstream.KeyValue) (*Mirror, error) {
	m := &Mirror{nc: js.Conn(), bucket: kv.Bucket(), prefix: "$KV." + kv.Bucket() + ".", rows: map[string]Row{}, moved: make(chan struct{})}
	stream := "KV_" + m.bucket
	get, err := space.StreamMsgGet(stream)
	if err != nil {
		return nil, fmt.Errorf("mirror %s: %w", m.bucket, err)
	}
	m.get = get
	push, err := js.Conn().JetStream(nats.MaxWait(SyncWait))
	if err != nil {
		return nil, fmt.Errorf("mirror %s: %w", m.bucket, err)
	}
	m.sub, err = push.Subscribe(m.prefix+">", m.apply, nats.BindStream(stream), nats.OrderedConsumer(),
		nats.DeliverLastPerSubject())
	if err != nil {
		return nil, fmt.Errorf("mirror %s: %w", m.bucket, err)
	}
	return m, nil
}

// apply takes one message of the watch into the mirror: a put sets its key, a delete or purge
// marker removes it.
func (m *Mirror) apply(msg *nats.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		return // not a stream message: nothing the broker stored
	}
	key, ok := strings.CutPrefix(msg.Subject, m.prefix)
	m.mu.Lock()
	defer m.mu.Unlock()
	if ok {
		switch msg.Header.Get(kvOperation) {
		case "DEL", "PURGE":
			delete(m.rows, key)
		default:
			m.rows[key] = Row{Value: msg.Data, Revision: md.Sequence.Stream}
		}
	}
	if md.Sequence.Stream > m.applied {
		m.applied = md.Sequence.Stream
		close(m.moved)
		m.moved = make(chan struct{})
	}
}

// kvOperation is the header a KV delete or purge marker carries (nats.go's kvop).
const kvOperation = "KV-Operation"

// Sync returns once the mirror holds every change the broker stored in the bucket before Sync's
// request, or an error (the broker unreachable, the watch not caught up within SyncWait).
func (m *Mirror) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, SyncWait)
	defer cancel()
	target, err := m.last(ctx)
	if err != nil {
		return fmt.Errorf("mirror %s: %w", m.bucket, err)
	}
	for {
		m.mu.Lock()
		applied, moved := m.applied, m.moved
		m.mu.Unlock()
		if applied >= target {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("mirror %s: the watch is at %d of %d: %w", m.bucket, applied, target, ctx.Err())
		}
	}
}

// last is the stream sequence of the bucket's newest message (0: none), read from the store
// (STREAM.MSG.GET, last by the subject $KV.<bucket>.>), which is moved in the same step as each
// write's store, before its answer: so every write answered before the request is at or below it.
// The consumer's own info is not that: its delivered and pending counts trail the store (nats-server
// signals consumers on a goroutine of its own after the answer has gone out). The newest message
// that still exists, rather than the stream's last sequence, since only a message that exists
// reaches the watch.
func (m *Mirror) last(ctx context.Context) (uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": m.prefix + ">"})
	resp, err := m.nc.RequestWithContext(ctx, m.get, req)
	if err != nil {
		return 0, err
	}
	var got struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *struct {
			ErrCode     uint16 `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &got); err != nil {
		return 0, fmt.Errorf("the last message: %w", err)
	}
	switch {
	case got.Error != nil && got.Error.ErrCode == uint16(jetstream.JSErrCodeMessageNotFound):
		return 0, nil
	case got.Error != nil:
		return 0, fmt.Errorf("the last message: %s (%d)", got.Error.Description, got.Error.ErrCode)
	case got.Message == nil:
		return 0, errors.New("the last message: an answer with neither message nor error")
	}
	return got.Message.Seq, nil
}

// Get is key's row after the last Sync (ok false: no such key).
func (m *Mirror) Get(key string) (Row, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rows[key]
	return r, ok
}

// Each calls f for every row, under the mirror's lock (f must not call the mirror).
func (m *Mirror) Each(f func(key string, r Row)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.rows {
		f(k, r)
	}
}

// Close stops the watch (its consumer is deleted).
func (m *Mirror) Close() { _ = m.sub.Unsubscribe() }

// SyncMirror syncs *m, opening kv's watch on js first if *m is nil. On a failure *m is closed and
// left nil, so the next call opens the watch afresh: a loop's way to hold a mirror across passes.
func SyncMirror(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, m **Mirror) error {
	if *m == nil {
		opened, err := OpenMirror(js, kv)
		if err != nil {
			return err
		}
		*m = opened
	}
	if err := (*m).Sync(ctx); err != nil {
		(*m).Close()
		*m = nil
		return err
	}
	return nil
}

// CloseMirrors closes each open mirror of ms and leaves it nil: a loop's cleanup when it stops.
func CloseMirrors(ms ...**Mirror) {
	for _, m := range ms {
		if *m != nil {
			(*m).Close()
			*m = nil
		}
	}
}
