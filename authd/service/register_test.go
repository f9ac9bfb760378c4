package service_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cotalgo/cotal/managerd/manager"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestRegisterManagerThroughAuthd: a real managerd registers each start with a real authd over the
// register-manager rail authd serves on its plane connection (auth-plane and supervisor
// credentials from signerd): epochs 0 and 1 over a restart. The rail's refusals (a non-holder,
// a bad body) are authority's TestRegisterManagerRail.
func TestRegisterManagerThroughAuthd(t *testing.T) {
	e := newEnv(t)
	start(t, e.config(t))
	files := e.sg.ClientFor(t, "managerd", sp)
	dir := t.TempDir()
	cfg := &manager.Config{
		Space: sp, Brokers: []string{e.url},
		Signer:   signerclient.FileConfig{Address: e.sg.Addr, CA: files.ServerCAFile, Cert: files.CertFile, Key: files.KeyFile},
		StateDir: filepath.Join(dir, "state"), InstanceID: "regthroughauthd00000000000", Root: filepath.Join(dir, "root"),
		Owner: "m1", Actor: "s1",
		Launcher:   manager.LauncherConfig{Socket: filepath.Join(dir, "l", "launcher.sock"), TokenFile: filepath.Join(dir, "t", "token")},
		API:        manager.APIConfig{Socket: filepath.Join(dir, "api", "manager.sock"), AllowUIDs: []uint32{uint32(os.Getuid())}},
		Connectors: []string{"echo"}, EnvAllow: []string{"TERM"}, Capacity: 2,
	}
	for i := range 2 {
		m, err := manager.Start(ctxT(t), manager.Inputs{Config: cfg}, manager.RuntimeOptions{})
		if err != nil {
			t.Fatalf("managerd start %d: %v", i, err)
		}
		testkit.Eventually(t, 30*time.Second, func() error {
			r, ok, err := m.Registration()
			if !ok {
				return fmt.Errorf("start %d not registered yet (last error %v)", i, err)
			}
			if r.ProcessEpoch != uint64(i) {
				t.Fatalf("start %d registered at epoch %d", i, r.ProcessEpoch)
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = m.Close(ctx)
		cancel()
		if err != nil {
			t.Fatalf("managerd close %d: %v", i, err)
		}
	}
}
