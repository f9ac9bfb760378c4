package fanout_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/fanout"
	"github.com/cotalgo/cotal/deliveryd/internal/reader"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// BenchmarkDelivery measures, in one run on one broker per N, durable fan-out throughput (chat
// messages posted by one agent, counted as copies stored in DLV, to N members of a durable
// channel, through the fan-out writer and the trusted reader) next to raw JetStream publish
// throughput of the same number of copies straight into the same DLV stream with the delivery
// credential. b.N is the number of chat messages; both report copies/s. Run with a fixed count
// (INBOX and DLV keep 1000 messages per subject, as upstream):
//
//	go test -run '^$' -bench BenchmarkDelivery -benchtime 400x ./deliveryd/internal/fanout/
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
		// waitFor polls DLV's last sequence (copies stored, even past the per-subject cap).
		waitFor := func(target uint64) {
			deadline := time.Now().Add(5 * time.Minute)
			for lastSeq() < target {
				if time.Now().After(deadline) {
					b.Fatalf("DLV reached %d of %d copies", lastSeq(), target)
				}
				time.Sleep(2 * time.Millisecond) // a benchmark's poll, not a test's synchronisation
			}
		}
		run := 0

		b.Run(fmt.Sprintf("raw/N=%d", members), func(b *testing.B) {
			run++
			start := lastSeq()
			b.ResetTimer()
			for i := range b.N {
				for _, lc := range lifecycles {
					subj, _ := e.N.Dlv(plane3test.Owner, lc[0], lc[1])
					m := nats.NewMsg(subj)
					m.Data = []byte(`{"version":1,"channel":"general","msg":{"id":"x"}}`)
					m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("raw-%d-%d-%s", run, i, lc[0]))
					if _, err := djs.PublishMsgAsync(m); err != nil {
						b.Fatal(err)
					}
				}
			}
			select {
			case <-djs.PublishAsyncComplete():
			case <-time.After(5 * time.Minute):
				b.Fatal("raw publish did not complete")
			}
			waitFor(start + uint64(b.N*members))
			b.StopTimer()
			b.ReportMetric(float64(b.N*members)/b.Elapsed().Seconds(), "copies/s")
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
		subj, _ := e.N.Chat(plane3test.Owner, "a0", "general")
		b.Run(fmt.Sprintf("fanout/N=%d", members), func(b *testing.B) {
			run++
			start := lastSeq()
			b.ResetTimer()
			for i := range b.N {
				body, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("f-%d-%d", run, i), "from": map[string]string{"id": "local.a0"}, "text": "x"})
				if _, err := sender.PublishAsync(subj, body); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-sender.PublishAsyncComplete():
			case <-time.After(5 * time.Minute):
				b.Fatal("posting did not complete")
			}
			waitFor(start + uint64(b.N*members))
			b.StopTimer()
			b.ReportMetric(float64(b.N*members)/b.Elapsed().Seconds(), "copies/s")
		})
		cancel()
		wg.Wait()
	}
}
