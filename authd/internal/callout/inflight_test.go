package callout

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// heldSigner holds every OpenCalloutRequest until release is closed, telling entered first.
type heldSigner struct {
	Signer
	entered chan struct{}
	release chan struct{}
}

func (h *heldSigner) OpenCalloutRequest(ctx context.Context, in *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	h.entered <- struct{}{}
	<-h.release
	return h.Signer.OpenCalloutRequest(ctx, in, opts...)
}

// TestWaitIdle: a callout being served when WaitIdle is called holds it until that callout is
// answered; WaitIdle with nothing in flight returns at once, and a callout begun after the call
// is not waited for.
func TestWaitIdle(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	held := &heldSigner{Signer: e.authd.API(), entered: make(chan struct{}, 4), release: make(chan struct{})}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, signer: held, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WaitIdle(ctxT(t)); err != nil {
		t.Fatalf("WaitIdle before Start = %v", err)
	}
	if err := r.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	g := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, g, 10*time.Minute, nil)
	connected := make(chan error, 1)
	go func() {
		c, err := e.connect(t, tok, nonceFor(t, tok))
		if err == nil {
			c.Close()
		}
		connected <- err
	}()
	select {
	case <-held.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the callout never reached signerd")
	}

	short, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	if err := r.WaitIdle(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitIdle with a callout held = %v, want DeadlineExceeded", err)
	}
	idle := make(chan error, 1)
	go func() { idle <- r.WaitIdle(ctxT(t)) }()
	select {
	case err := <-idle:
		t.Fatalf("WaitIdle returned %v while the callout is held", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(held.release)
	if err := <-idle; err != nil {
		t.Fatalf("WaitIdle after the answer = %v", err)
	}
	if err := <-connected; err != nil {
		t.Fatalf("the held connect, once released: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		r.flight.mu.Lock()
		defer r.flight.mu.Unlock()
		if n := len(r.flight.active); n != 0 {
			return errors.New("callouts still tracked")
		}
		return nil
	})
}

// TestInflightOnlyBefore: a wait covers the tickets issued before its mark, never later ones.
func TestInflightOnlyBefore(t *testing.T) {
	var f inflight
	a := f.begin()
	before := f.mark()
	b := f.begin()
	done := make(chan error, 1)
	go func() { done <- f.waitUpTo(context.Background(), before) }()
	select {
	case err := <-done:
		t.Fatalf("waitUpTo returned %v with ticket %d open", err, a)
	case <-time.After(50 * time.Millisecond):
	}
	f.end(a)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitUpTo waited for a ticket issued after its mark")
	}
	f.end(b)
	if n := len(f.active); n != 0 || f.mark() != b {
		t.Fatalf("%d tickets tracked after both ended, mark %d", n, f.mark())
	}
}
