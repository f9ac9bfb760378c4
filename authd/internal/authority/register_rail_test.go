package authority

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// putLease writes lease.<iid> in the manager bucket as managerd would (the unlimited connection).
func putLease(t *testing.T, js jetstream.JetStream, n space.Names, iid, holder string) {
	t.Helper()
	ctx := context.Background()
	bucket, _ := n.Bucket(space.Manager)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	b, err := lifecycle.EncodeManagerLease(lifecycle.ManagerLease{Holder: holder, InstanceID: iid, Runtime: "pty", Root: "/srv", PID: 42, Since: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "lease."+iid, b); err != nil {
		t.Fatal(err)
	}
}

// askRegister publishes one register-manager request as owner.actor with body, having subscribed
// its reply subject first, and returns the decoded answer. A reply inbox on the message must get
// nothing: the answer goes only to <request>.reply.
func askRegister(t *testing.T, nc *nats.Conn, n space.Names, owner, actor string, body []byte) lifecycle.RegisterManagerReply {
	t.Helper()
	subj, err := n.RegisterManager(owner, actor, nats.NewInbox()[len("_INBOX."):])
	if err != nil {
		t.Fatal(err)
	}
	replies, err := nc.SubscribeSync(space.RailReply(subj))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = replies.Unsubscribe() }()
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = inbox.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Reply: inbox.Subject, Data: body}); err != nil {
		t.Fatal(err)
	}
	m, err := replies.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no answer on %s: %v", space.RailReply(subj), err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := inbox.Pending(); got != 0 {
		t.Fatalf("%d answers went to the message's reply inbox", got)
	}
	r, err := lifecycle.DecodeRegisterManagerReply(m.Data)
	if err != nil {
		t.Fatalf("answer %q: %v", m.Data, err)
	}
	return r
}

// TestRegisterManagerRail: over a real broker, the lease holder's three registrations commit
// epochs 0, 1 and 2; a non-holder, an unheld lease and a bad body are refused with nothing
// written.
func TestRegisterManagerRail(t *testing.T) {
	s, js, nc := provisioned(t)
	a := newAuthority(t, s, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := a.ServeRegisterManager(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if sub.Queue != space.AuthRailQueue || sub.Subject != s.Names().RegisterManagerServe() {
		t.Fatalf("subscribed %q in queue %q", sub.Subject, sub.Queue)
	}
	putLease(t, js, s.Names(), regIID, regPrincipal)
	body, _ := lifecycle.EncodeRegisterManagerRequest(regIID)

	var lastRev uint64
	for i := range 3 {
		r := askRegister(t, nc, s.Names(), "m1", "s1", body)
		if !r.OK || r.Result.InstanceID != regIID || r.Result.ProcessEpoch != uint64(i) || r.Result.RegistrationRevision <= lastRev ||
			r.Result.Generation != uint64(2*i+1) {
			t.Fatalf("registration %d = %+v", i, r)
		}
		lastRev = r.Result.RegistrationRevision
	}
	if g, _, _, err := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID); err != nil || g.Principal != regPrincipal || g.ProcessEpoch != 2 || g.RegistrationRevision != lastRev {
		t.Fatalf("gate = %+v, %v", g, err)
	}

	refused := func(t *testing.T, owner, actor string, body []byte, code Code) {
		t.Helper()
		w := s.Writes()
		r := askRegister(t, nc, s.Names(), owner, actor, body)
		if r.OK || r.Code != string(code) || r.Error == "" {
			t.Fatalf("answer %+v; want a %s refusal", r, code)
		}
		if s.Writes() != w {
			t.Fatalf("%d writes for a refused request", s.Writes()-w)
		}
	}
	t.Run("fail/non-holder", func(t *testing.T) { refused(t, "m1", "s2", body, CodePermissionDenied) })
	t.Run("fail/another owner", func(t *testing.T) { refused(t, "m2", "s1", body, CodePermissionDenied) })
	t.Run("fail/no lease", func(t *testing.T) {
		other, _ := lifecycle.EncodeRegisterManagerRequest(strings.Repeat("q", 26))
		refused(t, "m1", "s1", other, CodePermissionDenied)
	})
	t.Run("fail/bad body: no read", func(t *testing.T) {
		r := s.Reads()
		for _, b := range []string{``, `{}`, `{"v":1,"instanceId":"` + regIID + `","holder":"m1.s1"}`, `{"v":2,"instanceId":"` + regIID + `"}`} {
			refused(t, "m1", "s1", []byte(b), CodeBadRequest)
		}
		if s.Reads() != r {
			t.Fatalf("%d reads for bad bodies", s.Reads()-r)
		}
	})
	t.Run("fail/bad subject", func(t *testing.T) {
		_, err := a.RegisterManager(ctx, "cotal.other.ep.one.auth.register-manager.m1.s1.nonce0000", body)
		wantCode(t, err, CodeBadRequest)
	})
	if g, _, _, _ := s.EndpointGate(ctx, lifecycle.ManagerEndpoint, regIID); g.ProcessEpoch != 2 {
		t.Fatalf("a refusal moved the gate: %+v", g)
	}
}

// TestStoreLease: the lease row decodes; a released key reads absent; a row naming another
// instance, or garbage, is corruption.
func TestStoreLease(t *testing.T) {
	s, js, _ := provisioned(t)
	ctx := context.Background()
	if _, _, ok, err := s.Lease(ctx, regIID); ok || err != nil {
		t.Fatalf("unwritten lease: found %v, %v", ok, err)
	}
	putLease(t, js, s.Names(), regIID, regPrincipal)
	l, rev, ok, err := s.Lease(ctx, regIID)
	if err != nil || !ok || rev == 0 || l.Holder != regPrincipal || l.Registered() {
		t.Fatalf("Lease = %+v rev %d found %v, %v", l, rev, ok, err)
	}
	bucket, _ := s.Names().Bucket(space.Manager)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "lease."+regIID); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := s.Lease(ctx, regIID); ok || err != nil {
		t.Fatalf("released lease: found %v, %v", ok, err)
	}
	other := strings.Repeat("w", 26)
	b, _ := lifecycle.EncodeManagerLease(lifecycle.ManagerLease{Holder: regPrincipal, InstanceID: regIID, Runtime: "pty", Root: "/", PID: 1})
	if _, err := kv.Put(ctx, "lease."+other, b); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Lease(ctx, other); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a row of another instance: %v, want ErrCorrupt", err)
	}
	if _, err := kv.Put(ctx, "lease."+other, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Lease(ctx, other); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage: %v, want ErrCorrupt", err)
	}
}
