package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestIdempotentReplayAfterPolicyChange is finding 8 of issue 7: a replay returned the
// credential minted under an older, higher cap. The cached answer is tied to the policy digest
// it was minted under; after a policy change the same request_id is decided again and answered
// per the current policy: a new credential under the new cap (or the new policy's refusal).
func TestIdempotentReplayAfterPolicyChange(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	c := dialAs(t, s, signerdtest.ID("managerd", "alpha"))
	_, pub := newUser(t)
	req := &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, RequestId: "retry-1",
		Params: &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid}, Ttl: durationpb.New(time.Hour)}

	first, err := c.Mint(ctxT(t), req)
	if err != nil {
		t.Fatalf("mint under the 1h cap: %v", err)
	}
	wantLifetime(t, first.GetCredential(), time.Hour)
	again, err := c.Mint(ctxT(t), proto.Clone(req).(*signerv1.MintRequest))
	if err != nil || again.GetCredential().GetJti() != first.GetCredential().GetJti() {
		t.Fatalf("replay under the same policy: %v, jti %q; want the first credential %q", err, again.GetCredential().GetJti(), first.GetCredential().GetJti())
	}

	// The same policy with a 10m agent cap.
	narrowed := strings.Replace(signerdtest.DefaultPolicy, "ttl_max: 1h", "ttl_max: 10m", 1)
	if narrowed == signerdtest.DefaultPolicy {
		t.Fatal("DefaultPolicy changed shape; update this test's edit")
	}
	s.SetPolicy(t, narrowed)
	_, probePub := newUser(t)
	testkit.Eventually(t, 5*time.Second, func() error {
		r := proto.Clone(req).(*signerv1.MintRequest)
		r.RequestId, r.UserPublicKey = "", probePub
		resp, err := c.Mint(ctxT(t), r)
		if err != nil || !resp.GetCredential().GetTtlCapped() {
			return fmt.Errorf("fresh mint: %v, capped %v; waiting for the 10m cap", err, resp.GetCredential().GetTtlCapped())
		}
		return nil
	})

	replay, err := c.Mint(ctxT(t), proto.Clone(req).(*signerv1.MintRequest))
	if err != nil {
		t.Fatalf("replay after the policy change: %v", err)
	}
	cred := replay.GetCredential()
	if cred.GetJti() == first.GetCredential().GetJti() {
		t.Fatal("replay after the policy change returned the credential minted under the old 1h cap")
	}
	if !cred.GetTtlCapped() {
		t.Fatal("replay after the policy change was not capped by the new policy")
	}
	wantLifetime(t, cred, 10*time.Minute)
	recs := auditRecords(t, s.AuditPath)
	granted(signerdtest.ID("managerd", "alpha"), "Mint", "alpha", "agent", "").check(t, recs[len(recs)-1])
	if recs[len(recs)-1].JTI != cred.GetJti() {
		t.Fatalf("audit line jti %q, want the new credential's %q", recs[len(recs)-1].JTI, cred.GetJti())
	}

	// Under the new policy, the new answer is the one replayed.
	again, err = c.Mint(ctxT(t), proto.Clone(req).(*signerv1.MintRequest))
	if err != nil || again.GetCredential().GetJti() != cred.GetJti() {
		t.Fatalf("second replay under the new policy: %v, jti %q; want %q", err, again.GetCredential().GetJti(), cred.GetJti())
	}
	recs = auditRecords(t, s.AuditPath)
	if r := recs[len(recs)-1]; r.Reason != "replay" || r.Decision != audit.Granted {
		t.Fatalf("audit line %+v, want a granted replay", r)
	}
	verifyAudit(t, s.AuditPath)
}
