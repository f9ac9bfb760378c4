package server

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/profiles"
)

// sameParams compares parameters as Remint sees them: an empty list is an unset one.
func sameParams(a, b profiles.Params) bool {
	return a.Owner == b.Owner && a.Actor == b.Actor && a.LifecycleUID == b.LifecycleUID && a.Role == b.Role &&
		a.InboxNonce == b.InboxNonce && slices.Equal(a.Subscribe, b.Subscribe) && slices.Equal(a.AllowSubscribe, b.AllowSubscribe) &&
		slices.Equal(a.AllowPublish, b.AllowPublish) && slices.Equal(a.Capabilities, b.Capabilities) &&
		(a.Target == nil) == (b.Target == nil) && (a.Target == nil || *a.Target == *b.Target) &&
		a.ServiceEndpoint == b.ServiceEndpoint && a.InstanceID == b.InstanceID && slices.Equal(a.MemberChannels, b.MemberChannels)
}

func TestParamTags(t *testing.T) {
	ukp, _ := nkeys.CreateUser()
	user, _ := ukp.PublicKey()
	signer, _ := nkeys.CreateAccount()
	full := profiles.Params{Owner: "Owner_1", Actor: "Bot", LifecycleUID: "abcdefghijklmnopqrstuvwxyz", Role: "reviewer",
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general", "Team.A-b"}, AllowPublish: []string{"general"},
		Capabilities: []string{"spawn", "run"}, InboxNonce: "n_ABCDEFGH"}
	for _, tc := range []struct {
		name string
		p    profiles.Params
	}{
		{"ok/none", profiles.Params{}},
		{"ok/owner-actor", profiles.Params{Owner: "o", Actor: "a"}},
		{"ok/full-case-kept", full},
		{"ok/retirement-target", profiles.Params{Owner: "o", Actor: "manager_serve_iiiiiiiiiiiiiiiiiiiiiiiiii", LifecycleUID: "mmmmmmmmmmmmmmmmmmmmmmmmmm",
			Target: &profiles.RetirementTarget{Owner: "o", Actor: "Bob", LifecycleUID: "abcdefghijklmnopqrstuvwxyz"}}},
		{"ok/service-serve", profiles.Params{Owner: "u_abcdefghijklmnopqrstuvwxyz", ServiceEndpoint: "billing.api-v2", InstanceID: "ssssssssssssssssssssssssss"}},
		{"ok/deprovisioner-member-channels", profiles.Params{Owner: "o", Actor: "Bob", LifecycleUID: "abcdefghijklmnopqrstuvwxyz", MemberChannels: []string{"general", "Team.A-b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tags := paramTags(tc.p)
			if tags[0] != ParamsTag {
				t.Fatalf("tags %v do not start with %s", tags, ParamsTag)
			}
			// Through a signed JWT and back, as Remint reads them: jwt.TagList.Add would
			// lower-case, decoding must not.
			uc := jwt.NewUserClaims(user)
			uc.Tags = append(jwt.TagList{"profile:agent"}, tags...)
			token, err := uc.Encode(signer)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := jwt.DecodeUserClaims(token)
			if err != nil {
				t.Fatal(err)
			}
			back, err := paramsFromTags(dec.Tags)
			if err != nil || !sameParams(back, tc.p) {
				t.Fatalf("round trip %+v -> %+v (%v)", tc.p, back, err)
			}
		})
	}
	t.Run("ok/part of a target is a target", func(t *testing.T) {
		p, err := paramsFromTags(jwt.TagList{ParamsTag, "param:target_actor=bob"})
		if err != nil || p.Target == nil || *p.Target != (profiles.RetirementTarget{Actor: "bob"}) {
			t.Fatalf("params %+v (%v): want a target with only its actor, which Build refuses", p, err)
		}
	})
	for _, tc := range []struct {
		name string
		tags jwt.TagList
		want error
	}{
		{"fail/not-recorded", jwt.TagList{"profile:agent", "owner:o"}, errNoParams},
		{"fail/unknown-field", jwt.TagList{ParamsTag, "param:permissions=>"}, nil},
		{"fail/twice", jwt.TagList{ParamsTag, "param:owner=a", "param:owner=b"}, nil},
		{"fail/no-value", jwt.TagList{ParamsTag, "param:owner="}, nil},
		{"fail/no-equals", jwt.TagList{ParamsTag, "param:owner"}, nil},
		{"fail/target-twice", jwt.TagList{ParamsTag, "param:target_uid=a", "param:target_uid=b"}, nil},
		{"fail/target-no-value", jwt.TagList{ParamsTag, "param:target_owner="}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := paramsFromTags(tc.tags)
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCompactJWT(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"eyJh.eyJi.c2ln", true},
		{"a-_b.C9d.e", true},
		{"eyJh.eyJi.c2\nln", false},
		{"eyJh.eyJi.c2ln\r", false},
		{"eyJh.eyJi.c2ln=", false},
		{"eyJh.eyJi.c2+/", false},
		{"eyJh..c2ln", false},
		{"eyJh.eyJi.", false},
		{".eyJi.c2ln", false},
		{"eyJh.eyJi", false},
		{"eyJh.eyJi.c2ln.x", false},
		{"", false},
	} {
		if got := compactJWT(tc.s); got != tc.ok {
			t.Errorf("compactJWT(%q) = %v, want %v", tc.s, got, tc.ok)
		}
	}
}

// TestParamTagsBound: with every parameter set, paramTags writes exactly maxParamTags tags, the
// capacity sign reserves for them.
func TestParamTagsBound(t *testing.T) {
	p := profiles.Params{
		Owner: "o", Actor: "a", LifecycleUID: "u", Role: "r", InboxNonce: "n",
		Subscribe: []string{"s"}, AllowSubscribe: []string{"s"}, AllowPublish: []string{"p"},
		Capabilities: []string{"spawn"}, ServiceEndpoint: "e", InstanceID: "i", MemberChannels: []string{"m"},
		Target: &profiles.RetirementTarget{Owner: "o", Actor: "b", LifecycleUID: "v"},
	}
	if got := len(paramTags(p)); got != maxParamTags {
		t.Fatalf("paramTags wrote %d tags with every field set, maxParamTags is %d", got, maxParamTags)
	}
}
