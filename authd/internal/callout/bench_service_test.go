package callout

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/authority/authoritytest"
	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// serveReads is how many rows the authority's CheckServe re-reads per service connect: the
// registration (spec), the endpoint gate, the root, the approval and the name binding.
const serveReads = 5

// benchService is the benchmark's service instance, registered, approved and activated through
// the authority's API: the authority, its store, the registration's witness and the activate
// request whose replay mints a fresh access bearer.
type benchService struct {
	auth     *authority.Authority
	store    *authority.Store
	witness  string
	activate *serviceaccess.Request
}

// registerService runs the seed's sequence for svcEndpoint/svcInstance owned by owner on a
// provisioned space of its own (as authd's plane connection reaches its auth bucket on loopback),
// with e's signerd minting: register (idp) -> approval-required, name-bind (operator), decide
// approve (idp), the register replay -> registered, activate (idp) -> credential, which creates
// the root. Each answer must be the one the sequence expects.
func registerService(b *testing.B, e *env) *benchService {
	b.Helper()
	sp := authoritytest.Provisioned(b, testSpace)
	store, err := authority.NewStore(sp.Conn, sp.Names, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	auth, err := authority.New(authority.Config{Store: store, Ledger: e.ledger, Space: testSpace, Account: sp.Account,
		Signer: e.authd.API(), Held: func() error { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	manifest, err := json.Marshal(serviceaccess.Manifest{V: 1, Root: serviceaccess.Member{URN: svcEndpoint, Kind: "endpoint"}, Members: []serviceaccess.Member{}})
	if err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(manifest)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	contract := &serviceaccess.Contract{Closures: []string{digest}, Artifacts: []serviceaccess.Artifact{{Digest: digest, Bytes: manifest}}}
	idp := authority.ServiceCaller{Proof: serviceaccess.ProofIDP, Owner: owner}
	do := func(req *serviceaccess.Request, caller authority.ServiceCaller, want serviceaccess.AnswerKind) *serviceaccess.Answer {
		b.Helper()
		req.Account, req.Space = sp.Account, testSpace
		ans, err := auth.ServiceRequest(ctxT(b), req, caller)
		if err != nil || ans.Kind != want || ans.RequestID != req.RequestID {
			b.Fatalf("%s: answer %+v (%v), want %s for %s", req.Kind, ans, err, want, req.RequestID)
		}
		return ans
	}
	register := &serviceaccess.Request{Kind: serviceaccess.KindRegister, RequestID: "register-0001", Endpoint: svcEndpoint, Instance: svcInstance, Contract: contract}
	proposed := do(register, idp, serviceaccess.AnswerApprovalRequired)
	do(&serviceaccess.Request{Kind: serviceaccess.KindNameBind, RequestID: "bind-0001", Endpoint: svcEndpoint, Owner: owner},
		authority.ServiceCaller{Proof: serviceaccess.ProofOperator}, serviceaccess.AnswerBound)
	do(&serviceaccess.Request{Kind: serviceaccess.KindDecide, RequestID: "decide-0001", Endpoint: svcEndpoint, Instance: svcInstance,
		Proposal: proposed.Proposal, Contract: contract, Decision: serviceaccess.DecisionApprove}, idp, serviceaccess.AnswerDecided)
	registered := do(register, idp, serviceaccess.AnswerRegistered)
	s := &benchService{auth: auth, store: store, witness: registered.Witness,
		activate: &serviceaccess.Request{Kind: serviceaccess.KindActivate, Account: sp.Account, Space: testSpace, RequestID: "activate-0001",
			Endpoint: svcEndpoint, Instance: svcInstance, Witness: registered.Witness}}
	if tok := s.access(b); tok == "" {
		b.Fatal("activate minted no access bearer")
	}
	return s
}

// access replays the activate request (activate mints anew on every replay, with the same
// requestId) and returns the fresh access bearer, which lives 60 s.
func (s *benchService) access(b *testing.B) string {
	b.Helper()
	req := *s.activate
	ans, err := s.auth.ServiceRequest(ctxT(b), &req, authority.ServiceCaller{Proof: serviceaccess.ProofIDP, Owner: owner})
	if err != nil || ans.Kind != serviceaccess.AnswerCredential || ans.Access == nil || ans.Witness != s.witness {
		b.Fatalf("activate: answer %+v (%v), want a credential for the registration", ans, err)
	}
	return ans.Access.Token
}

// BenchmarkConnectService compares, in one run on one broker with one responder (authd's, with
// signerd), a user connect (an interactive row's bearer: bearer verify, ledger, nonce, the agent
// grant) and a service connect (an access bearer the authority minted through signerd:
// Validator.Access, the authority's CheckServe, the service-serve grant). The service instance
// is real: registered, name-bound, approved and activated (which created its root) through the
// authority's API on a provisioned space of its own, whose auth and records buckets CheckServe
// leader-reads (STREAM.MSG.GET, serveReads rows at once) on loopback as authd's plane connection
// does; the benchmark fails unless the service connects made exactly serveReads reads each and
// the user connects none. The variants take turns in rounds (each service round first replays the
// activate request outside the clock for a fresh access bearer: it lives 60 s); each reports
// connects/s and p50/p99 latency, and "ratio" is service over user connects/s (the goal is at
// least 0.7).
//
//	go test -run '^$' -bench BenchmarkConnectService -benchtime 3000x -count 3 ./authd/internal/callout/
func BenchmarkConnectService(b *testing.B) {
	e := startEnv(b, envOptions{noResponder: true})
	svc := registerService(b, e)
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.authd.API()})
	if err != nil {
		b.Fatal(err)
	}
	resp, err := New(Config{Space: testSpace, Signer: e.authd, Ledger: e.ledger, JWKS: cache, Services: svc.auth,
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
	// reads are the store reads each variant's connects made (the activate replays that mint
	// the service bearers read too, outside the count).
	reads := map[string]uint64{}
	count := func(b *testing.B, name string, n, conc int, connect func() (*nats.Conn, error)) ([]time.Duration, time.Duration) {
		r0 := svc.store.Reads()
		lat, elapsed := connects(b, n, conc, connect)
		reads[name] += svc.store.Reads() - r0
		return lat, elapsed
	}
	user := func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		return count(b, "user", n, conc, func() (*nats.Conn, error) { return dial(userTok, nonceFor(b, userTok)) })
	}
	service := func(b *testing.B, n, conc int) ([]time.Duration, time.Duration) {
		b.StopTimer()
		tok := svc.access(b)
		b.StartTimer()
		return count(b, "service", n, conc, func() (*nats.Conn, error) { return dial(tok, svcName()) })
	}
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			clear(reads)
			rate := runRounds(b, conc, []*roundVariant{
				{name: "user", round: user},
				{name: "service", round: service},
			})
			if reads["service"] != uint64(serveReads*b.N) || reads["user"] != 0 {
				b.Fatalf("%d store reads for %d service connects (want %d each), %d for the user connects (want none)",
					reads["service"], b.N, serveReads, reads["user"])
			}
			b.ReportMetric(rate["service"]/rate["user"], "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
