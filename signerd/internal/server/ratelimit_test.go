package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// Finding 3 of issue 7: refusals were unbounded. An identity the policy does not know (or a
// certificate without a URI SAN) had no rate limit, a known caller over its rate still cost one
// fsynced audit line per refusal, and malformed requests were validated and audited before the
// rate was asked: one unknown identity wrote 9.6 MB of audit in 3 s.

// stranger (bearer_test.go) is a CA-valid identity tablePolicy does not list either.

// unknownBurst is the unknown-caller burst of limitsPolicy; its rate is so slow that no token
// refills during a test.
const unknownBurst = 5

// limitsPolicy is tablePolicy with a limits block: unknown callers get unknownBurst requests,
// then nothing, and extra adds keys to the block.
func limitsPolicy(extra string) string {
	return tablePolicy + fmt.Sprintf("limits:\n  unknown_callers: {per_second: 0.0001, burst: %d}\n", unknownBurst) + extra
}

// flood makes n calls of call from 8 goroutines and counts the outcomes by code.
func flood(t *testing.T, n int, call func(ctx context.Context) error) map[codes.Code]int {
	t.Helper()
	var (
		mu   sync.Mutex
		got  = map[codes.Code]int{}
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				code := status.Code(call(ctxT(t)))
				mu.Lock()
				got[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

// probeReq is a Mint of the probe profile in alpha for pub.
func probeReq(pub string) *signerv1.MintRequest {
	return &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub}
}

// aggregates returns the aggregate lines (Count > 0) among recs.
func aggregates(recs []audit.Record) []audit.Record {
	var out []audit.Record
	for _, r := range recs {
		if r.Count > 0 {
			out = append(out, r)
		}
	}
	return out
}

// wantAggregate asserts r is the aggregate refusal line of caller for rpc, reason and count.
func wantAggregate(t *testing.T, r audit.Record, caller, rpc, reason string, count uint64) {
	t.Helper()
	if r.Caller != caller || r.RPC != rpc || r.Decision != audit.Denied || r.Reason != reason || r.Count != count ||
		r.Space != "" || r.Profile != "" || r.Subject != "" || r.JTI != "" {
		t.Fatalf("aggregate line = %+v, want caller %q rpc %q denied %q count %d and no request fields", r, caller, rpc, reason, count)
	}
}

// stop stops s, which writes the refusal counts, and returns the audit lines after the first
// before.
func stop(t *testing.T, s *signerdtest.Signer, before int) []audit.Record {
	t.Helper()
	s.Serve.Stop()
	verifyAudit(t, s.AuditPath)
	return auditRecords(t, s.AuditPath)[before:]
}

func TestRateLimitUnknownCallerFlood(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: limitsPolicy("")})
	c := dialAs(t, s, stranger)
	_, pub := newUser(t)
	before := len(auditRecords(t, s.AuditPath))

	const n = 2000
	got := flood(t, n, func(ctx context.Context) error { _, err := c.Mint(ctx, probeReq(pub)); return err })
	if got[codes.PermissionDenied] != unknownBurst || got[codes.ResourceExhausted] != n-unknownBurst {
		t.Fatalf("outcomes %v, want %d PermissionDenied (caller-unknown, within the burst) and %d ResourceExhausted", got, unknownBurst, n-unknownBurst)
	}
	_, err := c.Mint(ctxT(t), probeReq(pub))
	wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")

	// While serving, only the burst is audited one by one.
	recs := auditRecords(t, s.AuditPath)[before:]
	if len(recs) != unknownBurst {
		t.Fatalf("%d audit lines for %d refusals before the flush, want %d", len(recs), n+1, unknownBurst)
	}
	for _, r := range recs {
		denied(stranger, "Mint", "alpha", "probe", "caller-unknown").check(t, r)
	}
	// Stopping writes the count: one line for everything past the burst.
	recs = stop(t, s, before)
	if len(recs) != unknownBurst+1 {
		t.Fatalf("%d audit lines for %d refusals, want %d: %+v", len(recs), n+1, unknownBurst+1, recs)
	}
	wantAggregate(t, recs[unknownBurst], stranger, "Mint", "rate-limited", n+1-unknownBurst)
}

// TestRateLimitKnownCallerAuditedInAggregate: a caller the policy knows, past its rate, is
// refused before its request is read: a malformed request is not validated (RATE_LIMITED, not
// INVALID_ARGUMENT) and no refusal gets a line of its own.
func TestRateLimitKnownCallerAuditedInAggregate(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: limitsPolicy("")})
	c := dialAs(t, s, limitedID) // burst 2, no refill within the test
	_, pub := newUser(t)
	before := len(auditRecords(t, s.AuditPath))

	const n = 1000
	got := flood(t, n, func(ctx context.Context) error { _, err := c.Mint(ctx, probeReq(pub)); return err })
	if got[codes.OK] != 2 || got[codes.ResourceExhausted] != n-2 {
		t.Fatalf("outcomes %v, want 2 granted and %d ResourceExhausted", got, n-2)
	}
	for _, req := range []*signerv1.MintRequest{
		{Space: "../etc", Profile: signerv1.Profile(999), UserPublicKey: "not a key\r\n", RequestId: "bad id!"},
		{Space: "alpha", Profile: signerv1.Profile_PROFILE_PROBE, UserPublicKey: pub[:20] + "\r\n" + pub[20:]},
	} {
		_, err := c.Mint(ctxT(t), req)
		wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	}
	_, err := c.Remint(ctxT(t), &signerv1.RemintRequest{Space: "alpha", Jwt: "x"})
	wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")

	if recs := auditRecords(t, s.AuditPath)[before:]; len(recs) != 2 {
		t.Fatalf("%d audit lines before the flush, want the 2 grants: %+v", len(recs), recs)
	}
	recs := stop(t, s, before)
	if len(recs) != 3 {
		t.Fatalf("%d audit lines for 2 grants and %d refusals, want 3: %+v", len(recs), n+1, recs)
	}
	granted(limitedID, "Mint", "alpha", "probe", "").check(t, recs[0])
	granted(limitedID, "Mint", "alpha", "probe", "").check(t, recs[1])
	wantAggregate(t, recs[2], limitedID, "Mint,Remint", "rate-limited", n-2+3)
}

// TestRateLimitCertWithoutIdentity: a CA-valid certificate without a URI SAN is limited by
// its fingerprint; its aggregate line names the fingerprint.
func TestRateLimitCertWithoutIdentity(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: limitsPolicy("")})
	files := s.ClientSpec(t, mtls.LeafSpec{CommonName: "no identity"})
	c := dial(t, s.Addr, files)
	before := len(auditRecords(t, s.AuditPath))

	const n = 500
	got := flood(t, n, func(ctx context.Context) error {
		_, err := c.GetSpace(ctx, &signerv1.GetSpaceRequest{Space: "alpha"})
		return err
	})
	if got[codes.Unauthenticated] != unknownBurst || got[codes.ResourceExhausted] != n-unknownBurst {
		t.Fatalf("outcomes %v, want %d Unauthenticated and %d ResourceExhausted", got, unknownBurst, n-unknownBurst)
	}
	recs := stop(t, s, before)
	if len(recs) != unknownBurst+1 {
		t.Fatalf("%d audit lines for %d refusals, want %d: %+v", len(recs), n, unknownBurst+1, recs)
	}
	for _, r := range recs[:unknownBurst] {
		if r.Caller != "-" || r.Reason != "unauthenticated" {
			t.Fatalf("audit line %+v, want caller - and reason unauthenticated", r)
		}
	}
	wantAggregate(t, recs[unknownBurst], "sha256:"+fingerprint(t, files.CertFile), "GetSpace", "rate-limited", n-unknownBurst)
}

// fingerprint is the hex SHA-256 of the certificate in a PEM file.
func fingerprint(t *testing.T, certFile string) string {
	t.Helper()
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s holds no PEM block", certFile)
	}
	sum := sha256.Sum256(block.Bytes)
	return hex.EncodeToString(sum[:])
}

// TestRateLimitLegitimateCallerDuringFlood: another identity's flood does not take a known
// caller's rate; only the global cap, shared by all, ends its grants.
func TestRateLimitLegitimateCallerDuringFlood(t *testing.T) {
	const globalBurst = 40
	s := signerdtest.Start(t, signerdtest.Options{Policy: limitsPolicy(fmt.Sprintf("  global: {per_second: 0.0001, burst: %d}\n", globalBurst))})
	attacker, manager := dialAs(t, s, stranger), dialAs(t, s, managerAlpha)
	_, pub := newUser(t)
	before := len(auditRecords(t, s.AuditPath))

	// The flood runs until the manager is done; it has spent its burst once it is refused.
	var exhausted, floodCalls atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, err := attacker.Mint(ctxT(t), probeReq(pub))
				floodCalls.Add(1)
				if status.Code(err) == codes.ResourceExhausted {
					exhausted.Add(1)
				}
			}
		})
	}
	// Stop the flood however the test ends, before its connection is closed.
	stopFlood := sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(stopFlood)
	testkit.Eventually(t, 5*time.Second, func() error {
		if exhausted.Load() == 0 {
			return fmt.Errorf("flood not yet past its burst")
		}
		return nil
	})

	// The global bucket has globalBurst tokens; the flood took unknownBurst of them.
	grants := 0
	var err error
	for range globalBurst {
		if _, err = manager.Mint(ctxT(t), probeReq(pub)); err != nil {
			break
		}
		grants++
	}
	stopFlood()
	if want := globalBurst - unknownBurst; grants != want {
		t.Fatalf("manager granted %d during the flood, then %v; want %d (the global burst less the flood's)", grants, err, want)
	}
	wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")

	recs := aggregates(stop(t, s, before))
	if len(recs) != 2 {
		t.Fatalf("aggregate lines %+v, want one for the flood and one for the manager", recs)
	}
	for _, r := range recs {
		switch r.Caller {
		case stranger:
			wantAggregate(t, r, stranger, "Mint", "rate-limited", uint64(floodCalls.Load()-unknownBurst))
		case managerAlpha:
			wantAggregate(t, r, managerAlpha, "Mint", "global-rate-limited", 1)
		default:
			t.Fatalf("aggregate line for %q", r.Caller)
		}
	}
}

// TestRateLimitRefusalsFlushedEveryInterval: the counts are written while serving, every
// limits.refusal_audit_interval, not only at stop.
func TestRateLimitRefusalsFlushedEveryInterval(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: limitsPolicy("  refusal_audit_interval: 1s\n")})
	c := dialAs(t, s, stranger)
	_, pub := newUser(t)
	const n = 50
	got := flood(t, n, func(ctx context.Context) error { _, err := c.Mint(ctx, probeReq(pub)); return err })
	if got[codes.ResourceExhausted] != n-unknownBurst {
		t.Fatalf("outcomes %v, want %d ResourceExhausted", got, n-unknownBurst)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		var sum uint64
		for _, r := range aggregates(auditRecords(t, s.AuditPath)) {
			sum += r.Count
		}
		if sum != n-unknownBurst {
			return fmt.Errorf("aggregate lines count %d refusals, want %d", sum, n-unknownBurst)
		}
		return nil
	})
	verifyAudit(t, s.AuditPath)
}

// BenchmarkFloodUnknownCaller reproduces the measurement of finding 3: one identity the policy
// does not know floods Mint from 8 goroutines on one connection for 3 s; it reports the
// refusals and what they cost in audit bytes and lines. It runs for a fixed time whatever
// -benchtime says (use -benchtime=1x).
func BenchmarkFloodUnknownCaller(b *testing.B) {
	s := signerdtest.Start(b, signerdtest.Options{})
	tlsCfg, _, err := mtls.NewClientTLS(s.Client(b, stranger), "localhost")
	if err != nil {
		b.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	c := signerv1.NewSignerServiceClient(conn)
	kp, err := nkeys.CreateUser()
	if err != nil {
		b.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		b.Fatal(err)
	}
	sizeBefore := fileSize(b, s.AuditPath)
	linesBefore := fileLines(b, s.AuditPath)
	var denials atomic.Int64
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				_, err := c.Mint(ctx, probeReq(pub))
				cancel()
				if err != nil {
					denials.Add(1)
				}
			}
		})
	}
	wg.Wait()
	s.Serve.Stop() // writes the counts
	b.ReportMetric(float64(denials.Load()), "denials/3s")
	b.ReportMetric(float64(fileSize(b, s.AuditPath)-sizeBefore), "audit-bytes/3s")
	b.ReportMetric(float64(fileLines(b, s.AuditPath)-linesBefore), "audit-lines/3s")
}

func fileSize(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Size()
}

func fileLines(tb testing.TB, path string) int {
	tb.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, c := range data {
		if c == '\n' {
			n++
		}
	}
	return n
}
