package service_test

import (
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// proxy forwards TCP on loopback to the broker until cut: then it closes every connection it
// carries and closes each new one at once, as a broker unreachable from one host would look to
// that host's client, until healed.
type proxy struct {
	t      *testing.T
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, target: strings.TrimPrefix(target, "nats://")}
	t.Cleanup(func() { _ = ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
		go func() { _, _ = io.Copy(c, b); _ = c.Close() }()
	}
}

// setCut cuts (closing what it carries) or heals.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// TestLeaseFence (issue 20 item 7): deliveryd is cut off from the broker for longer than its
// lease TTL (2 s here; the broker-gone window is a minute, so the watchdog does not end it), and
// a successor acquires the lease as soon as the row expires. The old instance must be fenced
// (MayAct, the check before every publish, reply and ack, false) before the successor holds the
// lease and stay fenced when its connection comes back, until it has renewed, found the
// successor's row and stopped; and it must have done nothing with a message that waited for
// it (no fan-out copy, no ack). The successor is a bare lease holder, so every copy and ack is
// the old one's. The order of events is asserted, never a time.
func TestLeaseFence(t *testing.T) {
	e := plane3test.New(t)
	pjs := e.Provisioner(t)
	servicetest.ShortenLease(t, e, pjs, 2*time.Second)
	members(t, e)
	p := startProxy(t, e.URL)
	cfg := servicetest.Config(t, e, "deliveryd-old")
	cfg.Brokers = []string{p.url()}
	cfg.BrokerGone = yamlx.Duration(time.Minute)
	var logs logBuffer
	svc := start(t, cfg, &logs)
	kv := servicetest.DeliveryKV(t, e)
	servicetest.WaitReady(t, kv, "deliveryd-old", 5*time.Second)
	bob := plane3test.Receive(t, e, "bob", uidBob)
	ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
	e.Post(t, ajs, "alice", "before", "before the cut")
	eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"before"}) })
	djs := plane3test.JS(t, e.Delivery(t)) // the observer: a delivery credential may read INBOX and CHAT's consumers
	inboxBefore := inboxCount(t, e, djs, "bob", uidBob)

	p.setCut(true)
	bucket, _ := e.N.Bucket(space.Delivery)
	succ := e.Delivery(t)
	var events []string
	eventually(t, 30*time.Second, func() error {
		if svc.MayAct() {
			events = append(events, "old may act")
		} else {
			events = append(events, "old fenced")
		}
		if _, err := lease.Acquire(ctx(t), lease.Config{Conn: succ, Bucket: bucket, Key: space.DeliveryLeaseKey, Holder: "successor"}); err != nil {
			return err
		}
		events = append(events, "successor acquired")
		return nil
	})
	if n := len(events); events[n-2] != "old fenced" || svc.MayAct() {
		t.Fatalf("a successor acquired the lease while the old instance could still act: %v\n%s", testkit.Runs(events), logs.String())
	}
	// A message waits for the fan-out while the old instance is cut off; then it comes back.
	seq := e.Post(t, ajs, "alice", "during", "while the successor holds the lease")
	p.setCut(false)
	events = append(events, "healed")
	// From the heal until it stops, the old instance's fence never lifts: it reconnects, renews
	// on the new connection, finds the successor's row and stops without having been let act.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
sample:
	for {
		select {
		case <-svc.Done():
			events = append(events, "old stopped")
			break sample
		case <-deadline:
			t.Fatalf("the old instance did not stop after the heal; events: %s\n%s", testkit.Runs(events), logs.String())
		case <-tick.C:
			if svc.MayAct() {
				events = append(events, "old may act")
			} else {
				events = append(events, "old fenced")
			}
		}
	}
	if slices.Contains(events[slices.Index(events, "successor acquired"):], "old may act") {
		t.Fatalf("the old instance could act after the successor acquired the lease: %s\n%s", testkit.Runs(events), logs.String())
	}
	err := svc.Err()
	if !errors.Is(err, service.ErrLeaseTaken) {
		t.Fatalf("Err = %v; want ErrLeaseTaken\n%s", err, logs.String())
	}
	if !logs.has("broker connection restored") {
		t.Fatalf("the old instance never reconnected:\n%s", logs.String())
	}
	// It did nothing with "during": no inbox entry, no copy, no ack.
	if n := inboxCount(t, e, djs, "bob", uidBob); n != inboxBefore {
		t.Fatalf("INBOX holds %d entries for bob, %d before the cut: the old instance wrote a fan-out copy", n, inboxBefore)
	}
	if n := servicetest.DLVCount(t, e, pjs, "bob", uidBob); n != 1 {
		t.Fatalf("DLV holds %d messages for bob, want only the one before the cut", n)
	}
	c, err := djs.Consumer(ctx(t), e.N.ChatStream(), e.N.FanoutConsumer())
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream >= seq {
		t.Fatalf("the fan-out consumer's ack floor is %d, at or past %d: the old instance acked the message posted while the successor held the lease", info.AckFloor.Stream, seq)
	}
	t.Logf("events: %s", testkit.Runs(events))
}

// inboxCount is how many entries INBOX_<t> holds for lifecycle local.<actor>.<uid>.
func inboxCount(t *testing.T, e *plane3test.Env, js jetstream.JetStream, actor, uid string) uint64 {
	t.Helper()
	subj, err := e.N.Dinbox(plane3test.Owner, actor, uid)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), e.N.InboxStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}
