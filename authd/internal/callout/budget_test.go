package callout

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// counting passes the responder's signerd calls through and counts them: opens, signed grants,
// signed refusals, and calls signerd answered RESOURCE_EXHAUSTED (its rate limit).
type counting struct {
	Signer
	opens, grants, refusals, limited atomic.Int64

	mu       sync.Mutex
	warnings []string // Config.Warn's reports, "code: message"
}

func (c *counting) warned() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.warnings)
}

func (c *counting) OpenCalloutRequest(ctx context.Context, in *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	c.opens.Add(1)
	resp, err := c.Signer.OpenCalloutRequest(ctx, in, opts...)
	if status.Code(err) == codes.ResourceExhausted {
		c.limited.Add(1)
	}
	return resp, err
}

func (c *counting) SignCalloutResponse(ctx context.Context, in *signerv1.SignCalloutResponseRequest, opts ...grpc.CallOption) (*signerv1.SignCalloutResponseResponse, error) {
	if in.GetGrant() != nil {
		c.grants.Add(1)
	} else {
		c.refusals.Add(1)
	}
	resp, err := c.Signer.SignCalloutResponse(ctx, in, opts...)
	if status.Code(err) == codes.ResourceExhausted {
		c.limited.Add(1)
	}
	return resp, err
}

// budgetResponder starts a responder on e's callout connection with the given budgets and clock,
// its signerd calls counted and its warnings recorded.
func budgetResponder(t *testing.T, e *env, open, refusal Rate, now func() time.Time) *counting {
	t.Helper()
	c := &counting{Signer: e.authd.API()}
	warn := func(code, msg string, _ error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.warnings = append(c.warnings, code+": "+msg)
	}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, OpenRate: open, RefusalRate: refusal,
		Now: now, Logger: testLogger(t), signer: c, Warn: warn})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return c
}

// badConnect is an attacker's connect: the public sentinel and a token that is no bearer. It
// never succeeds; it returns once the broker refused it (signed refusal or callout timeout).
func (e *env) badConnect() error {
	kp, _ := nkeys.CreateUser()
	nonce := newNonce()
	nc, err := nats.Connect(e.url, nats.UserJWT(func() (string, error) { return e.gs.GetSentinelJwt(), nil }, kp.Sign),
		nats.Token("not-a-bearer"), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce),
		nats.NoReconnect(), nats.Timeout(10*time.Second))
	if err == nil {
		nc.Close()
		return fmt.Errorf("a bad connect was admitted")
	}
	return nil
}

// laptopNonce is a fresh inbox nonce bound to owner.laptop, the principal of row("laptop").
func laptopNonce(t testing.TB) string {
	n, err := space.BoundInboxNonce(owner, "laptop", rand.Text())
	if err != nil {
		t.Error(err)
	}
	return n
}

// TestCalloutLocalBudgets: on a clock that stands still the buckets never refill, so the counts
// are exact. Past the refusal budget a refused connect gets no reply and signerd is not asked to
// sign it; grants are not charged to it; past the open budget signerd is not asked at all.
func TestCalloutLocalBudgets(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	top := t // the responder logs to the test that built it
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	frozen := time.Now()
	c := budgetResponder(t, e, Rate{PerSecond: 1, Burst: 8}, Rate{PerSecond: 1, Burst: 2}, func() time.Time { return frozen })

	good := func(t *testing.T) error {
		t.Helper()
		cl, err := e.connect(t, tok, laptopNonce(t))
		if err == nil {
			cl.Close()
		}
		return err
	}
	bad := func(t *testing.T, n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() { errs <- e.badConnect() })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("ok/grant", func(t *testing.T) {
		if err := good(t); err != nil {
			t.Fatalf("good connect: %v", err)
		}
	})
	t.Run("ok/refusals-past-the-budget-unsigned", func(t *testing.T) {
		bad(t, 5)
		if o, rf := c.opens.Load(), c.refusals.Load(); o != 6 || rf != 2 {
			t.Fatalf("signerd opened %d and signed %d refusals; want 6 (1 grant + 5) and 2 (the refusal burst)", o, rf)
		}
	})
	t.Run("ok/grant-past-the-refusal-budget", func(t *testing.T) {
		if err := good(t); err != nil {
			t.Fatalf("good connect with the refusal budget spent: %v", err)
		}
		if g := c.grants.Load(); g != 2 {
			t.Fatalf("signerd signed %d grants, want 2", g)
		}
	})
	t.Run("fail/past-the-open-budget", func(t *testing.T) {
		bad(t, 3) // one more open (the 8th), two dropped before signerd
		if err := good(t); err == nil {
			t.Fatal("a connect past the open budget was admitted")
		}
		if o, rf, g := c.opens.Load(), c.refusals.Load(), c.grants.Load(); o != 8 || rf != 2 || g != 2 {
			t.Fatalf("signerd opened %d, signed %d refusals and %d grants; want 8, 2, 2", o, rf, g)
		}
		if l := logOf(top); !strings.Contains(l, outcomeOpenBudget) {
			t.Fatalf("the responder log does not say %q", outcomeOpenBudget)
		}
		// The first refusal dropped was reported at once; the drops after it within the second
		// wait for the next report.
		if w := c.warned(); len(w) == 0 || !strings.HasPrefix(w[0], WarnBudget+": ") || !strings.Contains(w[0], "1 past callout_refusals") {
			t.Fatalf("warnings %q, want the first a %s report of one refusal dropped", w, WarnBudget)
		}
	})
}

// floodPolicy is testPolicy with authd's signerd rate at the deployed policy's 200 a second and
// a burst of 50, so the flood's overload shows within a second.
var floodPolicy = strings.Replace(testPolicy, "rate: {per_second: 10000, burst: 20000}", "rate: {per_second: 200, burst: 50}", 1)

// TestCalloutRefusalFlood is the measure, in counts: a flood of bad connects at 5x the
// refusal budget (120 a second against 24) while 50 good clients connect, once each, 10 a
// second. authd's signerd rate is 200 calls a second. Without a refusal budget the flood alone
// asks 240 calls a second (an open and a signed refusal each) and good connects lose calls to
// signerd's rate limit; with it the flood asks 120 + 24 and every good client connects at its
// first attempt.
func TestCalloutRefusalFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the broker for about six seconds")
	}
	if raceEnabled {
		t.Skip("counts what a request rate costs; under the race detector the cores, not the budgets, are the limit")
	}
	const (
		goodClients = 50
		floodRate   = 120 // bad connects a second: 5x the refusal budget
	)
	e := startEnv(t, envOptions{noResponder: true, policy: floodPolicy})
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	c := budgetResponder(t, e, Rate{PerSecond: 160, Burst: 160}, Rate{PerSecond: floodRate / 5, Burst: floodRate / 5}, nil)

	base := e.ns.NumClients()
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var sent, admitted atomic.Int64
	flood.Go(func() {
		tick := time.NewTicker(time.Second / floodRate)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			sent.Add(1)
			flood.Go(func() {
				if e.badConnect() != nil {
					admitted.Add(1)
				}
			})
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		flood.Wait()
		// A client can give up before the broker has its callout answer; the broker must be
		// done with every connect before the test shuts it down (nats-server dereferences its
		// torn-down eventing for a callout still in progress at Shutdown).
		testkit.Eventually(t, 30*time.Second, func() error {
			if n := e.ns.NumClients(); n > base {
				return fmt.Errorf("broker still holds %d connections, %d before the flood", n, base)
			}
			return nil
		})
	}()
	// Let the flood run a second (counted in connects sent, not on a clock) so signerd's burst
	// is spent before the good clients come.
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := sent.Load(); n < floodRate {
			return fmt.Errorf("%d bad connects sent", n)
		}
		return nil
	})

	var ok, failed atomic.Int64
	var goods sync.WaitGroup
	tick := time.NewTicker(100 * time.Millisecond)
	for range goodClients {
		<-tick.C
		goods.Go(func() {
			kp, _ := nkeys.CreateUser()
			nonce := laptopNonce(t)
			nc, err := nats.Connect(e.url, nats.UserJWT(func() (string, error) { return e.gs.GetSentinelJwt(), nil }, kp.Sign),
				nats.Token(tok), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce), nats.NoReconnect(), nats.Timeout(10*time.Second))
			if err != nil {
				failed.Add(1)
				return
			}
			ok.Add(1)
			nc.Close()
		})
	}
	tick.Stop()
	goods.Wait()
	close(stop)
	flood.Wait()
	t.Logf("bad connects sent %d (admitted %d); good connected %d of %d; signerd opens %d, signed refusals %d, grants %d, rate-limited answers %d",
		sent.Load(), admitted.Load(), ok.Load(), goodClients, c.opens.Load(), c.refusals.Load(), c.grants.Load(), c.limited.Load())
	if admitted.Load() != 0 {
		t.Fatalf("%d bad connects were admitted", admitted.Load())
	}
	if ok.Load() != goodClients {
		t.Fatalf("%d of %d good clients connected during the flood (%d failed); signerd rate-limited %d calls",
			ok.Load(), goodClients, failed.Load(), c.limited.Load())
	}
}

// TestNewRefusesBudgets: a budget that admits nothing is a configuration error, named.
func TestNewRefusesBudgets(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		open, refusal Rate
	}{
		{name: "fail/open-zero-burst", open: Rate{PerSecond: 10}},
		{name: "fail/refusal-negative-rate", refusal: Rate{PerSecond: -1, Burst: 5}},
		{name: "fail/refusal-zero-rate", refusal: Rate{Burst: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, OpenRate: tc.open, RefusalRate: tc.refusal})
			if err == nil || !strings.Contains(err.Error(), "RefusalRate") {
				t.Fatalf("New = %v, want a budget error", err)
			}
		})
	}
}
