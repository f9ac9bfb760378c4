package authority

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// sepChildEnv makes the test binary the register child of TestServiceBarrierKill.
const sepChildEnv = "COTAL_AUTHORITY_SEP_CHILD"

// runSepChild runs the re-registration RID of instance IID (expecting WITNESS) and, before the
// write at POINT, says "point <POINT>" on stdout and waits to be killed.
func runSepChild() int {
	fail := func(err error) int {
		fmt.Println("error", err)
		return 1
	}
	nc, err := nats.Connect(os.Getenv("URL"), nats.UserCredentials(os.Getenv("CREDS")))
	if err != nil {
		return fail(err)
	}
	n, err := space.NewNames(testSpace)
	if err != nil {
		return fail(err)
	}
	s, err := NewStore(nc, n, 5*time.Second)
	if err != nil {
		return fail(err)
	}
	led, err := ledger.Open(filepath.Join(os.Getenv("DIR"), "state"))
	if err != nil {
		return fail(err)
	}
	a, err := New(Config{Store: s, Ledger: led, Space: testSpace, Account: os.Getenv("ACCOUNT"), Held: func() error { return nil }})
	if err != nil {
		return fail(err)
	}
	c := sepContract()
	sepTempInstall(a, serviceaccess.Snapshot{V: 1, Account: a.cfg.Account, Space: testSpace, Owner: sepOwner, Endpoint: sepEP,
		Instance: os.Getenv("IID"), Generation: 1, Contract: c})
	point := os.Getenv("POINT")
	a.sep.fault = func(p string) error {
		if p == point {
			fmt.Println("point", p)
			select {} // killed here
		}
		return nil
	}
	req := &serviceaccess.Request{Kind: serviceaccess.KindRegister, Account: a.cfg.Account, Space: testSpace, RequestID: os.Getenv("RID"),
		Endpoint: sepEP, Instance: os.Getenv("IID"), Contract: &c, Expected: &serviceaccess.Expected{State: "registered", Witness: os.Getenv("WITNESS")}}
	ans, err := a.ServiceRequest(context.Background(), req, ServiceCaller{Proof: serviceaccess.ProofIDP, Owner: sepOwner})
	if err != nil {
		return fail(err)
	}
	fmt.Println("finished", ans.Kind)
	return 0
}

// TestServiceBarrierKill: a real child process runs a pre-activation re-registration and is
// killed with SIGKILL before the spec write (after its freeze), before the reopen (after the spec
// write) and before its ledger turns registered (after the reopen); the replay of the same
// request in this process answers registered at generation 3: the generation advanced once.
func TestServiceBarrierKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	x := newSepRig(t)
	for i, point := range []string{"spec", "reopen", "ledger-registered"} {
		t.Run("ok/killed before "+point, func(t *testing.T) {
			iid := iidN(200 + i)
			r := x.registered(t, iid, "reg-first", 1)
			re := x.req(serviceaccess.KindRegister, "reg-killed", iid)
			re.Expected = &serviceaccess.Expected{State: "registered", Witness: r.Witness}
			// The child binds the request itself; its ledger entry must exist as the parent's
			// replay will find it, so the parent binds nothing first.
			jwt, kp := x.sp.Broker.Space(testSpace).MintUnlimited(t)
			cmd, said := testkit.StartChild(t, 60*time.Second, sepChildEnv+"=1", "URL="+x.sp.Broker.URL, "CREDS="+testkit.WriteCredsFile(t, jwt, kp),
				"DIR="+t.TempDir(), "ACCOUNT="+x.a.cfg.Account, "IID="+iid, "RID=reg-killed", "WITNESS="+r.Witness, "POINT="+point)
			if said != "point "+point {
				t.Fatalf("child said %q", said)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child exit %v, want killed by SIGKILL", err)
			}
			g := x.gate(t, iid)
			if point != "ledger-registered" && (g.State != lifecycle.GateFrozen || g.Generation != 2) {
				t.Fatalf("after the kill the gate is %+v; want frozen at generation 2", g)
			}
			a := x.do(t, re, idp(sepOwner))
			wantKind(t, a, serviceaccess.AnswerRegistered, "")
			if g := x.gate(t, iid); a.Generation != 3 || g.Generation != 3 || g.State != lifecycle.GateOpen || g.ProcessEpoch != 1 {
				t.Fatalf("the replay: answer generation %d, gate %+v; want 3, open at epoch 1", a.Generation, g)
			}
		})
	}
}
