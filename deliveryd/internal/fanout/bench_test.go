package fanout_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
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

// BenchmarkDelivery measures, in one run on one broker per N, durable fan-out throughput next to
// two raw JetStream publish baselines, all counted as copies stored in DLV for N members of a
// durable channel (b.N is the number of chat messages; every variant reports copies/s, and the
// CPU cores the whole process used meanwhile):
//
//   - raw: the b.N × N copies published straight into DLV with the delivery credential (one
//     stored write per copy);
//   - chain: the same stored writes a fanned-out copy costs, published raw with no daemon: each
//     chat message into CHAT as the agent, then per member its inbox entry into INBOX and its
//     frame into DLV with the delivery credential (1 + 2N writes per chat message);
//   - fanout: the chat messages posted by one agent, each copy going CHAT → fan-out writer →
//     INBOX → trusted reader (ACL and member rows re-read) → DLV.
//
// Every publish is asynchronous. Run with a fixed count (INBOX and DLV keep 1000 messages per
// subject, as upstream):
//
//	go test -run '^$' -bench BenchmarkDelivery -benchtime 900x -count 6 ./deliveryd/internal/fanout/
func BenchmarkDelivery(b *testing.B) {
	for _, members := range []int{1, 10, 100} {
		e := plane3test.New(b)
		dc := e.Delivery(b)
		djs := plane3test.JS(b, dc)
		pjs := e.Provisioner(b)
		var lifecycles [][2]string
		for i := range members {
			actor, uid := fmt.Sprintf("m%03d", i), fmt.Sprintf("uid%023d", i)
			e.SetACL(b, pjs, actor, uid, []string{"general"})
			e.Join(b, djs, "general", actor, uid, 0, 1)
			lifecycles = append(lifecycles, [2]string{actor, uid})
		}
		sender := plane3test.JS(b, e.Agent(b, "a0", uid0))
		chatSubj, _ := e.N.Chat(plane3test.Owner, "a0", "general")
		dlv, err := djs.Stream(plane3test.Ctx(b), e.N.DLVStream())
		if err != nil {
			b.Fatal(err)
		}
		lastSeq := func() uint64 {
			info, err := dlv.Info(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			return info.State.LastSeq
		}
		run := 0
		// measure times publish(i) for every chat message i, then waits until every publish is
		// acknowledged and DLV's last sequence (copies stored, even past the per-subject cap)
		// has grown by b.N × members.
		measure := func(b *testing.B, publish func(i int)) {
			run++
			start := lastSeq()
			var ru0, ru1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			b.ResetTimer()
			for i := range b.N {
				publish(i)
			}
			for _, js := range []jetstream.JetStream{sender, djs} {
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(5 * time.Minute):
					b.Fatal("publishing did not complete")
				}
			}
			target := start + uint64(b.N*members)
			deadline := time.Now().Add(5 * time.Minute)
			for lastSeq() < target {
				if time.Now().After(deadline) {
					b.Fatalf("DLV reached %d of %d copies", lastSeq(), target)
				}
				time.Sleep(2 * time.Millisecond) // a benchmark's poll, not a test's synchronisation
			}
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(b.N*members)/b.Elapsed().Seconds(), "copies/s")
			b.ReportMetric(cpu.Seconds()/b.Elapsed().Seconds(), "cores")
		}
		publish := func(js jetstream.JetStream, subj string, data []byte, id string, frame bool) {
			m := nats.NewMsg(subj)
			m.Data = data
			m.Header.Set(jetstream.MsgIDHeader, id)
			if frame {
				m.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
			}
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		chat := func(i int) []byte {
			body, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("f-%d-%d", run, i), "from": map[string]string{"id": "local.a0"}, "text": "x"})
			return body
		}
		b.Run(fmt.Sprintf("raw/N=%d", members), func(b *testing.B) {
			measure(b, func(i int) {
				for _, lc := range lifecycles {
					subj, _ := e.N.Dlv(plane3test.Owner, lc[0], lc[1])
					publish(djs, subj, []byte(`{"version":1,"channel":"general","msg":{"id":"x"}}`), fmt.Sprintf("raw-%d-%d-%s", run, i, lc[0]), true)
				}
			})
		})
		// chain runs before the loops: the reader's durable delivers all of INBOX, so it takes
		// chain's entries when it starts. Their copies carry the ids chain's frames did and
		// collapse on them; fanout's clock starts once the reader has settled them all.
		b.Run(fmt.Sprintf("chain/N=%d", members), func(b *testing.B) {
			measure(b, func(i int) {
				body := chat(i)
				if _, err := sender.PublishAsync(chatSubj, body); err != nil {
					b.Fatal(err)
				}
				entry, _ := json.Marshal(plane3.Entry{Msg: body, Channel: "general", Seq: uint64(i + 1), Reason: plane3.ReasonDurable, Generation: 1})
				frame, _ := dlvclient.EncodeFrame("general", body)
				for _, lc := range lifecycles {
					id := plane3.MsgID(fmt.Sprintf("f-%d-%d", run, i), plane3.Lifecycle{Owner: plane3test.Owner, Actor: lc[0], UID: lc[1]}, 1)
					inbox, _ := e.N.Dinbox(plane3test.Owner, lc[0], lc[1])
					publish(djs, inbox, entry, id, false)
					subj, _ := e.N.Dlv(plane3test.Owner, lc[0], lc[1])
					publish(djs, subj, frame, id, true)
				}
			})
		})

		w, err := fanout.New(plane3test.Ctx(b), dc, fanout.Config{Names: e.N})
		if err != nil {
			b.Fatal(err)
		}
		r, err := reader.New(plane3test.Ctx(b), dc, reader.Config{Names: e.N})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, loop := range []func(context.Context) error{w.Run, r.Run} {
			wg.Add(1)
			go func() { defer wg.Done(); _ = loop(ctx) }()
		}
		settled := func() bool {
			c, err := djs.Consumer(context.Background(), e.N.InboxStream(), e.N.ReaderConsumer())
			if err != nil {
				b.Fatal(err)
			}
			info, err := c.Info(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			return info.NumPending == 0 && info.NumAckPending == 0
		}
		for deadline := time.Now().Add(5 * time.Minute); !settled(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("the reader did not settle chain's entries")
			}
		}
		b.Run(fmt.Sprintf("fanout/N=%d", members), func(b *testing.B) {
			measure(b, func(i int) {
				if _, err := sender.PublishAsync(chatSubj, chat(i)); err != nil {
					b.Fatal(err)
				}
			})
		})
		cancel()
		wg.Wait()
	}
}
