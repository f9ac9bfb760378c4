package service_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// planeConn is an auth-plane connection of its own (authd's identity may mint one), to play
// another instance or an operator touching the plane row.
func (e *env) planeConn(t *testing.T) (*nats.Conn, jetstream.KeyValue, string) {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.sg.Addr, TLS: e.sg.ClientFor(t, "authd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: sp, Profile: signerv1.Profile_PROFILE_AUTH_PLANE, NatsURL: e.url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, append(rail.NatsOptions(), nats.NoReconnect())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	n, _ := space.NewNames(sp)
	bucket, _ := n.Bucket(space.Auth)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctxT(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return nc, kv, bucket
}

// TestPlaneTaken: when another instance's row replaces authd's plane claim, authd stops serving
// (Done, ErrPlaneTaken, discovery file gone) and leaves the other row alone.
func TestPlaneTaken(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	var ev events
	s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Events: ev.on})
	nc, kv, bucket := e.planeConn(t)
	if err := kv.Delete(ctxT(t), "plane"); err != nil {
		t.Fatal(err)
	}
	other, err := lease.Acquire(ctxT(t), lease.Config{Conn: nc, Bucket: bucket, Key: "plane", Holder: "intruder", KeyTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("authd still serving after its claim was taken")
	}
	if !errors.Is(s.Err(), service.ErrPlaneTaken) {
		t.Fatalf("Err = %v, want ErrPlaneTaken", s.Err())
	}
	ev.waitStates(t, 0, "ready/READY", "unavailable/STOPPING", "stopped/PLANE_TAKEN")
	if _, err := os.Stat(daemon.DiscoveryPath(cfg.StateDir, service.FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("discovery file after losing the claim: %v", err)
	}
	row, ok := e.planeRow(t)
	if !ok || row["holder"] != "intruder" || row["incarnation"] != other.Row().Incarnation {
		t.Fatalf("the other instance's row was touched: %v", row)
	}
}

// TestPlaneGone: a deleted plane row is created again by the holder, which keeps serving.
func TestPlaneGone(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	var ev events
	s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Events: ev.on})
	before, _ := e.planeRow(t)
	_, kv, _ := e.planeConn(t)
	if err := kv.Delete(ctxT(t), "plane"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		row, ok := e.planeRow(t)
		if !ok || row["incarnation"] != before["incarnation"] || row["ready"] != true {
			return errors.New("plane row not re-created yet")
		}
		return nil
	})
	if !ev.warned(service.CodePlane) || s.State() != service.StateReady {
		t.Fatalf("PLANE warning %v, state %s; want the warning, still ready", ev.warned(service.CodePlane), s.State())
	}
	select {
	case <-s.Done():
		t.Fatalf("authd stopped: %v", s.Err())
	default:
	}
	if _, err := service.Ready(readyCtx(t), cfg.StateDir, os.Getpid()); err != nil {
		t.Fatalf("Ready = %v", err)
	}
}
