package fanout_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// r3 runs BenchmarkDelivery on a 3-node cluster of nats-server processes (pkg/testkit/cluster)
// with the space at R3 instead of one embedded broker; its sub-benchmarks are named N=<n>,R3.
var r3 = flag.Bool("delivery.r3", false, "BenchmarkDelivery on a 3-node cluster, the space at R3")

// external runs BenchmarkDelivery on one nats-server process (a 1-node pkg/testkit/cluster) with
// the space at R1 instead of the embedded broker, so the broker can be given cores of its own: run
// the test binary under `taskset -c 1` with $COTAL_NATS_SERVER a wrapper that execs nats-server
// under `taskset -c 0`. Its sub-benchmarks are named N=<n>,ext.
var external = flag.Bool("delivery.external", false, "BenchmarkDelivery on one nats-server process, the space at R1")

func TestMain(m *testing.M) { cluster.Main(m) }

// env is the benchmark's environment for one N: one embedded broker, or with -delivery.r3 a
// 3-node cluster with the space at R3.
func env(b *testing.B) *plane3test.Env {
	if *r3 && *external {
		b.Fatal("-delivery.r3 and -delivery.external exclude each other")
	}
	if !*r3 && !*external {
		return plane3test.New(b)
	}
	nodes, replicas := 3, 3
	if *external {
		nodes, replicas = 1, 1
	}
	s := signerdtest.Start(b, signerdtest.Options{Spaces: []string{plane3test.Space}})
	c := cluster.Start(b, s, nodes)
	return plane3test.OnWith(b, s, c.URLList(), provision.Options{Replicas: replicas})
}

// BenchmarkDelivery measures, in one run on one broker per N, durable fan-out throughput next to
// two raw JetStream publish baselines and the contract's floor, all counted as copies stored in
// DLV for N members of a durable channel. b.N is the number of chat messages; each iteration of
// the benchmark (each -count, a round) measures the four variants one after the other, each round
// in the next of four orders (a Williams square: over four rounds each variant runs once in each
// place and once right after each other variant), so that the drift of a shared machine and the
// wake of the variant before fall on all four alike (run a multiple of four counts), and reports:
//
//   - raw-copies/s: the b.N × N copies published straight into DLV with the delivery credential
//     (one stored write per copy);
//   - chain-copies/s: the same stored writes a fanned-out copy costs, published raw with no
//     daemon: each chat message into CHAT as the agent, then per member its inbox entry into
//     INBOX and its frame into DLV with the delivery credential (1 + 2N writes per message);
//   - fanout-copies/s: the chat messages posted by one agent, each copy going CHAT → fan-out
//     writer → INBOX → trusted reader (ACL and member rows re-read) → DLV;
//   - floor-copies/s: the same posts through the contract's JetStream work alone, with none of
//     the loops' own code (startFloor): what any fan-out writer and reader can reach on this
//     machine while the contract is a stored inbox entry and an ack per copy;
//   - fanout/raw, fanout/chain, chain/raw and floor/chain, the ratios of that round; ns/op is
//     fan-out's time per chat message; *-cores, the CPU cores the whole process used during each
//     variant.
//
// Every publish is asynchronous. The loops run only for fanout, the floor's only for floor; before
// its clock starts each settles what the variants before it left in CHAT and INBOX (the loops'
// copies carry the ids chain's did and collapse on them; the floor's carry ids of their own). Run with a fixed count of messages (INBOX and DLV keep 1000 per subject, as
// upstream) and a timeout past go test's ten minutes (twelve rounds take about a quarter hour):
//
//	go test -run '^$' -bench BenchmarkDelivery -benchtime 900x -count 12 -timeout 90m ./deliveryd/internal/fanout/
//
// At R3 on a 3-node cluster (slower: each stored write is a replication round trip):
//
//	go test -run '^$' -bench BenchmarkDelivery -benchtime 900x -count 8 -timeout 90m ./deliveryd/internal/fanout/ -args -delivery.r3
//
// On one nats-server process pinned to a core of its own, the benchmark on the other (the split of
// a deployment whose broker does not share cores with deliveryd and the publishers; pin-nats is a
// script of one line, `exec taskset -c 0 /path/to/nats-server "$@"`):
//
//	COTAL_NATS_SERVER=$PWD/pin-nats taskset -c 1 go test -run '^$' -bench BenchmarkDelivery -benchtime 900x -count 8 ./deliveryd/internal/fanout/ -args -delivery.external
func BenchmarkDelivery(b *testing.B) {
	const rawV, chainV, fanV, floorV = 0, 1, 2, 3 // the variants, in the order of their arrays below
	orders := [][4]int{{rawV, chainV, floorV, fanV}, {chainV, fanV, rawV, floorV}, {fanV, floorV, chainV, rawV}, {floorV, rawV, fanV, chainV}}
	for _, members := range []int{1, 10, 100} {
		e := env(b)
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
		// measure calls publish(i) for every chat message i, waits until every publish is
		// acknowledged and DLV's last sequence (copies stored, even past the per-subject cap)
		// has grown by n × members, and returns how long that took and the CPU cores the
		// process used meanwhile.
		measure := func(b *testing.B, n int, publish func(i int)) (time.Duration, float64) {
			run++
			start := lastSeq()
			var ru0, ru1 syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			began := time.Now()
			for i := range n {
				publish(i)
			}
			for _, js := range []jetstream.JetStream{sender, djs} {
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(5 * time.Minute):
					b.Fatal("publishing did not complete")
				}
			}
			target := start + uint64(n*members)
			deadline := time.Now().Add(5 * time.Minute)
			for lastSeq() < target {
				if time.Now().After(deadline) {
					b.Fatalf("DLV reached %d of %d copies", lastSeq(), target)
				}
				time.Sleep(2 * time.Millisecond) // a benchmark's poll, not a test's synchronisation
			}
			took := time.Since(began)
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			return took, cpu.Seconds() / took.Seconds()
		}
		// stall lets the benchmark's publishers wait while the broker catches up, rather than
		// fail after nats.go's 200 ms once 4000 publishes are unacknowledged (chain at N = 100
		// publishes 200 per chat message).
		stall := jetstream.WithStallWait(time.Minute)
		publish := func(js jetstream.JetStream, subj string, data []byte, id string, frame bool) {
			m := nats.NewMsg(subj)
			m.Data = data
			m.Header.Set(jetstream.MsgIDHeader, id)
			if frame {
				m.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
			}
			if _, err := js.PublishMsgAsync(m, stall); err != nil {
				b.Fatal(err)
			}
		}
		chat := func(i int) []byte {
			body, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("f-%d-%d", run, i), "from": map[string]string{"id": "local.a0"}, "text": "x"})
			return body
		}
		raw := func(i int) {
			for _, lc := range lifecycles {
				subj, _ := e.N.Dlv(plane3test.Owner, lc[0], lc[1])
				publish(djs, subj, []byte(`{"version":1,"channel":"general","msg":{"id":"x"}}`), fmt.Sprintf("raw-%d-%d-%s", run, i, lc[0]), true)
			}
		}
		chain := func(i int) {
			body := chat(i)
			if _, err := sender.PublishAsync(chatSubj, body, stall); err != nil {
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
		}
		fan := func(i int) {
			if _, err := sender.PublishAsync(chatSubj, chat(i), stall); err != nil {
				b.Fatal(err)
			}
		}
		round := 0
		name := fmt.Sprintf("N=%d", members)
		switch {
		case *r3:
			name += ",R3"
		case *external:
			name += ",ext"
		}
		b.Run(name, func(b *testing.B) {
			b.StopTimer() // the variants are timed one by one below
			var took [4]time.Duration
			var cores [4]float64
			// Each round runs the variants in the next of their four orders.
			for _, v := range orders[round%len(orders)] {
				switch v {
				case rawV:
					took[v], cores[v] = measure(b, b.N, raw)
				case chainV:
					took[v], cores[v] = measure(b, b.N, chain)
				case fanV, floorV:
					var stop func()
					if v == fanV {
						stop = startLoops(b, e, dc)
					} else {
						stop = startFloor(b, e, dc, lifecycles)
					}
					settled(b, e, djs)
					took[v], cores[v] = measure(b, b.N, fan)
					stop()
				}
			}
			round++
			var rate [4]float64
			for v := range took {
				rate[v] = float64(b.N*members) / took[v].Seconds()
			}
			b.ReportMetric(float64(took[fanV].Nanoseconds())/float64(b.N), "ns/op")
			for v, name := range []string{"raw", "chain", "fanout", "floor"} {
				b.ReportMetric(rate[v], name+"-copies/s")
				b.ReportMetric(cores[v], name+"-cores")
			}
			b.ReportMetric(rate[fanV]/rate[rawV], "fanout/raw")
			b.ReportMetric(rate[fanV]/rate[chainV], "fanout/chain")
			b.ReportMetric(rate[chainV]/rate[rawV], "chain/raw")
			b.ReportMetric(rate[floorV]/rate[chainV], "floor/chain")
		})
	}
}

// settled waits until the fanout and reader durables have nothing pending or unacked.
func settled(b *testing.B, e *plane3test.Env, djs jetstream.JetStream) {
	b.Helper()
	idle := func() bool {
		for _, c := range [][2]string{{e.N.ChatStream(), e.N.FanoutConsumer()}, {e.N.InboxStream(), e.N.ReaderConsumer()}} {
			cons, err := djs.Consumer(context.Background(), c[0], c[1])
			if err != nil {
				b.Fatal(err)
			}
			info, err := cons.Info(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if info.NumPending != 0 || info.NumAckPending != 0 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Minute); !idle(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the loops did not settle what raw and chain left")
		}
	}
}
