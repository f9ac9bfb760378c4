package service_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/authd/service"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// newEnvStores is newEnv with the space provisioned item by item on a signerd-minted provisioner
// credential, each Plan item passed through edit first (nil drops it): a space provisioned before
// the records store, or with a store in another shape.
func newEnvStores(t *testing.T, edit func(provision.Item) *provision.Item) *env {
	t.Helper()
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{sp}})
	ns := sg.StartBrokerServer(t)
	url := ns.ClientURL()
	mgr, err := signerclient.Dial(signerclient.Config{Addr: sg.Addr, TLS: sg.ClientFor(t, "managerd", sp)})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: mgr, Space: sp, Profile: signerv1.Profile_PROFILE_PROVISIONER, NatsURL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer rail.Close()
	if err := rail.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, rail.NatsOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	items, err := provision.Plan(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if e := edit(it); e != nil {
			if _, err := js.CreateStream(ctxT(t), e.Config); err != nil {
				t.Fatalf("create %s: %v", e.Name, err)
			}
		}
	}
	return &env{sg: sg, ns: ns, url: url}
}

// TestStoreCheck: authd starts only on a space whose auth and records stores exist as
// provision.Plan makes them; otherwise it refuses with CodeStore naming the bucket, before the
// plane claim writes anything.
func TestStoreCheck(t *testing.T) {
	refused := func(t *testing.T, e *env, bucket, reason string, cause error) {
		t.Helper()
		cfg := e.config(t)
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		var se *service.StartError
		if !errors.As(err, &se) || se.Code != service.CodeStore || se.Details["bucket"] != bucket ||
			!strings.Contains(se.Reason, bucket) || !strings.Contains(se.Reason, reason) || !errors.Is(err, cause) {
			t.Fatalf("start = %v; want STORE naming %s (%s)", err, bucket, reason)
		}
		if row, ok := e.planeRow(t); ok {
			t.Fatalf("a refused start wrote the plane row: %v", row)
		}
	}
	t.Run("fail/records bucket missing", func(t *testing.T) {
		e := newEnvStores(t, func(it provision.Item) *provision.Item {
			if it.Name == "cotal_records_alpha" {
				return nil
			}
			return &it
		})
		refused(t, e, "cotal_records_alpha", "does not exist", jetstream.ErrStreamNotFound)
	})
	t.Run("fail/records bucket with a max age", func(t *testing.T) {
		e := newEnvStores(t, func(it provision.Item) *provision.Item {
			if it.Name == "cotal_records_alpha" {
				it.Config.MaxAge = time.Hour
			}
			return &it
		})
		refused(t, e, "cotal_records_alpha", "another configuration", provision.ErrMismatch)
	})
	t.Run("fail/auth bucket without per-key TTLs", func(t *testing.T) {
		e := newEnvStores(t, func(it provision.Item) *provision.Item {
			if it.Name == "cotal_auth_alpha" {
				it.Config.AllowMsgTTL = false
				it.Config.SubjectDeleteMarkerTTL = 0
			}
			return &it
		})
		refused(t, e, "cotal_auth_alpha", "another configuration", provision.ErrMismatch)
	})
	t.Run("ok/both stores as provisioned", func(t *testing.T) {
		e := newEnv(t)
		s := start(t, e.config(t))
		if !s.Ready() {
			t.Fatalf("state %v", s.State())
		}
	})
}
