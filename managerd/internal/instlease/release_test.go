package instlease_test

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestReleaseUnanswered: a release round whose reply is lost (a supervisor's connection is cut
// at each credential expiry, and a reply sent across the cut never arrives) is tried again from
// a fresh read, so the row is deleted, never a successor's; a broker that answers no round
// leaves the row to the TTL after a bounded number of rounds. The replies are held by a TCP
// proxy between the lease's connection and the real broker, released when the client's retry
// reaches the broker, so no test waits on a clock.
func TestReleaseUnanswered(t *testing.T) {
	e := newEnv(t)
	kv := e.kv(t, full)
	for _, tc := range []struct {
		name     string
		from, to int // hold the broker's replies from the key's from-th request to its to-th
		wantErr  bool
		wantRow  bool
		wantSeen int
	}{
		// Requests naming the key: 1 the read, 2 the delete, 3 the next round's read.
		{name: "ok/read-unanswered-then-retried", from: 1, to: 2, wantSeen: 3},
		{name: "ok/delete-landed-unanswered-reads-no-row", from: 2, to: 3, wantSeen: 3},
		{name: "fail/no-round-answered-left-to-the-ttl", from: 1, to: 1 << 30, wantErr: true, wantRow: true, wantSeen: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := id("unanswered" + string(rune('a'+tc.from)))
			p := startHoldProxy(t, strings.TrimPrefix(e.url, "nats://"), "lease."+inst)
			cfg := e.cfg(t, full, inst, t.TempDir())
			cfg.Conn = e.connTo(t, "nats://"+p.addr, full, signerv1.Profile_PROFILE_SUPERVISOR, supervisorParams)
			cfg.OpTimeout = time.Second
			l := acquire(t, cfg)
			p.arm(tc.from, tc.to)
			err := l.Release(ctxT(t))
			if (err != nil) != tc.wantErr || (tc.wantErr && !strings.Contains(err.Error(), "left to the TTL")) {
				t.Fatalf("Release = %v; want error %v ('left to the TTL')", err, tc.wantErr)
			}
			if _, ok := rowAt(t, kv, "lease."+inst); ok != tc.wantRow {
				t.Fatalf("row present after Release = %v, want %v", ok, tc.wantRow)
			}
			if seen := p.count(); seen != tc.wantSeen {
				t.Fatalf("requests naming the key after arming = %d, want %d", seen, tc.wantSeen)
			}
			p.arm(0, 0)
		})
	}
}

// holdProxy forwards client connections to the broker. Once armed with (from, to) it counts the
// client's bytes naming key and holds every broker→client byte from the from-th occurrence
// until the to-th, then passes the held bytes on.
type holdProxy struct {
	addr string
	key  []byte

	mu       sync.Mutex
	cond     *sync.Cond
	seen     int
	from, to int
}

func startHoldProxy(t *testing.T, broker, key string) *holdProxy {
	t.Helper()
	p := &holdProxy{key: []byte(key)}
	p.cond = sync.NewCond(&p.mu)
	p.addr = testkit.ServeProxy(t, broker, func() (up, down func(io.Writer, io.Reader)) { return p.toBroker, p.toClient })
	t.Cleanup(func() { p.arm(0, 0) })
	return p
}

// arm starts counting afresh; arm(0, 0) holds nothing.
func (p *holdProxy) arm(from, to int) {
	p.mu.Lock()
	p.seen, p.from, p.to = 0, from, to
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *holdProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen
}

func (p *holdProxy) holding() bool { return p.from > 0 && p.seen >= p.from && p.seen < p.to }

// toBroker counts the key in what the client sends (across reads) before passing it on, so a
// reply to a counted request is held.
func (p *holdProxy) toBroker(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	var tail []byte
	for {
		n, err := src.Read(buf)
		if n > 0 {
			win := append(tail, buf[:n]...)
			p.mu.Lock()
			p.seen += bytes.Count(win, p.key)
			p.mu.Unlock()
			p.cond.Broadcast()
			tail = append([]byte(nil), win[max(0, len(win)-len(p.key)+1):]...)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// toClient passes the broker's bytes on, waiting while the proxy holds.
func (p *holdProxy) toClient(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.holding() {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
