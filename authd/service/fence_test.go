package service_test

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// cutter is a dialer for authd's broker connections that can blackhole the one whose CONNECT
// names it: from the cut on, what authd writes on it is dropped and what the broker sends is
// read and thrown away, so the socket stays open and neither side sees a disconnect: a broker
// (or the JetStream behind it) that stops answering one connection while the others work.
type cutter struct {
	name string
	cut  atomic.Bool

	mu    sync.Mutex
	named int // connections that sent CONNECT with name
}

func (c *cutter) Dial(network, address string) (net.Conn, error) {
	conn, err := net.DialTimeout(network, address, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

func (c *cutter) connections() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.named
}

type cutConn struct {
	net.Conn
	c     *cutter
	named atomic.Bool
}

func (k *cutConn) Write(b []byte) (int, error) {
	if !k.named.Load() && bytes.HasPrefix(b, []byte("CONNECT ")) && bytes.Contains(b, []byte(`"name":"`+k.c.name+`"`)) {
		k.named.Store(true)
		k.c.mu.Lock()
		k.c.named++
		k.c.mu.Unlock()
	}
	if k.named.Load() && k.c.cut.Load() {
		return len(b), nil
	}
	return k.Conn.Write(b)
}

func (k *cutConn) Read(b []byte) (int, error) {
	for {
		n, err := k.Conn.Read(b)
		if err != nil || !k.named.Load() || !k.c.cut.Load() {
			return n, err
		}
	}
}

// TestPlaneFence (issue 20 item 7): authd's plane connection stops answering (its renewals
// neither succeed nor fail), while its callout connection and signerd keep working. authd must
// stop answering callouts before its row can expire: a successor that acquires the plane as soon
// as the broker lets it finds the old authd already silent, and every callout answered came
// before the successor held the plane. Events are put in order by one loop; no time is asserted.
func TestPlaneFence(t *testing.T) {
	cut := &cutter{name: "authd-plane"}
	h := newHumanEnv(t, newEnv(t), true, nil, nats.SetCustomDialer(cut))
	if cut.connections() != 1 {
		t.Fatalf("%d connections named authd-plane, want 1", cut.connections())
	}
	c := h.client(t, 0)
	if _, err := h.connect(t, c); err != nil {
		t.Fatalf("connect before the cut: %v", err)
	}
	nc, _, bucket := h.e.planeConn(t)

	cut.cut.Store(true)
	var events []string
	answered := func() bool {
		_, err := h.connect(t, c)
		if err == nil {
			events = append(events, "callout answered")
			return true
		}
		events = append(events, "callout unanswered")
		return false
	}
	var successor *lease.Lease
	testkit.Eventually(t, 60*time.Second, func() error {
		answered()
		l, err := lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: bucket, Key: "plane", Holder: "successor", KeyTTL: 2 * time.Second})
		if err != nil {
			return err
		}
		successor = l
		events = append(events, "successor acquired")
		return nil
	})
	t.Cleanup(func() { _ = successor.Release(ctxT(t)) })
	// While the successor holds the plane, the old authd answers nothing.
	if answered() {
		t.Fatalf("the old authd answered a callout while the successor held the plane; events: %s", testkit.Runs(events))
	}
	last := -1
	for i, e := range events {
		if e == "callout answered" {
			last = i
		}
	}
	if acq := len(events) - 2; last > acq || events[acq-1] != "callout unanswered" {
		t.Fatalf("events out of order (the old authd must be silent before the successor acquires): %s", testkit.Runs(events))
	}
	t.Logf("events: %s", testkit.Runs(events))
	select {
	case <-h.s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced authd did not stop")
	}
	if !errors.Is(h.s.Err(), service.ErrPlaneLost) {
		t.Fatalf("Err = %v, want ErrPlaneLost", h.s.Err())
	}
	// The host heard of it: unavailable at the fence, then stopped. (The renewal in flight hangs
	// on the cut connection past the fence, so no retry warning need come first.)
	h.ev.waitStates(t, 0, "ready/READY", "unavailable/FENCE", "stopped/FENCE")
}
