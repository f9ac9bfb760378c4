package signerclient

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// replicaEnv is two signerd replicas on one init directory, a broker that trusts them and a
// managerd client that knows both addresses.
type replicaEnv struct {
	s      *signerdtest.Signer
	a, b   *signerdtest.Replica
	url    string
	client *Client
}

func startReplicas(t *testing.T, policy string) *replicaEnv {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Policy: policy, Replicas: 2})
	c, err := Dial(Config{Addrs: s.Addrs(), TLS: s.ClientFor(t, mtls.KindManagerd, testSpace),
		ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd", CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &replicaEnv{s: s, a: s.Replicas[0], b: s.Replicas[1], url: s.StartBroker(t), client: c}
}

// lines is the number of audit lines in each replica's file, every file verified on its own.
func (e *replicaEnv) lines(t *testing.T) (a, b int) {
	t.Helper()
	return e.a.Audit(t).Lines, e.b.Audit(t).Lines
}

// mint mints an agent credential for a fresh key through the two-replica client.
func (e *replicaEnv) mint(t *testing.T) error {
	_, pub := newUser(t)
	_, err := e.client.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()})
	return err
}

// TestReplicasFailoverMidStream (issue 13 item 2): four workers mint through a client that knows
// both replicas; replica A is stopped after 40 of 160 calls. Every call succeeds, no call needed
// more than its one retry (the retry policy's maxAttempts 2) and at most one retried call per
// worker (what was in flight when A went); each call is audited exactly once, on the replica
// that answered it; after the stop every call lands on B; each file verifies alone and names its
// own replica.
func TestReplicasFailoverMidStream(t *testing.T) {
	e := startReplicas(t, "")
	const workers, total, stopAt = 4, 160, 40
	var (
		mu       sync.Mutex
		done     int
		failed   []error
		stopped  = make(chan struct{})
		afterB   int // calls started after A had stopped
		stopOnce sync.Once
	)
	a0, b0 := e.lines(t)
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range total {
			next <- i
		}
	}()
	var aBeforeStop, bBeforeStop int
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				select {
				case <-stopped:
					mu.Lock()
					afterB++
					mu.Unlock()
				default:
				}
				err := e.mint(t)
				mu.Lock()
				done++
				if err != nil {
					failed = append(failed, err)
				}
				n := done
				mu.Unlock()
				if n == stopAt {
					stopOnce.Do(func() {
						// Stop A from this worker while the other three keep calling.
						aBeforeStop, bBeforeStop = e.a.Audit(t).Lines-a0, e.b.Audit(t).Lines-b0
						e.a.Stop(t)
						close(stopped)
					})
				}
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed with a replica stopped, want none; first: %v", len(failed), total, failed[0])
	}
	if aBeforeStop == 0 || bBeforeStop == 0 {
		t.Fatalf("before the stop A audited %d and B %d calls, want both some (round_robin)", aBeforeStop, bBeforeStop)
	}
	if r := e.client.Retried(); r > workers {
		t.Fatalf("%d calls were retried, want at most %d (one per worker in flight at the stop)", r, workers)
	}
	aN, bN := e.lines(t)
	if got := (aN - a0) + (bN - b0); got != total {
		t.Fatalf("audited %d (A) + %d (B) = %d calls, want %d: each call exactly once", aN-a0, bN-b0, got, total)
	}
	if bN-b0 < bBeforeStop+afterB {
		t.Fatalf("B audited %d calls, want at least the %d before the stop and the %d started after it", bN-b0, bBeforeStop, afterB)
	}
	for _, r := range []*signerdtest.Replica{e.a, e.b} {
		if got := r.Audit(t).Replicas; !slices.Equal(got, []string{r.ID}) {
			t.Fatalf("%s holds chains %v, want only its own %s", filepath.Base(r.AuditPath), got, r.ID)
		}
	}
	if filepath.Base(e.b.AuditPath) != e.b.ID+".audit" {
		t.Fatalf("replica %s writes %s, want a file named by its id", e.b.ID, e.b.AuditPath)
	}
	t.Logf("before stop A=%d B=%d; after: A=%d B=%d; retried %d", aBeforeStop, bBeforeStop, aN-a0, bN-b0, e.client.Retried())

	// A restarts on its own file and chain and takes calls again.
	e.a.Restart(t)
	testkit.Eventually(t, 10*time.Second, func() error {
		before := e.a.Audit(t).Lines
		if err := e.mint(t); err != nil {
			return err
		}
		if err := e.mint(t); err != nil {
			return err
		}
		if e.a.Audit(t).Lines == before {
			return errors.New("restarted replica A takes no calls yet")
		}
		return nil
	})
}

// TestReplicasRemintOnOtherReplica (acceptance: authority continuity): a rail's credential is
// minted on one replica, that replica stops, and the renewal (Remint) lands on the other: it is
// accepted, proven on the broker and adopted, and a fresh connection made with it works.
func TestReplicasRemintOnOtherReplica(t *testing.T) {
	e := startReplicas(t, shortPolicy("1h", "own"))
	a0, b0 := e.lines(t)
	r, err := NewRail(RailConfig{Client: e.client, Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, Params: agentParams(), NatsURL: e.url})
	if err != nil {
		t.Fatalf("NewRail: %v", err)
	}
	t.Cleanup(r.Close)
	if err := r.Start(ctxT(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	firstJTI, _ := r.Current()
	aN, bN := e.lines(t)
	minter, other := e.a, e.b
	switch {
	case aN-a0 == 1 && bN == b0:
	case bN-b0 == 1 && aN == a0:
		minter, other = e.b, e.a
	default:
		t.Fatalf("the Mint was audited %d times on A and %d on B, want once on one", aN-a0, bN-b0)
	}
	minter.Stop(t)
	before := other.Audit(t).Lines
	got, err := r.RenewNow(ctxT(t))
	if err != nil {
		t.Fatalf("Remint on %s of a credential minted on %s: %v", other.ID, minter.ID, err)
	}
	// (A Remint in the same second as the Mint may yield the same jti: NATS derives it from the
	// claims, and both replicas sign the same claims with the same key.)
	t.Logf("minted %s on %s, reminted %s on %s", firstJTI, minter.ID, got.JTI, other.ID)
	if n := other.Audit(t).Lines; n != before+1 {
		t.Fatalf("%s audited %d lines for the renewal, want 1", other.ID, n-before)
	}
	c := connectChat(t, e.url, r.NatsOptions()...)
	if err := c.roundTrip(5 * time.Second); err != nil {
		t.Fatalf("connection with the credential reminted on %s: %v", other.ID, err)
	}
	if jwtNow := r.cur.Load().jwt; !strings.HasPrefix(jwtNow, "eyJ") {
		t.Fatal("adopted credential is not a JWT")
	} else if uc, err := jwt.DecodeUserClaims(jwtNow); err != nil || uc.ID != got.JTI || uc.Subject != r.PublicKey() {
		t.Fatalf("adopted credential %v (%v), want jti %s for %s", uc, err, got.JTI, r.PublicKey())
	}
}

// TestReplicasNotServingGetsNoCalls: a replica whose health is NOT_SERVING gets no call. First a
// drained replica (up, answering, health NOT_SERVING): once the client has seen it, 40 calls all
// land on the other. Then a replica whose audit disk fills: the one call that meets it is
// refused UNAVAILABLE and retried on the other, the replica turns NOT_SERVING and stops itself,
// and every call succeeds, each audited once on the healthy replica.
func TestReplicasNotServingGetsNoCalls(t *testing.T) {
	t.Run("ok/drained", func(t *testing.T) {
		e := startReplicas(t, "")
		for range 4 { // both subchannels up
			if err := e.mint(t); err != nil {
				t.Fatalf("mint: %v", err)
			}
		}
		e.a.Drain()
		testkit.Eventually(t, 10*time.Second, func() error {
			before := e.a.Audit(t).Lines
			for range 4 {
				if err := e.mint(t); err != nil {
					return err
				}
			}
			if n := e.a.Audit(t).Lines; n != before {
				return fmt.Errorf("drained replica A still took %d of 4 calls", n-before)
			}
			return nil
		})
		a0, b0 := e.lines(t)
		const n = 40
		for i := range n {
			if err := e.mint(t); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		aN, bN := e.lines(t)
		if aN != a0 || bN-b0 != n {
			t.Fatalf("with A NOT_SERVING, A audited %d and B %d of %d calls, want 0 and %d", aN-a0, bN-b0, n, n)
		}
	})
	t.Run("ok/audit-broken", func(t *testing.T) {
		e := startReplicas(t, "")
		for range 4 {
			if err := e.mint(t); err != nil {
				t.Fatalf("mint: %v", err)
			}
		}
		a0, b0 := e.lines(t)
		retried := e.client.Retried()
		e.a.BreakAudit()
		const n = 40
		for i := range n {
			if err := e.mint(t); err != nil {
				t.Fatalf("call %d with A's audit disk full: %v", i, err)
			}
		}
		if r := e.client.Retried() - retried; r > 1 {
			t.Fatalf("%d calls retried, want at most the one that met A", r)
		}
		if bN := e.b.Audit(t).Lines; bN-b0 != n {
			t.Fatalf("B audited %d of %d calls, want all", bN-b0, n)
		}
		// A stopped itself; its restart cuts the torn line, and its file then verifies alone with
		// no line from the calls after the break.
		e.a.Restart(t)
		if got := e.a.Audit(t); got.Lines != a0 || !slices.Equal(got.Replicas, []string{e.a.ID}) {
			t.Fatalf("A's file after restart: %+v, want %d lines of %s", got, a0, e.a.ID)
		}
	})
}

func TestDialAddresses(t *testing.T) {
	files := mtls.ClientFiles{CertFile: "c", KeyFile: "k", ServerCAFile: "ca"}
	tests := []struct {
		name  string
		addr  string
		addrs []string
		want  string // "" accepts the addresses (Dial then fails on the missing TLS files)
	}{
		{name: "ok/one", addr: "127.0.0.1:7443"},
		{name: "ok/list", addrs: []string{"127.0.0.1:7443", "signerd-2.example:7443", "unix:/run/cotal/signerd.sock", "[::1]:7443"}},
		{name: "fail/both", addr: "127.0.0.1:1", addrs: []string{"127.0.0.1:2"}, want: "both"},
		{name: "fail/none", want: "empty"},
		{name: "fail/duplicate", addrs: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"}, want: "twice"},
		{name: "fail/empty-entry", addrs: []string{"127.0.0.1:1", ""}, want: "host:port"},
		{name: "fail/no-port", addrs: []string{"127.0.0.1"}, want: "host:port"},
		{name: "fail/port-zero", addrs: []string{"127.0.0.1:0"}, want: "port"},
		{name: "fail/port-name", addrs: []string{"localhost:https"}, want: "port"},
		{name: "fail/no-host", addrs: []string{":7443"}, want: "port"},
		{name: "fail/unix-relative", addrs: []string{"unix:run/signerd.sock"}, want: "unix:/absolute/path"},
		{name: "fail/comma-list", addr: "127.0.0.1:1,127.0.0.1:2", want: "host:port"},
		{name: "fail/scheme", addr: "dns:///signerd:7443", want: "host:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Dial(Config{Addr: tt.addr, Addrs: tt.addrs, TLS: files})
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial succeeded without TLS files")
			}
			if tt.want == "" {
				if !strings.Contains(err.Error(), "TLS") {
					t.Fatalf("Dial = %v, want the addresses accepted and the TLS files refused", err)
				}
				return
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Dial = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestFileConfigAddresses: the signer: block takes address or addresses, and Missing names
// address when neither is set.
func TestFileConfigAddresses(t *testing.T) {
	f := FileConfig{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, CA: "ca", Cert: "c", Key: "k"}
	if m := f.Missing("signer."); len(m) != 0 {
		t.Fatalf("Missing = %v with addresses set, want none", m)
	}
	if cfg := f.ClientConfig(); !slices.Equal(cfg.Addrs, f.Addresses) || cfg.Addr != "" {
		t.Fatalf("ClientConfig = %+v, want Addrs %v", cfg, f.Addresses)
	}
	if got := f.Endpoint(); got != "127.0.0.1:1,127.0.0.1:2" {
		t.Fatalf("Endpoint = %q, want the addresses joined", got)
	}
	f.Addresses = nil
	if m := f.Missing("signer."); !slices.Equal(m, []string{"signer.address"}) {
		t.Fatalf("Missing = %v with no address, want [signer.address]", m)
	}
}

// TestReplicasKill9UnderLoad (acceptance: killing one replica under load): two signerd replicas
// run as child processes on one init directory; four workers mint through a client that knows
// both, and the replica is killed with SIGKILL after 40 of 160 calls. Every call succeeds, none
// after more than its one retry, at most one per worker (the calls in flight at the kill); each
// call is audited on the replica that answered it, and a call the dead replica answered but whose
// answer was lost is audited there and again on the survivor, so the audited lines number between
// the calls and the calls plus the retries.
func TestReplicasKill9UnderLoad(t *testing.T) {
	t.Parallel() // most of it is building signerd
	s := signerdtest.Start(t, signerdtest.Options{})
	bin := signerdtest.Build(t)
	p1, p2 := s.StartProcess(t, bin, "proc-1"), s.StartProcess(t, bin, "proc-2")
	c, err := Dial(Config{Addrs: []string{p1.Addr, p2.Addr}, TLS: s.ClientFor(t, mtls.KindManagerd, testSpace),
		ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd", CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })

	const workers, total, killAt = 4, 160, 40
	var (
		mu       sync.Mutex
		done     int
		failed   []error
		killOnce sync.Once
		wg       sync.WaitGroup
	)
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range total {
			next <- i
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				_, pub := newUser(t)
				_, err := c.Mint(ctxT(t), &signerv1.MintRequest{Space: testSpace, Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Params: agentParams()})
				mu.Lock()
				done++
				if err != nil {
					failed = append(failed, err)
				}
				n := done
				mu.Unlock()
				if n == killAt {
					killOnce.Do(func() { p1.Kill(t) })
				}
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed with a replica killed, want none; first: %v", len(failed), total, failed[0])
	}
	retried := c.Retried()
	if retried > workers {
		t.Fatalf("%d calls were retried, want at most %d (one per worker in flight at the kill)", retried, workers)
	}
	a, b := p1.Audit(t), p2.Audit(t)
	if a.Lines == 0 || b.Lines == 0 {
		t.Fatalf("audited %d lines on %s and %d on %s, want both some", a.Lines, p1.ID, b.Lines, p2.ID)
	}
	if sum := a.Lines + b.Lines; sum < total || sum > total+int(retried) {
		t.Fatalf("audited %d + %d = %d lines for %d calls with %d retried, want %d to %d", a.Lines, b.Lines, sum, total, retried, total, total+int(retried))
	}
	if !slices.Equal(a.Replicas, []string{p1.ID}) || !slices.Equal(b.Replicas, []string{p2.ID}) {
		t.Fatalf("chains %v and %v, want each file to hold only its own replica's", a.Replicas, b.Replicas)
	}
	t.Logf("%s audited %d, %s %d; %d calls retried", p1.ID, a.Lines, p2.ID, b.Lines, retried)
}

// TestReplicasUnixAndTCP: a list may mix a Unix socket and TCP; the client's own dialer reaches
// both (the socket forwards to replica A, byte for byte, so TLS is end to end) and calls spread
// over the two.
func TestReplicasUnixAndTCP(t *testing.T) {
	e := startReplicas(t, "")
	dir, err := os.MkdirTemp("", "sc") // a short path: socket names are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "a.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", e.a.Addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	c, err := Dial(Config{Addrs: []string{"unix:" + sock, e.b.Addr}, TLS: e.s.ClientFor(t, mtls.KindManagerd, testSpace)})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Round robin reaches a replica once its connection is ready, which under load may come after
	// the first calls: call until both have audited one (bounded), and every call is audited once.
	a0, b0 := e.lines(t)
	calls := 0
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.GetSpace(ctxT(t), testSpace); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		calls++
		aN, bN := e.lines(t)
		if aN-a0 > 0 && bN-b0 > 0 {
			if (aN-a0)+(bN-b0) != calls {
				t.Fatalf("A (over the socket) audited %d and B %d of %d calls, want %d in all", aN-a0, bN-b0, calls, calls)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d calls A (over the socket) audited %d and B %d, want both some", calls, aN-a0, bN-b0)
		}
	}
}
