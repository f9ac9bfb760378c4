package authority

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// childEnv makes the test binary the barrier child of TestBarrierKill.
const childEnv = "COTAL_AUTHORITY_BARRIER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runBarrierChild())
	}
	if os.Getenv(sepChildEnv) == "1" {
		os.Exit(runSepChild())
	}
	os.Exit(m.Run())
}

// runBarrierChild runs the barrier of tOwner.tActor at tUID over the creds it was given and,
// after step STEP, says "step <n>" on stdout and waits to be killed.
func runBarrierChild() int {
	fail := func(err error) int {
		fmt.Println("error", err)
		return 1
	}
	stop, err := strconv.Atoi(os.Getenv("STEP"))
	if err != nil {
		return fail(err)
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
	a.containPoll, a.sweepSettle = 50*time.Millisecond, 50*time.Millisecond
	a.afterStep = func(step int) error {
		if step == stop {
			fmt.Println("step", step)
			select {} // killed here
		}
		return nil
	}
	if _, err := a.Retire(context.Background(), tOwner, tActor, tUID); err != nil {
		return fail(err)
	}
	fmt.Println("finished")
	return 0
}

// TestBarrierKill: a real child process runs the barrier and is killed with SIGKILL right after
// each step; then, in this process, a boot resume owes the retirement whenever its gate is
// frozen by its opId (steps 2-8; after step 1 the gate is still open and a retried Retire adopts
// the intent; after step 9 nothing is owed), and it finishes the same opId, adopting every write
// the child made (no second freeze, the stage unchanged). Meanwhile no other operation moves the
// frozen gate: a retirement of the alias at another uid is refused, writing nothing.
func TestBarrierKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	for step := stepIntent; step <= stepHeadRetired; step++ {
		t.Run(fmt.Sprintf("step-%d", step), func(t *testing.T) {
			b, s, _, _ := provisionedBroker(t)
			activate(t, s, tOwner, tActor, tUID)
			parent := testAuthority(t, s, nil)
			op, _ := lifecycle.ManagedRetirementOpID(tUID)

			jwt, kp := b.Space(testSpace).MintUnlimited(t)
			cmd, said := testkit.StartChild(t, 60*time.Second, childEnv+"=1", "URL="+b.URL, "CREDS="+testkit.WriteCredsFile(t, jwt, kp),
				"DIR="+t.TempDir(), "ACCOUNT="+parent.cfg.Account, "STEP="+strconv.Itoa(step))
			if said != "step "+strconv.Itoa(step) {
				t.Fatalf("child said %q", said)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child exit %v, want killed by SIGKILL", err)
			}
			crashed := readRows(t, s, tOwner, tActor, tUID)

			// No other operation can move it: the alias at another uid is refused.
			w := s.Writes()
			if _, err := parent.Retire(ctxT(t), tOwner, tActor, tUID2); CodeOf(err) != CodeExpired || s.Writes() != w {
				t.Fatalf("a retirement at another uid: %v, %d writes", err, s.Writes()-w)
			}

			owed, err := parent.Resume(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			wantOwed := step >= stepFreeze && step < stepHeadRetired
			if (len(owed) == 1 && owed[0] == op) != wantOwed || len(owed) > 1 {
				t.Fatalf("after step %d Resume owes %v, want owed=%v", step, owed, wantOwed)
			}
			if wantOwed {
				res, found, err := parent.Wait(ctxT(t), op)
				if err != nil || (found && res.OpID != op) {
					t.Fatalf("resumed flight = %+v, %v", res, err)
				}
			} else if _, err := parent.Retire(ctxT(t), tOwner, tActor, tUID); err != nil {
				t.Fatalf("a retried Retire after step %d: %v", step, err)
			}
			final := retiredAt(t, s, tOwner, tActor, tUID)
			if final.stageRev != crashed.stageRev {
				t.Fatalf("the stage was rewritten: rev %d -> %d", crashed.stageRev, final.stageRev)
			}
			wantFreezes := int64(0) // the child's freeze is adopted
			if step == stepIntent {
				wantFreezes = 1 // the child stopped before it froze
			}
			if parent.freezes.Load() != wantFreezes {
				t.Fatalf("parent froze %d times after step %d, want %d", parent.freezes.Load(), step, wantFreezes)
			}
			if step >= stepFrontier && final.frontierRev != crashed.frontierRev {
				t.Fatalf("the frontier was rewritten: rev %d -> %d", crashed.frontierRev, final.frontierRev)
			}
			if owed, err := parent.Resume(ctxT(t)); err != nil || len(owed) != 0 {
				t.Fatalf("a second Resume owes %v, %v", owed, err)
			}
		})
	}
}
