package signerclient

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

func agentMint(t *testing.T) *signerv1.MintRequest {
	t.Helper()
	_, pub := newUser(t)
	return &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()}
}

// TestCallsFallBackToUnary runs Calls against a real signerd serving no Stream RPC (as one from
// before it): every call is answered by the unary RPC.
func TestCallsFallBackToUnary(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: shortPolicy("1h", "own"), NoStream: true})
	calls := dialAs(t, s, signerdtest.ID(mtls.KindManagerd, testSpace)).Calls()
	for i := range 3 {
		req := agentMint(t)
		cred, err := calls.Mint(ctxT(t), req)
		if err != nil {
			t.Fatalf("mint %d: %v", i, err)
		}
		if cred.GetUserPublicKey() != req.GetUserPublicKey() {
			t.Fatalf("credential for %s, want %s", cred.GetUserPublicKey(), req.GetUserPublicKey())
		}
	}
	if calls.Opened() != 0 || calls.FellBack() != 3 {
		t.Fatalf("streams opened %d, fallen back %d; want 0 and 3", calls.Opened(), calls.FellBack())
	}
	calls.lanes[0].mu.Lock()
	until := calls.lanes[0].unaryUntil
	calls.lanes[0].mu.Unlock()
	if until.IsZero() {
		t.Fatal("an UNIMPLEMENTED stream did not set the lane's unary period")
	}
}

// proxy forwards TCP connections to target until kill cuts every one of them.
type proxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{}
	cp := func(dst io.Writer, src io.Reader) {
		p.mu.Lock()
		p.conns = append(p.conns, dst.(net.Conn), src.(net.Conn))
		p.mu.Unlock()
		_, _ = io.Copy(dst, src)
	}
	p.addr = testkit.ServeProxy(t, target, func() (up, down func(io.Writer, io.Reader)) { return cp, cp })
	return p
}

func (p *proxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// TestCallsStreamBreaks cuts the connection under a stream with a call in flight: the call fails
// UNAVAILABLE and is not resent, and the next call opens a new stream and is answered.
func TestCallsStreamBreaks(t *testing.T) {
	// A two-second group-commit wait keeps the Mint in flight while the connection is cut.
	s := signerdtest.Start(t, signerdtest.Options{Policy: shortPolicy("1h", "own"), AuditMaxDelay: 2 * time.Second})
	p := startProxy(t, s.Addr)
	c, err := Dial(Config{Addr: p.addr, TLS: s.Client(t, signerdtest.ID(mtls.KindManagerd, testSpace))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	calls := c.Calls()

	t.Run("fail/in-flight-unavailable", func(t *testing.T) {
		errc := make(chan error, 1)
		go func() {
			_, err := calls.Mint(ctxT(t), agentMint(t))
			errc <- err
		}()
		// Wait until the call is registered on an open stream, then cut the connection.
		deadline := time.Now().Add(10 * time.Second)
		for {
			l := calls.lanes[0]
			l.mu.Lock()
			cs := l.cur
			l.mu.Unlock()
			n := 0
			if cs != nil {
				cs.mu.Lock()
				n = len(cs.pending)
				cs.mu.Unlock()
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the call never reached a stream")
			}
			time.Sleep(5 * time.Millisecond) // poll interval, not synchronisation
		}
		p.kill()
		err := <-errc
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("in-flight call = %v, want UNAVAILABLE", err)
		}
		if calls.FellBack() != 0 {
			t.Fatalf("%d calls fell back to the unary RPC: the broken call must not be resent", calls.FellBack())
		}
	})

	t.Run("ok/next-call-reopens", func(t *testing.T) {
		req := agentMint(t)
		cred, err := calls.Mint(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if cred.GetUserPublicKey() != req.GetUserPublicKey() {
			t.Fatalf("credential for %s, want %s", cred.GetUserPublicKey(), req.GetUserPublicKey())
		}
		if calls.Opened() != 2 || calls.FellBack() != 0 {
			t.Fatalf("streams opened %d, fallen back %d; want 2 and 0", calls.Opened(), calls.FellBack())
		}
	})
}

// TestCallsDrain drains the replica under an open stream: signerd tells the stream to drain,
// the client half-closes it and signerd ends it cleanly, so the lane holds no stream and the
// next call opens (or falls back) anew.
func TestCallsDrain(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: shortPolicy("1h", "own")})
	calls := dialAs(t, s, signerdtest.ID(mtls.KindManagerd, testSpace)).Calls()
	if _, err := calls.Mint(ctxT(t), agentMint(t)); err != nil {
		t.Fatal(err)
	}
	l := calls.lanes[0]
	l.mu.Lock()
	cs := l.cur
	l.mu.Unlock()
	if calls.Opened() != 1 || cs == nil {
		t.Fatalf("streams opened %d, lane stream %v; want 1 open", calls.Opened(), cs)
	}
	s.Replicas[0].Drain()
	select {
	case <-cs.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the drained stream never ended")
	}
	cs.mu.Lock()
	retiring, pending := cs.retiring, cs.pending
	cs.mu.Unlock()
	l.mu.Lock()
	cur := l.cur
	l.mu.Unlock()
	if !retiring || pending != nil || cur != nil {
		t.Fatalf("after drain: retiring %v, pending %v, lane stream %v; want retired, ended, detached", retiring, pending, cur)
	}
}
