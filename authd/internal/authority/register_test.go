package authority

import (
	"context"
	"errors"
	"strings"
	"testing"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// These tests run registration on a provisioned real broker with the unlimited connection
// (provisioned); the auth-plane profile's reach on these keys is proven in pkg/profiles.

var (
	regIID       = strings.Repeat("b", 26)
	regPrincipal = "m1.s1"
)

// newAuthority is testAuthority with signer for Mac and held as the plane check (nil: held).
func newAuthority(t *testing.T, s *Store, signer signerv1.SignerServiceClient, held func() error) *Authority {
	t.Helper()
	return testAuthority(t, s, func(c *Config) {
		c.Signer = signer
		if held != nil {
			c.Held = held
		}
	})
}

func wantCode(t *testing.T, err error, code Code) {
	t.Helper()
	if CodeOf(err) != code {
		t.Fatalf("err = %v (code %q), want code %q", err, CodeOf(err), code)
	}
}

// TestRegisterEndpointEpochs: the first registration commits epoch 0, each later one the previous
// plus one through a freeze; the gate records the spec's KV revision; the generation moves once
// per transition; a service endpoint uses the same gate family.
func TestRegisterEndpointEpochs(t *testing.T) {
	s, _, _ := provisioned(t)
	a := newAuthority(t, s, nil, nil)
	ctx := context.Background()
	var lastRev uint64
	for i, wantGen := range []uint64{1, 3, 5} {
		reg, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
		if err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
		if reg.ProcessEpoch != uint64(i) || reg.Generation != wantGen || reg.RegistrationRevision <= lastRev {
			t.Fatalf("registration %d = %+v; want epoch %d, generation %d, revision above %d", i, reg, i, wantGen, lastRev)
		}
		lastRev = reg.RegistrationRevision
		spec, srev, ok, err := s.Spec(ctx, lifecycle.ManagerEndpoint, regIID)
		if err != nil || !ok || srev != reg.RegistrationRevision || spec.ProcessEpoch != reg.ProcessEpoch || spec.Principal != regPrincipal {
			t.Fatalf("spec after registration %d = %+v rev %d (found %v, %v)", i, spec, srev, ok, err)
		}
		g, _, ok, err := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID)
		want := lifecycle.EndpointGate{State: lifecycle.GateOpen, Principal: regPrincipal, ProcessEpoch: uint64(i),
			RegistrationRevision: reg.RegistrationRevision, Generation: wantGen}
		if err != nil || !ok || g.Op != nil || g.State != want.State || g.Principal != want.Principal ||
			g.ProcessEpoch != want.ProcessEpoch || g.RegistrationRevision != want.RegistrationRevision || g.Generation != want.Generation {
			t.Fatalf("gate after registration %d = %+v (found %v, %v); want %+v", i, g, ok, err, want)
		}
	}
	reg, err := a.RegisterEndpoint(ctx, "svc.a-b", regIID, regPrincipal)
	if err != nil || reg.ProcessEpoch != 0 || reg.Generation != 1 {
		t.Fatalf("a service endpoint's first registration = %+v, %v", reg, err)
	}
	if g, _, ok, _ := s.EndpointGate(ctx, "svc.a-b", regIID); !ok || g.ProcessEpoch != 0 {
		t.Fatalf("epgate.svc_a-b: %+v found %v", g, ok)
	}
}

// TestRegisterEndpointAdoptsFreeze: a start that crashed after freezing the gate at epoch e leaves
// it frozen(registration); the next registration adopts the freeze and commits e+1.
func TestRegisterEndpointAdoptsFreeze(t *testing.T) {
	s, _, _ := provisioned(t)
	a := newAuthority(t, s, nil, nil)
	ctx := context.Background()
	writes := 0
	a.cfg.Held = func() error {
		// The first registration writes twice (spec, gate); the second freezes (the 3rd write)
		// and crashes before its spec write (the 4th).
		if writes++; writes == 4 {
			return errors.New("crashed")
		}
		return nil
	}
	if _, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal); err != nil {
		t.Fatal(err)
	}
	_, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
	wantCode(t, err, CodeUnavailable)
	g, _, _, err := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID)
	op, _ := lifecycle.RegistrationOpID(lifecycle.ManagerEndpoint, regIID, 0)
	if err != nil || g.State != lifecycle.GateFrozen || g.Op == nil || g.Op.OpID != op || g.Generation != 2 {
		t.Fatalf("gate after the crash = %+v, %v; want frozen by %s at generation 2", g, err, op)
	}
	reg, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
	if err != nil || reg.ProcessEpoch != 1 || reg.Generation != 3 {
		t.Fatalf("the next registration = %+v, %v; want epoch 1 at generation 3", reg, err)
	}
}

// TestRegisterEndpointRefusals: each refusal writes nothing.
func TestRegisterEndpointRefusals(t *testing.T) {
	s, _, _ := provisioned(t)
	ctx := context.Background()
	a := newAuthority(t, s, nil, nil)
	if _, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal); err != nil {
		t.Fatal(err)
	}
	noWrite := func(t *testing.T, f func() error, code Code) {
		t.Helper()
		w := s.Writes()
		wantCode(t, f(), code)
		if s.Writes() != w {
			t.Fatalf("%d writes were sent", s.Writes()-w)
		}
	}
	t.Run("fail/bad coordinates: no read", func(t *testing.T) {
		r := s.Reads()
		for _, c := range [][3]string{{"Manager", regIID, regPrincipal}, {lifecycle.ManagerEndpoint, "short", regPrincipal}, {lifecycle.ManagerEndpoint, regIID, "m1"}, {lifecycle.ManagerEndpoint, regIID, "m1.s*"}} {
			noWrite(t, func() error { _, err := a.RegisterEndpoint(ctx, c[0], c[1], c[2]); return err }, CodeBadRequest)
		}
		if s.Reads() != r {
			t.Fatalf("%d reads for refused coordinates", s.Reads()-r)
		}
	})
	t.Run("fail/another principal", func(t *testing.T) {
		noWrite(t, func() error {
			_, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, "m1.s2")
			return err
		}, CodePermissionDenied)
	})
	t.Run("fail/plane not held", func(t *testing.T) {
		b := newAuthority(t, s, nil, func() error { return errors.New("lost the plane") })
		noWrite(t, func() error {
			_, err := b.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
			return err
		}, CodeUnavailable)
	})
	retire := lifecycle.Op{OpID: strings.Repeat("r", 26), Kind: lifecycle.OpRetirement}
	for _, st := range []lifecycle.GateState{lifecycle.GateFrozen, lifecycle.GateRetired} {
		t.Run("fail/"+string(st)+" by a retirement", func(t *testing.T) {
			iid := strings.Repeat(string("fz"[len(st)%2]), 26)
			key, _ := lifecycle.EndpointGateKey(lifecycle.ManagerEndpoint, iid)
			b, err := lifecycle.EncodeEndpointGate(lifecycle.EndpointGate{State: st, Principal: regPrincipal, RegistrationRevision: 1, Generation: 2, Op: &retire})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Create(ctx, space.Auth, key, b); err != nil {
				t.Fatal(err)
			}
			noWrite(t, func() error {
				_, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, iid, regPrincipal)
				var e *Error
				if errors.As(err, &e) && !e.RetirementBegun() {
					t.Errorf("refusal %v does not say a retirement began", err)
				}
				return err
			}, CodeFailedPrecondition)
		})
	}
	t.Run("fail/corrupt gate", func(t *testing.T) {
		iid := strings.Repeat("k", 26)
		key, _ := lifecycle.EndpointGateKey(lifecycle.ManagerEndpoint, iid)
		if _, err := s.Create(ctx, space.Auth, key, []byte(`{"v":1,"state":"open"}`)); err != nil {
			t.Fatal(err)
		}
		noWrite(t, func() error {
			_, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, iid, regPrincipal)
			return err
		}, CodeUnavailable)
	})
}

// TestRegisterEndpointConfirmConflict: a later start of the instance that registers between this
// registration's reopen and its confirming read makes this one conflict; the later one stands.
func TestRegisterEndpointConfirmConflict(t *testing.T) {
	s, _, _ := provisioned(t)
	a := newAuthority(t, s, nil, nil)
	ctx := context.Background()
	if _, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal); err != nil {
		t.Fatal(err)
	}
	var later Registration
	var laterErr error
	a.beforeConfirm = func() {
		a.beforeConfirm = nil
		later, laterErr = a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
	}
	_, err := a.RegisterEndpoint(ctx, lifecycle.ManagerEndpoint, regIID, regPrincipal)
	wantCode(t, err, CodeConflict)
	if laterErr != nil || later.ProcessEpoch != 2 {
		t.Fatalf("the later registration = %+v, %v; want epoch 2", later, laterErr)
	}
	if g, _, _, _ := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID); g.State != lifecycle.GateOpen || g.ProcessEpoch != 2 {
		t.Fatalf("gate = %+v; want open at epoch 2", g)
	}
}

// TestProof: CurrentProof is signerd's Mac of the payload (a real signerd, authd's identity);
// VerifyProof accepts it and refuses anything else.
func TestProof(t *testing.T) {
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
	reg := lifecycle.Registration{
		Space: testSpace, Owner: "u_" + strings.Repeat("a", 26), Actor: "cli", InstanceID: regIID, LifecycleUID: strings.Repeat("c", 26),
		Identities: lifecycle.Identities{Supervisor: "U" + strings.Repeat("A", 55), Executor: "U" + strings.Repeat("B", 55),
			Serve: "U" + strings.Repeat("C", 55), GoalWriter: "U" + strings.Repeat("D", 55), SessionLedger: "U" + strings.Repeat("E", 55)},
		RegistrationRevision: 7,
	}
	p, err := a.CurrentProof(ctx, reg)
	if err != nil || !lifecycle.IsProof(p) {
		t.Fatalf("CurrentProof = %q, %v", p, err)
	}
	if again, err := a.CurrentProof(ctx, reg); err != nil || again != p {
		t.Fatalf("CurrentProof is not a function of the registration: %q then %q (%v)", p, again, err)
	}
	if err := a.VerifyProof(ctx, reg, p); err != nil {
		t.Fatalf("VerifyProof(current) = %v", err)
	}
	next := reg
	next.ProcessEpoch = 1
	np, err := a.CurrentProof(ctx, next)
	if err != nil || np == p {
		t.Fatalf("the next epoch's proof = %q, %v; want another proof", np, err)
	}
	wantCode(t, a.VerifyProof(ctx, next, p), CodePermissionDenied)
	wantCode(t, a.VerifyProof(ctx, reg, ""), CodePermissionDenied)
	wantCode(t, a.VerifyProof(ctx, reg, strings.ToUpper(p)), CodePermissionDenied)
	other := reg
	other.Space = "other"
	_, err = a.CurrentProof(ctx, other)
	wantCode(t, err, CodeBadRequest)
	bad := reg
	bad.Identities.Serve = "nope"
	_, err = a.CurrentProof(ctx, bad)
	wantCode(t, err, CodeBadRequest)
	_, err = newAuthority(t, s, nil, nil).CurrentProof(ctx, reg)
	wantCode(t, err, CodeUnavailable)
}
