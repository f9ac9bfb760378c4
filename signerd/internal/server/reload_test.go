package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// reloadInterval is signerdtest's policy_reload_interval.
const reloadInterval = 100 * time.Millisecond

// TestPolicyReload swaps the policy file under a running signerd: a valid new policy takes
// effect (a dropped profile is denied, a lowered cap binds the next Remint), and an invalid one
// is ignored while the previous policy keeps deciding.
func TestPolicyReload(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	c := dialAs(t, s, signerdtest.ID("managerd", "alpha"))

	mintProbe := func(t *testing.T) (*signerv1.MintResponse, error) {
		t.Helper()
		_, pub := newUser(t)
		return c.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub})
	}
	// agent is minted under the default policy (1h cap) and reminted after the reload.
	agentKP, agentPub := newUser(t)
	agent, err := c.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: agentPub,
		Params: &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid}, Ttl: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatalf("mint agent: %v", err)
	}
	if _, err := mintProbe(t); err != nil {
		t.Fatalf("probe refused under the default policy: %v", err)
	}

	// Without the probe rule and with a 10m agent cap.
	narrowed := strings.Replace(signerdtest.DefaultPolicy, "      probe: {ttl_max: 1m, remint: none}\n", "", 1)
	narrowed = strings.Replace(narrowed, "ttl_max: 1h", "ttl_max: 10m", 1)
	if narrowed == signerdtest.DefaultPolicy || strings.Contains(narrowed, "probe") || !strings.Contains(narrowed, "ttl_max: 10m") {
		t.Fatal("DefaultPolicy changed shape; update this test's edits")
	}

	t.Run("fail/profile-dropped-by-reload", func(t *testing.T) {
		s.SetPolicy(t, narrowed)
		testkit.Eventually(t, 5*time.Second, func() error {
			_, err := mintProbe(t)
			if status.Code(err) != codes.PermissionDenied {
				return fmt.Errorf("probe mint: %v; want PermissionDenied", err)
			}
			return nil
		})
		resp, err := mintProbe(t)
		wantRefusal(t, err, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
		wantNoCredential(t, resp)
		recs := auditRecords(t, s.AuditPath)
		denied(signerdtest.ID("managerd", "alpha"), "Mint", "alpha", "probe", "profile-not-allowed").check(t, recs[len(recs)-1])
	})

	t.Run("ok/remint-under-reloaded-cap", func(t *testing.T) {
		cred := agent.GetCredential()
		at := time.Now().Unix()
		resp, err := c.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: cred.GetJwt(), ProofUnixSeconds: at,
			Proof: remintProof(t, agentKP, "alpha", cred.GetJti(), at), Ttl: durationpb.New(time.Hour)})
		if err != nil {
			t.Fatalf("remint: %v", err)
		}
		if !resp.GetCredential().GetTtlCapped() {
			t.Fatal("ttl_capped = false for 1h under a reloaded 10m cap")
		}
		wantLifetime(t, resp.GetCredential(), 10*time.Minute)
	})

	t.Run("fail/invalid-policy-keeps-old", func(t *testing.T) {
		// Would re-allow the probe, but carries an unknown key: the whole file must be refused.
		s.SetPolicy(t, signerdtest.DefaultPolicy+"bogus_key: true\n")
		// The old policy must keep deciding across many reload intervals after the bad write.
		window := time.NewTimer(8 * reloadInterval)
		defer window.Stop()
		tick := time.NewTicker(reloadInterval / 2)
		defer tick.Stop()
		for checks := 0; ; checks++ {
			resp, err := mintProbe(t)
			wantRefusal(t, err, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
			wantNoCredential(t, resp)
			select {
			case <-window.C:
				if checks < 4 {
					t.Fatalf("only %d checks in the window", checks)
				}
				return
			case <-tick.C:
			}
		}
	})

	t.Run("ok/valid-policy-after-invalid", func(t *testing.T) {
		// The watcher is still alive: the next valid file takes effect.
		s.SetPolicy(t, signerdtest.DefaultPolicy)
		testkit.Eventually(t, 5*time.Second, func() error {
			_, err := mintProbe(t)
			if err != nil {
				return fmt.Errorf("probe mint: %w", err)
			}
			return nil
		})
		recs := auditRecords(t, s.AuditPath)
		if last := recs[len(recs)-1]; last.Decision != audit.Granted || last.Profile != "probe" {
			t.Fatalf("last audit line = %+v, want a granted probe", last)
		}
	})

	t.Run("audit/verify", func(t *testing.T) {
		if sum := verifyAudit(t, s.AuditPath); sum.Lines < 5 {
			t.Fatalf("audit holds %d lines, want at least 5", sum.Lines)
		}
	})
}
