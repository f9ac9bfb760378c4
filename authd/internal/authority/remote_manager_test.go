package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestCurrentRegistrationCheck: the one current-registration check (a real signerd computes the
// proofs, a real broker holds the gate) and the four managed-agent decisions built on it.
func TestCurrentRegistrationCheck(t *testing.T) {
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{testSpace}})
	files := sg.ClientFor(t, mtls.KindAuthd, testSpace)
	c, err := signerclient.Dial(signerclient.FileConfig{Address: sg.Addr, CA: files.ServerCAFile, Cert: files.CertFile, Key: files.KeyFile}.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, _, _ := provisioned(t)
	a := newAuthority(t, s, c.API(), nil)
	ctx := context.Background()

	owner := "u_" + strings.Repeat("a", 26)
	ids := managerauthority.Identities{Supervisor: managerauthority.Identity{ID: "U" + strings.Repeat("A", 55)},
		Executor: managerauthority.Identity{ID: "U" + strings.Repeat("B", 55)}, Serve: managerauthority.Identity{ID: "U" + strings.Repeat("C", 55)},
		GoalWriter: managerauthority.Identity{ID: "U" + strings.Repeat("D", 55)}, SessionLedger: managerauthority.Identity{ID: "U" + strings.Repeat("E", 55)}}
	m := RemoteManager{Owner: owner, Actor: "cli", InstanceID: regIID, LifecycleUID: strings.Repeat("c", 26), Identities: ids.Lifecycle()}
	put := func(actor string, scope ...string) {
		t.Helper()
		if err := a.cfg.Ledger.Put(ledger.Interactive, ledger.Row{Ver: ledger.Version, Owner: owner, Actor: actor, Scope: scope,
			AllowSubscribe: []string{}, AllowPublish: []string{}, LifecycleUID: strings.Repeat("d", 26), GrantedAt: time.Now().UnixMilli()}); err != nil {
			t.Fatal(err)
		}
	}
	put("cli", "supervise")
	put("ops", "spawn", "admin")

	t.Run("fail/an unregistered instance is failed-precondition", func(t *testing.T) {
		_, err := a.CheckCurrentRegistration(ctx, m, 0, "sha256:"+strings.Repeat("0", 64))
		wantCode(t, err, CodeFailedPrecondition)
	})
	serve, _ := m.ServePrincipal()
	reg, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, serve)
	if err != nil {
		t.Fatal(err)
	}
	proof, err := a.CurrentProof(ctx, a.registration(m, lifecycle.EndpointGate{RegistrationRevision: reg.RegistrationRevision, ProcessEpoch: reg.ProcessEpoch}))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ok/the current registration passes", func(t *testing.T) {
		g, err := a.CheckCurrentRegistration(ctx, m, 0, proof)
		if err != nil || g.Principal != serve || g.ProcessEpoch != 0 || g.RegistrationRevision != reg.RegistrationRevision {
			t.Fatalf("check = %+v, %v", g, err)
		}
	})
	t.Run("fail/another epoch is conflict", func(t *testing.T) {
		_, err := a.CheckCurrentRegistration(ctx, m, 1, proof)
		wantCode(t, err, CodeConflict)
	})
	t.Run("fail/another proof is permission-denied", func(t *testing.T) {
		_, err := a.CheckCurrentRegistration(ctx, m, 0, "sha256:"+strings.Repeat("f", 64))
		wantCode(t, err, CodePermissionDenied)
		other := m
		other.Identities.Serve = "U" + strings.Repeat("F", 55)
		_, err = a.CheckCurrentRegistration(ctx, other, 0, proof)
		wantCode(t, err, CodePermissionDenied)
	})
	t.Run("fail/another owner is permission-denied", func(t *testing.T) {
		other := m
		other.Owner = "u_" + strings.Repeat("b", 26)
		_, err := a.CheckCurrentRegistration(ctx, other, 0, proof)
		wantCode(t, err, CodePermissionDenied)
	})

	envelope := managerauthority.ManagedRequest{V: 1, Space: testSpace, Actor: "cli", InstanceID: regIID, ManagerLifecycleUID: m.LifecycleUID,
		RequestID: "r1", RegistrationProof: proof, ServeEpoch: 0, Identities: ids}
	target := managerauthority.Target{Owner: owner, Actor: "bob", LifecycleUID: strings.Repeat("e", 26)}
	opID, _ := lifecycle.ManagedRetirementOpID(target.LifecycleUID)
	with := func(kind string, f func(*managerauthority.ManagedRequest)) managerauthority.ManagedRequest {
		r := envelope
		r.Kind = kind
		if f != nil {
			f(&r)
		}
		return r
	}
	t.Run("ok/enrollment", func(t *testing.T) {
		d, err := a.AuthorizeRemoteManagedAgentEnrollment(ctx, owner, &managerauthority.EnrollmentRequest{ManagedRequest: with(managerauthority.KindEnrollment, nil)})
		if err != nil || d != (ManagedAgentDecision{Authorized: true, Owner: owner, Actor: "cli", InstanceID: regIID, ServeEpoch: 0}) {
			t.Fatalf("decision %+v, %v", d, err)
		}
	})
	t.Run("ok/prepare-retirement", func(t *testing.T) {
		d, err := a.AuthorizeRemoteManagedAgentPrepareRetirement(ctx, owner, &managerauthority.PrepareRetirementRequest{
			ManagedRequest: with(managerauthority.KindPrepareRetirement, nil), Target: target, OpID: opID})
		if err != nil || !d.Authorized || d.Owner != owner || d.InstanceID != regIID {
			t.Fatalf("decision %+v, %v", d, err)
		}
	})
	t.Run("ok/runtime create and status", func(t *testing.T) {
		d, err := a.AuthorizeRemoteManagedAgentRuntimeCreate(ctx, owner, &managerauthority.RuntimeRequest{ManagedRequest: with(managerauthority.KindRuntimeCreate, nil), Target: target})
		if err != nil || d != (RuntimeDecision{Owner: owner, InstanceID: regIID, Actor: "cli", Target: target}) {
			t.Fatalf("decision %+v, %v", d, err)
		}
		d, err = a.AuthorizeRemoteManagedAgentRuntimeStatus(ctx, owner, &managerauthority.RuntimeRequest{ManagedRequest: with(managerauthority.KindRuntimeStatus, nil), Target: target})
		if err != nil || d.Target != target {
			t.Fatalf("decision %+v, %v", d, err)
		}
	})
	t.Run("fail/runtime of another owner's target", func(t *testing.T) {
		other := target
		other.Owner = "u_" + strings.Repeat("b", 26)
		_, err := a.AuthorizeRemoteManagedAgentRuntimeStatus(ctx, owner, &managerauthority.RuntimeRequest{ManagedRequest: with(managerauthority.KindRuntimeStatus, nil), Target: other})
		wantCode(t, err, CodePermissionDenied)
	})
	t.Run("fail/runtime decision of the other kind", func(t *testing.T) {
		_, err := a.AuthorizeRemoteManagedAgentRuntimeCreate(ctx, owner, &managerauthority.RuntimeRequest{ManagedRequest: with(managerauthority.KindRuntimeStatus, nil), Target: target})
		wantCode(t, err, CodeBadRequest)
	})
	t.Run("fail/prepare-retirement under another opId", func(t *testing.T) {
		bad, _ := lifecycle.InteractiveRetirementOpID(target.LifecycleUID)
		_, err := a.AuthorizeRemoteManagedAgentPrepareRetirement(ctx, owner, &managerauthority.PrepareRetirementRequest{
			ManagedRequest: with(managerauthority.KindPrepareRetirement, nil), Target: target, OpID: bad})
		wantCode(t, err, CodePermissionDenied)
	})
	t.Run("fail/a spawn and admin row does not supervise", func(t *testing.T) {
		_, err := a.AuthorizeRemoteManagedAgentEnrollment(ctx, owner, &managerauthority.EnrollmentRequest{
			ManagedRequest: with(managerauthority.KindEnrollment, func(r *managerauthority.ManagedRequest) { r.Actor = "ops" })})
		wantCode(t, err, CodePermissionDenied)
	})
	t.Run("fail/another space", func(t *testing.T) {
		_, err := a.AuthorizeRemoteManagedAgentEnrollment(ctx, owner, &managerauthority.EnrollmentRequest{
			ManagedRequest: with(managerauthority.KindEnrollment, func(r *managerauthority.ManagedRequest) { r.Space = "other" })})
		wantCode(t, err, CodePermissionDenied)
	})
	t.Run("fail/a stale epoch is conflict", func(t *testing.T) {
		if _, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, serve); err != nil {
			t.Fatal(err)
		}
		_, err := a.AuthorizeRemoteManagedAgentEnrollment(ctx, owner, &managerauthority.EnrollmentRequest{ManagedRequest: with(managerauthority.KindEnrollment, nil)})
		wantCode(t, err, CodeConflict)
	})
}
