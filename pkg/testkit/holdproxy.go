package testkit

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// HoldProxy forwards TCP connections to a target address. Armed with a marker, it holds
// everything the target sends on a connection once the client has sent the marker on that
// connection, until the connection closes (either side) or Free: a request that reached the
// target has its reply withheld, as a broker that went silent on that one connection would.
// Other connections, and new ones, pass freely until they send the marker themselves.
type HoldProxy struct {
	// Addr is the proxy's host:port.
	Addr string

	mu     sync.Mutex
	cond   *sync.Cond
	marker []byte // nil: unarmed
	arm    int    // counts Arm calls: a connection holds only under the Arm it matched
	held   int    // connections that started holding since the last Arm
}

// ServeProxy forwards each loopback connection to target (host:port) and returns the proxy's
// address. For each connection pair() gives up, which copies what the client sends to the
// target, and down, the other way; each returns when its source or destination ends, and both
// connections are then closed. t's cleanup closes the listener and every connection and waits
// for the copies; a cleanup registered after ServeProxy runs first, so a proxy that withholds
// bytes lets them go there.
func ServeProxy(t testing.TB, target string, pair func() (up, down func(dst io.Writer, src io.Reader))) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: proxy: %v", err)
	}
	var (
		wg      sync.WaitGroup
		connsMu sync.Mutex
		conns   []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, c, s)
			connsMu.Unlock()
			up, down := pair()
			wg.Go(func() { up(s, c); _ = s.Close(); _ = c.Close() })
			wg.Go(func() { down(c, s); _ = c.Close(); _ = s.Close() })
		}
	})
	return ln.Addr().String()
}

// StartHoldProxy is a HoldProxy to target (host:port), unarmed.
func StartHoldProxy(t testing.TB, target string) *HoldProxy {
	t.Helper()
	p := &HoldProxy{}
	p.cond = sync.NewCond(&p.mu)
	p.Addr = ServeProxy(t, target, func() (up, down func(io.Writer, io.Reader)) {
		c := &proxied{p: p}
		return c.toTarget, c.toClient
	})
	t.Cleanup(p.Free)
	return p
}

// Arm holds each connection, from now on, whose client sends marker (matched across reads).
func (p *HoldProxy) Arm(marker string) {
	p.mu.Lock()
	p.marker, p.held = []byte(marker), 0
	p.arm++
	p.mu.Unlock()
}

// Held is how many connections started holding since Arm.
func (p *HoldProxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Free disarms the proxy and lets every held connection's bytes through; a later Arm holds only
// the connections that send its marker.
func (p *HoldProxy) Free() {
	p.mu.Lock()
	p.marker = nil
	p.mu.Unlock()
	p.cond.Broadcast()
}

// proxied is one client connection and its target connection.
type proxied struct {
	p      *HoldProxy
	heldAt int  // the Arm whose marker this connection sent (0: none); guarded by p.mu
	closed bool // guarded by p.mu
}

// holding reports whether the connection holds now: it sent the marker of the Arm still in
// force. p.mu must be held.
func (c *proxied) holding() bool {
	return c.heldAt != 0 && c.heldAt == c.p.arm && c.p.marker != nil
}

// toTarget looks for the marker in what the client sends before passing it on, so the reply to
// the request carrying it is already held.
func (c *proxied) toTarget(dst io.Writer, src io.Reader) {
	defer c.close()
	buf := make([]byte, 32<<10)
	var tail []byte
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c.p.mu.Lock()
			if m := c.p.marker; len(m) > 0 && c.heldAt != c.p.arm {
				win := append(tail, buf[:n]...)
				if bytes.Contains(win, m) {
					c.heldAt = c.p.arm
					c.p.held++
				}
				tail = append([]byte(nil), win[max(0, len(win)-len(m)+1):]...)
			}
			c.p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// toClient passes the target's bytes on, waiting while this connection is held.
func (c *proxied) toClient(dst io.Writer, src io.Reader) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c.p.mu.Lock()
			for c.holding() && !c.closed {
				c.p.cond.Wait()
			}
			closed := c.closed
			c.p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close ends a held wait once either direction has ended.
func (c *proxied) close() {
	c.p.mu.Lock()
	c.closed = true
	c.p.mu.Unlock()
	c.p.cond.Broadcast()
}
