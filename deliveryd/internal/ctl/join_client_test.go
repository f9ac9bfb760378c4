package ctl_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestAgentJoin: pkg/dlvclient.Join, the agent side of durableJoin, against the real responder:
// a join is durable at generation 1 for the agent's lifecycle and writes the membership row; a
// repeat is the same membership; a channel outside the caller's ACL is a RefusedError with
// deliveryd's reason; a uid that is not the caller's live lifecycle is refused by the client
// (ErrBadReply), and with the responder unbound the join fails fast with ErrNoResponders.
func TestAgentJoin(t *testing.T) {
	f := setup(t, nil, nil)
	a1, a2 := f.e.Agent(t, "a1", uid1), f.e.Agent(t, "a2", uid2)
	owner := plane3test.Owner

	res, err := dlvclient.Join(plane3test.Ctx(t), a1, f.e.N, owner, "a1", uid1, "general")
	if err != nil || !res.Durable || res.Generation != 1 || res.LifecycleUID != uid1 {
		t.Fatalf("join: %+v, %v", res, err)
	}
	if m := f.member(t, "general", "a1", uid1); m == nil || !m.Activated || m.Generation != 1 {
		t.Fatalf("membership row after the join: %+v", m)
	}
	again, err := dlvclient.Join(plane3test.Ctx(t), a1, f.e.N, owner, "a1", uid1, "general")
	if err != nil || again != res {
		t.Fatalf("repeated join: %+v, %v; want %+v", again, err, res)
	}

	_, err = dlvclient.Join(plane3test.Ctx(t), a2, f.e.N, owner, "a2", uid2, "team.backend")
	var re *dlvclient.RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Message, "not within your read ACL") {
		t.Fatalf("join outside the ACL: %v", err)
	}
	if m := f.member(t, "team.backend", "a2", uid2); m != nil {
		t.Fatalf("a refused join wrote a row: %+v", m)
	}

	if _, err := dlvclient.Join(plane3test.Ctx(t), a2, f.e.N, owner, "a2", uid1, "general"); !errors.Is(err, dlvclient.ErrBadReply) {
		t.Fatalf("join naming another lifecycle: %v, want ErrBadReply", err)
	}

	f.r.Stop()
	if err := f.dc.Flush(); err != nil { // the broker has processed the unsubscriptions
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := dlvclient.Join(plane3test.Ctx(t), a1, f.e.N, owner, "a1", uid1, "general"); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("join without a responder: %v, want ErrNoResponders", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("join without a responder took %v", d)
	}
}
