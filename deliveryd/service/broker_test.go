package service_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/deliveryd/internal/watchdog"
	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// startBroker is a broker the test stops and starts again (signerdtest.Broker).
func startBroker(t *testing.T, s *signerdtest.Signer) *signerdtest.Broker {
	return s.StartRestartableBroker(t)
}

// TestBrokerGone (e): the watchdog on the resident connection's own events.
func TestBrokerGone(t *testing.T) {
	t.Run("fail/broker-stopped-fatal-after-window", func(t *testing.T) {
		s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
		b := startBroker(t, s)
		e := plane3test.On(t, s, b.NS.ClientURL())
		var logs logBuffer
		cfg := servicetest.Config(t, e, "deliveryd-a")
		cfg.BrokerGone = yamlx.Duration(time.Second)
		svc := start(t, cfg, &logs)
		b.Stop()
		err := stopped(t, svc, 15*time.Second, &logs)
		var ge *watchdog.GoneError
		if !errors.As(err, &ge) || ge.Limit != "window" || ge.Max != time.Second || ge.Down < time.Second {
			t.Fatalf("Err = %v; want the broker-gone verdict after the 1s window\n%s", err, logs.String())
		}
		if !logs.has("broker connection lost") {
			t.Fatalf("no disconnect logged:\n%s", logs.String())
		}
	})
	t.Run("ok/broker-restart-within-window", func(t *testing.T) {
		s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
		b := startBroker(t, s)
		e := plane3test.On(t, s, b.NS.ClientURL())
		members(t, e)
		var logs logBuffer
		cfg := servicetest.Config(t, e, "deliveryd-a")
		const window = 3 * time.Second
		cfg.BrokerGone = yamlx.Duration(window)
		svc := start(t, cfg, &logs)
		bob := plane3test.Receive(t, e, "bob", uidBob)
		ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
		e.Post(t, ajs, "alice", "before", "before the restart")
		eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"before"}) })

		down := time.Now()
		b.Stop()
		b.Start()
		eventually(t, 10*time.Second, func() error {
			if !logs.has("broker connection restored") {
				return errors.New("not reconnected yet")
			}
			return nil
		})
		// Delivery works again, once alice's own connection is back and CHAT answers.
		eventually(t, 15*time.Second, func() error {
			_, err := ajs.Stream(ctx(t), e.N.ChatStream())
			return err
		})
		e.Post(t, ajs, "alice", "after", "after the restart")
		eventually(t, 15*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"before", "after"}) })
		// The reconnect cleared the clock: twice the window after the stop, it still serves.
		eventually(t, 4*window, func() error {
			select {
			case <-svc.Done():
				t.Fatalf("stopped after a restart within the window: %v\n%s", svc.Err(), logs.String())
			default:
			}
			if time.Since(down) < 2*window {
				return errors.New("watching")
			}
			return nil
		})
	})
}

// deliveryPolicy is signerdtest's default policy with the delivery profile's lifetime capped at ttl.
func deliveryPolicy(t *testing.T, ttl string) string {
	t.Helper()
	p := strings.Replace(signerdtest.DefaultPolicy, "delivery: {ttl_max: 24h", "delivery: {ttl_max: "+ttl, 1)
	if p == signerdtest.DefaultPolicy {
		t.Fatal("policy not changed")
	}
	return p
}

// TestRenewal (f): the delivery credential renews on a short TTL policy, and a missed renewal
// keeps the current one until it expires.
func TestRenewal(t *testing.T) {
	t.Run("ok/delivery-across-renewals", func(t *testing.T) {
		e := plane3test.NewWith(t, signerdtest.Options{Policy: deliveryPolicy(t, "4s")})
		members(t, e)
		var logs logBuffer
		svc := start(t, servicetest.Config(t, e, "deliveryd-a"), &logs)
		bob := plane3test.Receive(t, e, "bob", uidBob)
		ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
		var want []string
		for round := 1; round <= 3; round++ {
			eventually(t, 10*time.Second, func() error {
				if n := strings.Count(logs.String(), `"msg":"credential renewed"`); n < round {
					return errors.New("waiting for a renewal")
				}
				return nil
			})
			id := "r-" + string(rune('0'+round))
			want = append(want, id)
			e.Post(t, ajs, "alice", id, "after a renewal")
			eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), want) })
		}
		select {
		case <-svc.Done():
			t.Fatalf("stopped: %v", svc.Err())
		default:
		}
	})
	t.Run("ok/signerd-stopped-delivery-until-expiry", func(t *testing.T) {
		e := plane3test.NewWith(t, signerdtest.Options{Policy: deliveryPolicy(t, "8s")})
		members(t, e)
		var logs logBuffer
		var ev events
		svc, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "deliveryd-a")},
			service.RuntimeOptions{Logger: logs.logger(), Getenv: noEnv, Events: ev.on})
		if err != nil {
			t.Fatal(err)
		}
		closeAtEnd(t, svc)
		bob := plane3test.Receive(t, e, "bob", uidBob)
		ajs := plane3test.JS(t, e.Agent(t, "alice", uidAlice))
		e.S.Stop(t)
		e.Post(t, ajs, "alice", "one", "signerd stopped")
		eventually(t, 10*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"one"}) })
		eventually(t, 10*time.Second, func() error {
			if !logs.has("credential renewal failed; keeping the current credential") {
				return errors.New("no missed renewal logged yet")
			}
			return nil
		})
		select {
		case <-svc.Done():
			t.Fatalf("stopped before expiry: %v", svc.Err())
		default:
			e.Post(t, ajs, "alice", "two", "renewal missed, credential still live")
		}
		eventually(t, 5*time.Second, func() error { return servicetest.Exactly(bob.IDs(), []string{"one", "two"}) })
		err = stopped(t, svc, 15*time.Second, &logs)
		if !errors.Is(err, signerclient.ErrExpired) || !errors.Is(err, service.ErrCredentialExpired) {
			t.Fatalf("Err = %v; want the credential's expiry\n%s", err, logs.String())
		}
		// Each retried renewal was a CREDENTIAL warning; the stop is reported as CREDENTIAL.
		if w := strings.Count(strings.Join(ev.warnings(), " "), service.CodeCredential); w < 1 {
			t.Fatalf("no CREDENTIAL warning; warnings %v", ev.warnings())
		}
		if st := ev.states(); len(st) == 0 || st[0] != "ready/READY" || st[len(st)-1] != "stopped/CREDENTIAL" {
			t.Fatalf("states = %v; want ready ... stopped/CREDENTIAL", st)
		}
	})
}

// TestCloseRenewsDuringRelease: the rail goes on renewing the delivery credential until the lease
// is released. A proxy withholds the broker's reply to the release's delete (the delete lands) on
// the connection that sent it, and on nothing else. With renewals running, the rail renews within
// 3/4 of the 4 s credential's life and the resident connection moves onto the new credential,
// which ends the withheld connection; the release's retry then finds its row gone. With renewals
// stopped at the start of the teardown (the old order), the credential expires under the withheld
// connection, no reconnect can authenticate, and the release is left to the TTL.
func TestCloseRenewsDuringRelease(t *testing.T) {
	e := plane3test.NewWith(t, signerdtest.Options{Policy: deliveryPolicy(t, "4s")})
	p := testkit.StartHoldProxy(t, strings.TrimPrefix(e.URL, "nats://"))
	var logs logBuffer
	cfg := servicetest.Config(t, e, "deliveryd-a")
	cfg.Brokers = []string{"nats://" + p.Addr}
	svc := start(t, cfg, &logs)
	renewals := func() int { return strings.Count(logs.String(), `"msg":"credential renewed"`) }

	p.Arm("KV-Operation: DEL")
	before := renewals()
	closed := make(chan error, 1)
	go func() { closed <- svc.Close(ctx(t)) }()
	eventually(t, 10*time.Second, func() error {
		if p.Held() == 0 {
			return errors.New("the release's delete has not been sent yet")
		}
		return nil
	})
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close = %v; want the lease released\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Close did not return\n%s", logs.String())
	}
	if n := renewals(); n <= before {
		t.Fatalf("credential renewals during the release: %d; want at least one\n%s", n-before, logs.String())
	}
	if !logs.has("delivery lease released") {
		t.Fatalf("no release logged\n%s", logs.String())
	}
	if _, _, err := servicetest.LeaseRow(ctx(t), servicetest.DeliveryKV(t, e)); !errors.Is(err, servicetest.ErrNoRow) {
		t.Fatalf("lease row after Close: %v; want none", err)
	}
}
