package profiles_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/profiles"
	spaceprov "github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// These tests prove issue 11 item 8's channel patterns end to end: signerd mints an agent with a
// subtree grant ("team.>") only where the caller's policy covers it, and the broker holds the
// agent to that subtree.

// Each caller of channelPolicy stands for one policy shape.
const (
	callerWide    = "spiffe://cotal.local/managerd/alpha" // team.> and ops.>
	callerNarrow  = "spiffe://cotal.local/narrow"         // team.* only
	callerExclude = "spiffe://cotal.local/exclude"        // everything but team.secret
)

const channelPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["team.>", "ops.>"]}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
  - id: spiffe://cotal.local/narrow
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["team.*"]}
  - id: spiffe://cotal.local/exclude
    rpcs: [Mint]
    spaces: [alpha]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: [">"], exclude_channels: ["team.secret"]}
`

// signerWorld is a real signerd with channelPolicy and a broker that trusts it.
type signerWorld struct {
	s   *signerdtest.Signer
	url string

	mu   sync.Mutex
	errs map[*nats.Conn][]error
}

func startSignerWorld(t *testing.T) *signerWorld {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Policy: channelPolicy})
	return &signerWorld{s: s, url: s.StartBroker(t), errs: map[*nats.Conn][]error{}}
}

// mint asks signerd, as caller, for profile with params for a fresh user key.
func (w *signerWorld) mint(t *testing.T, caller string, profile signerv1.Profile, params *signerv1.ProfileParams) (*signerv1.Credential, nkeys.KeyPair, error) {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: w.s.Addr, TLS: w.s.Client(t, caller)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, _ := kp.PublicKey()
	cred, err := c.Mint(testCtx(t), &signerv1.MintRequest{Space: brokerSpace, Profile: profile, UserPublicKey: pub, Params: params})
	return cred, kp, err
}

// connect mints as caller and connects with the credential, recording the broker's asynchronous
// errors for the connection.
func (w *signerWorld) connect(t *testing.T, caller string, profile signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	cred, kp, err := w.mint(t, caller, profile, params)
	if err != nil {
		t.Fatalf("mint %s: %v", profile, err)
	}
	pub, _ := kp.PublicKey()
	must := mustOf(t)
	nc, err := nats.Connect(w.url,
		nats.UserJWT(func() (string, error) { return cred.GetJwt(), nil }, kp.Sign),
		nats.CustomInboxPrefix(must(space.InboxPrefix(pub))),
		nats.NoReconnect(), nats.Timeout(10*time.Second),
		nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.errs[nc] = append(w.errs[nc], err)
		}))
	if err != nil {
		t.Fatalf("connect %s: %v", profile, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (w *signerWorld) asyncErrors(nc *nats.Conn) []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.errs[nc]...)
}

// wantViolation polls until nc has a permissions violation naming text.
func (w *signerWorld) wantViolation(t *testing.T, nc *nats.Conn, text string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		for _, err := range w.asyncErrors(nc) {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), text) {
				return nil
			}
		}
		return errors.New("no violation " + text + " yet")
	})
}

func agentPatternParams(owner, actor string, allowSubscribe, allowPublish []string) *signerv1.ProfileParams {
	return &signerv1.ProfileParams{Owner: owner, Actor: actor, LifecycleUid: uid,
		AllowSubscribe: allowSubscribe, Subscribe: allowSubscribe, AllowPublish: allowPublish}
}

// TestAgentChannelSubtree: an agent signerd minted with team.> (its caller's policy allows
// team.>) reads and posts anywhere below team, history included, and nowhere else.
func TestAgentChannelSubtree(t *testing.T) {
	w := startSignerWorld(t)
	n, must := names(t), mustOf(t)
	prov := w.connect(t, callerWide, signerv1.Profile_PROFILE_PROVISIONER, &signerv1.ProfileParams{Owner: "m1", Actor: "s1"})
	if _, err := spaceprov.Ensure(testCtx(t), jsFor(t, prov), n, spaceprov.Options{}); err != nil {
		t.Fatalf("provision: %v", err)
	}

	team := w.connect(t, callerWide, signerv1.Profile_PROFILE_AGENT, agentPatternParams("o1", "a1", []string{"team.>"}, []string{"team.>"}))
	peer := w.connect(t, callerWide, signerv1.Profile_PROFILE_AGENT, agentPatternParams("o2", "a2", []string{"team.>", "ops.>"}, []string{"team.>", "ops.>"}))

	t.Run("ok/reads a deep team channel live", func(t *testing.T) {
		feed := subscribe(t, team, must(n.ChatReadGrant("team.>")))
		for _, ch := range []string{"team.x", "team.x.y"} {
			subj := must(n.Chat("o2", "a2", ch))
			if err := peer.Publish(subj, []byte(ch)); err != nil {
				t.Fatal(err)
			}
			expectMsg(t, feed, subj, ch)
		}
	})
	t.Run("ok/posts to a deep team channel", func(t *testing.T) {
		feed := subscribe(t, peer, must(n.ChatReadGrant("team.>")))
		subj := must(n.Chat("o1", "a1", "team.x.y"))
		if _, err := jsFor(t, team).Publish(testCtx(t), subj, []byte("stored")); err != nil {
			t.Fatalf("publish to CHAT: %v", err)
		}
		expectMsg(t, feed, subj, "stored")
	})
	t.Run("ok/reads team history through its subtree chathist consumer", func(t *testing.T) {
		// CHAT stored the three posts above; nothing else was posted.
		hist := must(n.ChatHistConsumer("o1", "a1", uid))
		c, err := jsFor(t, team).CreateOrUpdateConsumer(testCtx(t), n.ChatStream(), jetstream.ConsumerConfig{
			Name: hist, FilterSubject: must(n.ChatReadGrant("team.>")), AckPolicy: jetstream.AckNonePolicy,
			InactiveThreshold: time.Minute,
		})
		if err != nil {
			t.Fatalf("create %s on team.>: %v", hist, err)
		}
		batch, err := c.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, m.Subject()+"="+string(m.Data()))
		}
		want := []string{must(n.Chat("o2", "a2", "team.x")) + "=team.x", must(n.Chat("o2", "a2", "team.x.y")) + "=team.x.y",
			must(n.Chat("o1", "a1", "team.x.y")) + "=stored"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("history = %v, want %v", got, want)
		}
	})
	if errs := append(w.asyncErrors(team), w.asyncErrors(peer)...); len(errs) != 0 {
		t.Fatalf("broker errors: %v", errs)
	}

	for _, tt := range []struct{ name, op, subject string }{
		{"fail/posts outside team", "pub", must(n.Chat("o1", "a1", "ops.x"))},
		{"fail/posts to bare team (team.> needs a token below it)", "pub", must(n.Chat("o1", "a1", "team"))},
		{"fail/posts to a team-prefixed sibling", "pub", must(n.Chat("o1", "a1", "teams.x"))},
		{"fail/posts to team as another principal", "pub", must(n.Chat("o2", "a2", "team.x"))},
		{"fail/reads outside team", "sub", must(n.ChatRead("ops.x"))},
		{"fail/reads all chat", "sub", must(n.ChatReadGrant(">"))},
		{"fail/reads bare team", "sub", must(n.ChatRead("team"))},
		{"fail/creates a history consumer outside team", "pub", must(space.ConsumerCreateFiltered(n.ChatStream(), must(n.ChatHistConsumer("o1", "a1", uid)), must(n.ChatReadGrant("ops.>"))))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := w.connect(t, callerWide, signerv1.Profile_PROFILE_AGENT, agentPatternParams("o1", "a1", []string{"team.>"}, []string{"team.>"}))
			if tt.op == "sub" {
				if _, err := nc.SubscribeSync(tt.subject); err != nil {
					t.Fatal(err)
				}
				w.wantViolation(t, nc, testkit.SubscribeViolation(tt.subject))
				return
			}
			if err := nc.Publish(tt.subject, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			w.wantViolation(t, nc, testkit.PublishViolation(tt.subject))
		})
	}
}

// TestPolicyBoundsChannelPatterns: signerd refuses a pattern grant its caller's policy does not
// cover, with the policy's reason, and grants one that it does.
func TestPolicyBoundsChannelPatterns(t *testing.T) {
	w := startSignerWorld(t)
	for _, tc := range []struct {
		name, caller string
		allow        []string
		want         signerv1.Reason // REASON_UNSPECIFIED: granted
	}{
		{"ok/team.> within a team.> rule", callerWide, []string{"team.>"}, signerv1.Reason_REASON_UNSPECIFIED},
		{"ok/team.* within a team.> rule", callerWide, []string{"team.*"}, signerv1.Reason_REASON_UNSPECIFIED},
		{"ok/team.a within a team.* rule", callerNarrow, []string{"team.a"}, signerv1.Reason_REASON_UNSPECIFIED},
		{"ok/ops.> clear of a team.secret exclusion", callerExclude, []string{"ops.>"}, signerv1.Reason_REASON_UNSPECIFIED},
		{"fail/team.> under a team.* rule", callerNarrow, []string{"team.>"}, signerv1.Reason_REASON_CHANNEL_NOT_ALLOWED},
		{"fail/team.* under a team.* rule (it reaches team.>)", callerNarrow, []string{"team.*"}, signerv1.Reason_REASON_CHANNEL_NOT_ALLOWED},
		{"fail/> under a team.> rule", callerWide, []string{">"}, signerv1.Reason_REASON_CHANNEL_NOT_ALLOWED},
		{"fail/team.> overlapping a team.secret exclusion", callerExclude, []string{"team.>"}, signerv1.Reason_REASON_CHANNEL_NOT_ALLOWED},
		{"fail/team.* overlapping a team.secret exclusion", callerExclude, []string{"team.*"}, signerv1.Reason_REASON_CHANNEL_NOT_ALLOWED},
		{"fail/a partial wildcard is malformed", callerWide, []string{"team.a*"}, signerv1.Reason_REASON_INVALID_ARGUMENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cred, _, err := w.mint(t, tc.caller, signerv1.Profile_PROFILE_AGENT, agentPatternParams("o1", "a1", tc.allow, nil))
			switch {
			case tc.want == signerv1.Reason_REASON_UNSPECIFIED:
				if err != nil || cred.GetJwt() == "" {
					t.Fatalf("mint %v: %v", tc.allow, err)
				}
			default:
				if got := signerclient.ReasonOf(err); got != tc.want {
					t.Fatalf("mint %v: reason %v (err %v), want %v", tc.allow, got, err, tc.want)
				}
			}
		})
	}
}

// TestTrailingStarReachesSubtree is why signerd judges a grant by space.ChannelReach: the broker
// lets a permission's trailing '*' match a literal '>', so an agent granted team.* subscribes
// team.> and receives team.x.y. If nats-server ever stops doing this, this test fails and
// ChannelReach can be relaxed.
func TestTrailingStarReachesSubtree(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	reader := connectAs(t, b, principal{profiles.Agent, profiles.Params{Owner: "o1", Actor: "a1", LifecycleUID: uid, AllowSubscribe: []string{"team.*"}}})
	writer := connectAs(t, b, principal{profiles.Agent, profiles.Params{Owner: "o2", Actor: "a2", LifecycleUID: uid, AllowPublish: []string{"team.x.y"}}})
	feed := subscribe(t, reader, must(n.ChatReadGrant("team.>")))
	subj := must(n.Chat("o2", "a2", "team.x.y"))
	if err := writer.Publish(subj, []byte("deep")); err != nil {
		t.Fatal(err)
	}
	expectMsg(t, feed, subj, "deep")
	if errs := b.AsyncErrors(reader); len(errs) != 0 {
		t.Fatalf("broker errors: %v", errs)
	}
}
