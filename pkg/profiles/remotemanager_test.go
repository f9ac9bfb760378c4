package profiles

import (
	"errors"
	"slices"
	"testing"
)

// TestRemoteManagerParams: a remote-manager credential is bound to one manager instance: it
// requires Owner, Actor and InstanceID, its Actor must be manager_<InstanceID>, and it takes no
// lifecycle, channel, target or service parameter.
func TestRemoteManagerParams(t *testing.T) {
	good := mxGoldenParams[RemoteManager]
	t.Run("ok/golden params build and pin the lease", func(t *testing.T) {
		s, err := Build(mxSpace, RemoteManager, good)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(s.Pub.Allow, "$KV.cotal_manager_demo_space.lease."+mxIID) || slices.Contains(s.Pub.Allow, "$KV.cotal_manager_demo_space.lease.*") {
			t.Fatalf("lease rows %v", s.Pub.Allow)
		}
		if !slices.Contains(s.Tags, "principal:"+good.Owner+".manager_"+mxIID) {
			t.Fatalf("tags %v", s.Tags)
		}
	})
	with := func(f func(*Params)) Params { p := good; f(&p); return p }
	for _, tc := range []struct {
		name  string
		p     Params
		field string
	}{
		{"fail/no instance", with(func(p *Params) { p.InstanceID = "" }), "InstanceID"},
		{"fail/no actor", with(func(p *Params) { p.Actor = "" }), "Actor"},
		{"fail/no owner", with(func(p *Params) { p.Owner = "" }), "Owner"},
		{"fail/another instance's actor", with(func(p *Params) { p.Actor = "manager_cccccccccccccccccccccccccc" }), "Actor"},
		{"fail/the serve actor", with(func(p *Params) { p.Actor = "manager_serve_" + mxIID }), "Actor"},
		{"fail/instance wildcard", with(func(p *Params) { p.InstanceID = "*"; p.Actor = "manager_" }), "InstanceID"},
		{"fail/instance upper case", with(func(p *Params) {
			p.InstanceID = "BBBBBBBBBBBBBBBBBBBBBBBBBB"
			p.Actor = "manager_BBBBBBBBBBBBBBBBBBBBBBBBBB"
		}), "InstanceID"},
		{"fail/lifecycle uid", with(func(p *Params) { p.LifecycleUID = mxUID }), "LifecycleUID"},
		{"fail/service endpoint", with(func(p *Params) { p.ServiceEndpoint = mxEndpoint }), "ServiceEndpoint"},
		{"fail/channels", with(func(p *Params) { p.AllowSubscribe = []string{"general"} }), "AllowSubscribe"},
		{"fail/target", with(func(p *Params) { p.Target = &RetirementTarget{Owner: "o", Actor: "a", LifecycleUID: mxUID} }), "Target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(mxSpace, RemoteManager, tc.p)
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field {
				t.Fatalf("Build = %v, want a *ParamError on %s", err, tc.field)
			}
		})
	}
}
