package fanout_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// startFloor runs BenchmarkDelivery's floor: the contract's JetStream work with none of the
// loops' own code. Two plain loops on the delivery connection take the loops' durables (fanout on
// CHAT, reader on INBOX, with their configurations), in passes of their batch sizes overlapped as the loops'
// are (plane3.Overlap): the first copies each chat message's bytes as they are to every member's
// inbox, the second each inbox entry's bytes to its lifecycle's DLV subject with the frame header
// and the entry's dedup id, each acking a message after all its pass's copies are stored. No
// decode, row read, gate or back-pressure: a fan-out writer and reader that keep the contract (a
// stored inbox entry per member, an explicit ack per message) cannot do less. stop ends both.
func startFloor(b *testing.B, e *plane3test.Env, dc *nats.Conn, lifecycles [][2]string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	js, err := jetstream.New(dc, jetstream.WithPublishAsyncMaxPending(3*4096))
	if err != nil {
		b.Fatal(err)
	}
	wc, err := js.CreateOrUpdateConsumer(ctx, e.N.ChatStream(), fanout.ConsumerConfig(e.N))
	if err != nil {
		b.Fatal(err)
	}
	rc, err := js.CreateOrUpdateConsumer(ctx, e.N.InboxStream(), reader.ConsumerConfig(e.N))
	if err != nil {
		b.Fatal(err)
	}
	var inboxes []string
	dlvOf := map[string]string{}
	for _, lc := range lifecycles {
		in, _ := e.N.Dinbox(plane3test.Owner, lc[0], lc[1])
		d, _ := e.N.Dlv(plane3test.Owner, lc[0], lc[1])
		inboxes = append(inboxes, in)
		dlvOf[in] = d
	}
	stall := jetstream.WithStallWait(time.Minute)
	loop := func(c jetstream.Consumer, batchSize int, copies func(m jetstream.Msg, out []*nats.Msg) []*nats.Msg) {
		o := plane3.Overlap{}
		defer o.Close(ctx)
		for ctx.Err() == nil {
			batch, err := o.Next(ctx, c, batchSize)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				b.Error(err)
				return
			}
			if len(batch) == 0 {
				continue
			}
			var futs []jetstream.PubAckFuture
			var outs []*nats.Msg
			for _, m := range batch {
				outs = copies(m, outs[:0])
				for _, out := range outs {
					f, err := js.PublishMsgAsync(out, stall)
					if err != nil {
						b.Error(err)
						return
					}
					futs = append(futs, f)
				}
			}
			_ = o.Trim(ctx)
			o.Hold(func(ctx context.Context) error {
				for _, f := range futs {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						return err
					case <-ctx.Done():
						return nil
					}
				}
				for _, m := range batch {
					if err := m.Ack(); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		loop(wc, fanout.DefaultBatch, func(m jetstream.Msg, out []*nats.Msg) []*nats.Msg {
			md, _ := m.Metadata()
			seq := strconv.FormatUint(md.Sequence.Stream, 10)
			for i, in := range inboxes {
				x := nats.NewMsg(in)
				x.Data = m.Data()
				x.Header.Set(jetstream.MsgIDHeader, seq+"."+strconv.Itoa(i))
				out = append(out, x)
			}
			return out
		})
	}()
	go func() {
		defer wg.Done()
		loop(rc, reader.DefaultBatch, func(m jetstream.Msg, out []*nats.Msg) []*nats.Msg {
			x := nats.NewMsg(dlvOf[m.Subject()])
			x.Data = m.Data()
			x.Header.Set(jetstream.MsgIDHeader, m.Headers().Get(jetstream.MsgIDHeader))
			x.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
			return append(out, x)
		})
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	b.Cleanup(stop)
	return stop
}
