package ctl_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestBadInput: what is wrong with a ctl.delivery request gets a clear refusal and changes
// nothing; a request whose reply target is not its own lane gets no answer at all.
func TestBadInput(t *testing.T) {
	f := setup(t, nil, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	join := body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a1")
	big := []byte(`{"op":"durableJoin","args":{"channel":"general","pad":"` + strings.Repeat("x", 1<<20-80) + `"},"from":{"id":"local.a1"}}`)
	big = append(big[:len(big)-len(`"},"from":{"id":"local.a1"}}`)-(len(big)-(1<<20))], []byte(`"},"from":{"id":"local.a1"}}`)...)
	if len(big) != 1<<20 {
		t.Fatalf("the big body is %d bytes", len(big))
	}
	for _, tt := range []struct {
		name string
		body []byte
		want string
	}{
		{"fail/not JSON", []byte("durableJoin general"), "not a JSON object"},
		{"fail/a JSON array", []byte(`[{"op":"durableJoin"}]`), "not a JSON object"},
		{"fail/no op", []byte(`{"args":{"channel":"general"},"from":{"id":"local.a1"}}`), "op must be a non-empty string"},
		{"fail/an unknown verb", body(t, "purgeEverything", map[string]any{"channel": "general"}, "local.a1"), `op "purgeEverything" not supported`},
		{"fail/readHistory is not supported", body(t, ctl.OpReadHistory, map[string]any{"channel": "general"}, "local.a1"), "readHistory: not supported"},
		{"fail/args that are not an object", []byte(`{"op":"durableJoin","args":["general"],"from":{"id":"local.a1"}}`), "args must be a JSON object"},
		{"fail/a from.id that is not a string", []byte(`{"op":"durableJoin","args":{"channel":"general"},"from":{"id":7}}`), "from.id must be a string"},
		{"fail/no from", []byte(`{"op":"durableJoin","args":{"channel":"general"}}`), "from.id must be a string"},
		{"fail/a spoofed sender", body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a2"), "sender mismatch"},
		{"fail/a 1 MiB body", big, "body of 1048576 bytes is over the 65536-byte bound"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := f.state(t)
			r, ok := send(t, a1, space.CtlServiceDelivery, "a1", tt.body, "", 20*time.Second)
			if !ok {
				t.Fatal("no reply")
			}
			wantRefusal(t, r, tt.want)
			if after := f.state(t); after != before {
				t.Fatalf("a refused request moved %s to %s", before, after)
			}
			if m := f.member(t, "general", "a1", uid1); m != nil {
				t.Fatalf("a refused request wrote %+v", m)
			}
		})
	}

	a2 := f.e.Agent(t, "a2", uid2)
	own := "cotal." + plane3test.Space + ".ctl.delivery.local.a1"
	for _, tt := range []struct{ name, replyTo string }{
		{"fail/a reply target in another principal's lane is dropped", "cotal." + plane3test.Space + ".ctl.delivery.local.a2.reply.0123456789abcdef"},
		{"fail/a reply target outside the reply lane is dropped", own + ".other.0123456789abcdef"},
		{"fail/a multi-token reply nonce is dropped", own + ".reply.0123456789.abcdef"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := f.state(t)
			victim, err := a2.SubscribeSync("cotal." + plane3test.Space + ".ctl.delivery.local.a2.>")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = victim.Unsubscribe() }()
			if err := a2.Flush(); err != nil {
				t.Fatal(err)
			}
			if r, ok := send(t, a1, space.CtlServiceDelivery, "a1", join, tt.replyTo, quiet); ok {
				t.Fatalf("answered %+v on %s", r, tt.replyTo)
			}
			if m, err := victim.NextMsg(quiet); !errors.Is(err, nats.ErrTimeout) {
				t.Fatalf("the other principal's lane got %v, %v", m, err)
			}
			if after := f.state(t); after != before {
				t.Fatalf("a dropped request moved %s to %s", before, after)
			}
		})
	}
	t.Run("ok/the responder still answers a well-formed request", func(t *testing.T) {
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
	})
}

// TestListMemberships lists the caller lifecycle's open memberships only.
func TestListMemberships(t *testing.T) {
	f := setup(t, nil, nil)
	a1, a2 := f.e.Agent(t, "a1", uid1), f.e.Agent(t, "a2", uid2)
	for _, ch := range []string{"general", "team.backend"} {
		if r := call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": ch}); !r.OK {
			t.Fatal(r.Error)
		}
	}
	if r := call(t, a2, "a2", ctl.OpDurableJoin, map[string]any{"channel": "general"}); !r.OK {
		t.Fatal(r.Error)
	}
	if r := call(t, a1, "a1", ctl.OpDurableLeave, map[string]any{"channel": "team.backend", "generation": 1, "lifecycleUid": uid1}); !r.OK {
		t.Fatal(r.Error)
	}
	type list struct {
		Memberships []ctl.Membership `json:"memberships"`
	}
	for _, tt := range []struct {
		name, actor, uid string
		nc               *nats.Conn
		want             []ctl.Membership
	}{
		{"ok/the open rows of the caller's lifecycle, tombstones left out", "a1", uid1, a1, []ctl.Membership{{Channel: "general", Generation: 1, Activated: true}}},
		{"ok/another lifecycle of the caller has none", "a1", uid3, a1, []ctl.Membership{}},
		{"ok/the other caller sees only its own", "a2", uid2, a2, []ctl.Membership{{Channel: "general", Generation: 1, Activated: true}}},
		{"ok/a caller naming another principal's uid sees nothing of it", "a2", uid1, a2, []ctl.Membership{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := data[list](t, call(t, tt.nc, tt.actor, ctl.OpListMemberships, map[string]any{"lifecycleUid": tt.uid}))
			if len(got.Memberships) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got.Memberships, tt.want)
			}
			for i := range tt.want {
				if got.Memberships[i] != tt.want[i] {
					t.Fatalf("got %+v, want %+v", got.Memberships, tt.want)
				}
			}
		})
	}
	t.Run("fail/no lifecycleUid", func(t *testing.T) {
		wantRefusal(t, call(t, a1, "a1", ctl.OpListMemberships, map[string]any{}), "lifecycleUid: is required")
	})
}

// TestFenceAndStop: a fenced responder answers nothing and changes nothing; Stop unbinds it and
// Start binds it again.
func TestFenceAndStop(t *testing.T) {
	f := setup(t, nil, nil)
	a1 := f.e.Agent(t, "a1", uid1)
	join := body(t, ctl.OpDurableJoin, map[string]any{"channel": "general"}, "local.a1")

	t.Run("fail/a fenced responder neither writes nor replies", func(t *testing.T) {
		f.fence.Store(false)
		defer f.fence.Store(true)
		before := f.state(t)
		if r, ok := send(t, a1, space.CtlServiceDelivery, "a1", join, "", quiet); ok {
			t.Fatalf("a fenced responder answered %+v", r)
		}
		if after := f.state(t); after != before {
			t.Fatalf("a fenced join moved %s to %s", before, after)
		}
	})
	t.Run("fail/a stopped responder is unbound", func(t *testing.T) {
		f.r.Stop()
		f.r.Stop() // idempotent
		if r, ok := send(t, a1, space.CtlServiceDelivery, "a1", join, "", quiet); ok {
			t.Fatalf("a stopped responder answered %+v", r)
		}
		if m := f.member(t, "general", "a1", uid1); m != nil {
			t.Fatalf("a stopped responder wrote %+v", m)
		}
	})
	t.Run("ok/Start binds it again", func(t *testing.T) {
		if err := f.r.Start(plane3test.Ctx(t), f.dc); err != nil {
			t.Fatal(err)
		}
		if err := f.r.Start(plane3test.Ctx(t), f.dc); err == nil {
			t.Fatal("a second Start succeeded")
		}
		got := data[ctl.JoinResult](t, call(t, a1, "a1", ctl.OpDurableJoin, map[string]any{"channel": "general"}))
		if !got.Durable || got.Generation != 1 {
			t.Fatalf("join = %+v", got)
		}
	})
}

// TestNeverCreates: on an unprovisioned space Start fails naming the missing stream and binds
// nothing.
func TestNeverCreates(t *testing.T) {
	e := plane3test.Unprovisioned(t)
	r, err := ctl.New(ctl.Config{Names: e.N, WriterIdentity: "U"})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(plane3test.Ctx(t), e.Delivery(t))
	if err == nil || !strings.Contains(err.Error(), "stream CHAT_alpha") {
		t.Fatalf("Start = %v, want a missing CHAT_alpha", err)
	}
	for _, cfg := range []ctl.Config{{WriterIdentity: "U"}, {Names: e.N}, {Names: e.N, WriterIdentity: "U", MaxRequestBytes: -1}} {
		if _, err := ctl.New(cfg); err == nil {
			t.Fatalf("New(%+v) accepted an invalid config", cfg)
		}
	}
}

// signerRenewer renews as deliveryd's hook would: a Mint through the real signerd for a fresh
// key, proven by connecting with it. profile switches to one deliveryd may not mint, to make
// signerd refuse.
type signerRenewer struct {
	c      *signerclient.Client
	url    string
	refuse atomic.Bool
	calls  atomic.Int32
}

func (s *signerRenewer) RenewNow(ctx context.Context) (ctl.Proven, error) {
	s.calls.Add(1)
	kp, err := nkeys.CreateUser()
	if err != nil {
		return ctl.Proven{}, err
	}
	pub, _ := kp.PublicKey()
	p := signerv1.Profile_PROFILE_DELIVERY
	if s.refuse.Load() {
		p = signerv1.Profile_PROFILE_PROVISIONER
	}
	cred, err := s.c.Mint(ctx, &signerv1.MintRequest{Space: plane3test.Space, Profile: p, UserPublicKey: pub})
	if err != nil {
		return ctl.Proven{}, err
	}
	seed, _ := kp.Seed()
	nc, err := nats.Connect(s.url, nats.UserJWTAndSeed(cred.Jwt, string(seed)), nats.NoReconnect())
	if err != nil {
		return ctl.Proven{}, err
	}
	nc.Close()
	uc, err := jwt.DecodeUserClaims(cred.Jwt)
	if err != nil {
		return ctl.Proven{}, err
	}
	return ctl.Proven{Identity: uc.Subject, IssuedAt: time.Unix(uc.IssuedAt, 0), Expires: time.Unix(uc.Expires, 0)}, nil
}

// TestAdmin covers ctl.delivery-admin from a supervisor credential, and the broker refusing an
// agent that publishes there.
func TestAdmin(t *testing.T) {
	ren := &signerRenewer{}
	var started atomic.Bool
	started.Store(true)
	f := setup(t, func(c *ctl.Config) { c.Renewer, c.Started = ren, started.Load }, func(f *fixture, _ *ctl.Responders) {
		c, err := signerclient.Dial(signerclient.Config{Addr: f.e.S.Addr, TLS: f.e.S.ClientFor(t, mtls.KindDeliveryd, plane3test.Space)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ren.c, ren.url = c, f.e.URL
	})
	sup := f.e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: "local", Actor: "manager"})
	admin := func(t *testing.T, op, from string) reply {
		t.Helper()
		r, ok := send(t, sup, space.CtlServiceDeliveryAdmin, "manager", body(t, op, map[string]any{}, from), "", 20*time.Second)
		if !ok {
			t.Fatalf("%s: no reply", op)
		}
		return r
	}

	t.Run("ok/reloadCreds answers the identity, iat and exp signerd issued and the broker accepted", func(t *testing.T) {
		start := time.Now().Unix()
		got := data[ctl.ReloadResult](t, admin(t, ctl.OpReloadCreds, "local.manager"))
		d := got.Delivery
		if !d.OK || d.BrokerAccepted == nil || !strings.HasPrefix(d.BrokerAccepted.Identity, "U") || len(d.BrokerAccepted.Identity) != 56 {
			t.Fatalf("delivery = %+v", d)
		}
		if d.BrokerAccepted.IssuedAt < start-1 || d.BrokerAccepted.Expires-d.BrokerAccepted.IssuedAt != int64((24*time.Hour).Seconds()) {
			t.Fatalf("iat %d exp %d, want a 24 h delivery credential issued from %d", d.BrokerAccepted.IssuedAt, d.BrokerAccepted.Expires, start)
		}
		if !got.Membership.OK || !got.Membership.Skipped {
			t.Fatalf("membership = %+v, want skipped", got.Membership)
		}
	})
	t.Run("fail/reloadCreds before start-up finished is refused and renews nothing", func(t *testing.T) {
		started.Store(false)
		defer started.Store(true)
		before := ren.calls.Load()
		r := admin(t, ctl.OpReloadCreds, "local.manager")
		wantRefusal(t, r, "reloadCreds: "+ctl.ErrNotStarted)
		if n := ren.calls.Load(); n != before {
			t.Fatalf("the renewer was called %d times before start-up finished", n-before)
		}
	})
	t.Run("fail/reloadCreds reports a refused renewal as ok:false", func(t *testing.T) {
		ren.refuse.Store(true)
		defer ren.refuse.Store(false)
		r := admin(t, ctl.OpReloadCreds, "local.manager")
		wantRefusal(t, r, "reloadCreds: delivery:")
		if !strings.Contains(strings.ToLower(r.Error), "denied") {
			t.Fatalf("error %q does not carry signerd's refusal", r.Error)
		}
	})
	t.Run("ok/reloadStoreIdentity names the signer endpoint", func(t *testing.T) {
		got := data[ctl.StoreIdentity](t, admin(t, ctl.OpReloadStoreIdentity, "local.manager"))
		if got.Kind != "signer" || got.Endpoint != f.e.S.Addr {
			t.Fatalf("store identity = %+v, want signer %s", got, f.e.S.Addr)
		}
	})
	for _, op := range []string{ctl.OpEvictPrincipal, ctl.OpPrincipalLiveness, ctl.OpPlaneConnLiveness} {
		t.Run("fail/"+op+" has no executor", func(t *testing.T) {
			wantRefusal(t, admin(t, op, "local.manager"), op+": no executor wired")
		})
	}
	t.Run("fail/an unknown admin verb", func(t *testing.T) {
		wantRefusal(t, admin(t, "dropAll", "local.manager"), `unsupported delivery-admin op "dropAll"`)
	})
	t.Run("fail/a spoofed admin sender", func(t *testing.T) {
		wantRefusal(t, admin(t, ctl.OpReloadStoreIdentity, "local.other"), "sender mismatch")
	})
	t.Run("fail/an agent may not publish on ctl.delivery-admin", func(t *testing.T) {
		a1 := f.e.Agent(t, "a1", uid1)
		subj, _ := f.e.N.CtlDeliveryAdmin("local", "a1")
		r, ok := send(t, a1, space.CtlServiceDeliveryAdmin, "a1", body(t, ctl.OpReloadStoreIdentity, nil, "local.a1"), subj+".reply.0123456789abcdef", quiet)
		if ok {
			t.Fatalf("an agent's admin request was answered: %+v", r)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if err := a1.LastError(); err == nil || !strings.Contains(err.Error(), testkit.PublishViolation(subj)) {
				return errors.New("no publish violation yet: " + errString(err))
			}
			return nil
		})
	})
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
