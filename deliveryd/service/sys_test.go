package service_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/cluster"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// liveAgent is an agent connection of local.<actor> that never reconnects, so a kick ends it; its
// closed channel is closed when the server drops it.
type liveAgent struct {
	nc     *nats.Conn
	closed chan struct{}
}

func agentConn(t *testing.T, e *plane3test.Env, actor, uid string) *liveAgent {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.S.Addr, TLS: e.S.ClientFor(t, mtls.KindManagerd, plane3test.Space)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: plane3test.Space, Profile: signerv1.Profile_PROFILE_AGENT,
		Params: &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: actor, LifecycleUid: uid,
			Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}},
		NatsURL: e.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	a := &liveAgent{closed: make(chan struct{})}
	a.nc, err = nats.Connect(e.URL, append(rail.NatsOptions(), nats.Name("agent-"+actor), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(a.closed) }))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.nc.Close)
	return a
}

// waitClosed waits for the server to close the agent's connection.
func (a *liveAgent) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-a.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent's connection was not closed by the server")
	}
}

// policyWithout is signerd's default policy without the named profile rows of deliveryd.
func policyWithout(t *testing.T, profiles ...string) string {
	t.Helper()
	p := signerdtest.DefaultPolicy
	for _, name := range profiles {
		i := strings.Index(p, "      "+name+": ")
		if i < 0 {
			t.Fatalf("no %s row in the default policy", name)
		}
		j := strings.Index(p[i:], "\n")
		p = p[:i] + p[i+j+1:]
	}
	return p
}

func supervisor(t *testing.T, e *plane3test.Env) *nats.Conn {
	t.Helper()
	return e.Conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_SUPERVISOR, &signerv1.ProfileParams{Owner: plane3test.Owner, Actor: "manager"})
}

type evictData struct {
	Principal    string `json:"principal"`
	Kicked       int    `json:"kicked"`
	Remaining    int    `json:"remaining"`
	VerifiedGone bool   `json:"verifiedGone"`
	ScanComplete bool   `json:"scanComplete"`
	Verdict      string `json:"verdict"`
	Connections  int    `json:"connections"`
}

func decodeEvict(t *testing.T, r ctlReply) evictData {
	t.Helper()
	var d evictData
	if err := json.Unmarshal(r.Data, &d); err != nil {
		t.Fatalf("reply data %s: %v", r.Data, err)
	}
	return d
}

// TestEvictPrincipal: with live eviction on, ctl.delivery-admin's evictPrincipal closes a real
// agent's connection on the broker (scan, KICK, re-scan) and principalLiveness reads it live then
// gone; an absent principal is an idempotent success; a malformed one, an agent caller, eviction
// off and a policy without the $SYS profiles are refused.
func TestEvictPrincipal(t *testing.T) {
	e := plane3test.New(t)
	cfg := servicetest.Config(t, e, "deliveryd-evict")
	cfg.Membership.LiveEviction = true
	var logs logBuffer
	start(t, cfg, &logs)
	sup := supervisor(t, e)
	admin := space.CtlServiceDeliveryAdmin

	t.Run("ok/evicts a live agent", func(t *testing.T) {
		bob := agentConn(t, e, "bob", uidBob)
		carol := agentConn(t, e, "carol", uidCarol)
		r := ctlCall(t, sup, admin, "manager", "principalLiveness", map[string]string{"principal": "local.bob"})
		if d := decodeEvict(t, r); !r.OK || d.Verdict != "live" || d.Connections != 1 || !d.ScanComplete {
			t.Fatalf("principalLiveness before = %+v %+v", r, d)
		}
		r = ctlCall(t, sup, admin, "manager", "evictPrincipal", map[string]string{"principal": "local.bob"})
		d := decodeEvict(t, r)
		if !r.OK || d.Kicked != 1 || d.Remaining != 0 || !d.VerifiedGone || !d.ScanComplete || d.Principal != "local.bob" {
			t.Fatalf("evictPrincipal = %+v %+v", r, d)
		}
		bob.waitClosed(t)
		if !carol.nc.IsConnected() {
			t.Fatal("carol was evicted with bob")
		}
		r = ctlCall(t, sup, admin, "manager", "principalLiveness", map[string]string{"principal": "local.bob"})
		if d := decodeEvict(t, r); !r.OK || d.Verdict != "gone" || d.Connections != 0 {
			t.Fatalf("principalLiveness after = %+v %+v", r, d)
		}
	})
	t.Run("ok/absent principal is an idempotent success", func(t *testing.T) {
		r := ctlCall(t, sup, admin, "manager", "evictPrincipal", map[string]string{"principal": "local.nobody"})
		if d := decodeEvict(t, r); !r.OK || d.Kicked != 0 || !d.VerifiedGone {
			t.Fatalf("evictPrincipal(absent) = %+v %+v", r, d)
		}
	})
	t.Run("ok/planeConnLiveness grades a live connection and a gone one", func(t *testing.T) {
		dave := agentConn(t, e, "dave", uidAlice)
		cid, err := dave.nc.GetClientID()
		if err != nil {
			t.Fatal(err)
		}
		srv := dave.nc.ConnectedServerId()
		user := userOf(t, e, dave.nc)
		q := map[string]any{"query": map[string]any{
			"ledger":  map[string]any{"serverId": srv, "cid": cid, "userNkey": user},
			"records": map[string]any{"serverId": srv, "cid": cid + 100000, "userNkey": user},
		}}
		r := ctlCall(t, sup, admin, "manager", "planeConnLiveness", q)
		var pr struct{ Ledger, Records string }
		if !r.OK || json.Unmarshal(r.Data, &pr) != nil || pr.Ledger != "live" || pr.Records != "gone" {
			t.Fatalf("planeConnLiveness = %+v %+v", r, pr)
		}
		r = ctlCall(t, sup, admin, "manager", "planeConnLiveness", map[string]any{"query": map[string]any{"ledger": 1}})
		if r.OK {
			t.Fatalf("a malformed query was answered: %+v", r)
		}
	})
	t.Run("fail/malformed principal", func(t *testing.T) {
		for _, p := range []string{"nodot", "local.*", "local.>", ""} {
			r := ctlCall(t, sup, admin, "manager", "evictPrincipal", map[string]string{"principal": p})
			if r.OK || !strings.Contains(r.Error, "evictPrincipal") {
				t.Fatalf("evictPrincipal(%q) = %+v", p, r)
			}
		}
	})
	t.Run("fail/caller not supervisor", func(t *testing.T) {
		victim := agentConn(t, e, "erin", uidCarol)
		mallory := agentConn(t, e, "mallory", uidBob)
		subj := "cotal." + plane3test.Space + ".ctl." + admin + "." + plane3test.Owner + ".mallory"
		body, _ := json.Marshal(map[string]any{"op": "evictPrincipal", "args": map[string]string{"principal": "local.erin"},
			"from": map[string]string{"id": "local.mallory", "name": "mallory"}})
		if err := mallory.nc.PublishRequest(subj, subj+".reply.x", body); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, func() error {
			if err := mallory.nc.LastError(); err == nil || !strings.Contains(err.Error(), "Permissions Violation") {
				return fmt.Errorf("no permissions violation yet (last error %v)", err)
			}
			return nil
		})
		r := ctlCall(t, sup, admin, "manager", "principalLiveness", map[string]string{"principal": "local.erin"})
		if d := decodeEvict(t, r); !r.OK || d.Verdict != "live" || !victim.nc.IsConnected() {
			t.Fatalf("erin after an agent's evictPrincipal = %+v %+v", r, d)
		}
	})
}

// userOf is the user public key nc authenticated with, as the broker's scan reports it.
func userOf(t *testing.T, e *plane3test.Env, nc *nats.Conn) string {
	t.Helper()
	// The rail's inbox prefix is _INBOX_<user nkey>; the connection's own reply inbox shows it.
	inbox := nc.NewRespInbox()
	user, _, ok := strings.Cut(strings.TrimPrefix(inbox, "_INBOX_"), ".")
	if !ok || !strings.HasPrefix(user, "U") {
		t.Fatalf("no user key in inbox %q", inbox)
	}
	return user
}

// TestEvictRefusedWithoutExecutor: eviction off, or a signerd policy without deliveryd's $SYS
// profiles, leaves the verbs refusing loudly; the daemon serves regardless.
func TestEvictRefusedWithoutExecutor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy string
		on     bool
	}{
		{"fail/eviction off", "", false},
		{"fail/policy refuses the observer", "membership-observer", true},
		{"fail/policy refuses the evictor (torn pair)", "connection-evictor", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := signerdtest.Options{}
			if tc.policy != "" {
				opts.Policy = policyWithout(t, tc.policy)
			}
			e := plane3test.NewWith(t, opts)
			cfg := servicetest.Config(t, e, "deliveryd-noexec")
			cfg.Membership.LiveEviction = tc.on
			var logs logBuffer
			svc := start(t, cfg, &logs)
			sup := supervisor(t, e)
			for _, op := range []string{"evictPrincipal", "principalLiveness"} {
				r := ctlCall(t, sup, space.CtlServiceDeliveryAdmin, "manager", op, map[string]string{"principal": "local.bob"})
				if r.OK || !strings.Contains(r.Error, "no executor wired") {
					t.Fatalf("%s = %+v", op, r)
				}
			}
			if tc.on && !logs.has("live eviction off") {
				t.Fatalf("no warning logged:\n%s", logs.String())
			}
			if err := svc.Healthy(); err != nil {
				t.Fatalf("service not serving: %v", err)
			}
		})
	}
}

// TestMembershipFeed: the feed writes a principal's row when a real agent connects and deletes it
// when the agent leaves, and stamps the =feed heartbeat; without its credentials the daemon runs
// traffic-only with a warning.
func TestMembershipFeed(t *testing.T) {
	t.Run("ok/connect and disconnect reach the bucket", func(t *testing.T) {
		e := plane3test.New(t)
		cfg := servicetest.Config(t, e, "deliveryd-feed")
		cfg.Membership.Feed = true
		var logs logBuffer
		start(t, cfg, &logs)
		if !logs.has("membership feed up") {
			t.Fatalf("feed not up:\n%s", logs.String())
		}
		bucket, _ := e.N.Bucket(space.Membership)
		kv, err := plane3test.JS(t, e.Conn(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_MEMBERSHIP_RW, nil)).KeyValue(ctx(t), bucket)
		if err != nil {
			t.Fatal(err)
		}
		bob := agentConn(t, e, "bob", uidBob)
		eventually(t, 10*time.Second, func() error {
			en, err := kv.Get(ctx(t), "local.bob")
			if err != nil {
				return err
			}
			var row struct {
				Principal   string `json:"principal"`
				Connections int    `json:"connections"`
			}
			if err := json.Unmarshal(en.Value(), &row); err != nil || row.Principal != "local.bob" || row.Connections != 1 {
				return fmt.Errorf("row %s", en.Value())
			}
			return nil
		})
		hb, err := kv.Get(ctx(t), space.MembershipFeedKey)
		if err != nil || !strings.Contains(string(hb.Value()), `"complete":true`) {
			t.Fatalf("heartbeat: %v", err)
		}
		bob.nc.Close()
		eventually(t, 10*time.Second, func() error {
			if _, err := kv.Get(ctx(t), "local.bob"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("bob's row still there (%v)", err)
			}
			return nil
		})
	})
	t.Run("ok/the observer renews before its credential expires", func(t *testing.T) {
		pol := strings.Replace(signerdtest.DefaultPolicy, "membership-observer: {ttl_max: 24h", "membership-observer: {ttl_max: 3s", 1)
		if pol == signerdtest.DefaultPolicy {
			t.Fatal("no observer row to shorten")
		}
		e := plane3test.NewWith(t, signerdtest.Options{Policy: pol})
		cfg := servicetest.Config(t, e, "deliveryd-feed-renew")
		cfg.Membership.Feed = true
		cfg.Membership.PollInterval = yamlx.Duration(500 * time.Millisecond)
		var logs logBuffer
		start(t, cfg, &logs)
		bucket, _ := e.N.Bucket(space.Membership)
		kv, err := plane3test.JS(t, e.Conn(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_MEMBERSHIP_RW, nil)).KeyValue(ctx(t), bucket)
		if err != nil {
			t.Fatal(err)
		}
		// The heartbeat is stamped only after a successful CONNZ on the observer's credential:
		// one stamped two observer lifetimes after start proves the feed renewed it.
		past := time.Now().Add(7 * time.Second)
		eventually(t, 15*time.Second, func() error {
			hb, err := kv.Get(ctx(t), space.MembershipFeedKey)
			if err != nil {
				return err
			}
			var v struct {
				UpdatedAt time.Time `json:"updatedAt"`
				Complete  bool      `json:"complete"`
			}
			if err := json.Unmarshal(hb.Value(), &v); err != nil || !v.Complete || v.UpdatedAt.Before(past) {
				return fmt.Errorf("heartbeat %s not yet past %v", hb.Value(), past)
			}
			return nil
		})
		agentConn(t, e, "frank", uidAlice)
		eventually(t, 10*time.Second, func() error {
			_, err := kv.Get(ctx(t), "local.frank")
			return err
		})
		if logs.has("was not renewed") || logs.has("poll failed") {
			t.Fatalf("renewal trouble:\n%s", logs.String())
		}
	})
	for _, missing := range []string{"membership-rw", "membership-observer"} {
		t.Run("fail/degrades without "+missing, func(t *testing.T) {
			e := plane3test.NewWith(t, signerdtest.Options{Policy: policyWithout(t, missing)})
			cfg := servicetest.Config(t, e, "deliveryd-nofeed")
			cfg.Membership.Feed = true
			var logs logBuffer
			svc := start(t, cfg, &logs)
			if !logs.has("membership feed off: delivery runs traffic-only") || !logs.has(`"code":"MEMBERSHIP"`) {
				t.Fatalf("no degradation warning:\n%s", logs.String())
			}
			if err := svc.Healthy(); err != nil {
				t.Fatalf("service not serving: %v", err)
			}
			pjs := e.Provisioner(t)
			e.AddLifecycle(t, pjs, "bob", uidBob, []string{"general"})
			r := ctlCall(t, e.Agent(t, "bob", uidBob), space.CtlServiceDelivery, "bob", "durableJoin", map[string]string{"channel": "general"})
			if !r.OK {
				t.Fatalf("traffic-only delivery refused a durableJoin: %+v", r)
			}
		})
	}
}

// TestEvictCluster: on a 3-node cluster the account scan fans out to every node: with all three
// answering, an absent principal reads gone and an eviction is verified; with a node down the scan
// is incomplete, so an absent principal reads unknown (never gone) and an eviction kicks what it
// found but is not reported verified.
func TestEvictCluster(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{plane3test.Space}})
	c := cluster.Start(t, s, 3)
	e := plane3test.OnWith(t, s, c.URLList(), provision.Options{Replicas: 3})
	cfg := servicetest.Config(t, e, "deliveryd-cluster-evict")
	cfg.Brokers = c.URLs()
	cfg.Membership.LiveEviction = true
	var logs logBuffer
	start(t, cfg, &logs)
	sup := supervisor(t, e)
	admin := space.CtlServiceDeliveryAdmin

	r := ctlCall(t, sup, admin, "manager", "principalLiveness", map[string]string{"principal": "local.nobody"})
	if d := decodeEvict(t, r); !r.OK || d.Verdict != "gone" || !d.ScanComplete {
		t.Fatalf("principalLiveness(absent), every node up = %+v %+v", r, d)
	}
	bob := agentConn(t, e, "bob", uidBob)
	r = ctlCall(t, sup, admin, "manager", "evictPrincipal", map[string]string{"principal": "local.bob"})
	if d := decodeEvict(t, r); !r.OK || d.Kicked != 1 || !d.VerifiedGone {
		t.Fatalf("evictPrincipal, every node up = %+v %+v", r, d)
	}
	bob.waitClosed(t)

	// Down a node neither deliveryd nor the supervisor is on.
	dn, err := c.NodeOf("deliveryd")
	if err != nil {
		t.Fatal(err)
	}
	carol := agentConn(t, e, "carol", uidCarol)
	down := -1
	for i := 0; i < c.N(); i++ {
		if i != dn && c.URL(i) != sup.ConnectedUrl() && c.URL(i) != carol.nc.ConnectedUrl() {
			down = i
		}
	}
	if down < 0 {
		t.Skip("every node holds one of the test's connections")
	}
	if err := c.Kill(down); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		r := ctlCall(t, sup, admin, "manager", "principalLiveness", map[string]string{"principal": "local.nobody"})
		if d := decodeEvict(t, r); !r.OK || d.Verdict != "unknown" || d.ScanComplete {
			return fmt.Errorf("principalLiveness(absent), a node down = %+v %+v", r, d)
		}
		return nil
	})
	r = ctlCall(t, sup, admin, "manager", "evictPrincipal", map[string]string{"principal": "local.carol"})
	if d := decodeEvict(t, r); r.OK || d.Kicked != 1 || d.VerifiedGone || d.ScanComplete {
		t.Fatalf("evictPrincipal, a node down = %+v %+v", r, d)
	}
	carol.waitClosed(t)
}
