package authority

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cotalgo/cotal/managerd/manager"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestManagerdRegisters: three starts of a real managerd (its supervisor credential from a real
// signerd) against the authority serving the rail on authd's real auth-plane credential register
// epochs 0, 1 and 2; each start rewrites its lease row with its epoch and revision and writes its
// identity file, and its Close releases the rewritten row. It needs the profiles
// (auth-plane's lifecycle rows and rail, the supervisor's register-manager grant: branch
// h-profiles). A non-holder's refusal is TestRegisterManagerRail's.
func TestManagerdRegisters(t *testing.T) {
	e := plane3test.New(t)
	plane := e.Conn(t, mtls.KindAuthd, signerv1.Profile_PROFILE_AUTH_PLANE, nil)
	s, err := NewStore(plane, e.N, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a := newAuthority(t, s, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := a.ServeRegisterManager(ctx, plane)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	files := e.S.ClientFor(t, mtls.KindManagerd, plane3test.Space)
	dir := t.TempDir()
	cfg := &manager.Config{
		Space: plane3test.Space, Brokers: []string{e.URL},
		Signer:   signerclient.FileConfig{Address: e.S.Addr, CA: files.ServerCAFile, Cert: files.CertFile, Key: files.KeyFile},
		StateDir: filepath.Join(dir, "state"), InstanceID: regIID, Root: filepath.Join(dir, "root"),
		Owner: "m1", Actor: "s1", AgentOwner: plane3test.Owner,
		Launcher:   manager.LauncherConfig{Socket: filepath.Join(dir, "l", "launcher.sock"), TokenFile: filepath.Join(dir, "t", "token")},
		API:        manager.APIConfig{Socket: filepath.Join(dir, "api", "manager.sock"), AllowUIDs: []uint32{uint32(os.Getuid())}},
		Connectors: []string{"echo"}, EnvAllow: []string{"TERM"}, Capacity: 2,
	}
	var lastRev uint64
	for i := range 3 {
		m, err := manager.Start(ctx, manager.Inputs{Config: cfg}, manager.RuntimeOptions{})
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		var reg manager.Registration
		testkit.Eventually(t, 30*time.Second, func() error {
			r, ok, err := m.Registration()
			if !ok {
				return fmt.Errorf("start %d not registered yet (last error %v)", i, err)
			}
			reg = r
			return nil
		})
		if reg.ProcessEpoch != uint64(i) || reg.RegistrationRevision <= lastRev || reg.Generation != uint64(2*i+1) {
			t.Fatalf("start %d registered %+v", i, reg)
		}
		lastRev = reg.RegistrationRevision
		// ManagerService Status shows the same registration.
		c, closer, err := managerclient.Dial(ctx, cfg.API.Socket)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Status(ctx, &managerv1.StatusRequest{})
		closer.Close()
		if err != nil || !st.GetRegistration().GetRegistered() || st.GetRegistration().GetProcessEpoch() != reg.ProcessEpoch ||
			st.GetRegistration().GetRegistrationRevision() != reg.RegistrationRevision {
			t.Fatalf("Status after start %d: %v, %v", i, st.GetRegistration(), err)
		}
		l, _, ok, err := s.Lease(ctx, regIID)
		if err != nil || !ok || l.Holder != "m1.s1" || l.ProcessEpoch != reg.ProcessEpoch || l.RegistrationRevision != reg.RegistrationRevision {
			t.Fatalf("lease row after start %d = %+v (found %v, %v)", i, l, ok, err)
		}
		path := filepath.Join(cfg.StateDir, manager.IdentityFile)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v", path, fi, err)
		}
		b, _ := os.ReadFile(path)
		var id map[string]any
		if err := json.Unmarshal(b, &id); err != nil || len(id) != 3 || id["v"] != float64(1) || id["space"] != plane3test.Space || id["instanceId"] != regIID {
			t.Fatalf("identity file %q: %v", b, err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = m.Close(cctx)
		ccancel()
		if err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		if _, _, ok, _ := s.Lease(ctx, regIID); ok {
			t.Fatalf("the rewritten lease row of start %d was not released", i)
		}
	}
	if g, _, _, err := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID); err != nil || g.ProcessEpoch != 2 || g.Principal != "m1.s1" {
		t.Fatalf("gate = %+v, %v", g, err)
	}
}
