package serve

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// The broker below has no auth callout (the full service-serve admission needs authd and
// signerd): a custom authenticator stands in for it. It verifies the presented access bearer
// with the shared validator under the fixture's issuer key, as the callout's service arm does,
// and grants the service-serve profile's permissions (sub only the serve family, pub only the
// reply family); a requester connects with its own token and the mirror permissions.

const requesterToken = "requester-token-not-a-bearer"

type broker struct {
	url    string
	srv    *server.Server
	serve  string // cotal.<t>.sep.<epTok>.<iid>.>
	reply  string // cotal.<t>.sep.reply.<epTok>.<iid>.>
	prefix string // the requester's inbox prefix, inside the reply family

	v       *serviceaccess.Validator
	witness string

	mu        sync.Mutex
	presented []string // every bearer a service connection presented
	refused   int      // service connects refused
}

func (b *broker) Check(c server.ClientAuthentication) bool {
	tok := c.GetOpts().Token
	if tok == requesterToken {
		c.RegisterUser(&server.User{Username: "requester", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{b.serve}},
			Subscribe: &server.SubjectPermission{Allow: []string{b.reply}},
		}})
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.presented = append(b.presented, tok)
	claims, err := b.v.Access(context.Background(), tok)
	if err != nil || claims.Wit != b.witness {
		b.refused++
		return false
	}
	c.RegisterUser(&server.User{Username: "svc_" + claims.Iid, Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{b.reply}},
		Subscribe: &server.SubjectPermission{Allow: []string{b.serve}},
	}})
	return true
}

func (b *broker) seen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.presented...)
}

func startBroker(t *testing.T, f *fixture) *broker {
	t.Helper()
	names, err := space.NewNames(f.space)
	if err != nil {
		t.Fatal(err)
	}
	epTok, err := serviceaccess.EndpointTokenOf(f.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{witness: f.witness, v: &serviceaccess.Validator{Space: f.space, Keys: serviceaccess.StaticKeys(f.authenticity().keys)}}
	if b.serve, err = names.ServiceServe(epTok, f.instance); err != nil {
		t.Fatal(err)
	}
	if b.reply, err = names.ServiceReply(epTok, f.instance); err != nil {
		t.Fatal(err)
	}
	b.prefix = strings.TrimSuffix(b.reply, ".>") + ".requester"
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, CustomClientAuthentication: b}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("broker not ready")
	}
	t.Cleanup(s.Shutdown)
	b.srv, b.url = s, s.ClientURL()
	return b
}

func (b *broker) requester(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(b.url, nats.Token(requesterToken), nats.CustomInboxPrefix(b.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// sentinel is a bearer user JWT, as the space's sentinel is.
func sentinel(t *testing.T) string {
	t.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.BearerToken = true
	s, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// issuer mints real access bearers for the fixture on the wall clock, each life long, with a
// unique jti, and records them.
type issuer struct {
	f    *fixture
	life time.Duration
	n    atomic.Int64
}

func (i *issuer) mint(mut func(map[string]any)) (string, map[string]any) {
	c := i.f.claims(time.Now(), i.life)
	c["jti"] = jtiOf(time.Unix(0, i.n.Add(1)))
	if mut != nil {
		mut(c)
	}
	return i.f.token(c), c
}

// wallGrant is a grant on the wall clock for a bearer minted now.
func wallGrant(t *testing.T, f *fixture, iss *issuer) (*Grant, string) {
	t.Helper()
	tok, c := iss.mint(nil)
	in := f.input(c)
	in.Result = f.result(tok, c["exp"].(int64))
	in.Now = nil
	g, err := AuthorizeGuestServeGrant(in)
	if err != nil {
		t.Fatal(err)
	}
	return g, tok
}

func echo(m *nats.Msg) { _ = m.Respond(append([]byte("ok:"), m.Data...)) }

func TestServeEndpoint(t *testing.T) {
	f := newFixture(t)
	b := startBroker(t, f)
	req := b.requester(t)
	iss := &issuer{f: f, life: 3 * time.Second}
	g, first := wallGrant(t, f, iss)

	// The source: the first pull is the granted bearer; the second a validly signed bearer for
	// another witness, which the grant must refuse before it is ever presented; then fresh ones.
	type pull struct {
		at       time.Time
		iat, exp time.Time // the current bound bearer's
	}
	var (
		mu      sync.Mutex
		pulls   []pull
		cur     = [2]time.Time{}
		foreign string
	)
	bearer := func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		n := len(pulls)
		pulls = append(pulls, pull{at: time.Now(), iat: cur[0], exp: cur[1]})
		switch n {
		case 0:
			tok := first
			cl, err := g.check(tok)
			if err != nil {
				return "", err
			}
			cur = [2]time.Time{time.Unix(cl.Iat, 0), time.Unix(cl.Exp, 0)}
			return tok, nil
		case 1:
			tok, _ := iss.mint(func(c map[string]any) { c["wit"] = serviceaccess.WitnessOf([]byte("another registration")) })
			foreign = tok
			return tok, nil
		}
		tok, c := iss.mint(nil)
		cur = [2]time.Time{time.Unix(c["iat"].(int64), 0), time.Unix(c["exp"].(int64), 0)}
		return tok, nil
	}

	var readyCalls atomic.Int32
	var readyErr error
	ep, err := ServeEndpoint(context.Background(), EndpointOptions{
		URLs:          []string{b.url},
		Bearer:        bearer,
		SentinelCreds: func(context.Context) (string, error) { return sentinel(t), nil },
		Grant:         g,
		Handler:       echo,
		Ready: func(ctx context.Context, access string) error {
			readyCalls.Add(1)
			if access != first {
				readyErr = errors.New("ready was not given the bound bearer")
				return nil
			}
			// Ready comes only once the responder is bound and flushed: a request is answered.
			m, err := req.Request(strings.TrimSuffix(b.serve, ">")+"ready", []byte("r"), 2*time.Second)
			if err == nil && string(m.Data) != "ok:r" {
				err = fmt.Errorf("answer %q", m.Data)
			}
			readyErr = err
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if readyErr != nil || readyCalls.Load() != 1 {
		t.Fatalf("ready: %d calls, %v", readyCalls.Load(), readyErr)
	}

	// Requesters send numbered requests through three bearer rotations; every one is answered.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, answered atomic.Int64
	var failures sync.Map
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf("%d-%d", w, i)
				sent.Add(1)
				m, err := req.Request(strings.TrimSuffix(b.serve, ">")+"echo", []byte(body), 3*time.Second)
				if err != nil || string(m.Data) != "ok:"+body {
					failures.Store(body, err)
					continue
				}
				answered.Add(1)
				time.Sleep(5 * time.Millisecond) // pacing only, not synchronisation
			}
		}()
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if n := ep.Rotations(); n < 3 {
			return fmt.Errorf("%d rotations", n)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	failures.Range(func(k, v any) bool {
		t.Errorf("request %v not answered: %v", k, v)
		return true
	})
	t.Logf("%d requests answered across %d rotations", answered.Load(), ep.Rotations())
	if answered.Load() != sent.Load() || sent.Load() < 30 {
		t.Fatalf("answered %d of %d", answered.Load(), sent.Load())
	}
	if n := readyCalls.Load(); n != 1 {
		t.Fatalf("ready called %d times", n)
	}

	t.Run("ok/renews at 50-80 % of each bearer's life", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		var last time.Time
		for i, p := range pulls[1:] {
			life := p.exp.Sub(p.iat)
			if p.at.Before(p.iat.Add(life/2)) || !p.at.Before(p.exp) {
				t.Errorf("pull %d at %v, bearer life %v..%v", i+1, p.at, p.iat, p.exp)
			}
			if !p.iat.Equal(last) { // the first pull for this bearer
				if late := p.iat.Add(life * 8 / 10).Add(300 * time.Millisecond); p.at.After(late) {
					t.Errorf("pull %d at %v, after 80 %% of %v..%v", i+1, p.at, p.iat, p.exp)
				}
				last = p.iat
			}
		}
	})
	t.Run("fail/a bearer the grant refuses is never presented", func(t *testing.T) {
		seen := b.seen()
		if foreign == "" || len(seen) < 4 {
			t.Fatalf("foreign %v, %d presented", foreign != "", len(seen))
		}
		for i, tok := range seen {
			if tok == foreign {
				t.Fatalf("presented the foreign bearer at connect %d", i)
			}
			if err := g.Check(tok); err != nil && !isRefusal(err, RefuseBearer) { // an old one may have expired since
				t.Fatalf("presented bearer %d the grant refuses: %v", i, err)
			}
		}
		b.mu.Lock()
		refused := b.refused
		b.mu.Unlock()
		if refused != 0 {
			t.Fatalf("the broker refused %d service connects", refused)
		}
	})
	t.Run("fail/a reply outside the reply family is dropped and counted", func(t *testing.T) {
		before := ep.Dropped()
		for _, reply := range []string{"_INBOX.x.y", strings.Replace(b.prefix, f.instance, "zzzzzzzzzzzzzzzzzzzzzzzzzz", 1) + ".x", strings.TrimSuffix(b.reply, ">")} {
			if err := req.PublishMsg(&nats.Msg{Subject: strings.TrimSuffix(b.serve, ">") + "echo", Reply: reply, Data: []byte("drop")}); err != nil {
				t.Fatal(err)
			}
		}
		if err := req.Flush(); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if d := ep.Dropped() - before; d != 3 {
				return fmt.Errorf("%d dropped", d)
			}
			return nil
		})
	})
	t.Run("ok/close drains and stops", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ep.Close(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ep.Done():
		default:
			t.Fatal("not done after Close")
		}
		if err := ep.Err(); err != nil {
			t.Fatalf("Err after Close = %v", err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if n := b.srv.NumClients(); n != 1 {
				return fmt.Errorf("%d clients, want the requester only", n)
			}
			return nil
		})
		if _, err := req.Request(strings.TrimSuffix(b.serve, ">")+"echo", []byte("x"), 200*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("request after Close: %v", err)
		}
		if err := ep.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestServeEndpointRefusals(t *testing.T) {
	f := newFixture(t)
	b := startBroker(t, f)
	iss := &issuer{f: f, life: 2 * time.Second}
	g, first := wallGrant(t, f, iss)
	sent := sentinel(t)
	base := func() EndpointOptions {
		return EndpointOptions{
			URLs:          []string{b.url},
			Bearer:        func(context.Context) (string, error) { return first, nil },
			SentinelCreds: func(context.Context) (string, error) { return sent, nil },
			Grant:         g,
			Handler:       echo,
			Ready:         func(context.Context, string) error { return nil },
		}
	}
	for _, tc := range []struct {
		name string
		mut  func(*EndpointOptions)
	}{
		{"fail/no URL", func(o *EndpointOptions) { o.URLs = nil }},
		{"fail/no bearer", func(o *EndpointOptions) { o.Bearer = nil }},
		{"fail/no sentinel", func(o *EndpointOptions) { o.SentinelCreds = nil }},
		{"fail/no grant", func(o *EndpointOptions) { o.Grant = nil }},
		{"fail/a grant not from AuthorizeGuestServeGrant", func(o *EndpointOptions) { o.Grant = &Grant{} }},
		{"fail/no handler", func(o *EndpointOptions) { o.Handler = nil }},
		{"fail/no ready", func(o *EndpointOptions) { o.Ready = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.mut(&o)
			if ep, err := ServeEndpoint(context.Background(), o); err == nil {
				_ = ep.Close(context.Background())
				t.Fatal("served")
			}
		})
	}
	t.Run("fail/a first bearer the grant refuses is not presented", func(t *testing.T) {
		before := len(b.seen())
		o := base()
		foreign, _ := iss.mint(func(c map[string]any) { c["root"] = "r_zzzzzzzzzzzzzzzzzzzzzzzzzz" })
		o.Bearer = func(context.Context) (string, error) { return foreign, nil }
		_, err := ServeEndpoint(context.Background(), o)
		if !isRefusal(err, RefuseRoot) {
			t.Fatalf("ServeEndpoint = %v", err)
		}
		noTokenText(t, err, foreign)
		if n := len(b.seen()) - before; n != 0 {
			t.Fatalf("%d bearers presented", n)
		}
	})
	t.Run("fail/a sentinel that is not a bearer user JWT", func(t *testing.T) {
		o := base()
		o.SentinelCreds = func(context.Context) (string, error) { return "not-a-jwt", nil }
		if _, err := ServeEndpoint(context.Background(), o); err == nil || !strings.Contains(err.Error(), "sentinel") {
			t.Fatalf("ServeEndpoint = %v", err)
		}
	})
	t.Run("fail/ready refused closes the connection", func(t *testing.T) {
		o := base()
		o.Ready = func(context.Context, string) error { return errors.New("ready denied") }
		if _, err := ServeEndpoint(context.Background(), o); err == nil || !strings.Contains(err.Error(), "ready denied") {
			t.Fatalf("ServeEndpoint = %v", err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if n := b.srv.NumClients(); n != 0 {
				return fmt.Errorf("%d clients", n)
			}
			return nil
		})
	})
	t.Run("fail/no fresh bearer before expiry ends the endpoint", func(t *testing.T) {
		tok, _ := iss.mint(nil)
		pulls := atomic.Int32{}
		o := base()
		o.Bearer = func(context.Context) (string, error) {
			if pulls.Add(1) == 1 {
				return tok, nil
			}
			return "", errors.New("authority unavailable")
		}
		ep, err := ServeEndpoint(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ep.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the endpoint outlived its bearer")
		}
		if err := ep.Err(); !errors.Is(err, ErrExpired) || !strings.Contains(err.Error(), "authority unavailable") {
			t.Fatalf("Err = %v", err)
		}
		if pulls.Load() < 3 {
			t.Fatalf("%d pulls: the endpoint did not retry", pulls.Load())
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if n := b.srv.NumClients(); n != 0 {
				return fmt.Errorf("%d clients", n)
			}
			return nil
		})
	})
}
