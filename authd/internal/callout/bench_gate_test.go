package callout

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// BenchmarkConnectGateRead measures what the issuance gate read (step 8) costs a connect: the
// same responder (authd's, with signerd) admits an interactive row, which reads no gate, and a
// managed row, whose open gate it leader-reads (STREAM.MSG.GET) on every connect. The gates
// live on a provisioned broker of their own on loopback, as authd's plane connection is. The
// two variants take turns in rounds; each reports connects/s and p50/p99 latency.
//
//	go test -run '^$' -bench BenchmarkConnectGateRead -benchtime 3000x -count 3 ./authd/internal/callout/
func BenchmarkConnectGateRead(b *testing.B) {
	sp := authoritytest.Provisioned(b, testSpace)
	store, err := authority.NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	e := startEnv(b, envOptions{noResponder: true})
	inter := e.grant(b, row("laptop"))
	managed := row("worker")
	managed.LifecycleUID = strings.Repeat("m", 26)
	managed.TokenHash = ledger.HashActorToken("secret")
	if err := e.ledger.Put(ledger.Managed, managed); err != nil {
		b.Fatal(err)
	}
	open, _ := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: managed.LifecycleUID, State: lifecycle.GateOpen, Generation: 1})
	key, _ := lifecycle.GateKey(managed.LifecycleUID)
	if _, err := store.Create(ctxT(b), space.Auth, key, open); err != nil {
		b.Fatal(err)
	}
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		b.Fatal(err)
	}
	resp, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, Lifecycle: store,
		OpenRate: benchBudget, RefusalRate: benchBudget})
	if err != nil {
		b.Fatal(err)
	}
	if err := resp.Start(ctxT(b), e.svc); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(resp.Close)
	sentinel := e.gs.GetSentinelJwt()
	connectAs := func(r ledger.Row) func() (*nats.Conn, error) {
		tok, _ := e.bearerFor(b, r, 15*time.Minute, nil)
		return func() (*nats.Conn, error) {
			kp, _ := nkeys.CreateUser()
			nonce := nonceFor(b, tok)
			return nats.Connect(e.url, nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
				nats.Token(tok), nats.Name(nonce), nats.CustomInboxPrefix("_INBOX_"+nonce), nats.NoReconnect(), nats.Timeout(10*time.Second))
		}
	}
	connectsAs := func(r ledger.Row) func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		connect := connectAs(r)
		return func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) { return connects(b, n, conc, connect) }
	}
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			reads := store.Reads()
			rate := runRounds(b, conc, []*roundVariant{
				{name: "interactive", round: connectsAs(inter)},
				{name: "managed-gate-read", round: connectsAs(managed)},
			})
			if got := store.Reads() - reads; got != uint64(b.N) {
				b.Fatalf("%d gate reads for %d managed connects", got, b.N)
			}
			b.ReportMetric(rate["managed-gate-read"]/rate["interactive"], "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
