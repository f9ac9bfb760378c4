package service_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestStartRefusals: a start that cannot serve is refused with a stable code naming why.
func TestStartRefusals(t *testing.T) {
	t.Run("fail/unprovisioned-space-names-the-stream", func(t *testing.T) {
		e := plane3test.Unprovisioned(t)
		_, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "d")}, service.RuntimeOptions{Getenv: noEnv})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeMissing || !strings.Contains(err.Error(), "CHAT_"+e.N.Token()) {
			t.Fatalf("start = %v; want MISSING naming CHAT_%s", err, e.N.Token())
		}
	})
	t.Run("fail/unknown-caller-is-a-signer-refusal", func(t *testing.T) {
		e := plane3test.New(t)
		cfg := servicetest.Config(t, e, "d")
		cf := e.S.Client(t, signerdtest.ID("somebody", plane3test.Space))
		cfg.Signer.Cert, cfg.Signer.Key = cf.CertFile, cf.KeyFile
		_, err := service.Start(ctx(t), service.Inputs{Config: cfg}, service.RuntimeOptions{Getenv: noEnv})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeSigner {
			t.Fatalf("start = %v; want SIGNER", err)
		}
	})
	t.Run("fail/bad-watchdog-env", func(t *testing.T) {
		e := plane3test.New(t)
		_, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "d")},
			service.RuntimeOptions{Getenv: func(k string) string {
				if k == "COTAL_DELIVERY_BROKER_GONE_MS" {
					return "soon"
				}
				return ""
			}})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), "COTAL_DELIVERY_BROKER_GONE_MS") {
			t.Fatalf("start = %v; want CONFIG naming the variable", err)
		}
	})
}

// recorder is a Responders that records its calls and the fence it was handed.
type recorder struct {
	mu            sync.Mutex
	starts, stops int
	hooks         service.Hooks
	// failResumes makes that many starts after the first fail, as a bind that times out while
	// JetStream elects a leader does.
	failResumes int
	failed      int
}

func (r *recorder) Start(context.Context, *nats.Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	if r.starts > 1 && r.failed < r.failResumes {
		r.failed++
		return errors.New("stream CHAT_alpha: context deadline exceeded")
	}
	return nil
}

func (r *recorder) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops++
}

func (r *recorder) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, r.stops
}

// TestResponders: the responders seam is started with the loops, stopped on every quiesce,
// started again on resume, and handed the fence and the renewer.
func TestResponders(t *testing.T) {
	e := plane3test.New(t)
	rec := &recorder{}
	var logs logBuffer
	svc, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "d")}, service.RuntimeOptions{
		Logger: logs.logger(), Getenv: noEnv,
		Responders: func(h service.Hooks) (service.Responders, error) { rec.hooks = h; return rec, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, svc)
	if s, st := rec.counts(); s != 1 || st != 0 || !rec.hooks.MayAct() || rec.hooks.Renewer == nil || rec.hooks.SignerAddress != e.S.Addr || rec.hooks.Identity == "" {
		t.Fatalf("after start: starts %d stops %d hooks %+v", s, st, rec.hooks)
	}
	renewed, err := rec.hooks.Renewer.RenewNow(ctx(t))
	if err != nil || renewed.JTI == "" || !renewed.Expires.After(renewed.Issued) {
		t.Fatalf("RenewNow = %+v, %v", renewed, err)
	}
	kv := servicetest.DeliveryKV(t, e)
	if err := kv.Delete(ctx(t), space.DeliveryLeaseKey); err != nil {
		t.Fatal(err)
	}
	// At least one quiesce and resume, and running again: a renewal that lands in the same
	// moment may make a second round on a loaded machine (make check failed once on an exact 2/1).
	// The watch sees the delete at once; if a loaded machine delays it, the next renewal (every
	// 15 s) finds the row gone, so the wait outlasts one renew interval.
	eventually(t, 20*time.Second, func() error {
		if s, st := rec.counts(); s < 2 || s != st+1 || !rec.hooks.MayAct() {
			return fmt.Errorf("no quiesce and resume yet (starts %d, stops %d, mayAct %v)", s, st, rec.hooks.MayAct())
		}
		return nil
	})
	if err := svc.Close(ctx(t)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if s, st := rec.counts(); s < 2 || st != s || rec.hooks.MayAct() {
		t.Fatalf("after Close: starts %d stops %d mayAct %v", s, st, rec.hooks.MayAct())
	}
}

// TestResumeRetries: a resume whose responders fail to bind (twice here) stays quiesced and is
// tried again instead of stopping deliveryd; the third try serves.
func TestResumeRetries(t *testing.T) {
	e := plane3test.New(t)
	rec := &recorder{failResumes: 2}
	var logs logBuffer
	svc, err := service.Start(ctx(t), service.Inputs{Config: servicetest.Config(t, e, "d")}, service.RuntimeOptions{
		Logger: logs.logger(), Getenv: noEnv,
		Responders: func(h service.Hooks) (service.Responders, error) { rec.hooks = h; return rec, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, svc)
	if err := servicetest.DeliveryKV(t, e).Delete(ctx(t), space.DeliveryLeaseKey); err != nil {
		t.Fatal(err)
	}
	eventually(t, 25*time.Second, func() error {
		rec.mu.Lock()
		failed := rec.failed
		rec.mu.Unlock()
		// The fence lifts before "resumed" is logged: wait for the line too.
		if failed < 2 || !rec.hooks.MayAct() || !logs.has(`"resumed"`) {
			return fmt.Errorf("failed resumes %d, serving %v, resumed logged %v", failed, rec.hooks.MayAct(), logs.has(`"resumed"`))
		}
		return nil
	})
	select {
	case <-svc.Done():
		t.Fatalf("deliveryd stopped: %v", svc.Err())
	default:
	}
	if !logs.has("resume failed; staying quiesced and trying again") || !logs.has(`"resumed"`) {
		t.Fatalf("logs lack the retried resume:\n%s", logs.String())
	}
}

// TestCloseWaitsForBroker: Close with the broker down waits (up to the window) for it, then
// releases the lease.
func TestCloseWaitsForBroker(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	b := startBroker(t, s)
	e := plane3test.On(t, s, b.NS.ClientURL())
	var logs logBuffer
	cfg := servicetest.Config(t, e, "deliveryd-a")
	cfg.BrokerGone = yamlx.Duration(10 * time.Second)
	svc := start(t, cfg, &logs)
	b.Stop()
	eventually(t, 5*time.Second, func() error {
		if !logs.has("broker connection lost") {
			return errors.New("not disconnected yet")
		}
		return nil
	})
	closed := make(chan struct{})
	var closeErr error
	go func() {
		closeErr = svc.Close(ctx(t))
		close(closed)
	}()
	eventually(t, 10*time.Second, func() error {
		if !logs.has("waiting for the broker connection to release the delivery lease") {
			return errors.New("Close is not waiting yet")
		}
		return nil
	})
	select {
	case <-closed:
		t.Fatal("Close returned without the broker")
	default:
	}
	b.Start()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatalf("Close did not return:\n%s", logs.String())
	}
	if closeErr != nil || !logs.has("delivery lease released") {
		t.Fatalf("Close = %v; lease not released:\n%s", closeErr, logs.String())
	}
	if _, _, err := servicetest.LeaseRow(ctx(t), servicetest.DeliveryKV(t, e)); !errors.Is(err, servicetest.ErrNoRow) {
		t.Fatalf("lease row after Close: %v; want none", err)
	}
}
