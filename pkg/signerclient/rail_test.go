package signerclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// runRail runs r.Run in the background until the test ends and returns the channel its result
// arrives on (buffered, so a test may also read it itself).
func runRail(t *testing.T, r *Rail) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	return done
}

func TestRailRenewsLiveConnection(t *testing.T) {
	t.Run("ok/rail-renews-live-connection", func(t *testing.T) {
		e := startEnv(t, shortPolicy("3s", "own"))
		var logs logBuffer
		var (
			mu       sync.Mutex
			subjects []string
		)
		var r *Rail
		r = newRail(t, e, func(c *RailConfig) {
			c.Logger = newLogger(&logs)
			c.RetryInterval = 200 * time.Millisecond
			c.OnRenew = func(jti string, _ time.Time) {
				uc, err := jwt.DecodeUserClaims(r.cur.Load().jwt)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					subjects = append(subjects, "undecodable: "+err.Error())
					return
				}
				subjects = append(subjects, uc.Subject)
			}
		})
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		origJTI, origExp := r.Current()

		var reconnects atomic.Int32
		opts := append(r.NatsOptions(),
			nats.ReconnectWait(50*time.Millisecond),
			nats.MaxReconnects(-1),
			nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }),
		)
		c := connectChat(t, e.url, opts...)
		if err := c.roundTrip(5 * time.Second); err != nil {
			t.Fatalf("first round trip: %v", err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()

		testkit.Eventually(t, 15*time.Second, func() error {
			if !time.Now().After(origExp) {
				return fmt.Errorf("original credential %s not yet expired (%v)", origJTI, origExp)
			}
			mu.Lock()
			n := len(subjects)
			mu.Unlock()
			if n == 0 {
				return errors.New("no renewal yet")
			}
			if reconnects.Load() == 0 {
				return errors.New("connection has not reconnected since the original credential expired")
			}
			return c.roundTrip(time.Second)
		})

		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run returned %v after cancellation, want nil", err)
		}
		jti, exp := r.Current()
		if jti == origJTI || !exp.After(origExp) {
			t.Fatalf("Current = %s %v, want a renewed credential after %s %v", jti, exp, origJTI, origExp)
		}
		mu.Lock()
		for i, s := range subjects {
			if s != r.PublicKey() {
				t.Errorf("renewal %d subject = %q, want %q", i, s, r.PublicKey())
			}
		}
		mu.Unlock()
		// The connection's life across the renewals is the round trip above, made after the
		// original credential expired. Once Run has stopped, nothing renews its 3 s credential,
		// so a check of its status here would race that credential's expiry.
		out := logs.String()
		if !strings.Contains(out, "credential renewed") {
			t.Fatalf("log has no renewal line:\n%s", out)
		}
		if strings.Contains(out, "eyJ") || strings.Contains(out, r.cur.Load().jwt) {
			t.Fatalf("log contains JWT text:\n%s", out)
		}
	})
}

func TestRailRenewalFailure(t *testing.T) {
	t.Run("ok/renewal-failure-keeps-current", func(t *testing.T) {
		e := startEnv(t, shortPolicy("5s", "own"))
		var logs logBuffer
		var hookMu sync.Mutex
		var failed []error
		var retries []time.Duration
		r := newRail(t, e, func(c *RailConfig) {
			c.Logger = newLogger(&logs)
			c.RetryInterval = 100 * time.Millisecond
			c.OnRenewFailed = func(err error, retryIn time.Duration) {
				hookMu.Lock()
				defer hookMu.Unlock()
				failed, retries = append(failed, err), append(retries, retryIn)
			}
		})
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		origJTI, origExp := r.Current()
		origJWT := r.cur.Load().jwt
		seed, err := r.key.Seed()
		if err != nil {
			t.Fatal(err)
		}
		c := connectChat(t, e.url, r.NatsOptions()...)

		// Refuse remint of agents, and wait until signerd has reloaded the policy: a probe
		// credential of our own stops being renewable.
		e.s.SetPolicy(t, shortPolicy("5s", "none"))
		kp, pub := newUser(t)
		probe := mintAgent(t, e.client, pub)
		testkit.Eventually(t, 5*time.Second, func() error {
			_, err := e.client.Remint(ctxT(t), testSpace, probe.GetJwt(), kp, 0)
			if got := ReasonOf(err); got != signerv1.Reason_REASON_REMINT_NOT_ALLOWED {
				return fmt.Errorf("probe remint: reason %v (err %v), want REMINT_NOT_ALLOWED", got, err)
			}
			return nil
		})

		done := runRail(t, r)
		const warning = "credential renewal failed"
		testkit.Eventually(t, 10*time.Second, func() error {
			if n := logs.count(warning); n < 2 {
				return fmt.Errorf("%d renewal warnings, want at least 2 (a failure and a retry)", n)
			}
			return nil
		})
		// The host hears each failure too, with its reason and the wait before the retry.
		testkit.Eventually(t, 10*time.Second, func() error {
			hookMu.Lock()
			defer hookMu.Unlock()
			if len(failed) < 2 || ReasonOf(failed[0]) != signerv1.Reason_REASON_REMINT_NOT_ALLOWED || retries[0] <= 0 {
				return fmt.Errorf("OnRenewFailed got %v %v, want at least 2 REMINT_NOT_ALLOWED failures with a positive retry", failed, retries)
			}
			return nil
		})
		if jti, exp := r.Current(); jti != origJTI || !exp.Equal(origExp) {
			t.Fatalf("Current = %s %v after failed renewals, want the original %s %v", jti, exp, origJTI, origExp)
		}
		if r.cur.Load().jwt != origJWT {
			t.Fatal("the served JWT changed after failed renewals")
		}
		if err := c.roundTrip(time.Second); err != nil {
			t.Fatalf("round trip on the current credential: %v", err)
		}

		// Once the credential expires, Run gives up with the last refusal wrapped.
		select {
		case err := <-done:
			if !errors.Is(err, ErrExpired) || !errors.Is(err, ErrDenied) || ReasonOf(err) != signerv1.Reason_REASON_REMINT_NOT_ALLOWED {
				t.Fatalf("Run = %v, want ErrExpired wrapping a REMINT_NOT_ALLOWED denial", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after the credential expired")
		}

		out := logs.String()
		if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "REMINT_NOT_ALLOWED") {
			t.Fatalf("log lacks the warning and its reason:\n%s", out)
		}
		for name, secret := range map[string]string{"JWT": origJWT, "probe JWT": probe.GetJwt(), "seed": string(seed)} {
			if strings.Contains(out, secret) {
				t.Fatalf("log contains the %s:\n%s", name, out)
			}
		}
		if strings.Contains(out, "eyJ") {
			t.Fatalf("log contains JWT-shaped text:\n%s", out)
		}
	})
}

func TestRailStartRefusals(t *testing.T) {
	e := startEnv(t, "")
	other := testkit.StartBroker(t, testSpace)
	tests := []struct {
		name   string
		mutate func(*RailConfig)
		want   func(error) bool
	}{
		{
			name:   "fail/broker-refuses",
			mutate: func(c *RailConfig) { c.NatsURL = other.URL; c.ProveTimeout = 2 * time.Second },
			want:   func(err error) bool { var pe *ProofError; return errors.As(err, &pe) },
		},
		{
			name: "fail/profile-denied",
			mutate: func(c *RailConfig) {
				c.Profile = signerv1.Profile_PROFILE_ADMIN
				c.Params = &signerv1.ProfileParams{Owner: testOwner, Actor: testActor}
			},
			want: func(err error) bool {
				return errors.Is(err, ErrDenied) && ReasonOf(err) == signerv1.Reason_REASON_PROFILE_NOT_ALLOWED
			},
		},
		{
			name:   "fail/channel-denied",
			mutate: func(c *RailConfig) { p := agentParams(); p.AllowPublish = []string{"secret"}; c.Params = p },
			want:   func(err error) bool { return errors.Is(err, ErrDenied) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRail(t, e, tt.mutate)
			err := r.Start(ctxT(t))
			if err == nil || !tt.want(err) {
				t.Fatalf("Start = %v", err)
			}
			if jti, _ := r.Current(); jti != "" {
				t.Fatalf("a refused credential was adopted: %s", jti)
			}
			if err := r.Run(ctxT(t)); !errors.Is(err, ErrNotStarted) {
				t.Fatalf("Run before a successful Start = %v, want ErrNotStarted", err)
			}
		})
	}

	t.Run("fail/start-twice", func(t *testing.T) {
		r := newRail(t, e, nil)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := r.Start(ctxT(t)); !errors.Is(err, ErrStarted) {
			t.Fatalf("second Start = %v, want ErrStarted", err)
		}
	})

	t.Run("fail/other-subject-rejected", func(t *testing.T) {
		r := newRail(t, e, nil)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		jti, _ := r.Current()
		_, pub := newUser(t)
		foreign := mintAgent(t, e.client, pub)
		if _, err := r.accept(ctxT(t), foreign, r.cur.Load().account); !errors.Is(err, ErrSubjectChanged) {
			t.Fatalf("accept(credential for %s) = %v, want ErrSubjectChanged", pub, err)
		}
		if got, _ := r.Current(); got != jti {
			t.Fatalf("Current = %s after a rejected credential, want %s", got, jti)
		}
	})

	t.Run("ok/close-stops-run-and-signing", func(t *testing.T) {
		r := newRail(t, e, nil)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		r.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("Run after Close = %v, want ErrClosed", err)
		}
		if _, err := r.sign([]byte("nonce")); !errors.Is(err, ErrClosed) {
			t.Fatalf("sign after Close = %v, want ErrClosed", err)
		}
		if _, err := nats.Connect(e.url, r.NatsOptions()...); err == nil {
			t.Fatal("connect after Close succeeded")
		}
	})
}

func TestNewRailConfig(t *testing.T) {
	c := &Client{}
	base := RailConfig{Client: c, Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, NatsURL: "nats://127.0.0.1:4222"}
	tests := []struct {
		name   string
		mutate func(*RailConfig)
		ok     bool
	}{
		{name: "ok/minimal", mutate: func(*RailConfig) {}, ok: true},
		{name: "fail/no-client", mutate: func(c *RailConfig) { c.Client = nil }},
		{name: "fail/bad-space", mutate: func(c *RailConfig) { c.Space = " padded" }},
		{name: "fail/no-profile", mutate: func(c *RailConfig) { c.Profile = signerv1.Profile_PROFILE_UNSPECIFIED }},
		{name: "fail/no-url", mutate: func(c *RailConfig) { c.NatsURL = "" }},
		{name: "fail/negative-ttl", mutate: func(c *RailConfig) { c.TTL = -time.Second }},
		{name: "fail/negative-retry", mutate: func(c *RailConfig) { c.RetryInterval = -time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			tt.mutate(&cfg)
			r, err := NewRail(cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("NewRail err = %v, want ok=%v", err, tt.ok)
			}
			if r == nil {
				return
			}
			defer r.Close()
			if !strings.HasPrefix(r.PublicKey(), "U") || r.cfg.RetryInterval != DefaultRetryInterval || r.cfg.ProveTimeout != DefaultProveTimeout {
				t.Fatalf("rail = %s retry %v prove %v", r.PublicKey(), r.cfg.RetryInterval, r.cfg.ProveTimeout)
			}
		})
	}
}

func TestSchedule(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	t.Run("ok/renew-at-75-percent-of-usable-life-after-receipt", func(t *testing.T) {
		// The rail's clock reads ten minutes ahead of signerd's: renewal is timed from receipt.
		got := t0.Add(10 * time.Minute)
		c := &credential{issued: t0, expires: t0.Add(time.Hour + time.Second), received: got}
		if at, want := renewAt(c), got.Add(45*time.Minute); !at.Equal(want) {
			t.Fatalf("renewAt = %v, want %v", at, want)
		}
		// The usable life is exp - iat less a second, for iat's whole-second resolution.
		if want := got.Add(time.Hour); !c.localExpiry().Equal(want) {
			t.Fatalf("localExpiry = %v, want %v", c.localExpiry(), want)
		}
		if at, want := signerNow(c, got.Add(time.Minute)), t0.Add(time.Minute); !at.Equal(want) {
			t.Fatalf("signerNow a minute after receipt = %v, want %v", at, want)
		}
		if expired(c, got.Add(time.Hour-time.Millisecond)) || !expired(c, got.Add(time.Hour)) {
			t.Fatal("expired must turn true one lifetime less a second after receipt")
		}
	})
	tests := []struct {
		name     string
		left     time.Duration
		interval time.Duration
		want     time.Duration
	}{
		{name: "ok/interval-fits", left: time.Hour, interval: time.Minute, want: time.Minute},
		{name: "ok/midpoint-near-expiry", left: 30 * time.Second, interval: time.Minute, want: 15 * time.Second},
		{name: "ok/floor-no-busy-loop", left: 10 * time.Millisecond, interval: time.Minute, want: minRetry},
		{name: "ok/floor-after-expiry", left: -time.Second, interval: time.Minute, want: minRetry},
		{name: "ok/short-interval-is-its-own-floor", left: 10 * time.Millisecond, interval: 20 * time.Millisecond, want: 20 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryDelay(t0, t0.Add(tt.left), tt.interval); got != tt.want {
				t.Fatalf("retryDelay = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRailClockSkew is finding 9's rail clock: a client whose wall clock is minutes off still
// renews, because Remint proofs are dated from the credential's iat plus the time elapsed since
// it arrived, not from the local wall clock (signerd accepts proofs within ProofWindow, ±60 s).
func TestRailClockSkew(t *testing.T) {
	for _, tt := range []struct {
		name string
		skew time.Duration
	}{
		{name: "ok/client-clock-5m-ahead", skew: 5 * time.Minute},
		{name: "ok/client-clock-5m-behind", skew: -5 * time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := startEnv(t, shortPolicy("3s", "own"))
			var logs logBuffer
			renewed := make(chan string, 8)
			r := newRail(t, e, func(c *RailConfig) {
				c.Logger = newLogger(&logs)
				c.RetryInterval = 200 * time.Millisecond
				// time.Now().Add keeps the monotonic reading: the skew is a fixed wall-clock offset.
				c.Now = func() time.Time { return time.Now().Add(tt.skew) }
				c.OnRenew = func(jti string, _ time.Time) { renewed <- jti }
			})
			if err := r.Start(ctxT(t)); err != nil {
				t.Fatalf("Start with a client clock %v off: %v", tt.skew, err)
			}
			origJTI, _ := r.Current()
			done := runRail(t, r)
			select {
			case jti := <-renewed:
				if jti == origJTI || jti == "" {
					t.Fatalf("renewed jti = %q, want a new credential after %q", jti, origJTI)
				}
			case err := <-done:
				t.Fatalf("Run returned %v before any renewal; log:\n%s", err, logs.String())
			case <-time.After(10 * time.Second):
				t.Fatalf("no renewal within 10s; log:\n%s", logs.String())
			}
			if n := logs.count("credential renewal failed"); n != 0 {
				t.Fatalf("%d failed renewals with a client clock %v off; log:\n%s", n, tt.skew, logs.String())
			}
			c := connectChat(t, e.url, r.NatsOptions()...)
			if err := c.roundTrip(5 * time.Second); err != nil {
				t.Fatalf("round trip on the renewed credential: %v", err)
			}
		})
	}
}

// TestRailExpiredCredentialNotPresented is finding 9's expired JWT: once the credential has
// expired without renewal, NatsOptions' JWT callback refuses with ErrExpired, so nats.go's
// connect and reconnect fail on the client instead of presenting the expired JWT.
func TestRailExpiredCredentialNotPresented(t *testing.T) {
	t.Run("fail/expired-credential-refused-by-callback", func(t *testing.T) {
		e := startEnv(t, shortPolicy("2s", "none"))
		r := newRail(t, e, func(c *RailConfig) {
			c.RetryInterval = 100 * time.Millisecond
		})
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatalf("Start: %v", err)
		}
		expiredJWT := r.cur.Load().jwt

		// Wrap the rail's JWT callback as nats.go calls it, to see what every reconnect gets.
		var o nats.Options
		for _, opt := range r.NatsOptions() {
			if err := opt(&o); err != nil {
				t.Fatal(err)
			}
		}
		var (
			mu         sync.Mutex
			gaveUp     bool
			afterCalls int
			afterJWTs  int
			lastErr    error
		)
		userJWT := func() (string, error) {
			tok, err := o.UserJWT()
			mu.Lock()
			defer mu.Unlock()
			if gaveUp {
				afterCalls++
				if err == nil {
					afterJWTs++
				}
				lastErr = err
			}
			return tok, err
		}
		opts := append(r.NatsOptions(),
			nats.UserJWT(userJWT, o.SignatureCB),
			nats.ReconnectWait(50*time.Millisecond),
			nats.MaxReconnects(-1),
		)
		nc, err := nats.Connect(e.url, opts...)
		if err != nil {
			t.Fatalf("connect with the fresh credential: %v", err)
		}
		t.Cleanup(nc.Close)

		select {
		case err := <-runRail(t, r):
			if !errors.Is(err, ErrExpired) {
				t.Fatalf("Run = %v, want ErrExpired", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not give up after the credential expired")
		}
		mu.Lock()
		gaveUp = true
		mu.Unlock()

		testkit.Eventually(t, 10*time.Second, func() error {
			// nats.go calls userJWT holding the connection's lock, so ask the connection
			// before taking mu, never while holding it.
			if nc.IsConnected() {
				return errors.New("connection still up on the expired credential")
			}
			mu.Lock()
			defer mu.Unlock()
			if afterCalls == 0 {
				return errors.New("no reconnect attempt asked for a JWT since expiry")
			}
			return nil
		})
		mu.Lock()
		if afterJWTs != 0 || !errors.Is(lastErr, ErrExpired) {
			t.Fatalf("after expiry the callback handed out %d JWTs in %d calls (last error %v), want none and ErrExpired", afterJWTs, afterCalls, lastErr)
		}
		mu.Unlock()
		if tok, err := o.UserJWT(); tok == expiredJWT || !errors.Is(err, ErrExpired) {
			t.Fatalf("callback after expiry = (same JWT %v, %v), want ErrExpired", tok == expiredJWT, err)
		}
		if _, err := nats.Connect(e.url, r.NatsOptions()...); !errors.Is(err, ErrExpired) {
			t.Fatalf("connect after expiry = %v, want ErrExpired from the rail", err)
		}
	})
}

func TestRailRenewNow(t *testing.T) {
	t.Run("ok/renew-now-adopts-a-proven-credential", func(t *testing.T) {
		e := startEnv(t, shortPolicy("1h", "own"))
		var renewed atomic.Int32
		r := newRail(t, e, func(c *RailConfig) { c.OnRenew = func(string, time.Time) { renewed.Add(1) } })
		if _, err := r.RenewNow(ctxT(t)); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("RenewNow before Start = %v, want ErrNotStarted", err)
		}
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		done := runRail(t, r)
		first, _ := r.Current()
		// Two renewals in the same second with the same lifetime may yield the same JWT (the jti
		// is derived from the claims), so wait for the next second on signerd's clock.
		testkit.Eventually(t, 5*time.Second, func() error {
			got, err := r.RenewNow(ctxT(t))
			if err != nil {
				return err
			}
			if got.JTI == first {
				return errors.New("same jti")
			}
			return nil
		})
		jti, exp := r.Current()
		if jti == first || exp.IsZero() {
			t.Fatalf("Current = %s %v after RenewNow, first %s", jti, exp, first)
		}
		if renewed.Load() == 0 {
			t.Fatal("OnRenew was not called")
		}
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		default:
		}
	})
	t.Run("fail/renew-now-refused-keeps-current", func(t *testing.T) {
		e := startEnv(t, shortPolicy("1h", "own"))
		r := newRail(t, e, nil)
		if err := r.Start(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		first, _ := r.Current()
		e.s.Stop(t)
		if _, err := r.RenewNow(ctxT(t)); err == nil {
			t.Fatal("RenewNow with signerd stopped succeeded")
		}
		if jti, _ := r.Current(); jti != first {
			t.Fatalf("Current = %s after a failed RenewNow, want %s", jti, first)
		}
	})
}
