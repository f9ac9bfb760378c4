package callout

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/bearer"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

// serveReads is how many rows the authority's CheckServe re-reads per service connect: the
// registration (spec), the endpoint gate, the root, the approval and the name binding.
const serveReads = 5

// readingGate stands in for the authority's CheckServe in the benchmark: it leader-reads an open
// gate row serveReads times (STREAM.MSG.GET on a provisioned auth bucket, as CheckServe reads
// its rows) and admits when every read finds it open.
type readingGate struct {
	store *authority.Store
	uid   string
}

func (g readingGate) CheckServe(ctx context.Context, _ *serviceaccess.AccessClaims) error {
	for range serveReads {
		row, _, found, err := g.store.Gate(ctx, g.uid)
		if err != nil {
			return err
		}
		if !found || row.State != lifecycle.GateOpen {
			return fmt.Errorf("gate %s not open", g.uid)
		}
	}
	return nil
}

// BenchmarkConnectService compares, in one run on one broker with one responder (authd's, with
// signerd), a user connect (an interactive row's bearer: bearer verify, ledger, nonce, the agent
// grant) and a service connect (a signerd-minted access bearer: Validator.Access, the service
// gate, the service-serve grant). The service gate stands in for the authority's CheckServe by
// leader-reading serveReads rows of a provisioned auth bucket on loopback, as authd's plane
// connection reads them; the real CheckServe replaces it once it lands. The variants take turns
// in rounds (each service round mints a fresh access bearer outside the clock: it lives 60 s);
// each reports connects/s and p50/p99 latency, and "ratio" is service over user connects/s (the
// goal is at least 0.7).
//
//	go test -run '^$' -bench BenchmarkConnectService -benchtime 3000x -count 3 ./authd/internal/callout/
func BenchmarkConnectService(b *testing.B) {
	sp := authoritytest.Provisioned(b, testSpace)
	store, err := authority.NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	uid := strings.Repeat("s", 26)
	open, _ := lifecycle.EncodeGate(lifecycle.Gate{LifecycleUID: uid, State: lifecycle.GateOpen, Generation: 1})
	key, _ := lifecycle.GateKey(uid)
	if _, err := store.Create(ctxT(b), space.Auth, key, open); err != nil {
		b.Fatal(err)
	}
	e := startEnv(b, envOptions{noResponder: true})
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		b.Fatal(err)
	}
	resp, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, Services: readingGate{store: store, uid: uid},
		OpenRate: benchBudget, RefusalRate: benchBudget})
	if err != nil {
		b.Fatal(err)
	}
	if err := resp.Start(ctxT(b), e.svc); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(resp.Close)
	sentinel := e.gs.GetSentinelJwt()
	dial := func(tok, name string) (*nats.Conn, error) {
		kp, _ := nkeys.CreateUser()
		return nats.Connect(e.url, nats.UserJWT(func() (string, error) { return sentinel, nil }, kp.Sign),
			nats.Token(tok), nats.Name(name), nats.CustomInboxPrefix("_INBOX_"+name), nats.NoReconnect(), nats.Timeout(10*time.Second))
	}

	userTok, _ := e.bearerFor(b, e.grant(b, row("laptop")), 15*time.Minute, nil)
	user := func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		return connects(b, n, conc, func() (*nats.Conn, error) { return dial(userTok, nonceFor(b, userTok)) })
	}
	service := func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		b.StopTimer()
		tok, _ := e.serviceToken(b, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, time.Minute)
		b.StartTimer()
		return connects(b, n, conc, func() (*nats.Conn, error) { return dial(tok, svcName()) })
	}
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			reads := store.Reads()
			rate := runRounds(b, conc, []*roundVariant{
				{name: "user", round: user},
				{name: "service", round: service},
			})
			if got := store.Reads() - reads; got != uint64(serveReads*b.N) {
				b.Fatalf("%d gate reads for %d service connects, want %d each", got, b.N, serveReads)
			}
			b.ReportMetric(rate["service"]/rate["user"], "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
