package provision_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	uidA = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	uidB = "uidbbbbbbbbbbbbbbbbbbbbbbb"
)

// agentEnv is a real signerd and broker; every credential is minted by signerd.
type agentEnv struct {
	s   *signerdtest.Signer
	srv *server.Server
	n   space.Names
	cfg provision.Config
}

// newAgentEnv starts signerd and a broker and, when provisioned, creates the space's streams and
// buckets with provision.Run.
func newAgentEnv(t *testing.T, provisioned bool) *agentEnv {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})
	srv := s.StartBrokerServer(t)
	signer, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindManagerd, spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { signer.Close() })
	e := &agentEnv{s: s, srv: srv, n: names(t), cfg: provision.Config{Signer: signer, Space: spaceName, NatsURL: srv.ClientURL()}}
	if provisioned {
		if _, err := provision.Run(testCtx(t), e.cfg); err != nil {
			t.Fatalf("provision the space: %v", err)
		}
	}
	return e
}

// asyncErrs records a connection's asynchronous errors (the broker's refusals).
type asyncErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

// wait waits for an error containing want.
func (a *asyncErrs) wait(t *testing.T, nc *nats.Conn, want string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		_ = nc.Flush()
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, err := range a.errs {
			if strings.Contains(err.Error(), want) {
				return nil
			}
		}
		return fmt.Errorf("no async error %q yet; have %v", want, a.errs)
	})
}

// conn mints a credential of profile through signerd as caller kind and connects with it.
func (e *agentEnv) conn(t *testing.T, kind string, p signerv1.Profile, params *signerv1.ProfileParams) (jetstream.JetStream, *nats.Conn, *asyncErrs) {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.s.Addr, TLS: e.s.ClientFor(t, kind, spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: spaceName, Profile: p, Params: params, NatsURL: e.srv.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	errs := &asyncErrs{}
	nc, err := nats.Connect(e.srv.ClientURL(), append(rail.NatsOptions(), nats.ErrorHandler(errs.handler))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, nc, errs
}

func (e *agentEnv) provisioner(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, _, _ := e.conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_PROVISIONER, nil)
	return js
}

func (e *agentEnv) agent(t *testing.T, actor, uid, role string) jetstream.JetStream {
	t.Helper()
	js, _, _ := e.conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT, &signerv1.ProfileParams{
		Owner: "local", Actor: actor, LifecycleUid: uid, Role: role,
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general", "team.backend"}, AllowPublish: []string{"general"},
	})
	return js
}

// consumers lists every consumer the broker holds, as STREAM/name, sorted: what the broker has,
// read from its own monitoring state, not through any credential.
func (e *agentEnv) consumers(t *testing.T) []string {
	t.Helper()
	jsz, err := e.srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true})
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			for _, ci := range sd.Consumer {
				out = append(out, sd.Name+"/"+ci.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// aclRow reads a lifecycle's ACL row with the provisioner: the entry, or nil when absent.
func aclRow(t *testing.T, pjs jetstream.JetStream, key string) jetstream.KeyValueEntry {
	t.Helper()
	kv, err := pjs.KeyValue(testCtx(t), "cotal_acl_alpha")
	if err != nil {
		t.Fatal(err)
	}
	en, err := kv.Get(testCtx(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return en
}

func agentA() provision.Agent {
	return provision.Agent{Owner: "local", Actor: "a1", LifecycleUID: uidA, Role: "reviewer", AllowSubscribe: []string{"general", "team.backend"}}
}

// fetchOne binds a pre-created consumer as its agent and fetches one message.
func fetchOne(t *testing.T, js jetstream.JetStream, stream, consumer string) string {
	t.Helper()
	c, err := js.Consumer(testCtx(t), stream, consumer)
	if err != nil {
		t.Fatalf("bind %s on %s: %v", consumer, stream, err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatalf("fetch %s: %v", consumer, err)
	}
	m, ok := <-batch.Messages()
	if !ok {
		t.Fatalf("fetch %s: nothing (%v)", consumer, batch.Error())
	}
	if err := m.Ack(); err != nil {
		t.Fatalf("ack on %s: %v", consumer, err)
	}
	return string(m.Data())
}

// TestProvisionAgent provisions one agent through a signerd-minted provisioner: exactly its dm_
// (starting after the DM that was already waiting), dlv_ and role queue and its ACL row exist,
// with upstream's configuration; the agent's own signerd-minted credential binds and fetches from
// each; and a second run, after the DM stream has moved, creates and writes nothing.
func TestProvisionAgent(t *testing.T) {
	e := newAgentEnv(t, true)
	a := agentA()
	bjs := e.agent(t, "b1", uidB, "")
	dmToA, err := e.n.Inst("local", "a1", "local", "b1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bjs.Publish(testCtx(t), dmToA, []byte("before")); err != nil {
		t.Fatalf("DM before provisioning: %v", err)
	}

	p, err := provision.RunProvisionAgent(testCtx(t), e.cfg, a)
	if err != nil {
		t.Fatal(err)
	}
	dm, dlv := "dm_local-a1-"+uidA, "dlv_local-a1-"+uidA
	if got, want := p.Created, []string{dm, dlv, "local.a1." + uidA, "svc_reviewer"}; !slices.Equal(got, want) {
		t.Fatalf("created %v, want %v", got, want)
	}
	if got, want := p.Durables(), []string{dm, dlv, "svc_reviewer"}; !slices.Equal(got, want) {
		t.Fatalf("durables %v, want %v", got, want)
	}
	if got, want := e.consumers(t), []string{"DLV_alpha/" + dlv, "DM_alpha/" + dm, "TASK_alpha/svc_reviewer"}; !slices.Equal(got, want) {
		t.Fatalf("broker holds %v, want %v", got, want)
	}

	pjs := e.provisioner(t)
	created := map[string]time.Time{}
	for _, c := range []struct {
		stream, name, filter string
		deliver              jetstream.DeliverPolicy
		start                uint64
	}{
		{"DM_alpha", dm, "cotal.alpha.inst.local.a1.>", jetstream.DeliverByStartSequencePolicy, 2},
		{"DLV_alpha", dlv, "cotal.alpha.dlv.local.a1." + uidA, jetstream.DeliverAllPolicy, 0},
		{"TASK_alpha", "svc_reviewer", "cotal.alpha.svc.reviewer.>", jetstream.DeliverAllPolicy, 0},
	} {
		cons, err := pjs.Consumer(testCtx(t), c.stream, c.name)
		if err != nil {
			t.Fatal(err)
		}
		info := cons.CachedInfo()
		cfg := info.Config
		if cfg.Durable != c.name || cfg.FilterSubject != c.filter || cfg.AckPolicy != jetstream.AckExplicitPolicy ||
			cfg.AckWait != time.Minute || cfg.DeliverPolicy != c.deliver || cfg.OptStartSeq != c.start ||
			cfg.DeliverSubject != "" || cfg.InactiveThreshold != 0 {
			t.Fatalf("%s on %s: %+v", c.name, c.stream, cfg)
		}
		created[c.name] = info.Created
	}
	row := aclRow(t, pjs, "local.a1."+uidA)
	if row == nil {
		t.Fatal("no ACL row")
	}
	var raw map[string]any
	if err := json.Unmarshal(row.Value(), &raw); err != nil || len(raw) != 3 {
		t.Fatalf("ACL row %s (%v)", row.Value(), err)
	}
	acl, ok := provision.DecodeACL(row.Value())
	if !ok || !slices.Equal(acl.AllowSubscribe, a.AllowSubscribe) || acl.Revision != 1 || acl.UpdatedAt <= 0 {
		t.Fatalf("ACL row %s", row.Value())
	}

	t.Run("ok/the agent binds and fetches each", func(t *testing.T) {
		ajs := e.agent(t, "a1", uidA, "reviewer")
		if _, err := bjs.Publish(testCtx(t), dmToA, []byte("after")); err != nil {
			t.Fatal(err)
		}
		if got := fetchOne(t, ajs, "DM_alpha", dm); got != "after" {
			t.Fatalf("dm_ delivered %q, want the DM sent after the activation frontier", got)
		}
		djs, _, _ := e.conn(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_DELIVERY, nil)
		dlvSubj, _ := e.n.Dlv("local", "a1", uidA)
		if _, err := djs.Publish(testCtx(t), dlvSubj, []byte("handed off")); err != nil {
			t.Fatal(err)
		}
		if got := fetchOne(t, ajs, "DLV_alpha", dlv); got != "handed off" {
			t.Fatalf("dlv_ delivered %q", got)
		}
		task, _ := e.n.Svc("reviewer", "local", "b1")
		if _, err := bjs.Publish(testCtx(t), task, []byte("review this")); err != nil {
			t.Fatal(err)
		}
		if got := fetchOne(t, ajs, "TASK_alpha", "svc_reviewer"); got != "review this" {
			t.Fatalf("svc_reviewer delivered %q", got)
		}
	})

	t.Run("ok/a second run changes nothing", func(t *testing.T) {
		again, err := provision.RunProvisionAgent(testCtx(t), e.cfg, a)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Created) != 0 || !slices.Equal(again.Durables(), p.Durables()) {
			t.Fatalf("second run: %+v", again)
		}
		if got := e.consumers(t); len(got) != 3 {
			t.Fatalf("broker holds %v", got)
		}
		for _, c := range []struct{ stream, name string }{{"DM_alpha", dm}, {"DLV_alpha", dlv}, {"TASK_alpha", "svc_reviewer"}} {
			cons, err := pjs.Consumer(testCtx(t), c.stream, c.name)
			if err != nil {
				t.Fatal(err)
			}
			if cons.CachedInfo().Created != created[c.name] || (c.name == dm && cons.CachedInfo().Config.OptStartSeq != 2) {
				t.Fatalf("%s was recreated or changed: %+v", c.name, cons.CachedInfo())
			}
		}
		if again := aclRow(t, pjs, "local.a1."+uidA); again == nil || again.Revision() != row.Revision() {
			t.Fatalf("ACL row rewritten: %v", again)
		}
	})
}

// TestProvisionAgentFailureLeavesNothing: a provision refused before anything is written creates
// nothing, and one that fails midway (the role queue refused by the broker after dm_, dlv_ and
// the ACL row exist) is rolled back by a deprovisioner, so only what was there before remains.
func TestProvisionAgentFailureLeavesNothing(t *testing.T) {
	key := "local.a1." + uidA
	for _, tc := range []struct {
		name        string
		provisioned bool
		agent       func() provision.Agent
		before      func(t *testing.T, e *agentEnv, pjs jetstream.JetStream)
		step        string
		conflict    bool
		consumers   []string
	}{
		{name: "fail/invalid role", provisioned: true,
			agent: func() provision.Agent { a := agentA(); a.Role = "no role"; return a },
			step:  provision.StepValidate},
		{name: "fail/invalid channel", provisioned: true,
			agent: func() provision.Agent { a := agentA(); a.AllowSubscribe = []string{"team.>.x"}; return a },
			step:  provision.StepValidate},
		{name: "fail/ACL bucket missing",
			before: func(t *testing.T, e *agentEnv, pjs jetstream.JetStream) {
				items, err := provision.Plan(e.n)
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range items {
					if it.Name != "cotal_acl_alpha" {
						mustCreate(t, pjs, it.Config)
					}
				}
			},
			step: provision.StepBucket},
		{name: "fail/dlv_ exists with another ack wait", provisioned: true,
			before: func(t *testing.T, e *agentEnv, pjs jetstream.JetStream) {
				cfg, _ := provision.DlvDurable(e.n, "local", "a1", uidA)
				cfg.AckWait = 30 * time.Second
				if _, err := pjs.CreateConsumer(testCtx(t), "DLV_alpha", cfg); err != nil {
					t.Fatal(err)
				}
			},
			step: provision.StepCheckDlv, conflict: true, consumers: []string{"DLV_alpha/dlv_local-a1-" + uidA}},
		{name: "fail/ACL row with another grant", provisioned: true,
			before: func(t *testing.T, e *agentEnv, pjs jetstream.JetStream) {
				kv, err := pjs.KeyValue(testCtx(t), "cotal_acl_alpha")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := provision.ACL{AllowSubscribe: []string{"other"}, Revision: 1}.Encode()
				if _, err := kv.Create(testCtx(t), key, body); err != nil {
					t.Fatal(err)
				}
			},
			step: provision.StepCheckACL, conflict: true},
		{name: "fail/role queue refused midway is rolled back", provisioned: true,
			before: func(t *testing.T, e *agentEnv, pjs jetstream.JetStream) {
				// A work-queue stream refuses a second consumer whose filter overlaps.
				if _, err := pjs.CreateConsumer(testCtx(t), "TASK_alpha", jetstream.ConsumerConfig{
					Durable: "other", FilterSubject: "cotal.alpha.svc.reviewer.local.x", AckPolicy: jetstream.AckExplicitPolicy,
				}); err != nil {
					t.Fatal(err)
				}
			},
			step: provision.StepCreateRole, consumers: []string{"TASK_alpha/other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newAgentEnv(t, tc.provisioned)
			pjs := e.provisioner(t)
			var rowBefore []byte
			if tc.before != nil {
				tc.before(t, e, pjs)
				if tc.provisioned {
					if r := aclRow(t, pjs, key); r != nil {
						rowBefore = r.Value()
					}
				}
			}
			a := agentA()
			if tc.agent != nil {
				a = tc.agent()
			}
			p, err := provision.RunProvisionAgent(testCtx(t), e.cfg, a)
			var se *provision.StepError
			if !errors.As(err, &se) || se.Step != tc.step || errors.Is(err, provision.ErrConflict) != tc.conflict {
				t.Fatalf("err = %v, want step %q (conflict %v)", err, tc.step, tc.conflict)
			}
			if !strings.Contains(err.Error(), tc.step) || !strings.Contains(err.Error(), "local.a1.") {
				t.Fatalf("error does not name the step and lifecycle: %v", err)
			}
			if len(p.Created) != 0 {
				t.Fatalf("left behind: %v", p.Created)
			}
			want := tc.consumers
			if want == nil {
				want = []string{}
			}
			if got := e.consumers(t); !slices.Equal(got, want) {
				t.Fatalf("broker holds %v, want %v", got, want)
			}
			if tc.step != provision.StepBucket {
				r := aclRow(t, pjs, key)
				if (r == nil) != (rowBefore == nil) || (r != nil && string(r.Value()) != string(rowBefore)) {
					t.Fatalf("ACL row changed from %s to %v", rowBefore, r)
				}
			}
		})
	}
}

// TestProvisionAgentDirectRollback: ProvisionAgent on the caller's provisioner connection
// reports what it left when it fails midway, and Rollback on a deprovisioner for that lifecycle
// removes exactly that.
func TestProvisionAgentDirectRollback(t *testing.T) {
	e := newAgentEnv(t, true)
	pjs := e.provisioner(t)
	if _, err := pjs.CreateConsumer(testCtx(t), "TASK_alpha", jetstream.ConsumerConfig{
		Durable: "other", FilterSubject: "cotal.alpha.svc.>", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	p, err := provision.ProvisionAgent(testCtx(t), pjs, e.n, agentA())
	if err == nil {
		t.Fatal("no error")
	}
	dm, dlv, key := "dm_local-a1-"+uidA, "dlv_local-a1-"+uidA, "local.a1."+uidA
	if want := []string{dm, dlv, key}; !slices.Equal(p.Created, want) {
		t.Fatalf("left %v, want %v", p.Created, want)
	}
	djs, _, _ := e.conn(t, mtls.KindManagerd, signerv1.Profile_PROFILE_DEPROVISIONER,
		&signerv1.ProfileParams{Owner: "local", Actor: "a1", LifecycleUid: uidA})
	removed, err := provision.Rollback(testCtx(t), djs, e.n, p)
	if err != nil || !slices.Equal(removed, p.Created) {
		t.Fatalf("rollback removed %v, err %v", removed, err)
	}
	if got := e.consumers(t); !slices.Equal(got, []string{"TASK_alpha/other"}) {
		t.Fatalf("broker holds %v", got)
	}
	if aclRow(t, pjs, key) != nil {
		t.Fatal("ACL row left")
	}
}
