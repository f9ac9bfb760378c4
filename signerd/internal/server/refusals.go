package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// Refusals past a rate limit are not audited one by one: a flood would cost one fsynced line per
// request and fill the disk. begin refuses them before the request is read, finish counts them
// here, and Service.Run writes one line per caller and reason per interval with the count.

// Bounds of the refusal tally.
const (
	// MaxTalliedCallers bounds the callers counted separately in one interval; refusals of any
	// further caller are counted under OverflowCaller, so an attacker holding many certificates
	// costs at most MaxTalliedCallers+1 lines per reason and interval.
	MaxTalliedCallers = 1024
	// OverflowCaller is the caller of the aggregate line for callers beyond MaxTalliedCallers.
	OverflowCaller = "*"
	// finalFlushTimeout bounds the last write of the tally when Run stops.
	finalFlushTimeout = 5 * time.Second
)

// CertKeyPrefix starts the rate-limit key, and the audit caller of the aggregate line, of a
// client certificate without a usable identity: the hex SHA-256 of the leaf certificate follows.
const CertKeyPrefix = "sha256:"

// certKey is the rate-limit key of the verified leaf certificate of ctx's peer, or "-" when
// there is none (a listener without verified client certificates: all such callers share one
// bucket, which still bounds them).
func certKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return "-"
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "-"
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "-"
	}
	sum := sha256.Sum256(chains[0][0].Raw)
	return CertKeyPrefix + hex.EncodeToString(sum[:])
}

type tallyKey struct {
	caller string
	reason policy.Reason
}

type tallyCount struct {
	first time.Time
	count uint64
	rpcs  map[policy.RPC]bool
}

// refusalTally counts refusals past a rate limit until they are written.
type refusalTally struct {
	mu     sync.Mutex
	counts map[tallyKey]*tallyCount // guarded by mu
}

func newRefusalTally() *refusalTally {
	return &refusalTally{counts: map[tallyKey]*tallyCount{}}
}

// add counts one refusal of rpc for caller at t.
func (rt *refusalTally) add(caller string, reason policy.Reason, rpc policy.RPC, t time.Time) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.addLocked(tallyKey{caller, reason}, &tallyCount{first: t, count: 1, rpcs: map[policy.RPC]bool{rpc: true}})
}

// addLocked merges n into k's count. rt.mu must be held.
func (rt *refusalTally) addLocked(k tallyKey, n *tallyCount) {
	cur := rt.counts[k]
	if cur == nil && len(rt.counts) >= MaxTalliedCallers {
		k.caller = OverflowCaller
		cur = rt.counts[k]
	}
	if cur == nil {
		rt.counts[k] = n
		return
	}
	cur.count += n.count
	if n.first.Before(cur.first) {
		cur.first = n.first
	}
	for r := range n.rpcs {
		cur.rpcs[r] = true
	}
}

// take empties the tally and returns what it held, oldest first.
func (rt *refusalTally) take() []audit.Record {
	rt.mu.Lock()
	counts := rt.counts
	rt.counts = map[tallyKey]*tallyCount{}
	rt.mu.Unlock()
	out := make([]audit.Record, 0, len(counts))
	for k, n := range counts {
		var rpcs []string
		for _, r := range policy.RPCs() {
			if n.rpcs[r] {
				rpcs = append(rpcs, string(r))
			}
		}
		out = append(out, audit.Record{Time: n.first, Caller: k.caller, RPC: strings.Join(rpcs, ","),
			Decision: audit.Denied, Reason: string(k.reason), Count: n.count})
	}
	slices.SortFunc(out, func(a, b audit.Record) int {
		return cmp.Or(a.Time.Compare(b.Time), strings.Compare(a.Caller, b.Caller), strings.Compare(a.Reason, b.Reason))
	})
	return out
}

// putBack returns a record take handed out and the log did not accept, to be tried again.
func (rt *refusalTally) putBack(r audit.Record) {
	rpcs := map[policy.RPC]bool{}
	for name := range strings.SplitSeq(r.RPC, ",") {
		rpcs[policy.RPC(name)] = true
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.addLocked(tallyKey{r.Caller, policy.Reason(r.Reason)}, &tallyCount{first: r.Time, count: r.Count, rpcs: rpcs})
}

// Run writes the refusals past a rate limit to the audit log every interval (the policy's
// limits.refusal_audit_interval, read again after each write), one line per caller and reason,
// with the count, the RPCs refused (comma-separated) and the time of the first. It returns nil
// once ctx is done, after writing what was counted until then; stop serving first, so nothing
// is counted after that last write. signerd must run it for as long as it serves: until then,
// refusals past a rate are counted in memory and in the metrics only.
func (s *Service) Run(ctx context.Context) error {
	interval := s.policy.Current().Limits().RefusalAuditInterval
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			s.flushRefusals(fctx)
			cancel()
			return nil
		case <-t.C:
			s.flushRefusals(ctx)
			if next := s.policy.Current().Limits().RefusalAuditInterval; next != interval {
				interval = next
				t.Reset(interval)
			}
		}
	}
}

// flushRefusals writes the tally. A line the log refuses is put back for the next interval,
// so a log that recovers still records the refusals.
func (s *Service) flushRefusals(ctx context.Context) {
	for _, r := range s.refusals.take() {
		if err := s.audit.Append(ctx, r); err != nil {
			s.log.Error("audit append of rate-limit refusals failed; keeping the count for the next interval",
				"caller", r.Caller, "reason", r.Reason, "count", r.Count, "err", err)
			s.refusals.putBack(r)
		}
	}
}
