package signerdtest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestKill9UnderLoadKeepsAnsweredLines (issue 26, the pipelined audit writer): a real signerd
// process is killed with SIGKILL ten times while eight clients mint through it, and restarted on
// the same audit file each time. After every restart (which cuts a torn final line, if the kill
// left one) the file verifies as one chain from seq 1; every Mint that was answered, in any
// round, has its granted line there with the answered jti under its request id; and the chain
// continues across the restarts: the head verified after the previous restart is still the line
// at its seq, and the new lines follow it.
func TestKill9UnderLoadKeepsAnsweredLines(t *testing.T) {
	const (
		rounds    = 10
		workers   = 8
		killAfter = 120 // answered calls per round before the kill
	)
	s := signerdtest.Start(t, signerdtest.Options{})
	bin := signerdtest.Build(t)
	p := s.StartProcess(t, bin, "crash-1")
	tlsCfg, _, err := mtls.NewClientTLS(s.ClientFor(t, mtls.KindManagerd, "alpha"), "localhost")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}

	answered := map[string]string{} // request id -> jti, every round
	var prev audit.Head             // the head verified after the previous restart
	for round := range rounds {
		conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
		if err != nil {
			t.Fatal(err)
		}
		client := signerv1.NewSignerServiceClient(conn)
		var (
			mu         sync.Mutex
			got        = map[string]string{}
			beforeKill []error // a call that failed while the process was alive
			killed     atomic.Bool
			wg         sync.WaitGroup
		)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					id := fmt.Sprintf("crash-r%02d-w%d-%06d", round, w, i)
					resp, err := client.Mint(ctx, &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT,
						UserPublicKey: pub, RequestId: id, Params: agentParams()})
					mu.Lock()
					if err == nil {
						got[id] = resp.GetCredential().GetJti()
					} else if !killed.Load() {
						beforeKill = append(beforeKill, err)
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
		deadline := time.After(20 * time.Second)
		tick := time.NewTicker(time.Millisecond)
		for {
			mu.Lock()
			n, bad := len(got), len(beforeKill)
			mu.Unlock()
			if n >= killAfter || bad > 0 {
				break
			}
			select {
			case <-tick.C:
			case <-deadline:
				t.Fatalf("round %d: %d calls answered within 20s, want %d", round, n, killAfter)
			}
		}
		tick.Stop()
		killed.Store(true)
		p.Kill(t)
		wg.Wait()
		cancel()
		_ = conn.Close()
		if len(beforeKill) > 0 {
			t.Fatalf("round %d: %d calls failed before the kill; first: %v", round, len(beforeKill), beforeKill[0])
		}
		for id, jti := range got {
			answered[id] = jti
		}

		p.Restart(t)
		lines, head := auditLines(t, p.AuditPath)
		for id, jti := range answered {
			l, ok := lines[id]
			if !ok {
				t.Fatalf("round %d: call %s was answered (jti %s) but has no audit line", round, id, jti)
			}
			if l.JTI != jti || l.Decision != "granted" || l.RPC != "Mint" {
				t.Fatalf("round %d: call %s: line %+v, want a granted Mint with jti %s", round, id, l, jti)
			}
		}
		if head.Seq < prev.Seq+uint64(len(got)) {
			t.Fatalf("round %d: chain head seq %d, want at least %d (the previous head %d and this round's %d answered calls)",
				round, head.Seq, prev.Seq+uint64(len(got)), prev.Seq, len(got))
		}
		if prev.Seq > 0 {
			if h := lineAt(t, p.AuditPath, prev.Seq); h != prev.Hash {
				t.Fatalf("round %d: the line at seq %d has hash %s, want the previous round's head %s: the chain did not continue", round, prev.Seq, h, prev.Hash)
			}
		}
		prev = head
		t.Logf("round %d: %d calls answered, head seq %d", round, len(got), head.Seq)
	}
	torn, err := filepath.Glob(p.AuditPath + ".torn.*")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d answered calls over %d kills, all audited; %d torn tails cut at restart", len(answered), rounds, len(torn))
}

// auditLine is the part of an audit line the crash test checks.
type auditLine struct {
	Seq       uint64 `json:"seq"`
	RPC       string `json:"rpc"`
	JTI       string `json:"jti"`
	RequestID string `json:"request_id"`
	Decision  string `json:"decision"`
	Hash      string `json:"hash"`
}

// auditLines verifies the audit file set at path (rotated files first) as one chain from seq 1
// and returns its lines by request id and the chain's head.
func auditLines(t *testing.T, path string) (map[string]auditLine, audit.Head) {
	t.Helper()
	rotated, err := audit.Rotated(path)
	if err != nil {
		t.Fatal(err)
	}
	files := append(rotated, path)
	sum, err := audit.VerifyFiles(files, audit.FilesOptions{})
	if err != nil {
		t.Fatalf("audit verify: %v", err)
	}
	if len(sum.Chains) != 1 || sum.Chains[0].Seq != uint64(sum.Lines) {
		t.Fatalf("audit summary %+v: want one chain from seq 1 with a line per seq", sum)
	}
	out := map[string]auditLine{}
	for _, f := range files {
		for _, l := range readAudit(t, f) {
			if l.RequestID != "" {
				if _, dup := out[l.RequestID]; dup {
					t.Fatalf("request id %s audited twice", l.RequestID)
				}
				out[l.RequestID] = l
			}
		}
	}
	return out, sum.Chains[0]
}

// lineAt returns the hash of the line with seq in the file at path.
func lineAt(t *testing.T, path string, seq uint64) string {
	t.Helper()
	for _, l := range readAudit(t, path) {
		if l.Seq == seq {
			return l.Hash
		}
	}
	return ""
}

func readAudit(t *testing.T, path string) []auditLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []auditLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l auditLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// agentParams are an agent's parameters DefaultPolicy grants to managerd.
func agentParams() *signerv1.ProfileParams {
	return &signerv1.ProfileParams{
		Owner: "u_owner", Actor: "bot", LifecycleUid: "0123456789abcdefghijklmnop",
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"},
	}
}
