package profiles

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestServiceServeParams: service-serve (issue 24 item 6) takes exactly a derived owner, a service
// endpoint and an instance id; its actor is svc_<instanceId>; its rows are the instance's serve
// and reply families and nothing else; every other profile refuses the two service fields.
func TestServiceServeParams(t *testing.T) {
	good := mxGoldenParams[ServiceServe]
	with := func(f func(*Params)) Params {
		p := good
		f(&p)
		return p
	}
	t.Run("ok/golden", func(t *testing.T) {
		s, err := Build(mxSpace, ServiceServe, good)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Sub.Allow, []string{"cotal.demo_space.sep.billing_api-v2." + mxSvcIID + ".>"}) ||
			!slices.Equal(s.Pub.Allow, []string{"cotal.demo_space.sep.reply.billing_api-v2." + mxSvcIID + ".>"}) ||
			len(s.Pub.Deny)+len(s.Sub.Deny) != 0 || s.Resp != nil || s.Bearer || s.InboxNonce != "" {
			t.Fatalf("spec %+v", s)
		}
		wantTags := []string{"owner:" + good.Owner, "actor:svc_" + mxSvcIID, "principal:" + good.Owner + ".svc_" + mxSvcIID, "profile:service-serve"}
		if !slices.Equal(s.Tags, wantTags) || s.JWTName != good.Owner+"-svc_"+mxSvcIID {
			t.Fatalf("tags %v name %q, want %v and the principal's name", s.Tags, s.JWTName, wantTags)
		}
		if s.Lifetime != (Lifetime{Default: 60 * time.Second, Max: 60 * time.Second}) {
			t.Fatalf("lifetime %+v, want 60 s", s.Lifetime)
		}
	})
	t.Run("ok/callout only and no inbox", func(t *testing.T) {
		if !ServiceServe.CalloutOnly() || ServiceServe.HasInbox() {
			t.Fatalf("CalloutOnly %v HasInbox %v, want true false", ServiceServe.CalloutOnly(), ServiceServe.HasInbox())
		}
		for _, name := range All() {
			if name != ServiceServe && name.CalloutOnly() {
				t.Errorf("%s is callout-only", name)
			}
		}
	})
	t.Run("ok/claims carry no inbox and at most 60 s", func(t *testing.T) {
		k := mxKeys(t)
		s := mxSpec(t, ServiceServe, good)
		uc, err := s.Claims(k.userPub, k.acPub, mxNow, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(uc.Sub.Allow, s.Sub.Allow) || !slices.Equal(uc.Pub.Allow, s.Pub.Allow) || uc.Expires != mxNow.Unix()+60 {
			t.Fatalf("claims sub %v pub %v exp %d", uc.Sub.Allow, uc.Pub.Allow, uc.Expires)
		}
		if _, err := s.Claims(k.userPub, k.acPub, mxNow, 61*time.Second); err == nil {
			t.Fatal("Claims granted 61 s")
		}
		forged := *s
		forged.InboxNonce = mxNonce(t, good.Owner, "svc_"+mxSvcIID)
		var pe *ParamError
		if _, err := forged.Claims(k.userPub, k.acPub, mxNow, time.Minute); !errors.As(err, &pe) || pe.Field != "InboxNonce" {
			t.Fatalf("Claims of a spec given a nonce = %v, want a *ParamError on InboxNonce", err)
		}
	})
	for _, tc := range []struct {
		name  string
		p     Params
		field string
	}{
		{"fail/no owner", with(func(p *Params) { p.Owner = "" }), "Owner"},
		{"fail/no endpoint", with(func(p *Params) { p.ServiceEndpoint = "" }), "ServiceEndpoint"},
		{"fail/no instance", with(func(p *Params) { p.InstanceID = "" }), "InstanceID"},
		{"fail/owner not derived", with(func(p *Params) { p.Owner = "local" }), "Owner"},
		{"fail/owner upper case", with(func(p *Params) { p.Owner = "u_ABCDEFGHIJKLMNOPQRSTUVWXYZ" }), "Owner"},
		{"fail/actor given", with(func(p *Params) { p.Actor = "svc_" + mxSvcIID }), "Actor"},
		{"fail/inbox nonce", with(func(p *Params) { p.InboxNonce = mxNonce(t, p.Owner, "svc_"+mxSvcIID) }), "InboxNonce"},
		{"fail/uid", with(func(p *Params) { p.LifecycleUID = mxUID }), "LifecycleUID"},
		{"fail/channels", with(func(p *Params) { p.AllowSubscribe = []string{"general"} }), "AllowSubscribe"},
		{"fail/endpoint wildcard", with(func(p *Params) { p.ServiceEndpoint = "billing.*" }), "ServiceEndpoint"},
		{"fail/endpoint tail wildcard", with(func(p *Params) { p.ServiceEndpoint = ">" }), "ServiceEndpoint"},
		{"fail/endpoint upper case", with(func(p *Params) { p.ServiceEndpoint = "Billing" }), "ServiceEndpoint"},
		{"fail/endpoint underscore", with(func(p *Params) { p.ServiceEndpoint = "billing_api" }), "ServiceEndpoint"},
		{"fail/endpoint empty label", with(func(p *Params) { p.ServiceEndpoint = "billing..api" }), "ServiceEndpoint"},
		{"fail/endpoint too long", with(func(p *Params) { p.ServiceEndpoint = strings.Repeat("a", 65) }), "ServiceEndpoint"},
		{"fail/instance short", with(func(p *Params) { p.InstanceID = "abc" }), "InstanceID"},
		{"fail/instance wildcard", with(func(p *Params) { p.InstanceID = "*" }), "InstanceID"},
		{"fail/instance upper case", with(func(p *Params) { p.InstanceID = strings.ToUpper(mxSvcIID) }), "InstanceID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(mxSpace, ServiceServe, tc.p)
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field {
				t.Fatalf("Build = %v, want a *ParamError on %s", err, tc.field)
			}
		})
	}
	for _, name := range All() {
		if name == ServiceServe || name == RemoteManager {
			continue
		}
		for _, f := range []struct {
			field string
			set   func(*Params)
		}{
			{"ServiceEndpoint", func(p *Params) { p.ServiceEndpoint = mxEndpoint }},
			{"InstanceID", func(p *Params) { p.InstanceID = mxSvcIID }},
		} {
			t.Run("fail/"+string(name)+" refuses "+f.field, func(t *testing.T) {
				p := mxGoldenParams[name]
				f.set(&p)
				_, err := Build(mxSpace, name, p)
				var pe *ParamError
				if !errors.As(err, &pe) || pe.Field != f.field {
					t.Fatalf("Build = %v, want a *ParamError on %s", err, f.field)
				}
			})
		}
	}
}
