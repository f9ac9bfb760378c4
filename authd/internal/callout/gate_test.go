package callout

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/bearer"
)

// TestCalloutGate: while Config.Gate says false a request gets no reply and signerd is not
// asked to open it (the broker refuses the client at its callout timeout); once it says true the
// same client is admitted.
func TestCalloutGate(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	c := &counting{Signer: e.authd.API()}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	var open atomic.Bool
	resp, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache,
		Logger: testLogger(t), signer: c, Gate: open.Load})
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp.Close)

	t.Run("fail/gate-closed-unanswered", func(t *testing.T) {
		cl, err := e.connect(t, tok, laptopNonce(t))
		if err == nil {
			cl.Close()
			t.Fatal("admitted while the gate was closed")
		}
		if n := c.opens.Load(); n != 0 {
			t.Fatalf("signerd asked to open %d request(s) while the gate was closed", n)
		}
	})
	t.Run("ok/gate-open-admitted", func(t *testing.T) {
		open.Store(true)
		cl, err := e.connect(t, tok, laptopNonce(t))
		if err != nil {
			t.Fatalf("connect with the gate open: %v", err)
		}
		cl.Close()
		if n := c.opens.Load(); n != 1 {
			t.Fatalf("signerd opened %d request(s), want 1", n)
		}
	})
}
