package drill_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

var full = flag.Bool("drill.full", false, "run the full failure drill (make drill): 200 agents, 1000 messages")

func TestMain(m *testing.M) {
	code := m.Run()
	daemons.Remove()
	cluster.Cleanup()
	os.Exit(code)
}

// daemons are deliveryd and authd, built once per test binary run.
var daemons = testkit.Binaries{Prefix: "cotal-drill-bin-", Pkgs: []string{"github.com/cotalgo/cotal/deliveryd", "github.com/cotalgo/cotal/authd"}}

// size is one form of the drill. perSec paces the publisher so the failures land while it posts.
type size struct {
	name          string
	agents, msgs  int
	perSec        int
	deliverWithin time.Duration
}

var (
	small = size{name: "small", agents: 12, msgs: 200, perSec: 50, deliverWithin: 60 * time.Second}
	// The full form is issue 27's: 200 000 copies at R3. Its publisher posts 10 a second (2000
	// copies a second, past what delivery keeps up with on a 2-core machine), so the kills land
	// while it posts and the backlog drains after; deliverWithin bounds that tail.
	large = size{name: "full", agents: 200, msgs: 1000, perSec: 10, deliverWithin: 20 * time.Minute}
)

// leaseTTL is the delivery bucket's TTL in the drill (provision makes it 30 s): the successor
// deliveryd waits one TTL after the kill -9.
const leaseTTL = 3 * time.Second

// TestDrill is issue 13's failure drill. Its small form runs in `make test`; `make drill` runs
// the full form. Agents hold signerd-minted agent credentials (managerd's mint, as launched
// agents do), not bearers through authd's callout: see the report's note.
func TestDrill(t *testing.T) {
	sz := small
	if *full {
		sz = large
	}
	t0 := time.Now()
	phase := func(what string) { t.Logf("%7.1fs %s", time.Since(t0).Seconds(), what) }
	// The three builds run at once: nats-server (the cluster's), signerd, deliveryd and authd.
	natsErr, daemonsErr := make(chan error, 1), make(chan error, 1)
	go func() { _, err := cluster.BuildBinary(); natsErr <- err }()
	go func() { _, err := daemons.Build(); daemonsErr <- err }()
	sbin := signerdtest.Build(t)
	if err := <-natsErr; err != nil {
		t.Skipf("drill skipped: the nats-server binary cannot be built: %v", err)
	}
	if err := <-daemonsErr; err != nil {
		t.Fatal(err)
	}
	binDir := daemons.Dir(t)
	dbin := filepath.Join(binDir, "deliveryd")

	phase("built nats-server, signerd and deliveryd")
	// Two signerd replicas on one init: replica 1 in process, replica 2 a killable child.
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	proc := s.StartProcess(t, sbin, "drill-2")
	addrs := []string{s.Addr, proc.Addr}

	c := cluster.Start(t, s, 3)
	// managerd's signer client, on both replicas: the provisioner's, the publisher's and the load
	// credentials.
	mgr, err := signerclient.Dial(signerclient.Config{Addrs: addrs, TLS: s.ClientFor(t, mtls.KindManagerd, plane3test.Space)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close() })
	names, err := space.NewNames(plane3test.Space)
	if err != nil {
		t.Fatal(err)
	}
	e := &plane3test.Env{S: s, URL: c.URLList(), N: names}
	e.Provision(t, mgr, provision.Options{Replicas: 3}, func() error { return c.WaitHealthy(cluster.StartTimeout) })
	_, spaces := s.Trust(t)
	acc := spaces[0].DataAccountPublicKey()
	phase("cluster up, space provisioned at R3")
	pjs := e.Provisioner(t)
	shortenLease(t, e, pjs, leaseTTL)
	djs := plane3test.JS(t, e.Delivery(t))
	bucket, _ := e.N.Bucket(space.Delivery)
	leaseKV, err := djs.KeyValue(plane3test.Ctx(t), bucket)
	if err != nil {
		t.Fatal(err)
	}

	// authd (a child process with both signer addresses and every broker URL) and a ledger row
	// per agent, granted with `authd actor grant` to one IdP subject: authd picks each lifecycle
	// uid; managerd's part (the dlv_ durable, the ACL row) and a durable membership of general
	// are written for that owner, actor and uid.
	ad := startAuthd(t, filepath.Join(binDir, "authd"), s, addrs, c.URLs())
	phase("authd ready")
	agents := make([]*agent, sz.agents)
	owner := ""
	for i := range agents {
		agents[i] = &agent{actor: fmt.Sprintf("a%03d", i), got: map[string]int{}}
		ad.grant(t, agents[i].actor, owner)
		if owner == "" {
			owner = ad.rows(t)[agents[i].actor][0]
		}
	}
	rows := ad.rows(t)
	for _, a := range agents {
		a.owner, a.uid = rows[a.actor][0], rows[a.actor][1]
		if a.owner != owner || a.uid == "" {
			t.Fatalf("ledger row of %s: owner %q uid %q", a.actor, a.owner, a.uid)
		}
		e.AddLifecycleOf(t, pjs, a.owner, a.actor, a.uid, []string{"general"})
		e.JoinOf(t, djs, "general", a.owner, a.actor, a.uid, 0, 1)
	}
	phase(fmt.Sprintf("%d ledger rows granted (owner %s); lifecycles and memberships written", len(agents), owner))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	sv := &supervisor{bin: dbin, base: t.TempDir(), cf: s.ClientFor(t, mtls.KindDeliveryd, plane3test.Space), addrs: addrs, brokers: c.URLs(), kv: leaseKV}
	if err := sv.start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			sv.mu.Lock()
			for _, ch := range sv.all {
				t.Logf("%s stderr:\n%s", ch.holder, ch.stderr)
			}
			sv.mu.Unlock()
		}
	})
	t.Cleanup(sv.close)
	waitLease(t, leaseKV, "deliveryd-1", 30*time.Second)
	phase("lifecycles and memberships written; deliveryd-1 ready")
	sentinel, err := authclient.Sentinel(plane3test.Ctx(t), mgr.API(), plane3test.Space)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		a.connect(t, ad, sentinel, c.URLList())
		wg.Add(1)
		go func() { defer wg.Done(); a.consume(ctx) }()
	}
	// Renewal load: a few managerd-minted agent credentials on rails, renewed across the replica kill.
	loadRails := make([]*signerclient.Rail, 4)
	for i := range loadRails {
		loadRails[i] = newRail(t, mgr, c.URLList(), fmt.Sprintf("load%d", i), fmt.Sprintf("uiddrillload%014d", i))
	}
	phase("agents connected")
	// The publisher: numbered messages, each with a Nats-Msg-Id, retried until acked.
	pub := newRail(t, mgr, c.URLList(), "pub", "uiddrillpublisher000000000")
	pnc, err := nats.Connect(c.URLList(), append(pub.NatsOptions(), nats.Name("drill-pub"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pnc.Close)
	pjsPub := plane3test.JS(t, pnc)
	subj, err := e.N.Chat(plane3test.Owner, "pub", "general")
	if err != nil {
		t.Fatal(err)
	}
	var published, pubRetries atomic.Int64
	pubDone := make(chan error, 1)
	start := time.Now()
	go func() {
		tick := time.NewTicker(time.Second / time.Duration(sz.perSec)) // pacing, not synchronisation
		defer tick.Stop()
		deadline := time.Now().Add(sz.deliverWithin + 60*time.Second)
		for i := 1; i <= sz.msgs; i++ {
			<-tick.C
			id := msgID(i)
			body, _ := json.Marshal(map[string]any{"id": id, "from": map[string]string{"id": plane3test.Owner + ".pub"}, "text": strconv.Itoa(i), "to": "all"})
			for {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := pjsPub.Publish(pctx, subj, body, jetstream.WithMsgID(id))
				pcancel()
				if err == nil {
					published.Add(1)
					break
				}
				pubRetries.Add(1)
				if ctx.Err() != nil || time.Now().After(deadline) {
					pubErr := fmt.Errorf("message %d never acked: %w", i, err)
					pubDone <- pubErr
					return
				}
			}
		}
		pubDone <- nil
	}()
	at := func(frac float64) {
		t.Helper()
		want := int64(frac * float64(sz.msgs))
		eventually(t, sz.deliverWithin, func() error {
			if n := published.Load(); n < want {
				return fmt.Errorf("%d of %d published", n, want)
			}
			return nil
		})
	}
	rep := report{size: sz}
	event := func(msg string) { rep.kills = append(rep.kills, msg); phase(msg) }

	// 1. kill -9 the node leading CHAT (and DLV, when it leads both).
	at(0.15)
	chat, dlv := e.N.ChatStream(), e.N.DLVStream()
	chatLeader, err := c.StreamLeader(acc, chat)
	if err != nil {
		t.Fatal(err)
	}
	dlvLeader, err := c.StreamLeader(acc, dlv)
	if err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	if err := c.Kill(chatLeader); err != nil {
		t.Fatal(err)
	}
	event(fmt.Sprintf("kill -9 %s (leader of %s%s)", c.Node(chatLeader).Name, chat, map[bool]string{true: " and " + dlv, false: ""}[dlvLeader == chatLeader]))
	next, err := c.WaitStreamLeader(acc, chat, 20*time.Second, func(l int) bool { return l != chatLeader })
	if err != nil {
		t.Fatal(err)
	}
	event(fmt.Sprintf("%s took over %s after %v", c.Node(next).Name, chat, time.Since(killAt).Round(time.Millisecond)))

	// 2. kill -9 signerd replica drill-2 under load; prove the survivors' renewals.
	at(0.30)
	// Renewal load on both replicas while drill-2 dies: two workers renew agents' credentials
	// back to back (each a Remint and a proving connect) until 20 renewals after the kill.
	var loadCalls, loadFailed, afterKill atomic.Int64
	var loadErr atomic.Value
	var procDead atomic.Bool
	loadCtx, stopLoad := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	for w := range 2 {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for i := w; loadCtx.Err() == nil; i += 2 {
				rctx, rcancel := context.WithTimeout(loadCtx, 10*time.Second)
				_, err := loadRails[i%len(loadRails)].RenewNow(rctx)
				rcancel()
				if loadCtx.Err() != nil {
					return
				}
				loadCalls.Add(1)
				if err != nil {
					loadFailed.Add(1)
					loadErr.Store(err.Error())
				} else if procDead.Load() {
					afterKill.Add(1)
				}
			}
		}()
	}
	eventually(t, 20*time.Second, func() error {
		if n := loadCalls.Load(); n < 10 {
			return fmt.Errorf("%d renewals under load before the kill", n)
		}
		return nil
	})
	procLines := proc.Audit(t).Lines
	proc.Kill(t)
	procDead.Store(true)
	eventually(t, 30*time.Second, func() error {
		if n := afterKill.Load(); n < 20 {
			return fmt.Errorf("%d renewals after the kill", n)
		}
		return nil
	})
	stopLoad()
	lwg.Wait()
	if n := loadFailed.Load(); n != 0 {
		t.Fatalf("%d of %d renewals under load failed across the replica kill: %v", n, loadCalls.Load(), loadErr.Load())
	}
	rep.loadRenewals = int(loadCalls.Load())
	r1Before := s.Replicas[0].Audit(t).Lines
	event(fmt.Sprintf("kill -9 signerd replica %s (it had audited %d calls)", proc.ID, procLines))
	if procLines == 0 {
		t.Fatalf("signerd replica %s audited nothing before its kill: the load was not spread", proc.ID)
	}
	renewed := 0
	for _, r := range append([]*signerclient.Rail{pub}, loadRails...) {
		if _, err := r.RenewNow(plane3test.Ctx(t)); err != nil {
			t.Fatalf("renewal after the kill of %s: %v", proc.ID, err)
		}
		renewed++
	}
	if n := s.Replicas[0].Audit(t).Lines - r1Before; n < renewed {
		t.Fatalf("replica %s audited %d lines for %d renewals", s.Replicas[0].ID, n, renewed)
	}
	rep.renewed = renewed
	// No daemon lost its credential: deliveryd and authd still run (and deliver, and admit the
	// reconnects through the callout, below).
	for _, d := range []*child{sv.current(), ad.proc} {
		select {
		case <-d.exited:
			t.Fatalf("%s exited after the signerd replica's kill:\n%s", d.holder, d.stderr)
		default:
		}
	}

	// 3. restart the killed node; then, if another node leads DLV, kill -9 it and restart it.
	at(0.45)
	if err := c.Restart(chatLeader); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
		t.Fatal(err)
	}
	event(fmt.Sprintf("restart %s on its store; cluster healthy", c.Node(chatLeader).Name))
	if dlvLeader != chatLeader {
		now, err := c.StreamLeader(acc, dlv)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Kill(now); err != nil {
			t.Fatal(err)
		}
		nextDLV, err := c.WaitStreamLeader(acc, dlv, 20*time.Second, func(l int) bool { return l != now })
		if err != nil {
			t.Fatal(err)
		}
		event(fmt.Sprintf("kill -9 %s (leader of %s); %s took over", c.Node(now).Name, dlv, c.Node(nextDLV).Name))
		if err := c.Restart(now); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
			t.Fatal(err)
		}
		event(fmt.Sprintf("restart %s; cluster healthy", c.Node(now).Name))
	}

	// 4. kill -9 deliveryd; its successor takes the lease once the TTL has passed.
	at(0.65)
	dkill := time.Now()
	victim, err := sv.kill9()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 4*leaseTTL+20*time.Second, func() error {
		r, err := leaseRow(leaseKV)
		if err != nil {
			return err
		}
		if r.Holder == victim.holder || !r.Ready {
			return fmt.Errorf("lease row %+v", r)
		}
		return nil
	})
	succ := sv.current()
	event(fmt.Sprintf("kill -9 %s; %s (its credential minted with %s dead) holds the lease after %v", victim.holder, succ.holder, proc.ID, time.Since(dkill).Round(time.Millisecond)))

	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	rep.publishTook = time.Since(start)

	phase("publisher done")
	pubEnd := time.Now()
	// Every agent gets every number exactly once after dedup.
	want := make([]string, sz.msgs)
	for i := range want {
		want[i] = msgID(i + 1)
	}
	eventually(t, sz.deliverWithin, func() error {
		for _, a := range agents {
			if n := a.missing(want); n > 0 {
				return fmt.Errorf("%s misses %d of %d", a.actor, n, len(want))
			}
		}
		return nil
	})
	phase("every agent has every message")
	rep.tail = time.Since(pubEnd)
	select {
	case <-ad.proc.exited:
		t.Fatalf("authd exited during the drill:\n%s", ad.proc.stderr)
	default:
	}
	sv.mu.Lock()
	rep.deliverydExits = append([]string(nil), sv.exits...)
	if sv.startErr != nil {
		t.Errorf("supervisor: %v", sv.startErr)
	}
	sv.mu.Unlock()
	rep.published = int(published.Load())
	rep.pubRetries = int(pubRetries.Load())
	for _, a := range agents {
		a.mu.Lock()
		for _, id := range want {
			rep.delivered += min(a.got[id], 1)
		}
		for _, n := range a.got {
			if n > 1 {
				rep.handedTwice += n - 1
			}
		}
		rep.extra += len(a.got) - len(want)
		if !a.reconnectedAt.IsZero() {
			rep.reconnected++
			if d := a.reconnectedAt.Sub(killAt); d > rep.lastBack {
				rep.lastBack = d
			}
		}
		rep.restarts += a.restarts
		a.mu.Unlock()
		rep.dupsHidden += int(a.client.Duplicates())
	}
	rep.lost = rep.published*len(agents) - rep.delivered
	rep.signerRetried = mgr.Retried()
	t.Log("\n" + rep.String())
	fmt.Println(rep.String())
	if rep.published != sz.msgs || rep.lost != 0 || rep.handedTwice != 0 || rep.extra != 0 {
		t.Fatalf("published %d of %d, lost %d, handed over twice %d, unknown ids %d", rep.published, sz.msgs, rep.lost, rep.handedTwice, rep.extra)
	}
}

func msgID(i int) string { return fmt.Sprintf("m%05d", i) }

// agent is one drill agent: a bearer from authd's exchange (the human arm, its ledger row), a
// connection through the auth callout to the cluster (any node, reconnecting to the others, each
// reconnect a callout again), and its dlvclient.
type agent struct {
	owner, actor, uid string
	nc                *nats.Conn
	client            *dlvclient.Client

	mu            sync.Mutex
	got           map[string]int // id -> times handed over (after dedup)
	reconnectedAt time.Time      // the last reconnect
	restarts      int            // Run calls after the first
}

func newRail(t *testing.T, mgr *signerclient.Client, urls, actor, uid string) *signerclient.Rail {
	t.Helper()
	r, err := signerclient.NewRail(signerclient.RailConfig{Client: mgr, Space: plane3test.Space, Profile: signerv1.Profile_PROFILE_AGENT,
		Params: &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: actor, LifecycleUid: uid,
			Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}},
		NatsURL: urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Start(plane3test.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	return r
}

// connect exchanges an IdP token for a bearer at authd and connects through the callout.
func (a *agent) connect(t *testing.T, ad *authdRun, sentinel, urls string) {
	t.Helper()
	ac, err := authclient.New(authclient.Config{URL: ad.url, Cap: ad.cap, Actor: a.actor, IdPToken: ad.idp.token})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ac.Exchange(plane3test.Ctx(t))
	if err != nil {
		t.Fatalf("exchange for %s: %v", a.actor, err)
	}
	if b.Owner != a.owner {
		t.Fatalf("bearer owner %s, ledger row owner %s", b.Owner, a.owner)
	}
	opts, err := ac.NatsOptions(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(urls, append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) {
			a.mu.Lock()
			a.reconnectedAt = time.Now()
			a.mu.Unlock()
		}))...)
	if err != nil {
		t.Fatalf("%s through the callout: %v", a.actor, err)
	}
	t.Cleanup(nc.Close)
	a.nc = nc
	a.client, err = dlvclient.New(plane3test.Ctx(t), plane3test.JS(t, nc),
		dlvclient.Config{Space: plane3test.Space, Owner: a.owner, Actor: a.actor, LifecycleUID: a.uid})
	if err != nil {
		t.Fatal(err)
	}
}

// consume runs the dlvclient until ctx ends, running it again when the consumer fails (a node
// lost under it), as an agent would.
func (a *agent) consume(ctx context.Context) {
	for ctx.Err() == nil {
		_ = a.client.Run(ctx, func(_ context.Context, d dlvclient.Delivery) error {
			a.mu.Lock()
			a.got[d.ID]++
			a.mu.Unlock()
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		a.restarts++
		a.mu.Unlock()
		select { // back off before binding again
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (a *agent) missing(want []string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, id := range want {
		if a.got[id] == 0 {
			n++
		}
	}
	return n
}

// report is what the drill prints.
type report struct {
	size                                size
	kills                               []string
	published, pubRetries               int
	delivered, lost, handedTwice, extra int
	dupsHidden, reconnected, restarts   int
	renewed                             int
	lastBack, publishTook               time.Duration
	signerRetried                       uint64
	deliverydExits                      []string
	loadRenewals                        int
	tail                                time.Duration
}

func (r report) String() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "failure drill (%s): %d agents, %d messages on general, 3 nodes at R3, 2 signerd replicas\n", r.size.name, r.size.agents, r.size.msgs)
	fmt.Fprintf(&b, "agents: bearers from authd's exchange (ledger rows by authd actor grant), connected through the auth callout\n")
	for _, k := range r.kills {
		fmt.Fprintf(&b, "  - %s\n", k)
	}
	for _, x := range r.deliverydExits {
		fmt.Fprintf(&b, "  ! %s (restarted, as systemd's Restart=on-failure would)\n", x)
	}
	row := func(k string, v any) { fmt.Fprintf(&b, "| %-44s | %14v |\n", k, v) }
	fmt.Fprintf(&b, "| %-44s | %14s |\n|%s|%s|\n", "figure", "value", strings.Repeat("-", 46), strings.Repeat("-", 16))
	row("messages published (acked by CHAT)", r.published)
	row("publish retries (no ack within 2 s)", r.pubRetries)
	row("delivered, summed over agents (after dedup)", r.delivered)
	row("expected (published x agents)", r.published*r.size.agents)
	row("lost", r.lost)
	row("duplicates seen by agents, hidden by dedup", r.dupsHidden)
	row("duplicates handed over after dedup", r.handedTwice)
	row("agents reconnected", fmt.Sprintf("%d of %d", r.reconnected, r.size.agents))
	row("last agent back after the node kill", r.lastBack.Round(time.Millisecond))
	row("dlvclient consumers re-run after a failure", r.restarts)
	row("renewals under load across the replica kill", fmt.Sprintf("%d, 0 failed", r.loadRenewals))
	row("credentials renewed after the replica kill", r.renewed)
	row("signer calls failed over (Client.Retried)", r.signerRetried)
	row("deliveryd exits not caused by the drill", len(r.deliverydExits))
	row("publishing took", r.publishTook.Round(time.Millisecond))
	row("every agent complete, after the last publish", r.tail.Round(time.Millisecond))
	return b.String()
}

// shortenLease sets the delivery bucket's TTL (max_age) with the provisioner credential, as
// deliveryd's own crash test does (servicetest.ShortenLease, internal to deliveryd).
func shortenLease(t *testing.T, e *plane3test.Env, pjs jetstream.JetStream, ttl time.Duration) {
	t.Helper()
	bucket, _ := e.N.Bucket(space.Delivery)
	st, err := pjs.Stream(plane3test.Ctx(t), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxAge = ttl
	cfg.Duplicates = min(cfg.Duplicates, ttl)
	if _, err := pjs.UpdateStream(plane3test.Ctx(t), cfg); err != nil {
		t.Fatalf("shorten the lease TTL: %v", err)
	}
}

func leaseRow(kv jetstream.KeyValue) (lease.Row, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, space.DeliveryLeaseKey)
	if err != nil {
		return lease.Row{}, err
	}
	var r lease.Row
	err = json.Unmarshal(e.Value(), &r)
	return r, err
}

func waitLease(t *testing.T, kv jetstream.KeyValue, holder string, within time.Duration) {
	t.Helper()
	eventually(t, within, func() error {
		r, err := leaseRow(kv)
		if err != nil {
			return err
		}
		if r.Holder != holder || !r.Ready {
			return fmt.Errorf("lease row %+v, want %s ready", r, holder)
		}
		return nil
	})
}

type child struct {
	holder string
	cmd    *exec.Cmd
	stderr *testkit.SyncBuffer
	exited chan struct{}
}

// spawnDeliveryd runs `deliveryd serve` with both signerd replicas and every broker URL, in a
// new directory under base.
func spawnDeliveryd(bin, base string, cf mtls.ClientFiles, addrs, brokers []string, holder string) (*child, error) {
	q := strconv.Quote
	qs := func(l []string) string {
		out := make([]string, len(l))
		for i, v := range l {
			out[i] = q(v)
		}
		return strings.Join(out, ", ")
	}
	dir, err := os.MkdirTemp(base, holder)
	if err != nil {
		return nil, err
	}
	yaml := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {addresses: [%s], ca: %s, cert: %s, key: %s}\nstate_dir: %s\nholder: %s\nbroker_gone: 30s\n",
		q(plane3test.Space), qs(brokers), qs(addrs), q(cf.ServerCAFile), q(cf.CertFile), q(cf.KeyFile), q(filepath.Join(dir, "state")), q(holder))
	path := filepath.Join(dir, "deliveryd.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	c := &child{holder: holder, cmd: exec.Command(bin, "serve", "--config", path), stderr: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	c.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// supervisor keeps one deliveryd running, as systemd's Restart=on-failure does (without its
// RestartSec): when the running one exits (or the drill kills it), it waits until the lease row
// is gone (released, or expired after one TTL) and starts the next, deliveryd-2, deliveryd-3, ...
type supervisor struct {
	bin, base string
	cf        mtls.ClientFiles
	addrs     []string
	brokers   []string
	kv        jetstream.KeyValue

	mu       sync.Mutex
	cur      *child
	all      []*child
	killed   map[*child]bool
	exits    []string // deliveryd exits the drill did not cause, with their last log line
	startErr error
	done     chan struct{}
}

func (sv *supervisor) start(ctx context.Context) error {
	c, err := spawnDeliveryd(sv.bin, sv.base, sv.cf, sv.addrs, sv.brokers, "deliveryd-1")
	if err != nil {
		return err
	}
	sv.cur, sv.all, sv.killed, sv.done = c, []*child{c}, map[*child]bool{}, make(chan struct{})
	go sv.run(ctx)
	return nil
}

func (sv *supervisor) current() *child {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.cur
}

func (sv *supervisor) run(ctx context.Context) {
	defer close(sv.done)
	for n := 2; ; n++ {
		c := sv.current()
		select {
		case <-c.exited:
		case <-ctx.Done():
			return
		}
		sv.mu.Lock()
		if !sv.killed[c] {
			sv.exits = append(sv.exits, fmt.Sprintf("%s exited by itself: %s", c.holder, lastLine(c.stderr.String())))
		}
		sv.mu.Unlock()
		for {
			_, err := leaseRow(sv.kv)
			if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond): // poll interval
			}
		}
		next, err := spawnDeliveryd(sv.bin, sv.base, sv.cf, sv.addrs, sv.brokers, fmt.Sprintf("deliveryd-%d", n))
		sv.mu.Lock()
		if err != nil {
			sv.startErr = err
			sv.mu.Unlock()
			return
		}
		sv.cur = next
		sv.all = append(sv.all, next)
		sv.mu.Unlock()
	}
}

// kill9 sends the running deliveryd SIGKILL and waits until it is gone.
func (sv *supervisor) kill9() (*child, error) {
	sv.mu.Lock()
	c := sv.cur
	sv.killed[c] = true
	sv.mu.Unlock()
	if err := c.cmd.Process.Signal(os.Kill); err != nil {
		return c, err
	}
	<-c.exited
	return c, nil
}

// close kills every child and waits for the supervisor.
func (sv *supervisor) close() {
	sv.mu.Lock()
	all := append([]*child(nil), sv.all...)
	sv.mu.Unlock()
	<-sv.done
	sv.mu.Lock()
	all = append(all, sv.all[len(all):]...)
	sv.mu.Unlock()
	for _, c := range all {
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}
