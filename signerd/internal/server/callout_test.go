package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// Bearer tokens the test responder (standing in for authd) judges.
const (
	goodToken   = "good-token"
	replayToken = "replay-token"
	refusalText = "bearer refused"
)

// agentGrant is the grant authd makes for a good bearer: agent o1.a1 on channel general.
func agentGrant(expires time.Time) *signerv1.CalloutGrant {
	return &signerv1.CalloutGrant{
		Profile: signerv1.Profile_PROFILE_AGENT,
		Params: &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid,
			AllowPublish: []string{"general"}, AllowSubscribe: []string{"general"}, Subscribe: []string{"general"}},
		ExpiresAt: timestamppb.New(expires),
	}
}

// newNonce returns a fresh inbox nonce bound to o1.a1, the principal agentGrant names.
func newNonce() string { return boundNonce("o1", "a1") }

// boundNonce returns a fresh inbox nonce bound to owner.actor.
func boundNonce(owner, actor string) string {
	n, err := space.BoundInboxNonce(owner, actor, rand.Text())
	if err != nil {
		panic(err)
	}
	return n
}

// calloutUser mints authd's callout-service credential for the key `signerd init` registered
// and returns it with the key pair that signs the broker's nonce.
func calloutUser(t *testing.T, s *signerdtest.Signer, authd signerv1.SignerServiceClient) (string, nkeys.KeyPair) {
	t.Helper()
	seed, err := creds.ReadSeedFile(filepath.Join(s.Dir, "authd", space.Segment("alpha"), "callout.nk"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Wipe()
	kp, err := seed.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, _ := kp.PublicKey()
	resp, err := authd.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT, UserPublicKey: pub})
	if err != nil {
		t.Fatalf("mint callout user: %v", err)
	}
	return resp.GetCredential().GetJwt(), kp
}

// captured is one request the responder saw, with what signerd said about it.
type captured struct {
	sealed   []byte
	xkey     string
	opened   *signerv1.OpenCalloutRequestResponse
	answered *signerv1.SignCalloutResponseResponse
	// answeredFor is the user nkey of the request the answer was signed for (differs from
	// opened's for a replay).
	answeredFor string
}

// responder is authd's callout loop, driven through signerd over mTLS: open the request, grant
// a good bearer, answer a replay bearer with the first good request, refuse anything else.
type responder struct {
	authd signerv1.SignerServiceClient

	mu   sync.Mutex
	errs []error
	seen []*captured
}

func (r *responder) handle(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c := &captured{sealed: m.Data, xkey: m.Header.Get(server.AuthRequestXKeyHeader)}
	opened, err := r.authd.OpenCalloutRequest(ctx, &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: c.sealed, ServerXkey: c.xkey})
	if err != nil {
		r.fail(err)
		return
	}
	c.opened, c.answeredFor = opened, opened.GetUserNkey()
	req := &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: c.sealed, ServerXkey: c.xkey}
	switch opened.GetAuthToken() {
	case goodToken:
		req.Decision = &signerv1.SignCalloutResponseRequest_Grant{Grant: agentGrant(time.Now().Add(10 * time.Minute))}
	case replayToken:
		first := r.firstGood()
		if first == nil {
			r.fail(errors.New("replay before any good request"))
			return
		}
		req.SealedRequest, req.ServerXkey, c.answeredFor = first.sealed, first.xkey, first.opened.GetUserNkey()
		req.Decision = &signerv1.SignCalloutResponseRequest_Grant{Grant: agentGrant(time.Now().Add(10 * time.Minute))}
	default:
		req.Decision = &signerv1.SignCalloutResponseRequest_Error{Error: refusalText}
	}
	answered, err := r.authd.SignCalloutResponse(ctx, req)
	if err != nil {
		r.fail(err)
		return
	}
	c.answered = answered
	r.mu.Lock()
	r.seen = append(r.seen, c)
	r.mu.Unlock()
	if err := m.Respond(answered.GetSealedResponse()); err != nil {
		r.fail(err)
	}
}

func (r *responder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *responder) firstGood() *captured {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.seen {
		if c.opened.GetAuthToken() == goodToken {
			return c
		}
	}
	return nil
}

// last returns what the responder saw for the connection named nonce.
func (r *responder) last(t *testing.T, nonce string) *captured {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) != 0 {
		t.Fatalf("responder errors: %v", r.errs)
	}
	for i := len(r.seen) - 1; i >= 0; i-- {
		if r.seen[i].opened.GetConnectionName() == nonce {
			return r.seen[i]
		}
	}
	t.Fatalf("responder saw no request from connection %s", nonce)
	return nil
}

// connectSentinel connects as upstream clients do: the sentinel JWT (a bearer credential, so any
// key signs the nonce), the Cotal bearer as auth_token, and the inbox nonce as connection name
// and inbox prefix. A refusal the client lost to the broker's RTT PING (a callout nobody
// answers) is read from the broker's record (testkit.RefusedOnRecord).
func connectSentinel(t *testing.T, ns *server.Server, sentinel, token, nonce string) (*brokerConn, error) {
	t.Helper()
	kp, _ := newUser(t)
	bc := &brokerConn{}
	nc, err := nats.Connect(ns.ClientURL(),
		nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
		nats.Token(token), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce),
		nats.NoReconnect(), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			bc.mu.Lock()
			defer bc.mu.Unlock()
			bc.errs = append(bc.errs, err)
		}))
	if err != nil {
		return nil, testkit.RefusedOnRecord(t, ns, nonce, err)
	}
	t.Cleanup(nc.Close)
	bc.Conn = nc
	return bc, nil
}

// wantAuthViolation asserts a connect failed because the broker refused the authorization.
func wantAuthViolation(t *testing.T, bc *brokerConn, err error) {
	t.Helper()
	if err == nil {
		bc.Close()
		t.Fatal("connect succeeded; want an authorization violation")
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("connect error = %v, want an authorization violation", err)
	}
}

// TestCalloutOnBroker runs the whole callout through signerd on a real broker: the broker seals
// each request to the space's xkey, the responder (authd's role) has signerd open it and sign
// the answer, and the broker places the client by that answer.
func TestCalloutOnBroker(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	ns := s.StartBrokerServer(t)
	url := ns.ClientURL()
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	names, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}

	calloutJWT, calloutKP := calloutUser(t, s, authd)
	svc, err := nats.Connect(url, nats.UserJWT(func() (string, error) { return calloutJWT, nil }, calloutKP.Sign),
		nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("callout user: %v", err)
	}
	t.Cleanup(svc.Close)
	r := &responder{authd: authd}
	if _, err := svc.QueueSubscribe(space.AuthCalloutSubject, "cotal-auth-callout", r.handle); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}

	// A reader minted on the static path, in the data account.
	manager := dialAs(t, s, signerdtest.ID("managerd", "alpha"))
	readerKP, readerPub := newUser(t)
	rm, err := manager.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: readerPub,
		Params: &signerv1.ProfileParams{Owner: "o2", Actor: "a2", LifecycleUid: uid, AllowSubscribe: []string{"general"}, Subscribe: []string{"general"}}})
	if err != nil {
		t.Fatal(err)
	}
	reader := connectBroker(t, url, rm.GetCredential(), readerKP)

	goodNonce := newNonce()
	var agent *brokerConn
	parent := t

	t.Run("ok/granted-agent", func(t *testing.T) {
		// Connected for the parent test: the next case uses the same connection.
		agent, err = connectSentinel(parent, ns, gs.GetSentinelJwt(), goodToken, goodNonce)
		if err != nil {
			t.Fatalf("granted connect: %v", err)
		}
		seen := r.last(t, goodNonce)
		if seen.opened.GetClientJwt() != gs.GetSentinelJwt() || seen.opened.GetAuthToken() != goodToken ||
			seen.opened.GetServerXkey() != seen.xkey || !strings.HasPrefix(seen.opened.GetServerId(), "N") {
			t.Fatalf("opened request = {jwt sentinel %v, token %v, server_xkey %s, server_id %s}; header xkey %s",
				seen.opened.GetClientJwt() == gs.GetSentinelJwt(), seen.opened.GetAuthToken() == goodToken,
				seen.opened.GetServerXkey(), seen.opened.GetServerId(), seen.xkey)
		}
		if seen.answered.GetUserJti() == "" {
			t.Fatal("grant answered without a user jti")
		}

		read, err := names.ChatRead("general")
		if err != nil {
			t.Fatal(err)
		}
		sub, err := reader.SubscribeSync(read)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := reader.Flush(); err != nil {
			t.Fatal(err)
		}
		subject, err := names.Chat("o1", "a1", "general")
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.Publish(subject, []byte("hello via callout")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("the data-account reader got nothing on %s: %v", subject, err)
		}
		if m.Subject != subject || string(m.Data) != "hello via callout" {
			t.Fatalf("got %q on %s", m.Data, m.Subject)
		}
		// The inbox row is keyed on the nonce the client chose.
		if _, err := agent.SubscribeSync("_INBOX_" + goodNonce + ".probe"); err != nil {
			t.Fatal(err)
		}
		agent.noViolations(t)
		reader.noViolations(t)
	})

	t.Run("fail/granted-agent-publishes-as-other-principal", func(t *testing.T) {
		if agent == nil {
			t.Skip("no granted connection")
		}
		subject, err := names.Chat("o2", "a2", "general")
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.Publish(subject, []byte("impersonation")); err != nil {
			t.Fatal(err)
		}
		agent.waitViolation(t, testkit.PublishViolation(subject))
	})

	t.Run("fail/refused-token", func(t *testing.T) {
		nonce := newNonce()
		bc, err := connectSentinel(t, ns, gs.GetSentinelJwt(), "bad-token", nonce)
		wantAuthViolation(t, bc, err)
		seen := r.last(t, nonce)
		if seen.answered.GetUserJti() != "" || len(seen.answered.GetSealedResponse()) == 0 {
			t.Fatalf("refusal answered with jti %q and %d sealed bytes", seen.answered.GetUserJti(), len(seen.answered.GetSealedResponse()))
		}
	})

	t.Run("ok/response-bound-to-request", func(t *testing.T) {
		// The responder answers this connection with the sealed request of the granted one.
		// signerd signs it, but for that request's user nkey, so the broker refuses it.
		nonce := newNonce()
		bc, err := connectSentinel(t, ns, gs.GetSentinelJwt(), replayToken, nonce)
		wantAuthViolation(t, bc, err)
		seen := r.last(t, nonce)
		first := r.last(t, goodNonce)
		if seen.answered.GetUserJti() == "" {
			t.Fatal("signerd did not sign the replayed request")
		}
		if seen.answeredFor != first.opened.GetUserNkey() || seen.answeredFor == seen.opened.GetUserNkey() {
			t.Fatalf("answer signed for %s; this connection's nkey %s, the replayed request's %s",
				seen.answeredFor, seen.opened.GetUserNkey(), first.opened.GetUserNkey())
		}
	})

	// Issue 20 item 1: a client names another credential's inbox as its connection name. signerd
	// signs no grant for it (the responder's call fails, so nothing is answered) and the broker
	// refuses the connect; nobody gets the inbox. After the replay case: each of these waits out
	// the broker's callout timeout (2 s), and the replayed request must still be within signerd's
	// 5 s past its exp.
	for _, tc := range []struct{ name, nonce string }{
		{"fail/connection-name-is-a-minted-user-key", readerPub},
		{"fail/connection-name-is-another-principals-nonce", boundNonce("o2", "a2")},
		{"fail/connection-name-unbound", "n_" + rand.Text()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bc, err := connectSentinel(t, ns, gs.GetSentinelJwt(), goodToken, tc.nonce)
			wantAuthViolation(t, bc, err)
			// Taken, so the later cases' check for responder errors sees only theirs.
			r.mu.Lock()
			errs := slices.Clone(r.errs)
			r.errs = nil
			r.mu.Unlock()
			if len(errs) == 0 || status.Code(errs[len(errs)-1]) != codes.InvalidArgument ||
				!strings.Contains(errs[len(errs)-1].Error(), "bound to the granted principal") {
				t.Fatalf("responder errors %v; want signerd's InvalidArgument on the connection name", errs)
			}
		})
	}

	t.Run("ok/audit-holds-no-token", func(t *testing.T) {
		verifyAudit(t, s.AuditPath)
		wantNoSecretsInAudit(t, s.AuditPath)
		first := r.last(t, goodNonce)
		var grants, refusals, takeovers int
		for _, rec := range auditRecords(t, s.AuditPath) {
			switch {
			case rec.RPC == "SignCalloutResponse" && rec.Decision == audit.Denied:
				// The three connection names that named another inbox.
				takeovers++
				auditWant{caller: signerdtest.ID("authd", "alpha"), rpc: "SignCalloutResponse", space: "alpha", profile: "agent", decision: audit.Denied, reason: "invalid-argument"}.check(t, rec)
			case rec.RPC == "SignCalloutResponse" && rec.Reason == "callout-refusal":
				refusals++
				if rec.Decision != audit.Granted || rec.Profile != "" || rec.JTI != "" || !nkeys.IsValidPublicUserKey(rec.Subject) {
					t.Fatalf("refusal audit line = %+v", rec)
				}
			case rec.RPC == "SignCalloutResponse":
				// The grant and the replay: both signed for the granted connection's nkey.
				grants++
				auditWant{caller: signerdtest.ID("authd", "alpha"), rpc: "SignCalloutResponse", space: "alpha", profile: "agent", decision: audit.Granted}.check(t, rec)
				if rec.Subject != first.opened.GetUserNkey() {
					t.Fatalf("grant audited for subject %s, want %s", rec.Subject, first.opened.GetUserNkey())
				}
			case rec.RPC == "OpenCalloutRequest" && (rec.Decision != audit.Granted || !nkeys.IsValidPublicUserKey(rec.Subject)):
				t.Fatalf("open audit line = %+v", rec)
			}
		}
		if grants != 2 || refusals != 1 || takeovers != 3 {
			t.Fatalf("audit has %d grants, %d refusals and %d denied grants, want 2 (grant and replay), 1 and 3", grants, refusals, takeovers)
		}
	})
}

// wantNoSecretsInAudit asserts the audit file holds no bearer token or refusal text.
func wantNoSecretsInAudit(t *testing.T, path string) {
	t.Helper()
	data := readAll(t, path)
	for _, bad := range []string{"eyJ", goodToken, replayToken, refusalText} {
		if bytes.Contains(data, []byte(bad)) {
			t.Fatalf("audit file contains %q", bad)
		}
	}
}

// forgedServer plays a NATS server: its own server nkey and xkey, sealing requests to the
// space's xkey and opening the answers.
type forgedServer struct {
	kp, xkp  nkeys.KeyPair
	id, xkey string
}

func newForgedServer(t *testing.T) *forgedServer {
	t.Helper()
	kp, err := nkeys.CreateServer()
	if err != nil {
		t.Fatal(err)
	}
	xkp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	t.Cleanup(xkp.Wipe)
	f := &forgedServer{kp: kp, xkp: xkp}
	f.id, _ = kp.PublicKey()
	f.xkey, _ = xkp.PublicKey()
	return f
}

// token builds an authorization request as nats-server does, edits it, and signs it.
func (f *forgedServer) token(t *testing.T, gs *signerv1.GetSpaceResponse, nonce string, edit func(*jwt.AuthorizationRequestClaims)) (string, string) {
	t.Helper()
	_, userPub := newUser(t)
	ac := jwt.NewAuthorizationRequestClaims(gs.GetCalloutAccountPublicKey())
	ac.Audience = server.AuthRequestSubject
	ac.UserNkey = userPub
	ac.Server = jwt.ServerID{Name: "forged", Host: "127.0.0.1", ID: f.id, XKey: f.xkey}
	ac.ClientInformation = jwt.ClientInformation{Host: "127.0.0.1", ID: 7, Name: nonce}
	ac.ConnectOptions = jwt.ConnectOptions{JWT: gs.GetSentinelJwt(), Token: goodToken, Name: nonce, Protocol: 1}
	ac.Expires = time.Now().Add(2 * time.Second).Unix()
	if edit != nil {
		edit(ac)
	}
	tok, err := ac.Encode(f.kp)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ac.UserNkey
}

// seal seals data from this server to the space's xkey.
func (f *forgedServer) seal(t *testing.T, gs *signerv1.GetSpaceResponse, data string) []byte {
	t.Helper()
	out, err := f.xkp.Seal([]byte(data), gs.GetXkeyPublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// request returns a sealed request and its user nkey.
func (f *forgedServer) request(t *testing.T, gs *signerv1.GetSpaceResponse, nonce string, edit func(*jwt.AuthorizationRequestClaims)) ([]byte, string) {
	t.Helper()
	tok, user := f.token(t, gs, nonce, edit)
	return f.seal(t, gs, tok), user
}

// openResponse opens and decodes an answer sealed to this server.
func (f *forgedServer) openResponse(t *testing.T, gs *signerv1.GetSpaceResponse, sealed []byte) *jwt.AuthorizationResponseClaims {
	t.Helper()
	if bytes.HasPrefix(sealed, []byte("eyJ")) {
		t.Fatal("response is not sealed")
	}
	data, err := f.xkp.Open(sealed, gs.GetXkeyPublicKey())
	if err != nil {
		t.Fatalf("open response: %v", err)
	}
	rc, err := jwt.DecodeAuthorizationResponseClaims(string(data))
	if err != nil {
		t.Fatalf("decode response: %v", err)
	}
	return rc
}

func TestOpenCalloutRequest(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	srv, other := newForgedServer(t), newForgedServer(t)
	nonce := newNonce()

	t.Run("ok/opens-and-returns-claims", func(t *testing.T) {
		sealed, user := srv.request(t, gs, nonce, nil)
		resp, err := authd.OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey})
		if err != nil {
			t.Fatal(err)
		}
		want := &signerv1.OpenCalloutRequestResponse{UserNkey: user, ServerId: srv.id, ServerName: "forged", ServerXkey: srv.xkey,
			AuthToken: goodToken, ConnectionName: nonce, ClientHost: "127.0.0.1", ClientJwt: gs.GetSentinelJwt()}
		got := &signerv1.OpenCalloutRequestResponse{UserNkey: resp.GetUserNkey(), ServerId: resp.GetServerId(), ServerName: resp.GetServerName(),
			ServerXkey: resp.GetServerXkey(), AuthToken: resp.GetAuthToken(), ConnectionName: resp.GetConnectionName(),
			ClientHost: resp.GetClientHost(), ClientJwt: resp.GetClientJwt()}
		if got.String() != want.String() {
			t.Fatalf("opened = %v\nwant %v", got, want)
		}
		var claims jwt.AuthorizationRequestClaims
		if err := json.Unmarshal(resp.GetRequestClaimsJson(), &claims); err != nil {
			t.Fatal(err)
		}
		if claims.UserNkey != user || claims.Issuer != srv.id || claims.ClientInformation.ID != 7 {
			t.Fatalf("claims JSON = {user_nkey %s, iss %s, client id %d}", claims.UserNkey, claims.Issuer, claims.ClientInformation.ID)
		}
	})

	tok, _ := srv.token(t, gs, nonce, nil)
	// Another request's claims under this request's signature.
	tokB, _ := srv.token(t, gs, nonce, nil)
	tampered := tokB[:strings.LastIndexByte(tokB, '.')] + tok[strings.LastIndexByte(tok, '.'):]
	for _, tc := range []struct {
		name   string
		sealed []byte
		xkey   string
	}{
		{"fail/open-unsealed", []byte(tok), srv.xkey},
		{"fail/open-garbage", []byte("xkv1 certainly not a sealed box, but long enough to try"), srv.xkey},
		{"fail/open-empty", nil, srv.xkey},
		{"fail/open-oversized", make([]byte, 64<<10+1), srv.xkey},
		{"fail/open-xkey-missing", srv.seal(t, gs, tok), ""},
		{"fail/open-xkey-not-curve", srv.seal(t, gs, tok), srv.id},
		{"fail/open-wrong-xkey-header", srv.seal(t, gs, tok), other.xkey},
		{"fail/open-sealed-to-other-space", func() []byte {
			gb, err := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "beta")).GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "beta"})
			if err != nil {
				t.Fatal(err)
			}
			return srv.seal(t, gb, tok)
		}(), srv.xkey},
		{"fail/open-claimed-xkey-differs", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Server.XKey = other.xkey })), srv.xkey},
		{"fail/open-bad-signature", srv.seal(t, gs, tampered), srv.xkey},
		{"fail/open-not-a-request", srv.seal(t, gs, gs.GetSentinelJwt()), srv.xkey},
		{"fail/open-no-user-nkey", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.UserNkey = "" })), srv.xkey},
		{"fail/open-user-nkey-not-user", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.UserNkey = srv.id })), srv.xkey},
		{"fail/open-no-server-id", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Server.ID = "" })), srv.xkey},
		{"fail/open-signed-by-other-server", firstOf(other.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) {
			ac.Server.ID, ac.Server.XKey = srv.id, other.xkey
		})), other.xkey},
		{"fail/open-other-callout-account", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Subject = gs.GetAccountPublicKey() })), srv.xkey},
		{"fail/open-wrong-audience", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Audience = space.AuthCalloutSubject })), srv.xkey},
		{"fail/open-expired", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Expires = time.Now().Add(-2 * time.Minute).Unix() })), srv.xkey},
		{"fail/open-no-expiry", firstOf(srv.request(t, gs, nonce, func(ac *jwt.AuthorizationRequestClaims) { ac.Expires = 0 })), srv.xkey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := authd.OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: tc.sealed, ServerXkey: tc.xkey})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantNoCredential(t, resp)
			if strings.Contains(err.Error(), goodToken) || strings.Contains(err.Error(), "eyJ") {
				t.Fatalf("refusal %q echoes the request", err)
			}
		})
	}

	sealed, _ := srv.request(t, gs, nonce, nil)
	for _, tc := range []struct {
		name   string
		caller string
		space  string
		code   codes.Code
		reason string
	}{
		{"fail/managerd-not-allowed", signerdtest.ID("managerd", "alpha"), "alpha", codes.PermissionDenied, "RPC_NOT_ALLOWED"},
		{"fail/other-space-authd", signerdtest.ID("authd", "beta"), "alpha", codes.PermissionDenied, "SPACE_NOT_ALLOWED"},
		{"fail/unknown-caller", "spiffe://cotal.local/stranger", "alpha", codes.PermissionDenied, "CALLER_UNKNOWN"},
		{"fail/unknown-space", signerdtest.ID("authd", "gamma"), "gamma", codes.NotFound, "UNKNOWN_SPACE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := dialAs(t, s, tc.caller).OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: tc.space, SealedRequest: sealed, ServerXkey: srv.xkey})
			wantRefusal(t, err, tc.code, tc.reason)
			wantNoCredential(t, resp)
		})
	}

	t.Run("ok/audit", func(t *testing.T) {
		verifyAudit(t, s.AuditPath)
		wantNoSecretsInAudit(t, s.AuditPath)
		recs := auditRecords(t, s.AuditPath)
		opens := slices.DeleteFunc(recs, func(r audit.Record) bool { return r.RPC != "OpenCalloutRequest" })
		if len(opens) == 0 || opens[0].Decision != audit.Granted || !nkeys.IsValidPublicUserKey(opens[0].Subject) {
			t.Fatalf("first open audit line = %+v, want granted with the user nkey", opens)
		}
		for _, r := range opens[1:] {
			if r.Decision != audit.Denied || r.Subject != "" || r.Reason == "" {
				t.Fatalf("refused open audited as %+v", r)
			}
		}
	})
}

// firstOf returns the first of two values.
func firstOf[A, B any](a A, _ B) A { return a }

func TestSignCalloutResponse(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	srv, other := newForgedServer(t), newForgedServer(t)
	sign := func(t *testing.T, c signerv1.SignerServiceClient, req *signerv1.SignCalloutResponseRequest) (*signerv1.SignCalloutResponseResponse, error) {
		t.Helper()
		return c.SignCalloutResponse(ctxT(t), req)
	}
	grant := func(g *signerv1.CalloutGrant) *signerv1.SignCalloutResponseRequest_Grant {
		return &signerv1.SignCalloutResponseRequest_Grant{Grant: g}
	}

	t.Run("ok/grant-bound-to-request", func(t *testing.T) {
		nonce := newNonce()
		sealed, user := srv.request(t, gs, nonce, nil)
		expires := time.Now().Add(10 * time.Minute)
		resp, err := sign(t, authd, &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey, Decision: grant(agentGrant(expires))})
		if err != nil {
			t.Fatal(err)
		}
		rc := srv.openResponse(t, gs, resp.GetSealedResponse())
		if rc.Subject != user || rc.Audience != srv.id || rc.IssuerAccount != gs.GetCalloutAccountPublicKey() ||
			rc.Issuer != gs.GetCalloutSigningPublicKey() || rc.Error != "" {
			t.Fatalf("response = {sub %s aud %s issuer_account %s iss %s error %q}; want %s, %s, %s, %s, none",
				rc.Subject, rc.Audience, rc.IssuerAccount, rc.Issuer, rc.Error, user, srv.id, gs.GetCalloutAccountPublicKey(), gs.GetCalloutSigningPublicKey())
		}
		uc, err := jwt.DecodeUserClaims(rc.Jwt)
		if err != nil {
			t.Fatal(err)
		}
		if uc.Subject != user || uc.IssuerAccount != gs.GetAccountPublicKey() || !slices.Contains(gs.GetSigningPublicKeys(), uc.Issuer) {
			t.Fatalf("user JWT = {sub %s issuer_account %s iss %s}; want %s in %s signed by one of %v",
				uc.Subject, uc.IssuerAccount, uc.Issuer, user, gs.GetAccountPublicKey(), gs.GetSigningPublicKeys())
		}
		if uc.ID != resp.GetUserJti() || uc.Name != "o1-a1" || uc.Expires > expires.Unix() || uc.Expires < expires.Add(-5*time.Second).Unix() {
			t.Fatalf("user JWT = {jti %s name %s exp %d}; want jti %s, name o1-a1, exp at most %d", uc.ID, uc.Name, uc.Expires, resp.GetUserJti(), expires.Unix())
		}
		if !slices.Contains(uc.Sub.Allow, "_INBOX_"+nonce+".>") || slices.Contains(uc.Sub.Allow, "_INBOX_"+user+".>") {
			t.Fatalf("user JWT subscribe allow = %v, want the nonce inbox _INBOX_%s.>", uc.Sub.Allow, nonce)
		}
	})

	t.Run("ok/grant-capped-not-refused", func(t *testing.T) {
		sealed, _ := srv.request(t, gs, newNonce(), nil)
		resp, err := sign(t, authd, &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey,
			Decision: grant(agentGrant(time.Now().Add(3 * time.Hour)))})
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(srv.openResponse(t, gs, resp.GetSealedResponse()).Jwt)
		if err != nil {
			t.Fatal(err)
		}
		// DefaultPolicy caps authd's agents at 1h.
		if life := time.Duration(uc.Expires-uc.IssuedAt) * time.Second; life > time.Hour || life < time.Hour-2*time.Second {
			t.Fatalf("lifetime %v, want the 1h policy cap", life)
		}
	})

	t.Run("ok/refusal", func(t *testing.T) {
		sealed, user := srv.request(t, gs, newNonce(), nil)
		resp, err := sign(t, authd, &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey,
			Decision: &signerv1.SignCalloutResponseRequest_Error{Error: refusalText}})
		if err != nil {
			t.Fatal(err)
		}
		rc := srv.openResponse(t, gs, resp.GetSealedResponse())
		if rc.Error != refusalText || rc.Jwt != "" || rc.Subject != user || rc.Audience != srv.id || resp.GetUserJti() != "" {
			t.Fatalf("refusal = {error %q jwt %d bytes sub %s aud %s jti %q}", rc.Error, len(rc.Jwt), rc.Subject, rc.Audience, resp.GetUserJti())
		}
	})

	valid := func() []byte { return firstOf(srv.request(t, gs, newNonce(), nil)) }
	in10m := func() time.Time { return time.Now().Add(10 * time.Minute) }
	cases := []struct {
		name     string
		caller   string
		sealed   []byte
		xkey     string
		decision any
		code     codes.Code
		reason   string
	}{
		{"fail/decision-unset", "", valid(), srv.xkey, nil, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-auth-profile", "", valid(), srv.xkey, func() *signerv1.CalloutGrant {
			g := agentGrant(in10m())
			g.Profile, g.Params = signerv1.Profile_PROFILE_AUTH_CALLOUT, nil
			return g
		}(), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-sentinel-profile", "", valid(), srv.xkey, &signerv1.CalloutGrant{Profile: signerv1.Profile_PROFILE_SENTINEL, ExpiresAt: timestamppb.New(in10m())},
			codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-unspecified-profile", "", valid(), srv.xkey, &signerv1.CalloutGrant{ExpiresAt: timestamppb.New(in10m())}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-expired", "", valid(), srv.xkey, agentGrant(time.Now().Add(-time.Minute)), codes.InvalidArgument, "TTL_INVALID"},
		{"fail/grant-no-expiry", "", valid(), srv.xkey, func() *signerv1.CalloutGrant { g := agentGrant(in10m()); g.ExpiresAt = nil; return g }(),
			codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-bad-params", "", valid(), srv.xkey, func() *signerv1.CalloutGrant { g := agentGrant(in10m()); g.Params.LifecycleUid = ""; return g }(),
			codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-wildcard-channel-wider-than-policy", "", valid(), srv.xkey, func() *signerv1.CalloutGrant {
			g := agentGrant(in10m())
			g.Params.AllowSubscribe = []string{">"}
			return g
		}(), codes.PermissionDenied, "CHANNEL_NOT_ALLOWED"},
		{"fail/grant-malformed-channel-pattern", "", valid(), srv.xkey, func() *signerv1.CalloutGrant {
			g := agentGrant(in10m())
			g.Params.AllowSubscribe = []string{"team.>.x"}
			return g
		}(), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/grant-profile-not-allowed", "", valid(), srv.xkey, &signerv1.CalloutGrant{Profile: signerv1.Profile_PROFILE_SUPERVISOR,
			Params: &signerv1.ProfileParams{Owner: "o1", Actor: "a1"}, ExpiresAt: timestamppb.New(in10m())}, codes.PermissionDenied, "PROFILE_NOT_ALLOWED"},
		{"fail/grant-channel-not-allowed", "", valid(), srv.xkey, func() *signerv1.CalloutGrant {
			g := agentGrant(in10m())
			g.Params.AllowPublish = []string{"secret"}
			return g
		}(), codes.PermissionDenied, "CHANNEL_NOT_ALLOWED"},
		{"fail/bad-nonce", "", firstOf(srv.request(t, gs, "short", nil)), srv.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/bad-nonce-wildcard", "", firstOf(srv.request(t, gs, "abcdefgh.>", nil)), srv.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/bad-nonce-missing", "", firstOf(srv.request(t, gs, "", nil)), srv.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/refusal-empty", "", valid(), srv.xkey, "", codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/refusal-control-char", "", valid(), srv.xkey, "no\nway", codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/refusal-too-long", "", valid(), srv.xkey, strings.Repeat("x", 257), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/sign-unsealed", "", []byte(firstOf(srv.token(t, gs, newNonce(), nil))), srv.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/sign-wrong-xkey-header", "", valid(), other.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/sign-claimed-xkey-differs", "", firstOf(srv.request(t, gs, newNonce(), func(ac *jwt.AuthorizationRequestClaims) { ac.Server.XKey = other.xkey })),
			srv.xkey, agentGrant(in10m()), codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/refusal-for-unverified-request", "", firstOf(srv.request(t, gs, newNonce(), func(ac *jwt.AuthorizationRequestClaims) { ac.Server.ID = "" })),
			srv.xkey, refusalText, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"fail/managerd-not-allowed", signerdtest.ID("managerd", "alpha"), valid(), srv.xkey, agentGrant(in10m()), codes.PermissionDenied, "RPC_NOT_ALLOWED"},
		{"fail/managerd-refusal-not-allowed", signerdtest.ID("managerd", "alpha"), valid(), srv.xkey, refusalText, codes.PermissionDenied, "RPC_NOT_ALLOWED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: tc.sealed, ServerXkey: tc.xkey}
			switch d := tc.decision.(type) {
			case *signerv1.CalloutGrant:
				req.Decision = grant(d)
			case string:
				req.Decision = &signerv1.SignCalloutResponseRequest_Error{Error: d}
			}
			c := authd
			if tc.caller != "" {
				c = dialAs(t, s, tc.caller)
			}
			resp, err := sign(t, c, req)
			wantRefusal(t, err, tc.code, tc.reason)
			wantNoCredential(t, resp)
		})
	}

	t.Run("ok/audit", func(t *testing.T) {
		verifyAudit(t, s.AuditPath)
		wantNoSecretsInAudit(t, s.AuditPath)
		var grants, refusals, denials int
		for _, r := range auditRecords(t, s.AuditPath) {
			if r.RPC != "SignCalloutResponse" {
				continue
			}
			switch {
			case r.Decision == audit.Denied:
				denials++
				if r.JTI != "" || r.Reason == "" {
					t.Fatalf("denial audited as %+v", r)
				}
			case r.Reason == "callout-refusal":
				refusals++
				if r.JTI != "" || r.Profile != "" || !nkeys.IsValidPublicUserKey(r.Subject) {
					t.Fatalf("refusal audited as %+v", r)
				}
			default:
				grants++
				auditWant{caller: signerdtest.ID("authd", "alpha"), rpc: "SignCalloutResponse", space: "alpha", profile: "agent", decision: audit.Granted}.check(t, r)
				if !nkeys.IsValidPublicUserKey(r.Subject) {
					t.Fatalf("grant audited for subject %q", r.Subject)
				}
			}
		}
		if grants != 2 || refusals != 1 || denials != len(cases) {
			t.Fatalf("audit has %d grants, %d refusals, %d denials; want 2, 1, %d", grants, refusals, denials, len(cases))
		}
	})
}

// readAll reads a file or fails the test.
func readAll(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
