package authority

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cotalgo/cotal/authd/internal/connz"
	"github.com/cotalgo/cotal/pkg/space"
)

// Containment (barrier step 4). Upstream revokes the lifecycle's credential-ledger rows and
// verify-evicts its principals with a $SYS credential; Go's authd holds none, and an agent's
// broker credential is the callout's grant, which expires with its bearer (at most 300 s). So
// containment here is: no new credential, then no connection left.
//
//  1. Wait out the callouts that were being served when the gate froze (Config.Callouts): a
//     callout that began after the freeze read the frozen gate and refused.
//  2. Poll the account's connections (one account CONNZ round, connz.Sweeper, every expected
//     server answering) until two consecutive rounds list no connection of the alias. The
//     second round covers a connection whose grant was answered just before the freeze and that
//     the broker had not yet registered at the first.
//
// A connection of the alias still listed at the freeze + ContainWindow, a callout wait that
// does not end by then, or a round that is inconclusive (no answer, a server missing, a
// malformed answer) stops the barrier with unavailable: the gate stays frozen and the head
// retiring, and a later call (or the next start's Resume) contains again.
//
// A connection is the alias's when the broker names it by the callout grant's user name
// <owner>-<actor> (authorized_user or name_tag), tags it principal:<owner>.<actor>, or its
// connection name is one of the alias's bound inbox nonces (<InboxTag(owner, actor)>-...,
// which the callout grants to no other principal).

// connzPage is the connections one CONNZ answer lists at a time (with auth fields each is about
// a kilobyte, under connz.MaxAnswer), and maxConnzPages bounds the pages of one round.
const (
	connzPage     = 256
	maxConnzPages = 64
)

func (a *Authority) contain(ctx context.Context, t target, frozenAt time.Time) error {
	deadline := frozenAt.Add(a.containWindow)
	if a.cfg.Callouts != nil {
		wait := max(deadline.Sub(a.now()), time.Second)
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := a.cfg.Callouts.WaitIdle(wctx)
		cancel()
		if err != nil {
			return &Error{Code: CodeUnavailable, Msg: "the callouts in flight at the freeze did not finish", Err: err}
		}
	}
	tag, err := space.InboxTag(t.owner, t.actor)
	if err != nil {
		return refuse(CodeBadRequest, "%v", err)
	}
	clean := 0
	for {
		a.rounds.Add(1)
		n, err := a.connections(ctx, t, tag)
		if err != nil {
			return &Error{Code: CodeUnavailable, Msg: "the account's connections could not be listed", Err: err}
		}
		if n == 0 {
			if clean++; clean == 2 {
				return nil
			}
		} else {
			clean = 0
			if !a.now().Before(deadline) {
				return refuse(CodeUnavailable, "%d connection(s) of %s still live %v after the freeze", n, t.principal(), a.containWindow)
			}
		}
		select {
		case <-ctx.Done():
			return &Error{Code: CodeUnavailable, Msg: "containment stopped", Err: ctx.Err()}
		case <-time.After(a.containPoll):
		}
	}
}

// connections is one CONNZ round: how many open connections of the alias the account lists.
func (a *Authority) connections(ctx context.Context, t target, tag string) (int, error) {
	stream, err := a.names.BucketStream(space.Auth)
	if err != nil {
		return 0, err
	}
	nc := a.store.nc
	if a.connzNC != nil {
		nc = a.connzNC
	}
	sw := connz.Sweeper{NC: nc, Stream: stream, Window: a.sweepWindow, Settle: a.sweepSettle}
	jwtName := t.owner + "-" + t.actor
	ptag := "principal:" + t.principal()
	found := 0
	for page := range maxConnzPages {
		offset := page * connzPage
		body, _ := json.Marshal(map[string]any{"auth": true, "offset": offset, "limit": connzPage})
		more := false
		err := sw.Sweep(ctx, body, func(data []byte) (string, string, error) {
			ans, err := connz.Decode(data)
			if err != nil {
				return "", "", err
			}
			for _, c := range ans.Conns {
				if c.AuthorizedUser == jwtName || c.NameTag == jwtName || slices.Contains(c.Tags, ptag) || strings.HasPrefix(c.Name, tag+"-") {
					found++
				}
			}
			if ans.Total > offset+len(ans.Conns) {
				more = true
			}
			return ans.ServerID, ans.ServerName, nil
		})
		if err != nil {
			return 0, err
		}
		if !more {
			return found, nil
		}
	}
	return 0, fmt.Errorf("more than %d connections on one server", maxConnzPages*connzPage)
}

// LateIdler is the Config.Callouts of an authority built before its callout responder: boot
// resume runs before the callout subscribes, so the responder is Set once it exists. Until then
// no callout of this process is in flight and WaitIdle returns at once.
type LateIdler struct {
	p atomic.Pointer[Idler]
}

// Set makes i the responder WaitIdle waits on.
func (l *LateIdler) Set(i Idler) { l.p.Store(&i) }

// WaitIdle is the set responder's WaitIdle, or nil before Set.
func (l *LateIdler) WaitIdle(ctx context.Context) error {
	if p := l.p.Load(); p != nil && *p != nil {
		return (*p).WaitIdle(ctx)
	}
	return nil
}

var _ Idler = (*LateIdler)(nil)
