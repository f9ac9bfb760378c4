package service_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Cleanup()
	agentBinaries.Remove()
	os.Exit(code)
}

// TestPlaneReclaimCluster: on a 3-node cluster (real nats-server processes, the space at three
// replicas) the sweep hears every server: a holder connected to another node than the successor
// is found live there; with a node down the sweep is inconclusive (that node is a peer of the
// auth bucket's stream, so its answer is required even though the cluster no longer advertises
// it); with every node back and the holder killed, the successor reclaims before the TTL.
func TestPlaneReclaimCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{sp}})
	c := cluster.Start(t, sg, 3)
	plane3test.OnWith(t, sg, c.URLList(), provision.Options{Replicas: 3})
	e := &env{sg: sg, url: c.URL(0)}

	holderCfg := e.config(t)
	holderCfg.Brokers = []string{c.URL(2)}
	holderCfg.PlaneTTL = yamlx.Duration(reclaimTTL)
	holder := startChild(t, holderCfg)
	if _, err := service.Ready(readyCtx(t), holderCfg.StateDir, holder.cmd.Process.Pid); err != nil {
		t.Fatalf("holder not ready: %v\n%s", err, holder.stderr.String())
	}
	held, _ := e.planeRow(t)

	t.Run("fail/holder-live-on-another-node", func(t *testing.T) {
		cfg := e.config(t)
		cfg.PlaneTTL = yamlx.Duration(reclaimTTL)
		_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
		planeHeld(t, err, service.ErrHolderLive)
		t.Logf("refusal: %v", err)
		if !strings.Contains(err.Error(), "server n3") {
			t.Fatalf("refusal %v: want the holder found on n3", err)
		}
	})

	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	holder.exitCode(t)
	killed := time.Now()

	t.Run("fail/node-down-inconclusive", func(t *testing.T) {
		if err := c.Stop(1); err != nil {
			t.Fatal(err)
		}
		cfg := e.config(t)
		cfg.PlaneTTL = yamlx.Duration(reclaimTTL)
		var err error
		testkit.Eventually(t, 20*time.Second, func() error {
			var s *service.Service
			s, err = service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
			if err == nil {
				closeNow(s)
				t.Fatal("reclaimed while a node was down")
			}
			if errors.Is(err, service.ErrSweepInconclusive) && strings.Contains(err.Error(), "n2") {
				return nil
			}
			return err
		})
		t.Logf("refusal: %v", err)
		if row, ok := e.planeRow(t); !ok || row["incarnation"] != held["incarnation"] {
			t.Fatalf("the holder's row was touched: %v", row)
		}
		if err := c.Restart(1); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitHealthy(cluster.StartTimeout); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ok/every-node-answers-reclaimed", func(t *testing.T) {
		cfg := e.config(t)
		cfg.PlaneTTL = yamlx.Duration(reclaimTTL)
		var s *service.Service
		testkit.Eventually(t, reclaimTTL/2, func() error {
			var err error
			s, err = service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
			return err
		})
		closeAtEnd(t, s)
		took := time.Since(killed)
		t.Logf("reclaimed %v after the holder was killed (TTL %v)", took.Round(time.Millisecond), reclaimTTL)
		if took >= reclaimTTL/2 {
			t.Fatalf("reclaim took %v", took)
		}
		if row, ok := e.planeRow(t); !ok || row["instance"] != s.InstanceID() {
			t.Fatalf("row after the reclaim %v", row)
		}
	})
}
