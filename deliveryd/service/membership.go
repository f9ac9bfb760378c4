package service

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/deliveryd/internal/ctl"
	"github.com/cotalgo/cotal/deliveryd/internal/evict"
	"github.com/cotalgo/cotal/deliveryd/internal/membership"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// Membership is the configuration's membership section (Config.Membership): Feed runs the
// membership feed, LiveEviction wires ctl.delivery-admin's $SYS verbs. Both need signerd to
// mint deliveryd's membership-rw and $SYS credentials; without them delivery runs as before.
type Membership = config.Membership

// Warning codes of the membership side (daemon.Event codes).
const (
	// CodeMembership: the membership feed is off for want of its credentials or bucket, or a
	// running feed failed a poll or a renewal; delivery runs traffic-only.
	CodeMembership = "MEMBERSHIP"
	// CodeEviction: live eviction is configured but signerd refused its $SYS credential at start;
	// the $SYS verbs of ctl.delivery-admin refuse.
	CodeEviction = "EVICTION"
)

// sysParts are the membership feed and the $SYS executor (reference/delivery.md §4), both
// optional and fail-soft: without them delivery runs as before.
type sysParts struct {
	exec *evict.Executor
	feed *membership.Feed
}

// dialer is the $SYS dialer over the daemon's signer client, its account pinned to the delivery
// credential's own.
func (s *Service) dialer(extra []nats.Option) *evict.Dialer {
	return &evict.Dialer{Minter: s.signer, Space: s.cfg.Space, Account: s.rail.Account(), Brokers: s.cfg.Brokers, Options: extra}
}

// startExecutor wires the $SYS executor when the configuration asks for it: one membership-observer
// and one connection-evictor are minted and connected at start (the observer must name the
// daemon's own account: the tenancy check), so a policy that refuses either is reported now, and
// the verbs then refuse instead of failing per call.
func (s *Service) startExecutor(ctx context.Context, extra []nats.Option) ctl.Executor {
	if !s.cfg.Membership.LiveEviction {
		return nil
	}
	d := s.dialer(extra)
	// Both halves, or neither: a torn pair (an observer without an evictor) would scan and
	// never kick.
	var err error
	for _, p := range []signerv1.Profile{signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, signerv1.Profile_PROFILE_CONNECTION_EVICTOR} {
		var probe *evict.Conn
		if probe, err = d.Dial(ctx, p, "deliveryd-evict-check", false); err != nil {
			break
		}
		probe.Close()
	}
	if err == nil {
		s.sys.exec, err = evict.New(d, s.log)
	}
	if err != nil {
		s.warn(CodeEviction, "live eviction off: no $SYS credential; evictPrincipal, principalLiveness and planeConnLiveness refuse", err)
		return nil
	}
	s.log.Info("live eviction wired", "account", d.Account)
	return s.sys.exec
}

// startFeed runs the membership feed when the configuration asks for it; without its credentials
// or bucket it degrades to traffic-only with a warning, never stopping delivery.
func (s *Service) startFeed(ctx context.Context, extra []nats.Option) {
	if !s.cfg.Membership.Feed {
		return
	}
	f, err := membership.Start(ctx, membership.Config{
		Space: s.cfg.Space, Names: s.n, Observer: s.dialer(extra), Signer: s.signer, Brokers: s.cfg.Brokers,
		Options: extra, Poll: s.cfg.Membership.PollInterval.D(), Writer: s.rail.PublicKey(), Logger: s.log,
		Warn: func(msg string, err error) { s.warn(CodeMembership, msg, err) },
	})
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return
		}
		s.warn(CodeMembership, "membership feed off: delivery runs traffic-only", err)
		return
	}
	s.sys.feed = f
}

// closeSys stops the feed.
func (s *Service) closeSys() { s.sys.feed.Close() }
