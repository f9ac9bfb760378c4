package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// Finding 8 of issue 7: the idempotency cache was bounded by entry count (about 15 GB at 149 KB
// per large agent credential), its eviction was global (one caller pushed out another's
// entries, whose retries then minted twice), and a replay returned a credential minted under an
// older policy.

var idemNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const idemPolicy = "policy-1"

// idemResp is a Mint answer whose credential holds a JWT of n bytes.
func idemResp(n int) *signerv1.MintResponse {
	return &signerv1.MintResponse{Credential: &signerv1.Credential{Jwt: strings.Repeat("j", n)}}
}

// idemSize is what the cache charges for resp under key.
func idemSize(key idemKey, resp proto.Message) int64 {
	return int64(proto.Size(resp)+len(key.caller)+len(key.requestID)) + idemEntryOverhead
}

func idemPut(t *testing.T, c *idemCache, caller, id string, resp proto.Message) {
	t.Helper()
	if stored, same := c.put(idemKey{caller, id}, [32]byte{1}, idemPolicy, resp, idemNow); stored != resp || !same {
		t.Fatalf("put(%s, %s) kept another answer", caller, id)
	}
}

func idemHas(c *idemCache, caller, id string) bool {
	_, _, found := c.get(idemKey{caller, id}, [32]byte{1}, idemPolicy, idemNow)
	return found
}

// checkIdemBooks asserts the cache's byte counts add up and stay within its bounds.
func checkIdemBooks(t *testing.T, c *idemCache) {
	t.Helper()
	var total int64
	for name, o := range c.callers {
		var own int64
		for el := o.order.Front(); el != nil; el = el.Next() {
			own += el.Value.(*idemEntry).size
		}
		if own != o.bytes || own > c.callerMax || own == 0 {
			t.Fatalf("caller %s: entries weigh %d, books say %d, quota %d", name, own, o.bytes, c.callerMax)
		}
		total += own
	}
	if total != c.bytes || total > c.max || c.order.Len() != len(c.entries) {
		t.Fatalf("cache: entries weigh %d, books say %d, budget %d; %d in order, %d in map", total, c.bytes, c.max, c.order.Len(), len(c.entries))
	}
}

func TestIdemCacheBoundedByBytes(t *testing.T) {
	const small, large = 100, 150 << 10 // a probe credential; a large agent credential
	key := idemKey{"spiffe://td/a", "r-000"}
	budget := 10 * idemSize(key, idemResp(large))
	c := newIdemCache(time.Hour, budget, budget)
	for i := range 100 {
		idemPut(t, c, "spiffe://td/a", fmt.Sprintf("r-%03d", i), idemResp(large))
		checkIdemBooks(t, c)
	}
	if n := len(c.entries); n != 10 {
		t.Fatalf("%d large entries kept in a budget of 10, want 10", n)
	}
	// The newest are kept, the oldest went.
	if !idemHas(c, "spiffe://td/a", "r-099") || idemHas(c, "spiffe://td/a", "r-089") {
		t.Fatal("eviction did not drop the oldest entries first")
	}
	// The same budget holds many more small answers: it counts bytes, not entries.
	c = newIdemCache(time.Hour, budget, budget)
	for i := range 1000 {
		idemPut(t, c, "spiffe://td/a", fmt.Sprintf("r-%03d", i), idemResp(small))
	}
	checkIdemBooks(t, c)
	if n := len(c.entries); n != 1000 {
		t.Fatalf("%d small entries kept, want all 1000", n)
	}
}

func TestIdemCacheCallerQuotaEvictsOwnEntries(t *testing.T) {
	const jwt = 1000
	one := idemSize(idemKey{"spiffe://td/a", "r-000"}, idemResp(jwt))
	c := newIdemCache(time.Hour, 100*one, 5*one)
	idemPut(t, c, "spiffe://td/b", "b-000", idemResp(jwt))
	for i := range 50 {
		idemPut(t, c, "spiffe://td/a", fmt.Sprintf("r-%03d", i), idemResp(jwt))
		checkIdemBooks(t, c)
	}
	if got := c.callers["spiffe://td/a"].order.Len(); got != 5 {
		t.Fatalf("caller a holds %d entries, want its quota of 5", got)
	}
	if !idemHas(c, "spiffe://td/b", "b-000") {
		t.Fatal("caller a over its quota evicted caller b's entry")
	}
	if !idemHas(c, "spiffe://td/a", "r-049") || idemHas(c, "spiffe://td/a", "r-044") {
		t.Fatal("caller a over its quota did not lose its own oldest")
	}
}

// TestIdemCacheFullBudgetEvictsHeaviest: when the shares add up to more than the budget, a full
// cache drops the oldest entry of the caller holding the most, not the oldest overall.
func TestIdemCacheFullBudgetEvictsHeaviest(t *testing.T) {
	const jwt = 1000
	one := idemSize(idemKey{"spiffe://td/a", "r-000"}, idemResp(jwt))
	c := newIdemCache(time.Hour, 10*one, 8*one)
	idemPut(t, c, "spiffe://td/b", "b-000", idemResp(jwt)) // the oldest entry of all
	idemPut(t, c, "spiffe://td/b", "b-001", idemResp(jwt))
	for i := range 40 {
		idemPut(t, c, "spiffe://td/a", fmt.Sprintf("r-%03d", i), idemResp(jwt))
		checkIdemBooks(t, c)
	}
	if !idemHas(c, "spiffe://td/b", "b-000") || !idemHas(c, "spiffe://td/b", "b-001") {
		t.Fatal("a full cache evicted the light caller's entries")
	}
	if got := c.callers["spiffe://td/a"].order.Len(); got != 8 {
		t.Fatalf("heavy caller holds %d entries, want 8", got)
	}
}

func TestIdemCacheRefusesEntryOverQuota(t *testing.T) {
	c := newIdemCache(time.Hour, 1<<20, 4<<10)
	idemPut(t, c, "spiffe://td/a", "small", idemResp(100))
	resp := idemResp(8 << 10)
	if stored, same := c.put(idemKey{"spiffe://td/a", "huge"}, [32]byte{1}, idemPolicy, resp, idemNow); stored != resp || !same {
		t.Fatal("put of an entry over the quota did not hand back its own answer")
	}
	if idemHas(c, "spiffe://td/a", "huge") || !idemHas(c, "spiffe://td/a", "small") {
		t.Fatal("an entry over the quota was kept, or pushed out the caller's others")
	}
	checkIdemBooks(t, c)
}

// TestIdemCacheTiedToPolicy: an answer is served only under the policy it was granted under.
func TestIdemCacheTiedToPolicy(t *testing.T) {
	c := newIdemCache(time.Hour, 1<<20, 1<<20)
	key, digest := idemKey{"spiffe://td/a", "r-1"}, [32]byte{1}
	old := idemResp(100)
	c.put(key, digest, "policy-1", old, idemNow)
	if resp, same, found := c.get(key, digest, "policy-1", idemNow); !found || !same || resp != old {
		t.Fatal("answer not served under its own policy")
	}
	if _, _, found := c.get(key, digest, "policy-2", idemNow); found {
		t.Fatal("answer granted under policy-1 served under policy-2")
	}
	if len(c.entries) != 0 {
		t.Fatal("stale entry kept after a get under another policy")
	}
	checkIdemBooks(t, c)
	// A put under the new policy replaces one left under the old (as a racing put would find).
	c.put(key, digest, "policy-1", old, idemNow)
	fresh := idemResp(120)
	if stored, same := c.put(key, digest, "policy-2", fresh, idemNow); stored != fresh || !same {
		t.Fatal("put under a new policy kept the old policy's answer")
	}
	if resp, _, found := c.get(key, digest, "policy-2", idemNow); !found || resp != fresh {
		t.Fatal("the new policy's answer is not served")
	}
	checkIdemBooks(t, c)
}

func TestIdemCacheExpires(t *testing.T) {
	c := newIdemCache(time.Minute, 1<<20, 1<<20)
	key := idemKey{"spiffe://td/a", "r-1"}
	c.put(key, [32]byte{1}, idemPolicy, idemResp(100), idemNow)
	if _, _, found := c.get(key, [32]byte{1}, idemPolicy, idemNow.Add(time.Minute)); found {
		t.Fatal("entry served at the end of its window")
	}
	if c.bytes != 0 || len(c.callers) != 0 {
		t.Fatalf("expired entry still counted: %d bytes, %d callers", c.bytes, len(c.callers))
	}
}
