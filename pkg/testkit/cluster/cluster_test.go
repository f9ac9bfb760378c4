package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// r3Space starts signerd, a 3-node cluster trusting it, and provisions the space with three
// replicas through a signerd-minted provisioner connected with the whole URL list.
func r3Space(t *testing.T) (*cluster.Cluster, *plane3test.Env, string) {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	c := cluster.Start(t, s, 3)
	e := plane3test.OnWith(t, s, c.URLList(), provision.Options{Replicas: 3})
	_, spaces := s.Trust(t)
	return c, e, spaces[0].DataAccountPublicKey()
}

// TestClusterFormsAndReelects: three real nats-server processes from rendered configs form a
// cluster with a meta leader; the leader killed with SIGKILL is replaced by another node, and the
// restarted node (same store) rejoins under the same leader count.
func TestClusterFormsAndReelects(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	c := cluster.Start(t, s, 3)
	if c.N() != 3 || len(c.URLs()) != 3 {
		t.Fatalf("N %d URLs %v", c.N(), c.URLs())
	}
	leader, err := c.MetaLeader()
	if err != nil {
		t.Fatal(err)
	}
	js, err := c.Jsz(leader, "")
	if err != nil || js.Meta.Size != 3 {
		t.Fatalf("meta cluster size %v (%v), want 3", js.Meta, err)
	}
	// A credential minted by signerd is proven on, and connects to, each node alone.
	n, err := space.NewNames(plane3test.Space)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.N() {
		e := &plane3test.Env{S: s, URL: c.URL(i), N: n}
		nc := e.Agent(t, "a"+strconv.Itoa(i), "uidnodeaaaaaaaaaaaaaaaaaa"+strconv.Itoa(i))
		if got := nc.ConnectedUrl(); got != c.URL(i) {
			t.Fatalf("node %d: connected to %s, want %s", i, got, c.URL(i))
		}
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if c.Running(leader) {
		t.Fatal("killed node still running")
	}
	var next int
	if err := pollErr(15*time.Second, func() error {
		var err error
		next, err = c.MetaLeader()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("meta leader is still the killed node %d", leader)
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
		t.Fatal(err)
	}
	// A clean stop (SIGTERM) of the current leader hands leadership over; the node restarts.
	if err := c.Stop(next); err != nil {
		t.Fatal(err)
	}
	if c.Running(next) {
		t.Fatal("stopped node still running")
	}
	if err := c.Restart(next); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(next); err == nil {
		t.Fatal("Restart of a running node accepted")
	}
	if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
		t.Fatal(err)
	}
}

// TestSpaceR3: every stream and bucket of a space provisioned with replicas 3 has three
// replicas, one leader and two current followers, as the JetStream API reports it; the monitoring
// view agrees on CHAT's leader.
func TestSpaceR3(t *testing.T) {
	c, e, acc := r3Space(t)
	pjs := e.Provisioner(t)
	items, err := provision.Plan(e.N)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		st, err := pjs.Stream(plane3test.Ctx(t), it.Config.Name)
		if err != nil {
			t.Fatalf("%s: %v", it.Config.Name, err)
		}
		ci := st.CachedInfo()
		if ci.Config.Replicas != 3 || ci.Cluster == nil || ci.Cluster.Leader == "" || len(ci.Cluster.Replicas) != 2 {
			t.Fatalf("%s: replicas %d cluster %+v, want R3 with a leader and 2 peers", it.Config.Name, ci.Config.Replicas, ci.Cluster)
		}
	}
	// A lifecycle's dlv_ durable sets no replica count: it inherits DLV's three.
	const uid = "uidconsumeraaaaaaaaaaaaaaa"
	e.AddLifecycle(t, pjs, "a1", uid, []string{"general"})
	name, err := e.N.DlvConsumer(plane3test.Owner, "a1", uid)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := pjs.Consumer(plane3test.Ctx(t), e.N.DLVStream(), name)
	if err != nil {
		t.Fatal(err)
	}
	if ci := cons.CachedInfo(); ci.Cluster == nil || ci.Cluster.Leader == "" || len(ci.Cluster.Replicas) != 2 {
		t.Fatalf("%s: cluster %+v, want a leader and 2 peers", name, ci.Cluster)
	}
	chat := e.N.ChatStream()
	si, err := c.Stream(acc, chat)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := pjs.Stream(plane3test.Ctx(t), chat)
	if c.Node(si.Leader).Name != st.CachedInfo().Cluster.Leader || len(si.Replicas) != 3 {
		t.Fatalf("monitoring says leader %s replicas %v, API says %s", c.Node(si.Leader).Name, si.Replicas, st.CachedInfo().Cluster.Leader)
	}
}

// TestChatSurvivesLeaderKill: a publisher keeps posting numbered messages to CHAT (each with a
// Nats-Msg-Id, retried until acked) while CHAT's stream leader is killed with SIGKILL; another
// node takes over, the killed node restarts on its store and catches up, and the stream holds
// exactly the acked messages: one per number, at the sequence its ack gave, nothing lost or
// doubled.
func TestChatSurvivesLeaderKill(t *testing.T) {
	c, e, acc := r3Space(t)
	chat := e.N.ChatStream()
	leader, err := c.StreamLeader(acc, chat)
	if err != nil {
		t.Fatal(err)
	}
	ajs := plane3test.JS(t, e.Agent(t, "pub", "uidpubaaaaaaaaaaaaaaaaaaaa"))
	subj, err := e.N.Chat(plane3test.Owner, "pub", "general")
	if err != nil {
		t.Fatal(err)
	}

	const before, total = 40, 120
	var mu sync.Mutex
	acked := map[int]uint64{} // number -> CHAT sequence; guarded by mu
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pubErr := make(chan error, 1)
	killAt := make(chan struct{})
	go func() {
		for i := 1; i <= total; i++ {
			if i == before+1 {
				close(killAt)
			}
			body, _ := json.Marshal(map[string]any{"id": "m" + strconv.Itoa(i), "from": map[string]string{"id": plane3test.Owner + ".pub"}, "text": strconv.Itoa(i), "to": "all"})
			for {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				ack, err := ajs.Publish(pctx, subj, body, jetstream.WithMsgID("m"+strconv.Itoa(i)))
				pcancel()
				if err == nil {
					mu.Lock()
					acked[i] = ack.Sequence
					mu.Unlock()
					break
				}
				if ctx.Err() != nil {
					pubErr <- fmt.Errorf("message %d never acked: %w", i, err)
					return
				}
			}
		}
		pubErr <- nil
	}()
	<-killAt
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	next, err := c.WaitStreamLeader(acc, chat, 20*time.Second, func(l int) bool { return l != leader })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("CHAT leader %s killed after %d acks; %s took over", c.Node(leader).Name, before, c.Node(next).Name)

	// Every acked number at its own sequence, sequences 1..total with no gap or double.
	seqs := map[uint64]int{}
	for i := 1; i <= total; i++ {
		seq, ok := acked[i]
		if !ok {
			t.Fatalf("message %d not acked", i)
		}
		if j, dup := seqs[seq]; dup {
			t.Fatalf("messages %d and %d both acked at sequence %d", j, i, seq)
		}
		seqs[seq] = i
	}
	// The restarted node must hold the same state: poll its own /jsz until it has caught up.
	if err := pollErr(20*time.Second, func() error {
		js, err := c.Jsz(leader, "accounts=true&streams=true&acc="+acc)
		if err != nil {
			return err
		}
		for _, ad := range js.AccountDetails {
			for _, sd := range ad.Streams {
				if sd.Name == chat && sd.State.Msgs == total && sd.State.LastSeq == total {
					return nil
				}
				if sd.Name == chat {
					return fmt.Errorf("restarted node holds %d msgs, last seq %d", sd.State.Msgs, sd.State.LastSeq)
				}
			}
		}
		return errors.New("restarted node does not report CHAT")
	}); err != nil {
		t.Fatal(err)
	}
	st, err := e.Provisioner(t).Stream(plane3test.Ctx(t), chat)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.CachedInfo().State; s.Msgs != total || s.FirstSeq != 1 || s.LastSeq != total {
		t.Fatalf("CHAT holds %d msgs, seq %d..%d; want %d, 1..%d", s.Msgs, s.FirstSeq, s.LastSeq, total, total)
	}
	// Each stored message is the one its ack named.
	rjs := plane3test.JS(t, e.Conn(t, mtls.KindAuthd, signerv1.Profile_PROFILE_OBSERVER, &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "viewer"}))
	rs, err := rjs.Stream(plane3test.Ctx(t), chat)
	if err != nil {
		t.Fatal(err)
	}
	for seq, i := range seqs {
		m, err := rs.GetMsg(plane3test.Ctx(t), seq, jetstream.WithGetMsgSubject(subj))
		if err != nil {
			t.Fatalf("sequence %d: %v", seq, err)
		}
		if got := m.Header.Get(nats.MsgIdHdr); got != "m"+strconv.Itoa(i) {
			t.Fatalf("sequence %d holds %q, want m%d", seq, got, i)
		}
	}
}

func pollErr(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(25 * time.Millisecond) // poll interval
	}
}

// TestOneNode: a cluster of one is a standalone JetStream server (no cluster block), healthy, its
// own meta leader, and holds a space provisioned at R1.
func TestOneNode(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	c := cluster.Start(t, s, 1)
	if leader, err := c.MetaLeader(); err != nil || leader != 0 {
		t.Fatalf("MetaLeader = %d, %v; want node 0", leader, err)
	}
	js, err := c.Jsz(0, "")
	if err != nil || js.Meta != nil {
		t.Fatalf("jsz meta %+v (%v); want a standalone server", js.Meta, err)
	}
	e := plane3test.OnWith(t, s, c.URLList(), provision.Options{Replicas: 1})
	st, err := e.Provisioner(t).Stream(plane3test.Ctx(t), e.N.ChatStream())
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 1 {
		t.Fatalf("CHAT replicas %d; want 1", r)
	}
}
