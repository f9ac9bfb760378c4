package callout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// localSigner is upstream's shape, built only for the benchmark: the responder holds the xkey,
// the callout signing key and the data signing key itself (read from signerd's key directory)
// and opens, signs and seals in process. The decision logic (bearer, view, ledger, nonce) is the
// same Responder's. Like upstream's responder it opens each request once: the claims the open
// verified are kept for the answer (upstream holds them in one function; here they cross the
// two-call interface).
type localSigner struct {
	spaceName             string
	xkp, authKP, dataKP   nkeys.KeyPair
	authAccount, dataAcct string
	opened                sync.Map // string(sealed request) -> *jwt.AuthorizationRequestClaims
}

func newLocalSigner(b *testing.B, e *env) *localSigner {
	b.Helper()
	dir := filepath.Join(e.s.Dir, "signer", space.Segment(testSpace))
	load := func(name string) nkeys.KeyPair {
		seed, err := creds.ReadSeedFile(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		defer seed.Wipe()
		kp, err := seed.KeyPair()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(kp.Wipe)
		return kp
	}
	return &localSigner{spaceName: testSpace, xkp: load("xkey.nk"), authKP: load("auth-signing.nk"), dataKP: load("data-signing.nk"),
		authAccount: e.gs.GetCalloutAccountPublicKey(), dataAcct: e.gs.GetAccountPublicKey()}
}

func (l *localSigner) open(sealed []byte, xkey string) (*jwt.AuthorizationRequestClaims, error) {
	data, err := l.xkp.Open(sealed, xkey)
	if err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, err
	}
	if ac.Issuer != ac.Server.ID || ac.Server.XKey != xkey || ac.Subject != l.authAccount || ac.UserNkey == "" {
		return nil, errors.New("request does not verify")
	}
	return ac, nil
}

func (l *localSigner) OpenCalloutRequest(_ context.Context, in *signerv1.OpenCalloutRequestRequest, _ ...grpc.CallOption) (*signerv1.OpenCalloutRequestResponse, error) {
	ac, err := l.open(in.GetSealedRequest(), in.GetServerXkey())
	if err != nil {
		return nil, err
	}
	l.opened.Store(string(in.GetSealedRequest()), ac)
	return &signerv1.OpenCalloutRequestResponse{UserNkey: ac.UserNkey, ServerId: ac.Server.ID, ServerXkey: ac.Server.XKey,
		AuthToken: ac.ConnectOptions.Token, ConnectionName: ac.ConnectOptions.Name}, nil
}

var protoToProfile = map[signerv1.Profile]profiles.Name{
	signerv1.Profile_PROFILE_AGENT: profiles.Agent,
	signerv1.Profile_PROFILE_ADMIN: profiles.Admin,
}

func (l *localSigner) SignCalloutResponse(_ context.Context, in *signerv1.SignCalloutResponseRequest, _ ...grpc.CallOption) (*signerv1.SignCalloutResponseResponse, error) {
	v, ok := l.opened.LoadAndDelete(string(in.GetSealedRequest()))
	if !ok {
		return nil, errors.New("answer to a request that was not opened")
	}
	ac := v.(*jwt.AuthorizationRequestClaims)
	resp := jwt.NewAuthorizationResponseClaims(ac.UserNkey)
	resp.Audience = ac.Server.ID
	resp.IssuerAccount = l.authAccount
	resp.Error = in.GetError()
	if g := in.GetGrant(); g != nil {
		p := g.GetParams()
		spec, err := profiles.Build(l.spaceName, protoToProfile[g.GetProfile()], profiles.Params{
			Owner: p.GetOwner(), Actor: p.GetActor(), LifecycleUID: p.GetLifecycleUid(), Role: p.GetRole(),
			Subscribe: p.GetSubscribe(), AllowSubscribe: p.GetAllowSubscribe(), AllowPublish: p.GetAllowPublish(),
			Capabilities: p.GetCapabilities(), InboxNonce: ac.ConnectOptions.Name,
		})
		if err != nil {
			return nil, err
		}
		now := time.Now()
		uc, err := spec.Claims(ac.UserNkey, l.dataAcct, now, g.GetExpiresAt().AsTime().Sub(now).Truncate(time.Second))
		if err != nil {
			return nil, err
		}
		if resp.Jwt, err = uc.Encode(l.dataKP); err != nil {
			return nil, err
		}
	}
	token, err := resp.Encode(l.authKP)
	if err != nil {
		return nil, err
	}
	sealed, err := l.xkp.Seal([]byte(token), ac.Server.XKey)
	if err != nil {
		return nil, err
	}
	return &signerv1.SignCalloutResponseResponse{SealedResponse: sealed}, nil
}

// benchBudget is a local budget (OpenRate, RefusalRate) the benchmarks never reach: they
// measure what the path can carry, not the deployed budgets; each request still pays its checks.
var benchBudget = Rate{PerSecond: 1e6, Burst: 1e6}

// benchResponder starts a responder on e's callout connection with signer (nil: signerd).
func benchResponder(b *testing.B, e *env, signer Signer, maxInFlight int) *Responder {
	b.Helper()
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		b.Fatal(err)
	}
	r, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, MaxInFlight: maxInFlight, signer: signer,
		OpenRate: benchBudget, RefusalRate: benchBudget})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(context.Background(), e.svc); err != nil {
		b.Fatal(err)
	}
	return r
}

// connects makes n connects with conc at once and returns each one's latency and the time all of
// them took. A failed connect fails the benchmark.
func connects(b *testing.B, n, conc int, connect func() (*nats.Conn, error)) ([]time.Duration, time.Duration) {
	b.Helper()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				t0 := time.Now()
				nc, err := connect()
				lat[i] = time.Since(t0)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				nc.Close()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d connects failed; the first: %v", f, n, firstErr.Load())
	}
	return lat, elapsed
}

// benchConcs are the numbers of clients connecting at once: at 8 the remote path is bound by
// latency (its clock mostly waits on hops, the cores are not full), from 32 on both responders
// saturate the two cores, which is their throughput.
var benchConcs = []int{8, 32, 64}

// benchRounds is how many rounds each variant's connects are split into. The variants take turns
// round by round (the order reversed every other round), so a drift in the machine's speed,
// which on this virtual machine reaches 30% within minutes, falls on all of them alike.
const benchRounds = 6

// BenchmarkConnect compares, in one run on one broker, a client connect through the callout with
// authd's responder and signerd, through the same responder holding the keys in process
// (upstream's shape), and a plain connect with a static user JWT (no callout). Each concurrency
// is one sub-benchmark in which the three variants make b.N connects each, interleaved in
// rounds; it reports each variant's connects/s and p50/p99 latency, and the ratio of the
// authd+signerd throughput to the in-process one.
//
//	go test -run '^$' -bench BenchmarkConnect -benchtime 3000x -count 3 ./authd/internal/callout/
func BenchmarkConnect(b *testing.B) {
	e := startEnv(b, envOptions{noResponder: true})
	r := e.grant(b, row("laptop"))
	tok, _ := e.bearerFor(b, r, 15*time.Minute, nil)
	sentinel := e.gs.GetSentinelJwt()
	callout := func() (*nats.Conn, error) {
		kp, _ := nkeys.CreateUser()
		nonce := nonceFor(b, tok)
		return nats.Connect(e.url, nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
			nats.Token(tok), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce), nats.NoReconnect(), nats.Timeout(10*time.Second))
	}

	manager := dialSigner(b, e.s.Addr, e.s.ClientFor(b, mtls.KindManagerd, testSpace))
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	cred, err := manager.Mint(ctxT(b), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub,
		Params: &signerv1.ProfileParams{Owner: owner, Actor: "static", LifecycleUid: uid1, Subscribe: []string{"general"},
			AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}}})
	if err != nil {
		b.Fatal(err)
	}
	static := func() (*nats.Conn, error) {
		return nats.Connect(e.url, nats.UserJWT(func() (string, error) { return cred.GetJwt(), nil }, kp.Sign),
			nats.CustomInboxPrefix("_INBOX_"+pub), nats.NoReconnect(), nats.Timeout(10*time.Second))
	}
	local := newLocalSigner(b, e)

	// round runs n connects of a variant; signer nil is signerd, and without callout the client
	// connects with its static JWT.
	round := func(signer Signer, useCallout bool) func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		return func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
			if !useCallout {
				return connects(b, n, conc, static)
			}
			b.StopTimer()
			resp := benchResponder(b, e, signer, DefaultMaxInFlight)
			b.StartTimer()
			defer func() {
				b.StopTimer()
				resp.Close()
				b.StartTimer()
			}()
			return connects(b, n, conc, callout)
		}
	}
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			rate := runRounds(b, conc, []*roundVariant{
				{name: "authd+signerd", round: round(nil, true)},
				{name: "in-process-keys", round: round(local, true)},
				{name: "static-jwt", round: round(nil, false)},
			})
			b.ReportMetric(rate["authd+signerd"]/rate["in-process-keys"], "ratio")
			b.ReportMetric(0, "ns/op") // the clock covers all three variants: not a per-connect figure
		})
	}
}

// roundVariant is one variant of a connect benchmark: its name and what one of its rounds does
// (n connects by conc clients: their latencies and the wall time).
type roundVariant struct {
	name    string
	round   func(b *testing.B, n, conc int) ([]time.Duration, time.Duration)
	lat     []time.Duration
	elapsed time.Duration
}

// runRounds splits b.N connects of each variant into benchRounds rounds, the variants taking
// turns round by round (the order reversed every other round), reports each one's connects/s,
// p50 and p99, and returns the connects/s by name.
func runRounds(b *testing.B, conc int, vs []*roundVariant) map[string]float64 {
	b.Helper()
	b.ResetTimer()
	for round := range benchRounds {
		n := b.N / benchRounds
		if round == benchRounds-1 {
			n = b.N - n*(benchRounds-1)
		}
		order := slices.Clone(vs)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			lat, elapsed := v.round(b, n, conc)
			v.lat, v.elapsed = append(v.lat, lat...), v.elapsed+elapsed
		}
	}
	b.StopTimer()
	rate := map[string]float64{}
	for _, v := range vs {
		slices.Sort(v.lat)
		rate[v.name] = float64(len(v.lat)) / v.elapsed.Seconds()
		b.ReportMetric(rate[v.name], v.name+"-connects/s")
		b.ReportMetric(float64(v.lat[len(v.lat)/2].Microseconds())/1000, v.name+"-p50-ms")
		b.ReportMetric(float64(v.lat[len(v.lat)*99/100].Microseconds())/1000, v.name+"-p99-ms")
	}
	return rate
}

// BenchmarkReconnectStorm connects stormClients clients, restarts the broker, and reports how
// long until every client is connected again: through the callout (authd + signerd), and with
// static user JWTs for comparison. Clients wait 250 ms plus up to 250 ms of jitter between
// reconnect attempts (nats.go's defaults are 2 s and 100 ms).
//
//	go test -run '^$' -bench BenchmarkReconnectStorm -benchtime 1x ./authd/internal/callout/
func BenchmarkReconnectStorm(b *testing.B) {
	b.Run("authd+signerd", func(b *testing.B) { reconnectStorm(b, true) })
	b.Run("static-jwt", func(b *testing.B) { reconnectStorm(b, false) })
}

func reconnectStorm(b *testing.B, callout bool) {
	const stormClients = 300
	for range b.N {
		b.StopTimer()
		storeDir := b.TempDir()
		e := startEnv(b, envOptions{noResponder: true})
		// Restart needs a broker whose store directory and port the benchmark keeps.
		e.ns.Shutdown()
		e.ns = startBrokerOn(b, e.s, storeDir, -1)
		e.url = e.ns.ClientURL()
		e.svc = calloutConn(b, e.authd, e.s, e.url)
		resp := benchResponder(b, e, nil, DefaultMaxInFlight)
		r := e.grant(b, row("laptop"))
		tok, _ := e.bearerFor(b, r, 15*time.Minute, nil)
		sentinel := e.gs.GetSentinelJwt()
		var static *signerv1.Credential
		staticKP, _ := nkeys.CreateUser()
		staticPub, _ := staticKP.PublicKey()
		if !callout {
			manager := dialSigner(b, e.s.Addr, e.s.ClientFor(b, mtls.KindManagerd, testSpace))
			var err error
			if static, err = manager.Mint(ctxT(b), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: staticPub,
				Params: &signerv1.ProfileParams{Owner: owner, Actor: "static", LifecycleUid: uid1}}); err != nil {
				b.Fatal(err)
			}
		}

		var back atomic.Int64
		all := make(chan struct{})
		conns := make([]*nats.Conn, 0, stormClients)
		for i := range stormClients {
			var once sync.Once
			opts := []nats.Option{
				nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectJitter(250*time.Millisecond, 0),
				nats.IgnoreAuthErrorAbort(), nats.Timeout(10 * time.Second),
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
				nats.ReconnectHandler(func(*nats.Conn) {
					once.Do(func() {
						if back.Add(1) == stormClients {
							close(all)
						}
					})
				}),
			}
			if callout {
				kp, _ := nkeys.CreateUser()
				nonce := nonceFor(b, tok)
				opts = append(opts, nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
					nats.Token(tok), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce))
			} else {
				opts = append(opts, nats.UserJWT(func() (string, error) { return static.GetJwt(), nil }, staticKP.Sign),
					nats.CustomInboxPrefix("_INBOX_"+staticPub))
			}
			nc, err := nats.Connect(e.url, opts...)
			if err != nil {
				b.Fatalf("client %d: %v", i, err)
			}
			conns = append(conns, nc)
		}
		port := e.ns.Addr().(*net.TCPAddr).Port
		b.StartTimer()
		start := time.Now()
		e.ns.Shutdown()
		e.ns = startBrokerOn(b, e.s, storeDir, port)
		select {
		case <-all:
		case <-time.After(2 * time.Minute):
			b.Fatalf("%d of %d clients back after 2 minutes", back.Load(), stormClients)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s-until-all-back")
		b.StopTimer()
		for _, nc := range conns {
			nc.Close()
		}
		resp.Close()
	}
}
