package ctl_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzDecodeRequest: the envelope decoder never panics, refuses with ErrBadRequest only, and what
// it accepts is a well-formed envelope that re-encodes and decodes to the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"op":"durableJoin","args":{"channel":"general"},"from":{"id":"local.a1"}}`,
		`{"op":"durableLeave","args":{"channel":"general","generation":3,"lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"},"from":{"id":"local.a1","name":"x"}}`,
		`{"op":"listMemberships","args":null,"from":{"id":""}}`,
		`{"op":"","from":{"id":"a"}}`, `{"op":1}`, `[]`, `null`, `not json`, `{"op":"x","args":[1],"from":{"id":"a"}}`,
		`{"op":"x","args":{"a":1},"from":{"id":"a"}} trailing`, "\x00", `{"op":"x","from":{"id":null}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ctl.DecodeRequest(b, 4096)
		if err != nil {
			if !errors.Is(err, ctl.ErrBadRequest) {
				t.Fatalf("refusal %v does not match ErrBadRequest", err)
			}
			if len(b) >= 16 && len(b) < 200 && strings.Contains(err.Error(), string(b)) {
				t.Fatalf("refusal %q echoes the body", err)
			}
			return
		}
		if len(b) > 4096 || r.Op == "" || len(r.Op) > 64 || r.Args == nil {
			t.Fatalf("accepted a malformed envelope: %d bytes, op %q, args %v", len(b), r.Op, r.Args)
		}
		again, err := json.Marshal(map[string]any{"op": r.Op, "args": r.Args, "from": map[string]string{"id": r.From}})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ctl.DecodeRequest(again, 1<<20)
		if err != nil || r2.Op != r.Op || r2.From != r.From || len(r2.Args) != len(r.Args) {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, r2, err, r)
		}
	})
}

// FuzzSubjects: the caller parser and the boundReply guard never panic, accept only what names a
// valid principal, and accept a reply only under the request subject's own reply lane.
func FuzzSubjects(f *testing.F) {
	n, err := space.NewNames("alpha")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("cotal.alpha.ctl.delivery.local.a1", "cotal.alpha.ctl.delivery.local.a1.reply.0123456789abcdef")
	f.Add("cotal.alpha.ctl.delivery.local.a1", "cotal.alpha.ctl.delivery.local.a2.reply.0123456789abcdef")
	f.Add("cotal.alpha.ctl.delivery.nkey.a1", "_INBOX.x")
	f.Add("cotal.alpha.ctl.delivery.local.a1.x", "cotal.alpha.ctl.delivery.local.a1.x.reply.a.b")
	f.Fuzz(func(t *testing.T, subject, reply string) {
		if c, ok := ctl.ParseCaller(n, space.CtlServiceDelivery, subject); ok {
			want, err := n.CtlDelivery(c.Owner, c.Actor)
			if err != nil || want != subject {
				t.Fatalf("ParseCaller(%q) = %+v, which builds %q, %v", subject, c, want, err)
			}
		}
		if ctl.BoundReply(subject, reply) {
			nonce, ok := strings.CutPrefix(reply, subject+".reply.")
			if !ok || strings.ContainsAny(nonce, ".*> ") || nonce == "" {
				t.Fatalf("BoundReply(%q, %q) accepted a reply outside the lane", subject, reply)
			}
		}
	})
}

// FuzzDecodeLifecycleMemberships: lifecycleMemberships' closed argument decoder never panics,
// refuses with ErrBadRequest only and without echoing a long body, and what it accepts is a
// lifecycle whose owner, actor and uid pass their pkg/space grammars and re-encode to a member
// key, decoded from args that held exactly the three fields.
func FuzzDecodeLifecycleMemberships(f *testing.F) {
	for _, s := range []string{
		`{"owner":"local","actor":"a1","lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}`,
		`{"owner":"u_abcdefghijklmnopqrstuvwxyz","actor":"web","lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}`,
		`{"owner":"local","actor":"a1","lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa","channel":"general"}`,
		`{"owner":"local","actor":"a1"}`, `{"owner":7,"actor":"a1","lifecycleUid":"x"}`,
		`{"owner":"UABC","actor":"a1","lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}`,
		`{"owner":"local","actor":"a.1","lifecycleUid":"uidaaaaaaaaaaaaaaaaaaaaaaa"}`,
		`{"owner":"local","actor":"a1","lifecycleUid":null}`, `{}`,
	} {
		f.Add([]byte(`{"op":"lifecycleMemberships","args":` + s + `,"from":{"id":"local.authd"}}`))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ctl.DecodeRequest(b, 4096)
		if err != nil {
			return
		}
		lc, err := ctl.DecodeLifecycleMembershipsArgs(req.Args)
		if err != nil {
			if !errors.Is(err, ctl.ErrBadRequest) {
				t.Fatalf("refusal %v does not match ErrBadRequest", err)
			}
			for _, v := range req.Args {
				if len(v) > 80 && strings.Contains(err.Error(), string(v)) {
					t.Fatalf("refusal %q echoes a long value", err)
				}
			}
			return
		}
		if len(req.Args) != 3 {
			t.Fatalf("accepted args with %d fields: %v", len(req.Args), req.Args)
		}
		if space.ValidateOwner(lc.Owner) != nil || space.ValidateActor(lc.Actor) != nil || space.ValidateUID(lc.UID) != nil {
			t.Fatalf("accepted %+v outside the grammars", lc)
		}
		if lc.Owner != "local" && space.ValidateDerivedOwner(lc.Owner) != nil {
			t.Fatalf("accepted owner %q that is not a principal owner", lc.Owner)
		}
		if _, err := space.MemberKey("general", lc.Owner, lc.Actor, lc.UID); err != nil {
			t.Fatalf("accepted %+v, which makes no member key: %v", lc, err)
		}
	})
}
