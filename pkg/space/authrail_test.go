package space

import (
	"strings"
	"testing"
)

func TestAuthRails(t *testing.T) {
	n, err := NewNames("s2420")
	if err != nil {
		t.Fatal(err)
	}
	uid, cuid := strings.Repeat("c", 26), strings.Repeat("d", 26)
	r := RetireRail{"u_" + strings.Repeat("a", 26), "probe", uid, "u_" + strings.Repeat("a", 26), "manager_serve_" + strings.Repeat("b", 26), cuid, "nonce1234"}
	s, err := n.RetireLifecycle(r)
	if err != nil {
		t.Fatal(err)
	}
	want := n.Prefix() + ".ep.one.auth.retire-lifecycle.handle." + r.TargetOwner + ".probe." + uid + "." + r.CallerOwner + "." + r.CallerActor + "." + cuid + ".nonce1234"
	if s != want {
		t.Fatalf("RetireLifecycle = %q, want %q", s, want)
	}
	if !bruteMatch(strings.Split(n.RetireLifecycleServe(), "."), strings.Split(s, ".")) {
		t.Fatalf("serve pattern %q misses %q", n.RetireLifecycleServe(), s)
	}
	if bruteMatch(strings.Split(n.RetireLifecycleServe(), "."), strings.Split(RailReply(s), ".")) {
		t.Fatal("the serve pattern matches a reply subject")
	}
	g, err := n.RetireLifecycleCaller(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bruteMatch(strings.Split(g, "."), strings.Split(s, ".")) || !bruteMatch(strings.Split(RailReplyGrant(g), "."), strings.Split(RailReply(s), ".")) || !bruteMatch(strings.Split(n.RetireLifecycleReplyAny(), "."), strings.Split(RailReply(s), ".")) {
		t.Fatalf("grants %q / %q miss %q", g, RailReplyGrant(g), s)
	}
	back, err := n.ParseRetireLifecycle(s)
	if err != nil || back != r {
		t.Fatalf("ParseRetireLifecycle = %+v, %v", back, err)
	}
	for _, bad := range []string{RailReply(s), strings.Replace(s, uid, "x", 1), strings.Replace(s, "nonce1234", "*", 1), "cotal.other." + s[len(n.Prefix())+1:]} {
		if _, err := n.ParseRetireLifecycle(bad); err == nil {
			t.Errorf("ParseRetireLifecycle(%q) accepted", bad)
		}
	}
	bad := r
	bad.CallerUID = "short"
	if _, err := n.RetireLifecycle(bad); err == nil {
		t.Error("a bad caller uid was accepted")
	}

	m, err := n.RegisterManager(r.CallerOwner, r.CallerActor, "nonce1234")
	if err != nil {
		t.Fatal(err)
	}
	if m != n.Prefix()+".ep.one.auth.register-manager."+r.CallerOwner+"."+r.CallerActor+".nonce1234" {
		t.Fatalf("RegisterManager = %q", m)
	}
	mg, _ := n.RegisterManagerCaller(r.CallerOwner, r.CallerActor)
	if !bruteMatch(strings.Split(n.RegisterManagerServe(), "."), strings.Split(m, ".")) || !bruteMatch(strings.Split(mg, "."), strings.Split(m, ".")) || bruteMatch(strings.Split(n.RegisterManagerServe(), "."), strings.Split(RailReply(m), ".")) || !bruteMatch(strings.Split(n.RegisterManagerReplyAny(), "."), strings.Split(RailReply(m), ".")) {
		t.Fatal("register-manager patterns disagree with the subject")
	}
	o, a, nonce, err := n.ParseRegisterManager(m)
	if err != nil || o != r.CallerOwner || a != r.CallerActor || nonce != "nonce1234" {
		t.Fatalf("ParseRegisterManager = %q %q %q %v", o, a, nonce, err)
	}
	if _, _, _, err := n.ParseRegisterManager(RailReply(m)); err == nil {
		t.Error("a reply subject parsed as a request")
	}
}
