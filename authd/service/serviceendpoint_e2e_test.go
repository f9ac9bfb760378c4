package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/serve"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// scheduleAhead is how far ahead of the real clock ok/seed-sequence runs ServeEndpoint's
// schedule clock (EndpointOptions.Now). The endpoint renews at 50–80 % of a bearer's life, 30 to
// 48 s into a 60 s bearer; 49 s ahead, that point has come as soon as it serves, so it renews
// and moves to a new connection within seconds. Bearers are still judged on the real clock (the
// grant's and the renewal source's), and 49 s leaves a 60 s bearer 11 s of life by the schedule.
const scheduleAhead = 49 * time.Second

// testClock is authd's injected clock (RuntimeOptions.Now): the real clock plus an offset the
// test only moves forward.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) Now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// passTo moves the clock to at least at.
func (c *testClock) passTo(at time.Time) {
	if d := time.Until(at); d > time.Duration(c.ahead.Load()) {
		c.ahead.Store(int64(d))
	}
}

// countingTransport counts the HTTP requests a provider sends.
type countingTransport struct{ n atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// served is one endpoint instance as a real service runs it: registered and approved through
// the provider, its renewal source (a FileStore in a 0700 directory) activated, the serving
// grant verified and, after serve, ServeEndpoint serving it.
type served struct {
	s                   *sepEnv
	endpoint, instance  string
	epTok               string
	contract            *serviceaccess.Contract
	registered, decided *serviceaccess.Answer
	p                   *authclient.Provider
	sent                *countingTransport
	store               *authclient.FileStore
	src                 *authclient.RenewalSource
	cred                *serviceaccess.Answer // the first pull's (activate) credential
	grant               *serve.Grant
	v                   *serviceaccess.Validator // the test's reading of tokens, under the pinned keys
	ep                  *serve.Endpoint
	connName            string
	readies             atomic.Int32 // Ready calls the authority answered ready
}

// call is the provider as a sepCall.
func (sv *served) call(t testing.TB, req serviceaccess.Request, proof *serviceaccess.Proof) *serviceaccess.Answer {
	t.Helper()
	req.Account, req.Space = sv.s.info.Account, sp
	ans, err := sv.p.ServiceEndpointAuthority(ctxT(t), &req, proof)
	if err != nil {
		t.Fatalf("%s through the provider: %v", req.Kind, err)
	}
	return ans
}

// activateInstance registers a fresh instance of endpoint through a provider of its own
// (approvalSeconds as decide's), pins the authority's issuer and keys, makes the renewal source,
// pulls the first credential (activate, on the signed-in login) and verifies the serving grant.
func activateInstance(t *testing.T, s *sepEnv, endpoint string, approvalSeconds int64) *served {
	t.Helper()
	sv := &served{s: s, endpoint: endpoint, instance: newInstanceID(), contract: echoContract(endpoint), sent: &countingTransport{}}
	var err error
	if sv.epTok, err = serviceaccess.EndpointTokenOf(endpoint); err != nil {
		t.Fatal(err)
	}
	sv.p, err = authclient.NewProvider(authclient.ProviderConfig{
		URL: s.h.s.URL(), Account: s.info.Account, Space: sp,
		Login: func(context.Context) (string, error) { return s.idpToken(t), nil },
		Cap:   s.h.cap, Sentinel: s.h.sentin, HTTPClient: &http.Client{Transport: sv.sent},
	})
	if err != nil {
		t.Fatal(err)
	}
	sv.registered, sv.decided = approve(t, sv.call, s.h.owner, endpoint, sv.instance, sv.contract, approvalSeconds)
	info, err := sv.p.ServiceEndpointInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := serve.ServeAuthenticityOf(info)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := serviceaccess.KeysOf(info)
	if err != nil {
		t.Fatal(err)
	}
	sv.v = &serviceaccess.Validator{Space: sp, Keys: keys}
	if sv.store, err = authclient.NewFileStore(filepath.Join(t.TempDir(), "renewal")); err != nil {
		t.Fatal(err)
	}
	if perm(t, sv.store.Dir()) != 0o700 {
		t.Fatalf("renewal store directory mode %v", perm(t, sv.store.Dir()))
	}
	sv.src, err = sv.p.ServiceEndpointRenewal(authclient.RenewalConfig{Store: sv.store, Witness: sv.registered.Witness, Endpoint: endpoint, Instance: sv.instance})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sv.src.Close)
	if sv.cred, err = sv.src.Credential(ctxT(t)); err != nil {
		t.Fatalf("first pull (activate): %v", err)
	}
	sv.grant, err = serve.AuthorizeGuestServeGrant(serve.GrantInput{
		AccountPublicKey: s.info.Account, Result: sv.cred, Authenticity: auth,
		Registration: serve.Registration{Endpoint: endpoint, Instance: sv.instance, Contract: *sv.contract, Snapshot: sv.registered.Snapshot},
	})
	if err != nil {
		t.Fatalf("AuthorizeGuestServeGrant: %v", err)
	}
	return sv
}

// serve runs ServeEndpoint on the source (schedule is its clock, nil the real one): it binds
// the responder, which answers "answer:<request>", and calls ready with the access bearer
// through the provider.
func (sv *served) serve(t *testing.T, schedule func() time.Time) {
	t.Helper()
	sv.connName = "serve-" + sv.instance
	ep, err := serve.ServeEndpoint(ctxT(t), serve.EndpointOptions{
		URLs: []string{sv.s.h.e.url}, Bearer: sv.src.Bearer, SentinelCreds: sv.src.SentinelCreds, Grant: sv.grant,
		Handler: func(m *nats.Msg) { _ = m.Respond([]byte("answer:" + string(m.Data))) },
		Ready: func(ctx context.Context, access string) error {
			req := serviceaccess.Request{Kind: serviceaccess.KindReady, Account: sv.s.info.Account, Space: sp, RequestID: "ready-0001",
				Endpoint: sv.endpoint, Instance: sv.instance, Witness: sv.registered.Witness}
			ans, err := sv.p.ServiceEndpointAuthority(ctx, &req, &serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: access})
			if err != nil {
				return err
			}
			if ans.Kind != serviceaccess.AnswerReady {
				return fmt.Errorf("ready answered %s (%s)", ans.Kind, ans.Reason)
			}
			sv.readies.Add(1)
			return nil
		},
		Now:         schedule,
		NatsOptions: []nats.Option{nats.Name(sv.connName)},
	})
	if err != nil {
		t.Fatalf("ServeEndpoint: %v", err)
	}
	sv.ep = ep
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ep.Close(ctx)
	})
}

// access reads an access bearer's claims under the pinned keys.
func (sv *served) access(t *testing.T, token string) *serviceaccess.AccessClaims {
	t.Helper()
	c, err := sv.v.Access(ctxT(t), token)
	if err != nil {
		t.Fatalf("access bearer: %v", err)
	}
	return c
}

// stored reads the renewal record the source keeps in its store, and its proof's claims.
func (sv *served) stored(t *testing.T) (*authclient.RenewalRecord, *serviceaccess.RenewalClaims) {
	t.Helper()
	rec, err := sv.store.Load(sv.registered.Witness)
	if err != nil || rec == nil || rec.Renewal == nil {
		t.Fatalf("renewal record: %v (record present %v)", err, rec != nil)
	}
	c, err := sv.v.Renewal(ctxT(t), rec.Renewal.Token)
	if err != nil {
		t.Fatalf("renewal proof: %v", err)
	}
	return rec, c
}

// status reads the instance's status under proof.
func (sv *served) status(t *testing.T, proof *serviceaccess.Proof) *serviceaccess.InstanceStatus {
	t.Helper()
	ans := wantKind(t, sv.call(t, serviceaccess.Request{Kind: serviceaccess.KindStatus, Endpoint: sv.endpoint, Instance: sv.instance,
		Target: &serviceaccess.Target{Kind: serviceaccess.TargetInstance}}, proof), serviceaccess.AnswerStatus)
	if ans.Instance == nil {
		t.Fatal("status answer without an instance")
	}
	return ans.Instance
}

// subjects are the instance's serve and reply families with their trailing ">" cut (so
// base+"x" is a literal subject of the family).
func (sv *served) subjects(t *testing.T, instance string) (serveBase, replyBase string) {
	t.Helper()
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(must(n.ServiceServe(sv.epTok, instance)), ">"), strings.TrimSuffix(must(n.ServiceReply(sv.epTok, instance)), ">")
}

// serveConn connects to the broker as pkg/serve does: the space's sentinel as user JWT under a
// throwaway nkey, the access bearer as token, so authd's callout decides on the bearer. It
// returns the connection, its asynchronous errors recorded.
func (s *sepEnv) serveConn(t *testing.T, bearer, name string) (*conn, error) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	cn := &conn{closed: make(chan struct{})}
	nc, err := nats.Connect(s.h.e.url,
		nats.UserJWT(func() (string, error) { return s.h.sentin, nil }, kp.Sign),
		nats.TokenHandler(func() string { return bearer }),
		nats.Name(name), nats.NoReconnect(), nats.Timeout(10*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			cn.mu.Lock()
			cn.errs = append(cn.errs, err)
			cn.mu.Unlock()
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(cn.closed) }))
	if err != nil {
		return nil, err
	}
	t.Cleanup(nc.Close)
	cn.nc = nc
	return cn, nil
}

// waitAsync waits until c has an asynchronous error holding want.
func (c *conn) waitAsync(t *testing.T, want string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		_ = c.nc.Flush()
		for _, e := range c.asyncErrs() {
			if strings.Contains(e.Error(), want) {
				return nil
			}
		}
		return fmt.Errorf("no asynchronous error %q yet (have %v)", want, c.asyncErrs())
	})
}

// connsNamed is the broker's own view (CONNZ with the authorized user) of the connections
// named name.
func (s *sepEnv) connsNamed(t *testing.T, name string) []*server.ConnInfo {
	t.Helper()
	cz, err := s.h.e.ns.Connz(&server.ConnzOptions{Username: true, Limit: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var out []*server.ConnInfo
	for _, ci := range cz.Conns {
		if ci.Name == name {
			out = append(out, ci)
		}
	}
	return out
}

// calloutGrant is signerd's audit line of one callout answer it signed: the grant's profile,
// the user key it was signed for, and the issued user JWT's exp, the expiry the broker holds
// the connection to.
type calloutGrant struct {
	RPC      string    `json:"rpc"`
	Profile  string    `json:"profile"`
	Subject  string    `json:"subject"`
	Expiry   time.Time `json:"expiry"`
	Decision string    `json:"decision"`
}

// calloutGrants are the granted SignCalloutResponse lines of signerd's audit file.
func (s *sepEnv) calloutGrants(t *testing.T) []calloutGrant {
	t.Helper()
	data, err := os.ReadFile(s.h.e.sg.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []calloutGrant
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var g calloutGrant
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("audit line: %v", err)
		}
		if g.RPC == "SignCalloutResponse" && g.Decision == "granted" && g.Profile != "" {
			out = append(out, g)
		}
	}
	return out
}

// grantAfter waits for the callout grant signerd audits after the first before ones: the
// grant of the one service connect the test just made (it makes no other meanwhile). The
// grant's subject is a user key the broker makes up per callout request, so the order of the
// audit lines is what ties a grant to its connect.
func (s *sepEnv) grantAfter(t *testing.T, before int) calloutGrant {
	t.Helper()
	var gs []calloutGrant
	testkit.Eventually(t, 5*time.Second, func() error {
		if gs = s.calloutGrants(t); len(gs) <= before {
			return errors.New("no callout grant audited for the connect yet")
		}
		return nil
	})
	if len(gs) != before+1 {
		t.Fatalf("%d callout grants audited for one connect", len(gs)-before)
	}
	return gs[before]
}

// caller is a data-account connection that publishes on cotal.<t>.sep.> and subscribes to
// cotal.<t>.sep.reply.>, its inbox inside sv's reply family. It is minted by the test because no
// production profile may publish on sep subjects yet (the calling side is not in seed 002), so
// signerd has nothing to mint it with: the test signs it with the data account's signing key from
// signerd's key directory (as testkit.MintUnlimited does on its own broker) and connects over
// TCP loopback.
func (sv *served) caller(t *testing.T) *nats.Conn {
	t.Helper()
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := creds.ReadSeedFile(filepath.Join(sv.s.h.e.sg.Dir, "signer", space.Segment(sp), "data-signing.nk"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Wipe()
	skp, err := seed.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer skp.Wipe()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, _ := kp.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "e2e-caller"
	uc.IssuerAccount = sv.s.info.Account
	uc.Expires = time.Now().Add(10 * time.Minute).Unix()
	uc.Pub.Allow.Add(n.Prefix() + ".sep.>")
	uc.Sub.Allow.Add(n.Prefix() + ".sep.reply.>")
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatal(err)
	}
	_, replyBase := sv.subjects(t, sv.instance)
	nc, err := nats.Connect(sv.s.h.e.url, nats.UserJWT(func() (string, error) { return tok, nil }, kp.Sign),
		nats.CustomInboxPrefix(replyBase+"caller"), nats.NoReconnect())
	if err != nil {
		t.Fatalf("caller connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// answered sends one request to sv's serve family and checks the handler's answer.
func (sv *served) answered(t *testing.T, caller *nats.Conn, body string) {
	t.Helper()
	serveBase, _ := sv.subjects(t, sv.instance)
	m, err := caller.Request(serveBase+"echo", []byte(body), 10*time.Second)
	if err != nil || string(m.Data) != "answer:"+body {
		t.Fatalf("request %q: %v (answer %q)", body, err, func() string {
			if m == nil {
				return ""
			}
			return string(m.Data)
		}())
	}
}

// TestServiceEndpointE2E is issue 24's acceptance of the seed's sequence and of revocation,
// end to end: authd's real service (service_endpoints on), real signerd, the embedded broker in
// operator/JWT mode over TCP loopback and a fake IdP; the service side is the client a real
// service runs (pkg/authclient's Provider and renewal source with a FileStore, pkg/serve's
// authenticity, grant and ServeEndpoint), the caller a test-minted data-account user.
func TestServiceEndpointE2E(t *testing.T) {
	clk := &testClock{}
	s := newSepEnv(t, func(_ *service.Inputs, o *service.RuntimeOptions) { o.Now = clk.Now })
	n, err := space.NewNames(sp)
	if err != nil {
		t.Fatal(err)
	}

	// The sequence through the client: the registered snapshot is the one this service computes
	// from what it sent; the credential's lifetimes are capped; ServeEndpoint's connection lands
	// as service-serve with the bearer's exp; a caller's requests are answered; off-rail
	// publishes and subscribes are violations; ready was called; the endpoint renewed.
	t.Run("ok/seed-sequence", func(t *testing.T) {
		sv := activateInstance(t, s, "svc.echo", 0)
		witness := sv.registered.Witness

		// Snapshot: byte-equal to the canonical snapshot of what was sent, and its witness is
		// the one the answer, the grant and every bearer name.
		want, err := serviceaccess.Snapshot{V: 1, Account: s.info.Account, Space: sp, Owner: s.h.owner, Endpoint: sv.endpoint,
			Instance: sv.instance, Generation: 1, Contract: *sv.contract}.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sv.registered.Snapshot, want) || serviceaccess.WitnessOf(want) != witness || sv.registered.Generation != 1 {
			t.Fatalf("registered snapshot %s (generation %d, witness %s), want %s (witness %s)",
				sv.registered.Snapshot, sv.registered.Generation, witness, want, serviceaccess.WitnessOf(want))
		}
		if sv.grant.Witness() != witness || sv.grant.Owner() != s.h.owner || sv.grant.Root() != sv.cred.Root {
			t.Fatalf("grant names witness %s owner %s root %s", sv.grant.Witness(), sv.grant.Owner(), sv.grant.Root())
		}

		// Lifetimes: the access bearer at most 60 s, the renewal proof (kept in the store, never
		// handed out) at most 24 h, neither past the approval the root expires with.
		ac := sv.access(t, sv.cred.Access.Token)
		if ac.Exp <= ac.Iat || ac.Exp-ac.Iat > 60 || ac.Exp != sv.cred.Access.Exp || ac.Exp > sv.decided.ApprovalExpiresAt || ac.Wit != witness {
			t.Fatalf("access bearer iat %d exp %d (answer exp %d, approval %d)", ac.Iat, ac.Exp, sv.cred.Access.Exp, sv.decided.ApprovalExpiresAt)
		}
		if sv.cred.Renewal != nil {
			t.Fatal("the source handed out its renewal proof")
		}
		_, rc := sv.stored(t)
		if rc.Exp <= rc.Iat || rc.Exp-rc.Iat > 24*3600 || rc.Exp > sv.decided.ApprovalExpiresAt || rc.Wit != witness || rc.Root != sv.cred.Root {
			t.Fatalf("renewal proof iat %d exp %d (approval %d)", rc.Iat, rc.Exp, sv.decided.ApprovalExpiresAt)
		}
		if st := sv.src.State(); st.State != authclient.SourceReady || st.RenewalExp.Unix() != rc.Exp || st.AccessExp.Unix() != ac.Exp {
			t.Fatalf("source state %+v", st)
		}

		// Lands as service-serve: a connection of the test's own with the first access bearer,
		// made as pkg/serve makes it and before ServeEndpoint runs, so it is the only service
		// connect: the callout had signerd sign exactly one grant for it, service-serve with the
		// bearer's exp as the NATS user's exp, and the broker shows it in the data account as
		// <owner>-svc_<iid>, the name only a service-serve grant carries.
		user := s.h.owner + "-svc_" + sv.instance
		probeName := "probe-" + sv.instance
		before := len(s.calloutGrants(t))
		probe, err := s.serveConn(t, sv.cred.Access.Token, probeName)
		if err != nil {
			t.Fatalf("connect with the access bearer: %v", err)
		}
		if g := s.grantAfter(t, before); g.Profile != "service-serve" || g.Expiry.Unix() != ac.Exp {
			t.Fatalf("callout grant for the connect: profile %s expiry %d, want service-serve expiring at the bearer's exp %d", g.Profile, g.Expiry.Unix(), ac.Exp)
		}
		if pc := s.connsNamed(t, probeName); len(pc) != 1 || pc[0].Account != s.info.Account || pc[0].AuthorizedUser != user {
			for _, ci := range pc {
				t.Logf("CONNZ: %q in %s", ci.AuthorizedUser, ci.Account)
			}
			t.Fatalf("%d connections named %s in CONNZ, want one: %q in the data account %s", len(pc), probeName, user, s.info.Account)
		}

		// Serve, with the schedule clock ahead so the endpoint renews within seconds. Ready was
		// called once, and the instance reads ready by an access bearer.
		sv.serve(t, func() time.Time { return time.Now().Add(scheduleAhead) })
		if got := sv.readies.Load(); got != 1 {
			t.Fatalf("ready called %d times, want once", got)
		}
		bearer, err := sv.src.Bearer(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if st := sv.status(t, &serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: bearer}); st.State != "ready" || st.Witness != witness {
			t.Fatalf("status by the access bearer %+v, want ready at %s", st, witness)
		}
		// ServeEndpoint's own connection is the same identity in the broker, and a service-serve
		// grant expiring at its bearer's exp was signed.
		// The endpoint renews (and reconnects) every second or so here, and a reconnect still in
		// its callout shows in CONNZ under the callout's account with its raw nkey, so the
		// sample is taken again until it holds no such connection.
		testkit.Eventually(t, 5*time.Second, func() error {
			conns := s.connsNamed(t, sv.connName)
			if len(conns) == 0 {
				return errors.New("ServeEndpoint's connection is not in CONNZ")
			}
			for _, ci := range conns {
				if ci.Account != s.info.Account || ci.AuthorizedUser != user {
					return fmt.Errorf("serving connection is %q in %s, want %q in the data account %s", ci.AuthorizedUser, ci.Account, user, s.info.Account)
				}
			}
			return nil
		})
		testkit.Eventually(t, 5*time.Second, func() error {
			exp := sv.ep.Exp().Unix()
			for _, g := range s.calloutGrants(t) {
				if g.Profile == "service-serve" && g.Expiry.Unix() == exp {
					return nil
				}
			}
			return fmt.Errorf("no service-serve callout grant audited expiring at the endpoint's bearer exp %d", exp)
		})

		// Requests answered: the caller's request in the serve family, its reply in the reply
		// family, answered by the handler.
		caller := sv.caller(t)
		sv.answered(t, caller, "ping")

		// On its rail the serving identity publishes in its own reply family (the caller hears
		// it); off it, the broker refuses: another instance's reply family, a request subject of
		// its own serve family, a chat subject; and it may subscribe to no subject outside its
		// serve family (another instance's, its reply family).
		serveBase, replyBase := sv.subjects(t, sv.instance)
		onRail := replyBase + "probe"
		heard, err := caller.SubscribeSync(onRail)
		if err != nil {
			t.Fatal(err)
		}
		if err := caller.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := probe.nc.Publish(onRail, []byte("on-rail")); err != nil {
			t.Fatal(err)
		}
		if m, err := heard.NextMsg(5 * time.Second); err != nil || string(m.Data) != "on-rail" {
			t.Fatalf("publish in the own reply family not delivered: %v", err)
		}
		otherServe, otherReply := sv.subjects(t, newInstanceID())
		for _, bad := range []string{otherReply + "x", serveBase + "x", must(n.Chat(s.h.owner, "alice", "general"))} {
			if err := probe.nc.Publish(bad, []byte("x")); err != nil {
				t.Fatal(err)
			}
			probe.waitAsync(t, testkit.PublishViolation(bad))
		}
		for _, bad := range []string{otherServe + ">", replyBase + ">"} {
			if _, err := probe.nc.SubscribeSync(bad); err != nil {
				t.Fatal(err)
			}
			probe.waitAsync(t, testkit.SubscribeViolation(bad))
		}

		// The endpoint renewed: a fresh bearer bound on a new connection, which answers too.
		testkit.Eventually(t, 20*time.Second, func() error {
			if sv.ep.Rotations() == 0 {
				return errors.New("ServeEndpoint has not renewed yet")
			}
			return nil
		})
		if sv.ep.Exp().Unix() <= ac.Exp {
			t.Fatalf("endpoint bearer exp %d after renewal, first %d", sv.ep.Exp().Unix(), ac.Exp)
		}
		sv.answered(t, caller, "after-renewal")
		select {
		case <-sv.ep.Done():
			t.Fatalf("endpoint stopped: %v", sv.ep.Err())
		default:
		}
	})

	// A short approval caps both lifetimes: each ends exactly at the approval, and so does the
	// NATS user the callout grants on the access bearer.
	t.Run("ok/short-approval-caps-lifetimes", func(t *testing.T) {
		const approvalSeconds = 30
		sv := activateInstance(t, s, "svc.short", approvalSeconds)
		approval := sv.decided.ApprovalExpiresAt
		ac := sv.access(t, sv.cred.Access.Token)
		_, rc := sv.stored(t)
		if ac.Exp != approval || rc.Exp != approval || ac.Exp-ac.Iat > approvalSeconds || rc.Exp-rc.Iat > approvalSeconds {
			t.Fatalf("access iat %d exp %d, renewal iat %d exp %d; want both to end at the approval %d", ac.Iat, ac.Exp, rc.Iat, rc.Exp, approval)
		}
		before := len(s.calloutGrants(t))
		if _, err := s.serveConn(t, sv.cred.Access.Token, "short-"+sv.instance); err != nil {
			t.Fatalf("connect with the access bearer: %v", err)
		}
		if g := s.grantAfter(t, before); g.Profile != "service-serve" || g.Expiry.Unix() != approval {
			t.Fatalf("callout grant: profile %s expiry %d, want service-serve expiring at the approval %d", g.Profile, g.Expiry.Unix(), approval)
		}
	})

	// Revocation: after serving, the owner revokes; the next renew is refused, a connect with the
	// current access bearer is refused by the callout, and the source ends and sends nothing more.
	t.Run("ok/revocation", func(t *testing.T) {
		sv := activateInstance(t, s, "svc.revoke", 0)
		sv.serve(t, nil)
		bearer, err := sv.src.Bearer(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		sv.answered(t, sv.caller(t), "before-revoke")

		wantKind(t, sv.call(t, serviceaccess.Request{Kind: serviceaccess.KindDecide, RequestID: "decide-revoke", Endpoint: sv.endpoint, Instance: sv.instance,
			Proposal: sv.decided.Proposal, Contract: sv.contract, Decision: serviceaccess.DecisionRevoke}, nil), serviceaccess.AnswerDecided)
		if st := sv.status(t, &serviceaccess.Proof{Kind: serviceaccess.ProofOperator}); st.State != "revoked" {
			t.Fatalf("status after revoke %+v", st)
		}

		// The next pull is the renew on the stored proof: sent once, refused, and the source ends.
		before := sv.sent.n.Load()
		if _, err := sv.src.Bearer(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("pull after revoke = %v, want the source ended", err)
		}
		if d := sv.sent.n.Load() - before; d != 1 {
			t.Fatalf("the pull after revoke sent %d requests, want the one renew", d)
		}
		if st := sv.src.State(); st.State != authclient.SourceEnded || st.Cause != authclient.CauseAuthority {
			t.Fatalf("source state %+v", st)
		}
		// That renew, replayed as the source sent it, is denied.
		rec, _ := sv.stored(t)
		renew := sv.call(t, serviceaccess.Request{Kind: serviceaccess.KindRenew, RequestID: rec.RenewRequestID, Endpoint: sv.endpoint,
			Instance: sv.instance, Witness: sv.registered.Witness}, &serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: rec.Renewal.Token})
		if renew.Kind != serviceaccess.AnswerDenied || renew.Code != serviceaccess.CodeFailedPrecondition {
			t.Fatalf("renew after revoke answered %s %s (%s)", renew.Kind, renew.Code, renew.Reason)
		}

		// The callout refuses a fresh connect with the current access bearer.
		if _, err := s.serveConn(t, bearer, "revoked-"+sv.instance); !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect with the access bearer after revoke = %v, want an authorization violation", err)
		}

		// An ended source sends nothing: not for a bearer, a credential or the sentinel.
		before = sv.sent.n.Load()
		if _, err := sv.src.Bearer(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("Bearer on an ended source = %v", err)
		}
		if _, err := sv.src.Credential(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("Credential on an ended source = %v", err)
		}
		if _, err := sv.src.SentinelCreds(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("SentinelCreds on an ended source = %v", err)
		}
		if d := sv.sent.n.Load() - before; d != 0 {
			t.Fatalf("an ended source sent %d requests", d)
		}
	})

	// Approval expiry, on authd's injected clock: once it passes the approval, the renew is
	// refused, the activate the source then replays on the login is denied and the source ends,
	// and a connect with the current access bearer is refused. Last: it moves authd's clock
	// forward for good.
	t.Run("ok/approval-expiry", func(t *testing.T) {
		sv := activateInstance(t, s, "svc.expiry", 20)
		sv.serve(t, nil)
		bearer, err := sv.src.Bearer(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		sv.answered(t, sv.caller(t), "before-expiry")
		approval := sv.decided.ApprovalExpiresAt
		if st := sv.status(t, &serviceaccess.Proof{Kind: serviceaccess.ProofOperator}); st.State != "ready" || st.ApprovalExpiresAt != approval {
			t.Fatalf("status before expiry %+v", st)
		}

		clk.passTo(time.Unix(approval+1, 0))
		if st := sv.status(t, &serviceaccess.Proof{Kind: serviceaccess.ProofOperator}); st.State != "revoked" || st.ApprovalExpiresAt != 0 {
			t.Fatalf("status after the approval expired %+v", st)
		}

		// The renew: the proof the source holds (by its own clock still live) ends with the
		// approval, so the authority refuses it and the source drops it.
		before := sv.sent.n.Load()
		var se *authclient.SourceError
		if _, err := sv.src.Bearer(ctxT(t)); !errors.As(err, &se) || se.State != authclient.SourceUnavailable || se.Cause != authclient.CauseRenewal {
			t.Fatalf("renew after the approval expired = %v, want unavailable (renewal refused)", err)
		}
		// The activate replayed on the login is denied: no approval stands. The source ends.
		if _, err := sv.src.Bearer(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("activate after the approval expired = %v, want the source ended", err)
		}
		if d := sv.sent.n.Load() - before; d != 2 {
			t.Fatalf("the two pulls sent %d requests, want the renew and the activate", d)
		}
		if st := sv.src.State(); st.State != authclient.SourceEnded || st.Cause != authclient.CauseAuthority {
			t.Fatalf("source state %+v", st)
		}
		rec, err := sv.store.Load(sv.registered.Witness)
		if err != nil || rec == nil {
			t.Fatal(err)
		}
		act := sv.call(t, serviceaccess.Request{Kind: serviceaccess.KindActivate, RequestID: rec.ActivateRequestID, Endpoint: sv.endpoint,
			Instance: sv.instance, Witness: sv.registered.Witness}, nil)
		if act.Kind != serviceaccess.AnswerDenied || act.Code != serviceaccess.CodeFailedPrecondition {
			t.Fatalf("activate after the approval expired answered %s %s (%s)", act.Kind, act.Code, act.Reason)
		}

		// (The bearer ends with the approval, so the callout's validator, on authd's clock, refuses
		// it before the gate's approval check would.)
		if _, err := s.serveConn(t, bearer, "expired-"+sv.instance); !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect with the access bearer after the approval expired = %v, want an authorization violation", err)
		}
		before = sv.sent.n.Load()
		if _, err := sv.src.Bearer(ctxT(t)); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("Bearer on an ended source = %v", err)
		}
		if d := sv.sent.n.Load() - before; d != 0 {
			t.Fatalf("an ended source sent %d requests", d)
		}
	})
}
