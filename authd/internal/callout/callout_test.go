package callout

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/bearer/bearertest"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// reader is a static agent credential in the data account (minted for managerd), subscribed
// to channel general.
func (e *env) reader(t *testing.T) *nats.Subscription {
	t.Helper()
	return e.readerOn(t, "general")
}

// readerOn is reader subscribed to one concrete channel (managerd's policy must cover it).
func (e *env) readerOn(t *testing.T, channel string) *nats.Subscription {
	t.Helper()
	manager := dialSigner(t, e.s.Addr, e.s.ClientFor(t, mtls.KindManagerd, testSpace))
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	cred, err := manager.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub,
		Params: &signerv1.ProfileParams{Owner: "reader", Actor: "r", LifecycleUid: uid2, Subscribe: []string{channel}, AllowSubscribe: []string{channel}}})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, nats.UserJWT(func() (string, error) { return cred.GetJwt(), nil }, kp.Sign), nats.CustomInboxPrefix("_INBOX_"+pub))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	read, err := e.names.ChatRead(channel)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync(read)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestCalloutGrant: a bearer from SignBearer for a granted row connects through the responder
// and signerd, lands in the data account as <owner>-<actor> with the principal tags and the
// bearer's expiry, may do what the row grants and nothing else, and is dropped by the broker at
// the bearer's exp.
func TestCalloutGrant(t *testing.T) {
	e := startEnv(t, envOptions{allowed: func(ns *server.Server) []string { return []string{ns.ID()} }})
	sub := e.reader(t)
	r := e.grant(t, row("laptop"))
	tok, exp := e.bearerFor(t, r, 6*time.Second, nil)
	nonce := nonceFor(t, tok)
	c, err := e.connect(t, tok, nonce)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}

	t.Run("ok/lands in the data account as the principal", func(t *testing.T) {
		ci := e.connInfo(t, nonce)
		if ci.Account != e.gs.GetAccountPublicKey() {
			t.Fatalf("account %s, want the data account %s", ci.Account, e.gs.GetAccountPublicKey())
		}
		// The broker takes a callout user's name from its JWT as the authorized user. (It keeps
		// the tags of the JWT the client presented, the sentinel's, in its listings, so the
		// principal tags are checked on what was minted below.)
		if ci.AuthorizedUser != owner+"-laptop" {
			t.Fatalf("authorized user %q, want the JWT name %s-laptop", ci.AuthorizedUser, owner)
		}
		g := e.rec.grant(t, nonce)
		p := g.GetParams()
		if g.GetProfile() != signerv1.Profile_PROFILE_AGENT || p.GetOwner() != owner || p.GetActor() != "laptop" ||
			p.GetLifecycleUid() != uid1 || !slices.Equal(p.GetAllowPublish(), []string{"general"}) ||
			!slices.Equal(p.GetAllowSubscribe(), []string{"general"}) || !slices.Equal(p.GetCapabilities(), []string{"spawn"}) {
			t.Fatalf("grant = %v", g)
		}
		if !g.GetExpiresAt().AsTime().Equal(exp) {
			t.Fatalf("grant expires %v, want the bearer's exp %v", g.GetExpiresAt().AsTime(), exp)
		}
		spec, err := profiles.Build(testSpace, profiles.Agent, profiles.Params{Owner: owner, Actor: "laptop", LifecycleUID: uid1,
			Subscribe: p.GetSubscribe(), AllowSubscribe: p.GetAllowSubscribe(), AllowPublish: p.GetAllowPublish(),
			Capabilities: p.GetCapabilities(), InboxNonce: nonce})
		if err != nil {
			t.Fatal(err)
		}
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc, err := spec.Claims(upub, e.gs.GetAccountPublicKey(), time.Now(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, tag := range []string{"owner:" + owner, "actor:laptop", "principal:" + owner + ".laptop"} {
			if !slices.Contains([]string(uc.Tags), tag) {
				t.Fatalf("the granted params mint tags %v, lacking %s", uc.Tags, tag)
			}
		}
	})
	t.Run("ok/publishes on its channel", func(t *testing.T) {
		subject, _ := e.names.Chat(owner, "laptop", "general")
		if err := c.Publish(subject, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil || m.Subject != subject || string(m.Data) != "hi" {
			t.Fatalf("reader got %v, %v", m, err)
		}
		if _, err := c.SubscribeSync("_INBOX_" + nonce + ".reply"); err != nil {
			t.Fatal(err)
		}
		c.noErrors(t)
	})
	t.Run("fail/publish outside allowPublish", func(t *testing.T) {
		subject, _ := e.names.Chat(owner, "laptop", "team.secret")
		if err := c.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.PublishViolation(subject))
	})
	t.Run("fail/publish as another principal", func(t *testing.T) {
		subject, _ := e.names.Chat(owner2, "laptop", "general")
		if err := c.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.PublishViolation(subject))
	})
	t.Run("ok/dropped at the bearer's exp", func(t *testing.T) {
		select {
		case <-c.closed:
		case <-time.After(15 * time.Second):
			t.Fatal("connection still open long after the bearer expired")
		}
		c.waitError(t, "expired")
	})
	if log := logOf(t); strings.Contains(log, tok) || strings.Contains(log, "eyJ") {
		t.Fatal("the responder logged a bearer or JWT")
	}
}

// TestCalloutChannelPattern: a ledger row holding the channel subtree team.> connects through the
// callout (its pattern reaches the agent grant as written, and signerd grants it because authd's
// policy covers team.>); the broker lets it post on team.x and team.x.y, which a reader receives,
// and read its team.x history subject, and refuses a post on ops.x. A row whose pattern authd's
// policy does not cover (ops.>) is refused by signerd, so its connect is denied.
func TestCalloutChannelPattern(t *testing.T) {
	top := t // the responder logs to the test that started it
	e := startEnv(t, envOptions{})
	sub := e.readerOn(t, "team.x")
	r := row("pat")
	r.AllowSubscribe, r.AllowPublish = []string{"team.>"}, []string{"team.>"}
	e.grant(t, r)
	tok, _ := e.bearerFor(t, r, time.Minute, nil)
	nonce := nonceFor(t, tok)
	c, err := e.connect(t, tok, nonce)
	if err != nil {
		t.Fatalf("connect with a team.> row: %v", err)
	}
	if p := e.rec.grant(t, nonce).GetParams(); !slices.Equal(p.GetAllowPublish(), []string{"team.>"}) ||
		!slices.Equal(p.GetAllowSubscribe(), []string{"team.>"}) || !slices.Equal(p.GetSubscribe(), []string{"team.>"}) {
		t.Fatalf("grant params %v, want the row's team.> pattern", p)
	}
	t.Run("ok/publishes on team.x", func(t *testing.T) {
		subject, _ := e.names.Chat(owner, "pat", "team.x")
		if err := c.Publish(subject, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil || m.Subject != subject || string(m.Data) != "hi" {
			t.Fatalf("reader got %v, %v", m, err)
		}
		c.noErrors(t)
	})
	t.Run("ok/publishes and reads deeper in the subtree", func(t *testing.T) {
		read, _ := e.names.ChatRead("team.x.y")
		own, err := c.SubscribeSync(read)
		if err != nil {
			t.Fatal(err)
		}
		subject, _ := e.names.Chat(owner, "pat", "team.x.y")
		if err := c.Publish(subject, []byte("deep")); err != nil {
			t.Fatal(err)
		}
		m, err := own.NextMsg(5 * time.Second)
		if err != nil || m.Subject != subject || string(m.Data) != "deep" {
			t.Fatalf("own subscription got %v, %v", m, err)
		}
		c.noErrors(t)
	})
	t.Run("fail/publish on ops.x", func(t *testing.T) {
		subject, _ := e.names.Chat(owner, "pat", "ops.x")
		if err := c.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.PublishViolation(subject))
	})
	t.Run("fail/pattern outside authd's policy", func(t *testing.T) {
		r := row("wide")
		r.AllowSubscribe, r.AllowPublish = []string{"general"}, []string{"ops.>"}
		e.grant(t, r)
		tok, _ := e.bearerFor(t, r, time.Minute, nil)
		c, err := e.connect(t, tok, nonceFor(t, tok))
		wantDenied(t, c, err)
		if log := logOf(top); !strings.Contains(log, "signerd refused the grant") || !strings.Contains(log, "wide") {
			t.Fatalf("the denial was not signerd refusing the ops.> grant; log:\n%s", log)
		}
	})
}

// TestCalloutDenials: every ledger, view and request-shape refusal denies the connect.
func TestCalloutDenials(t *testing.T) {
	e := startEnv(t, envOptions{})
	e.grant(t, row("laptop"))
	admin := row("root")
	admin.Scope = []string{"admin", "spawn"}
	e.grant(t, admin)
	long := 10 * time.Minute

	// A row in both spaces, as only tampering leaves it (the writers refuse it).
	both := e.grant(t, row("twin"))
	both.Ver, both.TokenHash = ledger.Version, ledger.HashActorToken("x")
	data, err := json.Marshal(both)
	if err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(e.ledger.Dir(), string(ledger.Managed))
	if err := os.MkdirAll(mdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, owner+".twin.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}

	tampered := func() string {
		tok, _ := e.bearerFor(t, row("laptop"), long, nil)
		p := strings.Split(tok, ".")
		payload, _ := base64.RawURLEncoding.DecodeString(p[1])
		payload = []byte(strings.Replace(string(payload), `"spawn"`, `"admin"`, 2))
		return p[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + p[2]
	}()
	for _, tc := range []struct {
		name  string
		token string
		nonce string
	}{
		{"fail/no row", tokenOf(e.bearerFor(t, row("ghost"), long, nil)), ""},
		{"fail/scope widening", tokenOf(e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) { r.Scope = []string{"spawn", "run"} })), ""},
		{"fail/uid mismatch", tokenOf(e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) { r.LifecycleUid = uid2 })), ""},
		{"fail/no uid", tokenOf(e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) { r.LifecycleUid = "" })), ""},
		{"fail/row in both spaces", tokenOf(e.bearerFor(t, row("twin"), long, nil)), ""},
		{"fail/no token", "", ""},
		{"fail/not a bearer", "opaque-token", ""},
		{"fail/tampered bearer", tampered, ""},
		{"fail/nonce too short", tokenOf(e.bearerFor(t, row("laptop"), long, nil)), "short"},
		{"fail/nonce with dot", tokenOf(e.bearerFor(t, row("laptop"), long, nil)), "abcdefgh.>"},
		{"fail/view without a profile", tokenOf(e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) { r.View = "deployer" })), ""},
		{"fail/admin view without admin scope", tokenOf(e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) { r.View = "admin" })), ""},
		{"fail/bearer of another space's issuer", tokenOf(startEnvSigner(t).bearerFor(t, row("laptop"), long, nil)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nonce := tc.nonce
			if nonce == "" {
				nonce = nonceFor(t, tc.token)
			}
			c, err := e.connectInbox(t, tc.token, nonce, "_INBOX_probe0001")
			wantDenied(t, c, err)
		})
	}

	// The exchange issues manager-caller bound to one instance (issue 23); the view has no
	// profile, so signerd's bearer verifies and the connect is still denied, for that reason.
	parent := t
	t.Run("fail/manager-caller bound to an instance: no profile", func(t *testing.T) {
		tok, _ := e.bearerFor(t, row("laptop"), long, func(r *signerv1.SignBearerRequest) {
			r.View, r.ManagerInstanceId = "manager-caller", strings.Repeat("b", 26)
		})
		before := strings.Count(logOf(parent), refuseViewProfile)
		c, err := e.connectInbox(t, tok, nonceFor(t, tok), "_INBOX_probe0001")
		wantDenied(t, c, err)
		if after := strings.Count(logOf(parent), refuseViewProfile); after != before+1 {
			t.Fatalf("log shows %d new %q refusals, want 1", after-before, refuseViewProfile)
		}
	})

	t.Run("ok/admin view with admin scope", func(t *testing.T) {
		tok, _ := e.bearerFor(t, admin, long, func(r *signerv1.SignBearerRequest) { r.View, r.Scope = "admin", []string{"admin"} })
		nonce := nonceFor(t, tok)
		c, err := e.connect(t, tok, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SubscribeSync(e.names.InstAll()); err != nil {
			t.Fatal(err)
		}
		c.noErrors(t)
		subject, _ := e.names.Chat(owner, "root", "general")
		if err := c.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.PublishViolation(subject))
		if g := e.rec.grant(t, nonce); g.GetProfile() != signerv1.Profile_PROFILE_ADMIN || g.GetParams().GetOwner() != owner || g.GetParams().GetActor() != "root" {
			t.Fatalf("grant = %v", g)
		}
		if ci := e.connInfo(t, nonce); ci.AuthorizedUser != owner+"-root" {
			t.Fatalf("authorized user %q", ci.AuthorizedUser)
		}
	})

	t.Run("fail/revoked row, next connect, no restart", func(t *testing.T) {
		r := e.grant(t, row("revokee"))
		tok, _ := e.bearerFor(t, r, long, nil)
		c, err := e.connect(t, tok, nonceFor(t, tok))
		if err != nil {
			t.Fatalf("before revoke: %v", err)
		}
		c.Close()
		if err := e.ledger.Revoke(ledger.Interactive, owner, "revokee"); err != nil {
			t.Fatal(err)
		}
		c, err = e.connect(t, tok, nonceFor(t, tok))
		wantDenied(t, c, err)
	})

	t.Run("fail/narrowed row, next connect", func(t *testing.T) {
		r := e.grant(t, row("narrowed"))
		tok, _ := e.bearerFor(t, r, long, nil)
		r.Scope = []string{}
		e.grant(t, r)
		c, err := e.connect(t, tok, nonceFor(t, tok))
		wantDenied(t, c, err)
	})
}

func tokenOf(tok string, _ time.Time) string { return tok }

// TestCalloutBearerMatrix: every hand-signed bearer the verifier refuses (one per check of §3
// steps 9-12, signed with a test key the responder's JWKS holds) is denied at connect; the
// accepted shapes without a view connect, those with a view that has no profile are denied.
func TestCalloutBearerMatrix(t *testing.T) {
	k := bearertest.NewKey(t)
	e := startEnv(t, envOptions{jwks: bearertest.NewJWKS(k.JWK)})
	e.grant(t, row("laptop"))
	p := bearertest.Principal{Space: testSpace, Owner: owner, Owner2: owner2, Actor: "laptop", UID: uid1}
	p.Now = time.Now()
	parent := t
	for i, tc := range bearertest.Cases(t, k, p) {
		if tc.Boundary {
			continue // the responder reads the wall clock
		}
		t.Run(tc.Name, func(t *testing.T) {
			// Signed now: the time checks have 5 s of tolerance, which a slow run would eat.
			p.Now = time.Now()
			tc := bearertest.Cases(t, k, p)[i]
			admitted := tc.Want == "" && !strings.Contains(tc.Name, "-caller") && !strings.Contains(tc.Name, "transfer-writer")
			// The refusal is logged with the check that failed (a signed refusal is published
			// after its log line, so the line is there once the connect has failed).
			marker := "check=" + string(tc.Want) + " "
			// A typ other than JWT never reaches the user arm: the dispatch refuses it (check=typ),
			// or the service arm's validator does (a user payload under the access typ).
			if typ, err := serviceaccess.TypOf(tc.Token); err == nil && typ != serviceaccess.TypUser {
				marker = "check=" + checkTyp + " "
				if typ == serviceaccess.TypAccess {
					marker = "check=" + serviceaccess.CheckPayload + " "
				}
			}
			before := strings.Count(logOf(parent), marker)
			c, err := e.connect(t, tc.Token, nonceFor(t, tc.Token))
			if tc.Want != "" {
				defer func() {
					if after := strings.Count(logOf(parent), marker); after != before+1 {
						t.Errorf("log shows %d new refusals by %s, want 1", after-before, tc.Want)
					}
				}()
			}
			if admitted {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				c.Close()
				return
			}
			wantDenied(t, c, err)
		})
	}
	if log := logOf(t); strings.Contains(log, "eyJ") {
		t.Fatal("the responder logged a bearer")
	}
}

// startEnvSigner is a second signerd (another issuer key for the same space name) whose bearers
// the env's responder must refuse.
func startEnvSigner(t *testing.T) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Policy: testPolicy})
	return &env{s: s, authd: dialSigner(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, testSpace))}
}

// forger plays a NATS server (its own server key and xkey, sealing its own requests to the
// space's xkey) and delivers the requests to a second responder, configured like the env's,
// serving a test subject on a plain broker: nats-server refuses every publish on the callout
// subject in the AUTH account, so no client can put a crafted request there.
type forger struct {
	nc      *nats.Conn
	kp, xkp nkeys.KeyPair
	id, xk  string
}

const craftedSubject = "crafted.auth"

func newForger(t *testing.T, e *env, allowed []string) *forger {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("plain broker not ready")
	}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, AllowedServers: allowed, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	if err := r.startOn(ctxT(t), svc, craftedSubject); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f := &forger{nc: nc}
	f.kp, _ = nkeys.CreateServer()
	f.xkp, _ = nkeys.CreateCurveKeys()
	f.id, _ = f.kp.PublicKey()
	f.xk, _ = f.xkp.PublicKey()
	return f
}

// request is an authorization request as nats-server builds it, signed by signer.
func (f *forger) request(t *testing.T, e *env, signer nkeys.KeyPair, edit func(*jwt.AuthorizationRequestClaims)) string {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	ac := jwt.NewAuthorizationRequestClaims(e.gs.GetCalloutAccountPublicKey())
	ac.Audience = "nats-authorization-request"
	ac.UserNkey = pub
	ac.Server = jwt.ServerID{Name: "forged", Host: "127.0.0.1", ID: f.id, XKey: f.xk}
	ac.ConnectOptions = jwt.ConnectOptions{JWT: e.gs.GetSentinelJwt(), Token: "opaque", Name: newNonce(), Protocol: 1}
	ac.Expires = time.Now().Add(5 * time.Second).Unix()
	if edit != nil {
		edit(ac)
	}
	tok, err := ac.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f *forger) seal(t *testing.T, e *env, xkp nkeys.KeyPair, data string) []byte {
	t.Helper()
	out, err := xkp.Seal([]byte(data), e.gs.GetXkeyPublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ask publishes data on the callout subject with the xkey header (none if "") and reports
// whether any reply came within wait.
func (f *forger) ask(t *testing.T, data []byte, xkey string, wait time.Duration) bool {
	t.Helper()
	m := nats.NewMsg(craftedSubject)
	m.Data = data
	if xkey != "" {
		m.Header.Set(XKeyHeader, xkey)
	}
	_, err := f.nc.RequestMsg(m, wait)
	switch {
	case err == nil:
		return true
	case errors.Is(err, nats.ErrTimeout):
		return false
	default:
		t.Fatalf("request: %v", err)
		return false
	}
}

// TestCalloutCraftedRequests: requests that are not a real server's get no reply at all. A
// request a forged server signed consistently is answered by a responder without an allow-list
// (the control that shows silence is the responder's doing), and not by one whose allow-list
// names only the real broker, which still admits real clients.
func TestCalloutCraftedRequests(t *testing.T) {
	const wait = 1500 * time.Millisecond
	t.Run("no allow-list", func(t *testing.T) {
		e := startEnv(t, envOptions{})
		f := newForger(t, e, nil)
		other, _ := nkeys.CreateServer()
		otherX, _ := nkeys.CreateCurveKeys()
		otherXPub, _ := otherX.PublicKey()
		for _, tc := range []struct {
			name  string
			data  []byte
			xkey  string
			reply bool
		}{
			{"ok/consistent forged request is answered (control)", f.seal(t, e, f.xkp, f.request(t, e, f.kp, nil)), f.xk, true},
			{"fail/unsealed", []byte(f.request(t, e, f.kp, nil)), f.xk, false},
			{"fail/no xkey header", f.seal(t, e, f.xkp, f.request(t, e, f.kp, nil)), "", false},
			{"fail/wrong xkey header", f.seal(t, e, f.xkp, f.request(t, e, f.kp, nil)), otherXPub, false},
			{"fail/iss is not the server id", f.seal(t, e, otherX, f.request(t, e, other, func(ac *jwt.AuthorizationRequestClaims) { ac.Server.XKey = otherXPub })), otherXPub, false},
			{"fail/server xkey claim differs from header", f.seal(t, e, f.xkp, f.request(t, e, f.kp, func(ac *jwt.AuthorizationRequestClaims) { ac.Server.XKey = otherXPub })), f.xk, false},
			{"fail/garbage", []byte("not a sealed request at all"), f.xk, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if got := f.ask(t, tc.data, tc.xkey, wait); got != tc.reply {
					t.Fatalf("reply = %v, want %v", got, tc.reply)
				}
			})
		}
	})
	t.Run("allow-list of the real broker", func(t *testing.T) {
		e := startEnv(t, envOptions{allowed: func(ns *server.Server) []string { return []string{ns.ID()} }})
		f := newForger(t, e, []string{e.ns.ID()})
		t.Run("fail/server not on the allow-list", func(t *testing.T) {
			if f.ask(t, f.seal(t, e, f.xkp, f.request(t, e, f.kp, nil)), f.xk, wait) {
				t.Fatal("a forged server's request was answered")
			}
		})
		t.Run("ok/real broker still admits", func(t *testing.T) {
			r := e.grant(t, row("laptop"))
			tok, _ := e.bearerFor(t, r, time.Minute, nil)
			if _, err := e.connect(t, tok, nonceFor(t, tok)); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// TestCalloutSignerdUnreachable: with signerd unreachable the responder signs nothing, so
// connects are denied; it keeps serving and admits again once signerd is back.
func TestCalloutSignerdUnreachable(t *testing.T) {
	e := startEnv(t, envOptions{})
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	if _, err := e.connect(t, tok, nonceFor(t, tok)); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	e.proxy.cut()
	nonce := nonceFor(t, tok)
	c, err := e.connect(t, tok, nonce)
	wantDenied(t, c, err)
	if got, want := testkit.ClosedReason(t, e.ns, nonce), server.AuthenticationViolation.String(); got != want {
		t.Fatalf("the broker closed the refused connection for %q, want %q", got, want)
	}
	if !strings.Contains(logOf(t), "signerd unreachable") {
		t.Fatal("the responder did not log that signerd is unreachable")
	}
	e.proxy.restore(t)
	testkit.Eventually(t, 40*time.Second, func() error {
		c, err := e.connect(t, tok, nonceFor(t, tok))
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestCalloutConcurrent: many clients connecting at once are all admitted through a small
// in-flight bound.
func TestCalloutConcurrent(t *testing.T) {
	e := startEnv(t, envOptions{maxInFlight: 3})
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := e.connect(t, tok, nonceFor(t, tok))
			if err != nil {
				errs <- err
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestNewRefuses(t *testing.T) {
	e := startEnv(t, envOptions{})
	base := func() Config {
		return Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: nil}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"fail/no jwks", func(*Config) {}},
		{"fail/no signer", func(c *Config) { c.Signer = nil }},
		{"fail/bad space", func(c *Config) { c.Space = "" }},
		{"fail/allow-list entry not a server key", func(c *Config) { c.AllowedServers = []string{"Nnot-a-key"} }},
		{"fail/negative bound", func(c *Config) { c.MaxInFlight = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			if _, err := New(c); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
	t.Run("fail/second start", func(t *testing.T) {
		if err := e.r.Start(ctxT(t), e.svc); err == nil {
			t.Fatal("second Start accepted")
		}
	})
}

// gate holds every OpenCalloutRequest until released and counts how many are held at once.
type gate struct {
	Signer
	release       chan struct{}
	held, maxHeld atomic.Int64
}

func (g *gate) OpenCalloutRequest(ctx context.Context, in *signerv1.OpenCalloutRequestRequest, opts ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	n := g.held.Add(1)
	for {
		m := g.maxHeld.Load()
		if n <= m || g.maxHeld.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	g.held.Add(-1)
	return g.Signer.OpenCalloutRequest(context.WithoutCancel(ctx), in, opts...)
}

// TestCalloutInFlightBound: with MaxInFlight 3 and ten clients connecting at once, exactly
// three requests reach signerd while the rest wait.
func TestCalloutInFlightBound(t *testing.T) {
	e := startEnv(t, envOptions{noResponder: true})
	r := e.grant(t, row("laptop"))
	tok, _ := e.bearerFor(t, r, 10*time.Minute, nil)
	g := &gate{Signer: e.authd.API(), release: make(chan struct{})}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, MaxInFlight: 3, signer: g})
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Start(ctxT(t), e.svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp.Close)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := e.connect(t, tok, nonceFor(t, tok)); err == nil {
				c.Close()
			}
		}()
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := g.held.Load(); n != 3 {
			return fmt.Errorf("%d requests held, want 3", n)
		}
		return nil
	})
	if m := g.maxHeld.Load(); m != 3 {
		t.Fatalf("%d requests were in flight at once, bound 3", m)
	}
	close(g.release)
	wg.Wait()
	if m := g.maxHeld.Load(); m > 3 {
		t.Fatalf("%d requests were in flight at once, bound 3", m)
	}
}
