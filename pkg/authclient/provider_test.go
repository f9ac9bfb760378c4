package authclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// clock is the caller's clock, offset from the real one (the fake authority mints on the real
// clock).
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off = d
}

func login(context.Context) (string, error) { return loginToken, nil }

func newProvider(t testing.TB, a *fakeAuthority, base string, clk *clock, lg func(context.Context) (string, error)) *authclient.Provider {
	t.Helper()
	cfg := authclient.ProviderConfig{URL: base, Account: a.account, Space: testSpace, Login: lg}
	if clk != nil {
		cfg.Now = clk.now
	}
	p, err := authclient.NewProvider(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testWitness(t testing.TB) string { return "w_" + randID(t, 32) }

func activateReq(a *fakeAuthority, wit, id string) *serviceaccess.Request {
	return &serviceaccess.Request{Kind: serviceaccess.KindActivate, Account: a.account, Space: testSpace, RequestID: id,
		Endpoint: testEP, Instance: testIID, Witness: wit}
}

func authorityCode(t *testing.T, err error, want string) {
	t.Helper()
	var ae *authclient.AuthorityError
	if !errors.As(err, &ae) || ae.Code != want {
		t.Fatalf("error %v; want an AuthorityError %q", err, want)
	}
}

// poll waits for cond with a deadline.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewProvider(t *testing.T) {
	akp, _ := nkeys.CreateAccount()
	acct, _ := akp.PublicKey()
	for _, tc := range []struct {
		name, url, account, space, want, err string
	}{
		{name: "ok/https-tenant", url: "https://auth.example.com/tenant-a", want: "https://auth.example.com/tenant-a/service-endpoint-authority"},
		{name: "ok/https-tenant-slash", url: "https://auth.example.com/t/a/", want: "https://auth.example.com/t/a/service-endpoint-authority"},
		{name: "ok/https-root", url: "https://auth.example.com", want: "https://auth.example.com/service-endpoint-authority"},
		{name: "ok/http-loopback", url: "http://127.0.0.1:8081/tenant-a", want: "http://127.0.0.1:8081/tenant-a/service-endpoint-authority"},
		{name: "ok/http-localhost", url: "http://localhost:8081", want: "http://localhost:8081/service-endpoint-authority"},
		{name: "fail/http-remote", url: "http://auth.example.com/tenant-a", err: "loopback"},
		{name: "fail/http-remote-ip", url: "http://10.0.0.1/tenant-a", err: "loopback"},
		{name: "fail/scheme", url: "ftp://auth.example.com", err: "http(s)"},
		{name: "fail/query", url: "https://auth.example.com/t?x=1", err: "query"},
		{name: "fail/fragment", url: "https://auth.example.com/t#f", err: "query"},
		{name: "fail/userinfo", url: "https://u:p@auth.example.com/t", err: "user info"},
		{name: "fail/account", url: "https://auth.example.com", account: "nope", err: "Account"},
		{name: "fail/space", url: "https://auth.example.com", space: " acme", err: "space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := authclient.ProviderConfig{URL: tc.url, Account: acct, Space: testSpace}
			if tc.account != "" {
				cfg.Account = tc.account
			}
			if tc.space != "" {
				cfg.Space = tc.space
			}
			p, err := authclient.NewProvider(cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v; want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.URL() != tc.want {
				t.Fatalf("URL %q; want %q", p.URL(), tc.want)
			}
		})
	}
}

func TestProviderInfo(t *testing.T) {
	t.Run("ok/tenant-path-through-stripping-proxy", func(t *testing.T) {
		a := newFakeAuthority(t)
		proxy := stripProxy(t, "tenant-a", a.srv)
		p := newProvider(t, a, proxy.URL+"/tenant-a", nil, login)
		info, err := p.ServiceEndpointInfo(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := a.info()
		if info.Account != want.Account || info.Space != testSpace || info.Issuer != serviceaccess.Issuer(testSpace) ||
			len(info.Keys) != 1 || info.Keys[0] != want.Keys[0] {
			t.Fatalf("info %+v; want %+v", info, want)
		}
		// A POST takes the same path.
		wit := testWitness(t)
		ans, err := p.ServiceEndpointAuthority(context.Background(), activateReq(a, wit, "act_tenantpath1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if ans.Kind != serviceaccess.AnswerCredential || ans.RequestID != "act_tenantpath1" || ans.Witness != wit {
			t.Fatalf("answer %s %s", ans.Kind, ans.RequestID)
		}
	})
	t.Run("fail/tenant-path-dropped", func(t *testing.T) {
		a := newFakeAuthority(t)
		proxy := stripProxy(t, "tenant-a", a.srv)
		p := newProvider(t, a, proxy.URL, nil, login)
		_, err := p.ServiceEndpointInfo(context.Background())
		authorityCode(t, err, authclient.AuthorityStatus)
		if a.getCount() != 0 {
			t.Fatalf("the authority answered %d GETs without the tenant path", a.getCount())
		}
	})
	t.Run("fail/redirect-not-followed", func(t *testing.T) {
		a := newFakeAuthority(t)
		redir := httptest.NewServer(http.RedirectHandler(a.srv.URL+serviceaccess.Path, http.StatusTemporaryRedirect))
		t.Cleanup(redir.Close)
		p := newProvider(t, a, redir.URL, nil, login)
		_, err := p.ServiceEndpointInfo(context.Background())
		authorityCode(t, err, authclient.AuthorityRedirect)
		_, err = p.ServiceEndpointAuthority(context.Background(), activateReq(a, testWitness(t), "act_redirect01"), nil)
		authorityCode(t, err, authclient.AuthorityRedirect)
		if a.getCount() != 0 || len(a.seenRequests()) != 0 {
			t.Fatalf("the redirect was followed: %d GETs, %d POSTs", a.getCount(), len(a.seenRequests()))
		}
	})
	t.Run("fail/another-space", func(t *testing.T) {
		a := newFakeAuthority(t)
		p, err := authclient.NewProvider(authclient.ProviderConfig{URL: a.srv.URL, Account: a.account, Space: "other"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.ServiceEndpointInfo(context.Background())
		authorityCode(t, err, authclient.AuthorityUnbound)
	})
	t.Run("fail/too-large", func(t *testing.T) {
		big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(strings.Repeat(" ", 5<<20)))
		}))
		t.Cleanup(big.Close)
		a := newFakeAuthority(t)
		p := newProvider(t, a, big.URL, nil, login)
		_, err := p.ServiceEndpointInfo(context.Background())
		authorityCode(t, err, authclient.AuthorityTooLarge)
		_, err = p.ServiceEndpointAuthority(context.Background(), activateReq(a, testWitness(t), "act_toolarge1"), nil)
		authorityCode(t, err, authclient.AuthorityTooLarge)
	})
}

func TestProviderAuthority(t *testing.T) {
	ctx := context.Background()
	t.Run("ok/nil-proof-is-the-login", func(t *testing.T) {
		a := newFakeAuthority(t)
		p := newProvider(t, a, a.srv.URL, nil, login)
		ans, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_login0001"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.seenRequests(); len(got) != 1 || got[0].Proof != serviceaccess.ProofIDP || ans.Kind != serviceaccess.AnswerCredential {
			t.Fatalf("seen %+v, answer %s", got, ans.Kind)
		}
	})
	t.Run("ok/denied-is-an-answer", func(t *testing.T) {
		a := newFakeAuthority(t)
		p := newProvider(t, a, a.srv.URL, nil, func(context.Context) (string, error) { return "wrong", nil })
		ans, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_denied001"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if ans.Kind != serviceaccess.AnswerDenied || ans.Code != serviceaccess.CodeUnauthenticated || ans.RequestID != "act_denied001" {
			t.Fatalf("answer %s %s %s", ans.Kind, ans.Code, ans.RequestID)
		}
	})
	t.Run("fail/no-sign-in", func(t *testing.T) {
		a := newFakeAuthority(t)
		p := newProvider(t, a, a.srv.URL, nil, nil)
		_, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_nosignin1"), nil)
		authorityCode(t, err, authclient.AuthoritySignIn)
		if n := len(a.seenRequests()); n != 0 {
			t.Fatalf("%d requests sent without a sign-in", n)
		}
	})
	t.Run("fail/another-account-not-sent", func(t *testing.T) {
		a := newFakeAuthority(t)
		p := newProvider(t, a, a.srv.URL, nil, login)
		req := activateReq(a, testWitness(t), "act_otheracct")
		req.Space = "other"
		_, err := p.ServiceEndpointAuthority(ctx, req, nil)
		authorityCode(t, err, authclient.AuthorityRequest)
		if n := len(a.seenRequests()); n != 0 {
			t.Fatalf("%d requests sent for another space", n)
		}
	})
	for _, tc := range []struct {
		name string
		edit func(req *serviceaccess.Request, ans *serviceaccess.Answer) *serviceaccess.Answer
	}{
		{name: "fail/unbound-requestId", edit: func(_ *serviceaccess.Request, ans *serviceaccess.Answer) *serviceaccess.Answer {
			ans.RequestID = "act_someoneelse"
			return ans
		}},
		{name: "fail/unbound-kind", edit: func(req *serviceaccess.Request, _ *serviceaccess.Answer) *serviceaccess.Answer {
			return &serviceaccess.Answer{Kind: serviceaccess.AnswerReady, RequestID: req.RequestID, Witness: req.Witness}
		}},
		{name: "fail/unbound-witness", edit: func(_ *serviceaccess.Request, ans *serviceaccess.Answer) *serviceaccess.Answer {
			ans.Witness = "w_" + strings.Repeat("a", 52)
			return ans
		}},
		{name: "fail/unbound-denial-of-another-request", edit: func(_ *serviceaccess.Request, _ *serviceaccess.Answer) *serviceaccess.Answer {
			return denied("act_someoneelse", serviceaccess.CodeFailedPrecondition)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAuthority(t)
			a.setHook(func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
				return tc.edit(&env.Request, a.credential(&env.Request))
			})
			p := newProvider(t, a, a.srv.URL, nil, login)
			_, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_bound00001"), nil)
			authorityCode(t, err, authclient.AuthorityUnbound)
		})
	}
	t.Run("fail/status-not-the-answers", func(t *testing.T) {
		a := newFakeAuthority(t)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			_, _ = fmt.Fprintf(w, `{"kind":"denied","requestId":"act_status0001","code":"failed-precondition","reason":"x","message":"y"}`)
		}))
		t.Cleanup(srv.Close)
		p := newProvider(t, a, srv.URL, nil, login)
		_, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_status0001"), nil)
		authorityCode(t, err, authclient.AuthorityStatus)
	})
	t.Run("fail/malformed-answer", func(t *testing.T) {
		a := newFakeAuthority(t)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = fmt.Fprintf(w, `{"kind":"credential","requestId":"act_malformed1","surprise":"%s"}`, remoteText)
		}))
		t.Cleanup(srv.Close)
		p := newProvider(t, a, srv.URL, nil, login)
		_, err := p.ServiceEndpointAuthority(ctx, activateReq(a, testWitness(t), "act_malformed1"), nil)
		authorityCode(t, err, authclient.AuthorityMalformed)
		if strings.Contains(err.Error(), remoteText) {
			t.Fatalf("error %q holds the authority's text", err)
		}
	})
}

// --- renewal source ---

type rig struct {
	a   *fakeAuthority
	p   *authclient.Provider
	clk *clock
	dir string
	wit string
	// outputs collects every error and state text the source produced, checked for secrets.
	mu      sync.Mutex
	outputs []string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	a := newFakeAuthority(t)
	clk := &clock{}
	r := &rig{a: a, clk: clk, dir: filepath.Join(t.TempDir(), "renewal"), wit: testWitness(t)}
	r.p = newProvider(t, a, a.srv.URL, clk, login)
	t.Cleanup(func() { r.noSecrets(t) })
	return r
}

func (r *rig) source(t *testing.T) *authclient.RenewalSource {
	t.Helper()
	s, err := r.p.ServiceEndpointRenewal(authclient.RenewalConfig{Dir: r.dir, Witness: r.wit, Endpoint: testEP, Instance: testIID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func (r *rig) note(s ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outputs = append(r.outputs, s...)
}

// bearer pulls once and records the error and state text.
func (r *rig) bearer(s *authclient.RenewalSource) (string, error) {
	tok, err := s.Bearer(context.Background())
	if err != nil {
		r.note(err.Error())
	}
	r.note(fmt.Sprintf("%+v", s.State()))
	return tok, err
}

func (r *rig) noSecrets(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, out := range r.outputs {
		if strings.Contains(out, remoteText) {
			t.Errorf("output %q holds the authority's text", out)
		}
		for _, tok := range r.a.tokens() {
			if strings.Contains(out, tok) {
				t.Errorf("output %q holds a token", out)
			}
		}
	}
}

func (r *rig) record(t *testing.T) *authclient.RenewalRecord {
	t.Helper()
	fs, err := authclient.NewFileStore(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := fs.Load(r.wit)
	if err != nil || rec == nil {
		t.Fatalf("record %v, %v", rec, err)
	}
	return rec
}

func wantState(t *testing.T, s *authclient.RenewalSource, state, cause string) {
	t.Helper()
	if st := s.State(); st.State != state || st.Cause != cause {
		t.Fatalf("state %s/%s; want %s/%s", st.State, st.Cause, state, cause)
	}
}

func distinctIDs(seen []seen) []string {
	var ids []string
	for _, s := range seen {
		if !slices.Contains(ids, s.RequestID) {
			ids = append(ids, s.RequestID)
		}
	}
	return ids
}

func TestRenewalSource(t *testing.T) {
	t.Run("ok/ids-stored-before-send", func(t *testing.T) {
		r := newRig(t)
		fs, err := authclient.NewFileStore(r.dir)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		r.a.setHook(func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
			rec, err := fs.Load(r.wit)
			switch {
			case err != nil || rec == nil:
				t.Errorf("no record when the request arrived: %v", err)
			case env.Request.Kind == serviceaccess.KindActivate && env.Request.RequestID != rec.ActivateRequestID,
				env.Request.Kind == serviceaccess.KindRenew && env.Request.RequestID != rec.RenewRequestID:
				t.Errorf("%s requestId %s is not the stored one", env.Request.Kind, env.Request.RequestID)
			default:
				checked++
			}
			return nil
		})
		s := r.source(t)
		for range 3 {
			if _, err := r.bearer(s); err != nil {
				t.Fatal(err)
			}
		}
		got := r.a.seenRequests()
		if checked != 3 || len(got) != 3 || got[0].Kind != serviceaccess.KindActivate || got[0].Proof != serviceaccess.ProofIDP ||
			got[1].Kind != serviceaccess.KindRenew || got[1].Proof != serviceaccess.ProofRenewal {
			t.Fatalf("checked %d of %+v", checked, got)
		}
		st, _ := os.Stat(filepath.Join(r.dir, r.wit+".json"))
		dst, _ := os.Stat(r.dir)
		if st == nil || st.Mode().Perm() != 0o600 || dst == nil || dst.Mode().Perm() != 0o700 {
			t.Fatalf("record modes %v in %v; want 0600 in 0700", st, dst)
		}
	})
	t.Run("ok/two-ids-over-100-pulls-and-10-restarts", func(t *testing.T) {
		r := newRig(t)
		var bearers []string
		for range 10 {
			s := r.source(t)
			for range 10 {
				tok, err := r.bearer(s)
				if err != nil {
					t.Fatal(err)
				}
				bearers = append(bearers, tok)
			}
			wantState(t, s, authclient.SourceReady, "")
			if st := s.State(); !st.AccessExp.After(time.Now()) || !st.RenewalExp.After(st.AccessExp) {
				t.Fatalf("state expiries %v %v", st.AccessExp, st.RenewalExp)
			}
			s.Close()
		}
		got := r.a.seenRequests()
		ids := distinctIDs(got)
		rec := r.record(t)
		if len(got) != 100 || len(ids) != 2 || ids[0] != rec.ActivateRequestID || ids[1] != rec.RenewRequestID {
			t.Fatalf("%d requests under ids %v; record %s %s", len(got), ids, rec.ActivateRequestID, rec.RenewRequestID)
		}
		for i, g := range got {
			if i > 0 && (g.Kind != serviceaccess.KindRenew || g.Proof != serviceaccess.ProofRenewal) {
				t.Fatalf("pull %d sent %s on %s; want renew on renewal", i, g.Kind, g.Proof)
			}
		}
		slices.Sort(bearers)
		if len(slices.Compact(bearers)) != 100 {
			t.Fatal("a bearer was handed out twice: pulls must mint anew")
		}
	})
	t.Run("ok/expired-proof-replays-activate", func(t *testing.T) {
		r := newRig(t)
		r.a.mu.Lock()
		r.a.renewalTTL = 10 * time.Second
		r.a.mu.Unlock()
		s := r.source(t)
		for range 2 {
			if _, err := r.bearer(s); err != nil {
				t.Fatal(err)
			}
		}
		r.clk.set(11 * time.Second) // the machine was off: the renewal proof is dead by this clock
		r.a.mu.Lock()
		r.a.renewalTTL = time.Hour
		r.a.mu.Unlock()
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		got := r.a.seenRequests()
		if len(got) != 3 || got[2].Kind != serviceaccess.KindActivate || got[2].Proof != serviceaccess.ProofIDP || got[2].RequestID != got[0].RequestID {
			t.Fatalf("requests %+v; want the first activate replayed on the login", got)
		}
		wantState(t, s, authclient.SourceReady, "")
	})
	t.Run("ok/concurrent-pulls-send-one", func(t *testing.T) {
		r := newRig(t)
		release := make(chan struct{})
		r.a.setHook(func(*http.Request, *serviceaccess.Envelope) *serviceaccess.Answer {
			<-release
			return nil
		})
		s := r.source(t)
		const n = 8
		type out struct {
			tok  string
			cred *serviceaccess.Answer
			err  error
		}
		outs := make(chan out, n)
		for i := range n {
			go func() {
				if i%2 == 0 {
					tok, err := s.Bearer(context.Background())
					outs <- out{tok: tok, err: err}
					return
				}
				c, err := s.Credential(context.Background())
				outs <- out{cred: c, err: err}
			}()
		}
		poll(t, "every caller to join the one pull", func() bool { return s.Waiters() == n })
		close(release)
		var toks []string
		var creds []*serviceaccess.Answer
		for range n {
			o := <-outs
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.cred != nil {
				if o.cred.Renewal != nil {
					t.Fatal("the credential carries the renewal proof")
				}
				creds = append(creds, o.cred)
				toks = append(toks, o.cred.Access.Token)
			} else {
				toks = append(toks, o.tok)
			}
		}
		if got := r.a.seenRequests(); len(got) != 1 {
			t.Fatalf("%d requests for %d concurrent pulls", len(got), n)
		}
		if len(slices.Compact(toks)) != 1 || len(creds) != n/2 {
			t.Fatalf("pulls sharing one request answered %d bearers", len(slices.Compact(toks)))
		}
		creds[0].Access.Token = "mutated"
		if creds[1].Access.Token != toks[0] {
			t.Fatal("the callers share one credential, not a copy each")
		}
	})
	t.Run("fail/ended-sends-nothing", func(t *testing.T) {
		r := newRig(t)
		s := r.source(t)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		r.a.setHook(func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
			return denied(env.Request.RequestID, serviceaccess.CodeFailedPrecondition) // revoked
		})
		_, err := r.bearer(s)
		if !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("err %v; want ErrSourceEnded", err)
		}
		wantState(t, s, authclient.SourceEnded, authclient.CauseAuthority)
		before := len(r.a.seenRequests())
		_, berr := r.bearer(s)
		_, cerr := s.Credential(context.Background())
		if !errors.Is(berr, authclient.ErrSourceEnded) || cerr == nil || berr.Error() != cerr.Error() {
			t.Fatalf("ended source: Bearer %v, Credential %v; want the same refusal", berr, cerr)
		}
		if _, err := s.SentinelCreds(context.Background()); !errors.Is(err, authclient.ErrSourceEnded) {
			t.Fatalf("SentinelCreds on an ended source: %v", err)
		}
		if after := len(r.a.seenRequests()); after != before {
			t.Fatalf("the ended source sent %d more requests", after-before)
		}
	})
	t.Run("fail/close-aborts-the-pull", func(t *testing.T) {
		r := newRig(t)
		aborted := make(chan struct{})
		r.a.setHook(func(hr *http.Request, _ *serviceaccess.Envelope) *serviceaccess.Answer {
			select {
			case <-hr.Context().Done():
				close(aborted)
			case <-time.After(30 * time.Second):
				t.Error("the pull was not aborted")
			}
			return nil
		})
		s := r.source(t)
		errc := make(chan error, 1)
		go func() {
			_, err := s.Bearer(context.Background())
			errc <- err
		}()
		poll(t, "the request to arrive", func() bool { return len(r.a.seenRequests()) == 1 })
		s.Close()
		select {
		case err := <-errc:
			if !errors.Is(err, authclient.ErrSourceClosed) {
				t.Fatalf("err %v; want ErrSourceClosed", err)
			}
			r.note(err.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not end the pull")
		}
		select {
		case <-aborted:
		case <-time.After(10 * time.Second):
			t.Fatal("the request in flight was not aborted")
		}
		wantState(t, s, authclient.SourceClosed, "")
		if _, err := r.bearer(s); !errors.Is(err, authclient.ErrSourceClosed) {
			t.Fatalf("pull after Close: %v", err)
		}
		if n := len(r.a.seenRequests()); n != 1 {
			t.Fatalf("the closed source sent %d requests", n)
		}
	})
	t.Run("fail/unavailable-then-replay", func(t *testing.T) {
		r := newRig(t)
		s := r.source(t)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			cause string
			hook  func(hr *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer
		}{
			{authclient.CauseTransport, func(*http.Request, *serviceaccess.Envelope) *serviceaccess.Answer { panic(http.ErrAbortHandler) }},
			{authclient.CauseRateLimited, func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
				return denied(env.Request.RequestID, serviceaccess.CodeRateLimited)
			}},
			{authclient.CauseAuthority, func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
				return &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, RequestID: env.Request.RequestID, Message: remoteText}
			}},
		} {
			r.a.setHook(tc.hook)
			_, err := r.bearer(s)
			var se *authclient.SourceError
			if !errors.As(err, &se) || se.State != authclient.SourceUnavailable || se.Cause != tc.cause {
				t.Fatalf("err %v; want unavailable %s", err, tc.cause)
			}
			wantState(t, s, authclient.SourceUnavailable, tc.cause)
			r.a.setHook(nil)
			if _, err := r.bearer(s); err != nil {
				t.Fatalf("the replay after %s: %v", tc.cause, err)
			}
		}
		if ids := distinctIDs(r.a.seenRequests()); len(ids) != 2 {
			t.Fatalf("requestIds %v; replays must reuse the stored ones", ids)
		}
	})
	t.Run("fail/sign-in", func(t *testing.T) {
		r := newRig(t)
		// No signed-in login: nothing to activate on, nothing sent.
		p := newProvider(t, r.a, r.a.srv.URL, r.clk, nil)
		s, err := p.ServiceEndpointRenewal(authclient.RenewalConfig{Dir: r.dir, Witness: r.wit, Endpoint: testEP, Instance: testIID})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if _, err := r.bearer(s); err == nil {
			t.Fatal("a pull without a sign-in succeeded")
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseSignIn)
		if n := len(r.a.seenRequests()); n != 0 {
			t.Fatalf("%d requests sent without a sign-in", n)
		}
		// A rejected login: unavailable too, and the replay with a good login keeps the id.
		bad := newProvider(t, r.a, r.a.srv.URL, r.clk, func(context.Context) (string, error) { return "stale-login", nil })
		s2, err := bad.ServiceEndpointRenewal(authclient.RenewalConfig{Dir: r.dir, Witness: r.wit, Endpoint: testEP, Instance: testIID})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s2.Close)
		if _, err := r.bearer(s2); err == nil {
			t.Fatal("a pull on a rejected login succeeded")
		}
		wantState(t, s2, authclient.SourceUnavailable, authclient.CauseSignIn)
		if _, err := r.bearer(r.source(t)); err != nil {
			t.Fatal(err)
		}
		if ids := distinctIDs(r.a.seenRequests()); len(ids) != 1 {
			t.Fatalf("requestIds %v; the activate must be replayed", ids)
		}
	})
	t.Run("fail/renewal-rejected-falls-back-to-activate", func(t *testing.T) {
		r := newRig(t)
		s := r.source(t)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		r.a.setHook(func(_ *http.Request, env *serviceaccess.Envelope) *serviceaccess.Answer {
			if env.Proof.Kind == serviceaccess.ProofRenewal {
				return denied(env.Request.RequestID, serviceaccess.CodeUnauthenticated)
			}
			return nil
		})
		if _, err := r.bearer(s); err == nil {
			t.Fatal("a rejected renewal proof answered a bearer")
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseRenewal)
		if rec := r.record(t); rec.Renewal != nil || !s.State().RenewalExp.IsZero() {
			t.Fatal("the rejected renewal proof is still stored")
		}
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		got := r.a.seenRequests()
		if len(got) != 3 || got[2].Kind != serviceaccess.KindActivate || got[2].RequestID != got[0].RequestID {
			t.Fatalf("requests %+v; want the activate replayed", got)
		}
	})
	t.Run("fail/store", func(t *testing.T) {
		r := newRig(t)
		s := r.source(t)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(r.dir, r.wit+".json")
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sent := len(r.a.seenRequests())
		for _, tc := range []struct {
			name         string
			break_, mend func() error
		}{
			{"loose-file", func() error { return os.Chmod(path, 0o644) }, func() error { return os.Chmod(path, 0o600) }},
			{"loose-dir", func() error { return os.Chmod(r.dir, 0o755) }, func() error { return os.Chmod(r.dir, 0o700) }},
			{"damaged", func() error { return os.WriteFile(path, []byte(`{"v":1,"x":`), 0o600) }, func() error { return os.WriteFile(path, orig, 0o600) }},
			{"unknown-key", func() error {
				return os.WriteFile(path, append(orig[:len(orig)-1:len(orig)-1], []byte(`,"extra":1}`)...), 0o600)
			}, func() error { return os.WriteFile(path, orig, 0o600) }},
		} {
			if err := tc.break_(); err != nil {
				t.Fatal(err)
			}
			_, err := r.bearer(s)
			var se *authclient.SourceError
			if !errors.As(err, &se) || se.Cause != authclient.CauseStore {
				t.Fatalf("%s: err %v; want unavailable store", tc.name, err)
			}
			wantState(t, s, authclient.SourceUnavailable, authclient.CauseStore)
			if n := len(r.a.seenRequests()); n != sent {
				t.Fatalf("%s: the source sent on a broken store", tc.name)
			}
			if err := tc.mend(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		if ids := distinctIDs(r.a.seenRequests()); len(ids) != 2 {
			t.Fatalf("requestIds %v after the store was restored", ids)
		}
	})
	t.Run("fail/store-interface", func(t *testing.T) {
		r := newRig(t)
		fs, err := authclient.NewFileStore(r.dir)
		if err != nil {
			t.Fatal(err)
		}
		st := &faultyStore{inner: fs}
		s, err := r.p.ServiceEndpointRenewal(authclient.RenewalConfig{Store: st, Witness: r.wit, Endpoint: testEP, Instance: testIID})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		st.set(true, false) // the record cannot be created: nothing is sent
		if _, err := r.bearer(s); err == nil {
			t.Fatal("a pull with no stored ids succeeded")
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseStore)
		if n := len(r.a.seenRequests()); n != 0 {
			t.Fatalf("%d requests sent before the ids were stored", n)
		}
		st.set(false, false)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		st.set(true, false) // the new renewal proof cannot be stored: nothing is returned
		if tok, err := r.bearer(s); err == nil || tok != "" {
			t.Fatal("a credential was returned whose renewal proof was not stored")
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseStore)
		st.set(false, true)
		if _, err := r.bearer(s); err == nil {
			t.Fatal("a pull on an unreadable store succeeded")
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseStore)
		st.set(false, false)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		if ids := distinctIDs(r.a.seenRequests()); len(ids) != 2 {
			t.Fatalf("requestIds %v", ids)
		}
	})
	t.Run("fail/credential-expired", func(t *testing.T) {
		r := newRig(t)
		s := r.source(t)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(r.dir, r.wit+".json")
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r.clk.set(2 * time.Minute) // this clock is ahead: the fresh 60 s bearer is already dead
		tok, err := r.bearer(s)
		var se *authclient.SourceError
		if !errors.As(err, &se) || se.Cause != authclient.CauseCredentialExpired || tok != "" {
			t.Fatalf("err %v; want unavailable credential-expired", err)
		}
		wantState(t, s, authclient.SourceUnavailable, authclient.CauseCredentialExpired)
		if after, _ := os.ReadFile(path); string(after) != string(before) {
			t.Fatal("the expired credential's renewal proof was stored")
		}
		r.clk.set(0)
		if _, err := r.bearer(s); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ok/sentinel-creds", func(t *testing.T) {
		r := newRig(t)
		akp, _ := nkeys.CreateAccount()
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.BearerToken = true
		sentinel, err := uc.Encode(akp)
		if err != nil {
			t.Fatal(err)
		}
		p, err := authclient.NewProvider(authclient.ProviderConfig{URL: r.a.srv.URL, Account: r.a.account, Space: testSpace, Login: login, Sentinel: sentinel})
		if err != nil {
			t.Fatal(err)
		}
		s, err := p.ServiceEndpointRenewal(authclient.RenewalConfig{Dir: r.dir, Witness: r.wit, Endpoint: testEP, Instance: testIID})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.SentinelCreds(context.Background())
		if err != nil || got != sentinel {
			t.Fatalf("SentinelCreds: %.20q, %v; want the sentinel", got, err)
		}
		if _, err := jwt.DecodeUserClaims(got); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := s.SentinelCreds(context.Background()); err == nil {
			t.Fatal("a closed source handed out the sentinel")
		}
		if _, err := r.source(t).SentinelCreds(context.Background()); err == nil {
			t.Fatal("SentinelCreds without a sentinel succeeded")
		}
	})
}

// faultyStore fails Save or Load on demand.
type faultyStore struct {
	inner            authclient.RenewalStore
	mu               sync.Mutex
	failSave, failLd bool
}

func (f *faultyStore) set(save, load bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failSave, f.failLd = save, load
}

func (f *faultyStore) Load(w string) (*authclient.RenewalRecord, error) {
	f.mu.Lock()
	fail := f.failLd
	f.mu.Unlock()
	if fail {
		return nil, errors.New("disk on fire")
	}
	return f.inner.Load(w)
}

func (f *faultyStore) Save(rec *authclient.RenewalRecord) error {
	f.mu.Lock()
	fail := f.failSave
	f.mu.Unlock()
	if fail {
		return errors.New("disk full")
	}
	return f.inner.Save(rec)
}

func TestFileStore(t *testing.T) {
	wit := "w_" + strings.Repeat("b", 52)
	rec := &authclient.RenewalRecord{V: 1, Account: "A", Space: testSpace, Endpoint: testEP, Instance: testIID, Witness: wit,
		ActivateRequestID: "act_0123456789", RenewRequestID: "ren_0123456789", Renewal: &serviceaccess.Token{Token: "x.y.z", Exp: 42}}
	t.Run("ok/roundtrip", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "a", "b")
		fs, err := authclient.NewFileStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := fs.Load(wit); got != nil || err != nil {
			t.Fatalf("empty store: %v, %v", got, err)
		}
		for range 2 {
			if err := fs.Save(rec); err != nil {
				t.Fatal(err)
			}
		}
		got, err := fs.Load(wit)
		if err != nil || got.ActivateRequestID != rec.ActivateRequestID || got.Renewal.Token != "x.y.z" || got.Renewal.Exp != 42 {
			t.Fatalf("loaded %+v, %v", got, err)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 || ents[0].Name() != wit+".json" {
			t.Fatalf("directory holds %v; want the record alone (no temporary file left)", ents)
		}
		if s := got.LogValue().String(); strings.Contains(s, "x.y.z") {
			t.Fatalf("the record logs its proof: %s", s)
		}
	})
	t.Run("fail/loose-dir", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		_, err := authclient.NewFileStore(dir)
		if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "0700") {
			t.Fatalf("err %v; want the path and the mode named", err)
		}
	})
	t.Run("fail/loose-file", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "s")
		fs, _ := authclient.NewFileStore(dir)
		if err := fs.Save(rec); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, wit+".json")
		if err := os.Chmod(p, 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Load(wit); err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("err %v; want the path named", err)
		}
	})
	t.Run("fail/symlink", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "s")
		fs, _ := authclient.NewFileStore(dir)
		other := filepath.Join(t.TempDir(), "elsewhere.json")
		if err := os.WriteFile(other, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(other, filepath.Join(dir, wit+".json")); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Load(wit); err == nil {
			t.Fatal("a symlinked record loaded")
		}
	})
	t.Run("fail/trailing-data", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "s")
		fs, _ := authclient.NewFileStore(dir)
		if err := fs.Save(rec); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, wit+".json")
		raw, _ := os.ReadFile(p)
		if err := os.WriteFile(p, append(raw, []byte(" {}")...), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Load(wit); err == nil || strings.Contains(err.Error(), "x.y.z") {
			t.Fatalf("err %v; want a refusal without the proof", err)
		}
	})
	t.Run("fail/bad-record-not-saved", func(t *testing.T) {
		fs, _ := authclient.NewFileStore(filepath.Join(t.TempDir(), "s"))
		bad := *rec
		bad.RenewRequestID = bad.ActivateRequestID
		if err := fs.Save(&bad); err == nil {
			t.Fatal("a record with one requestId for both saved")
		}
	})
}
