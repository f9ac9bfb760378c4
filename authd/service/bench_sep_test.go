package service_test

import (
	"slices"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// BenchmarkServiceRenew measures one service renew through authd's real door: authd's service
// with service_endpoints on, a real signerd (loopback mTLS, its audit file on) and the embedded
// broker holding the auth and records buckets, for an instance registered, name-bound, approved
// and activated through the same door (TestServiceEndpointSequence's fixtures). Each iteration is
// one POST of a renew on the renewal proof, as a renewal source sends it: the door verifies the
// proof (Validator.Renewal), the authority re-reads the registration (five rows at once) and the
// request ledger, and signerd signs an access bearer and a renewal proof (two
// SignServiceCredential calls, an audit line each). The client replays one requestId, as a
// renewal source does (renew mints anew on every replay and the instance's ledger holds at most
// 64 requestIds), and presents the renewal proof of the previous answer. One client renews at a
// time; the benchmark reports p50 and p99 latency and renews/s (wall clock over all iterations,
// the client's encode and parse included).
//
//	go test -run '^$' -bench BenchmarkServiceRenew -benchtime 2000x -count 3 ./authd/service/
func BenchmarkServiceRenew(b *testing.B) {
	s := newSepEnv(b, nil)
	const endpoint = "svc.bench"
	iid := newInstanceID()
	registered, _ := approve(b, s.raw, s.h.owner, endpoint, iid, echoContract(endpoint), 0)
	cred := wantKind(b, s.raw(b, serviceaccess.Request{Kind: serviceaccess.KindActivate, RequestID: "activate-0001", Endpoint: endpoint,
		Instance: iid, Witness: registered.Witness}, nil), serviceaccess.AnswerCredential)
	renew := serviceaccess.Request{Kind: serviceaccess.KindRenew, RequestID: "renew-0001", Endpoint: endpoint, Instance: iid,
		Witness: registered.Witness}
	proof := cred.Renewal.Token
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		t0 := time.Now()
		ans := wantKind(b, s.raw(b, renew, &serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: proof}), serviceaccess.AnswerCredential)
		lat = append(lat, time.Since(t0))
		if ans.Access == nil || ans.Renewal == nil || ans.Witness != renew.Witness || ans.Root != cred.Root {
			b.Fatalf("renew answered %s; want both tokens for the registration's witness and root", ans.Kind)
		}
		proof = ans.Renewal.Token
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "renews/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
