// Package membership is deliveryd's membership feed (reference/delivery.md §4, upstream
// membership.ts): the broker-sourced record of which principals hold a live connection to the
// space, written to the derived bucket cotal_membership_<space>, one key per principal
// (owner.actor) and the heartbeat key "=feed".
//
// It is a separate module on two connections of its own, and fail-soft: delivery never depends on
// it. The membership-observer connection (a system-account user signerd mints for deliveryd,
// renewed by minting again at 75% of its life) polls the data account's CONNZ and hears its
// CONNECT and DISCONNECT events as re-poll triggers; the membership-rw connection (a data-account
// user on a signerclient rail, renewed by Remint at 75%) writes the bucket. The data account is
// the daemon's own credential account, and the observer must name it (the tenancy check).
//
// Each poll writes a principal's row only when it changed, deletes the row of a principal no
// complete scan lists any more, and re-stamps "=feed" every time, so a reader can tell a live
// feed from a stale one. A partial scan never deletes a row (a principal is gone only on a
// complete read) and says so in the heartbeat. Without its credentials (signerd refuses, or the
// bucket is missing) Start fails and the caller runs delivery traffic-only, with a warning.
package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/evict"
	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// renewFloor is the shortest wait before another observer renewal attempt.
const renewFloor = time.Second

// Config is what the feed needs.
type Config struct {
	// Space is the space name; Names its wire names.
	Space string
	Names space.Names
	// Observer dials the membership-observer connection (account pinned to the daemon's own).
	Observer *evict.Dialer
	// Signer mints and renews the membership-rw credential.
	Signer *signerclient.Client
	// Brokers and Options reach the broker (Options: TLS settings).
	Brokers []string
	Options []nats.Option
	// Poll is the CONNZ poll period.
	Poll time.Duration
	// Writer is stamped on every row (the daemon's user public key).
	Writer string
	Logger *slog.Logger
	// Warn reports a nonfatal condition of the running feed (a failed poll, a failed renewal).
	Warn func(msg string, err error)
	Now  func() time.Time
}

// Row is one principal's value in the bucket.
type Row struct {
	Principal   string `json:"principal"`
	Connections int    `json:"connections"`
	Since       string `json:"since"`
	UpdatedAt   string `json:"updatedAt"`
	Writer      string `json:"writer"`
}

// Heartbeat is the "=feed" value.
type Heartbeat struct {
	UpdatedAt string `json:"updatedAt"`
	Complete  bool   `json:"complete"`
	Live      int    `json:"live"`
	Writer    string `json:"writer"`
}

// Feed is a running membership feed.
type Feed struct {
	cfg    Config
	log    *slog.Logger
	rail   *signerclient.Rail
	rw     *nats.Conn
	kv     jetstream.KeyValue
	obs    *evict.Conn
	poke   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// rows is what this feed last wrote, by principal.
	rows map[string]Row
}

// Start brings the feed up: the membership-rw credential and connection, the bucket (opened,
// never created), the observer connection and its event subscriptions, one first poll; then it
// polls until Close. Any failure closes what it opened and returns the reason.
func Start(ctx context.Context, cfg Config) (_ *Feed, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Warn == nil {
		cfg.Warn = func(string, error) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.Signer == nil || cfg.Observer == nil {
		return nil, errors.New("membership: no signer client")
	}
	f := &Feed{cfg: cfg, log: cfg.Logger, poke: make(chan struct{}, 1), rows: map[string]Row{}}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.rail, err = signerclient.NewRail(signerclient.RailConfig{
		Client: cfg.Signer, Space: cfg.Space, Profile: signerv1.Profile_PROFILE_MEMBERSHIP_RW,
		NatsURLs: cfg.Brokers, Logger: cfg.Logger, OnRenew: func(string, time.Time) { f.swap() },
	}); err != nil {
		return nil, err
	}
	if err := f.rail.Start(ctx); err != nil {
		return nil, fmt.Errorf("membership: no membership-rw credential: %w", err)
	}
	if f.rw, err = nats.Connect(strings.Join(cfg.Brokers, ","), append(append(f.rail.NatsOptions(),
		nats.Name("deliveryd-membership-rw"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond)), cfg.Options...)...); err != nil {
		return nil, fmt.Errorf("membership: membership-rw connection: %w", err)
	}
	js, err := jetstream.New(f.rw)
	if err != nil {
		return nil, err
	}
	if f.kv, err = plane3.OpenBucket(ctx, js, cfg.Names, space.Membership); err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	if f.obs, err = cfg.Observer.Dial(ctx, signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER, "deliveryd-membership-observer", true); err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	for _, subj := range []func(string) (string, error){space.SysAccountConnect, space.SysAccountDisconnect} {
		s, err := subj(cfg.Observer.Account)
		if err != nil {
			return nil, err
		}
		if _, err := f.obs.Subscribe(s, func(*nats.Msg) { f.trigger() }); err != nil {
			return nil, fmt.Errorf("membership: subscribe %s: %w", s, err)
		}
	}
	if err := f.obs.Flush(); err != nil {
		return nil, err
	}
	if err := f.poll(ctx); err != nil {
		return nil, fmt.Errorf("membership: first poll: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		if err := f.rail.Run(runCtx); err != nil && !errors.Is(err, signerclient.ErrClosed) && runCtx.Err() == nil {
			cfg.Warn("membership feed: the membership-rw credential is no longer renewed", err)
		}
	}()
	go func() {
		defer f.wg.Done()
		f.loop(runCtx)
	}()
	f.log.Info("membership feed up", "bucket", f.kv.Bucket())
	return f, nil
}

func (f *Feed) trigger() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// swap moves the rw connection onto a renewed credential.
func (f *Feed) swap() {
	if f.rw != nil {
		_ = f.rw.ForceReconnect()
	}
}

func (f *Feed) loop(ctx context.Context) {
	t := time.NewTicker(f.cfg.Poll)
	defer t.Stop()
	failing, renewFailing := false, false
	for {
		renew := time.NewTimer(max(time.Until(f.obs.RenewAt()), renewFloor))
		select {
		case <-ctx.Done():
			renew.Stop()
			return
		case <-t.C:
		case <-f.poke:
		case <-renew.C:
		}
		renew.Stop()
		if !f.cfg.Now().Before(f.obs.RenewAt()) {
			// Mint again for the same key and move the connection onto it; a failure is retried
			// on the next pass (at least renewFloor later) while the old one lasts.
			if err := f.obs.Renew(ctx); err != nil && ctx.Err() == nil {
				if !renewFailing {
					f.cfg.Warn("membership feed: the membership-observer credential was not renewed", err)
				}
				renewFailing = true
			} else {
				renewFailing = false
			}
		}
		if err := f.poll(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				f.cfg.Warn("membership feed: poll failed; rows kept until a complete scan", err)
			}
			failing = true
			continue
		}
		failing = false
	}
}

// poll scans the account and brings the bucket in line.
func (f *Feed) poll(ctx context.Context) error {
	scan, err := evict.ScanAccount(ctx, f.obs.Conn, f.cfg.Observer.Account)
	if err != nil {
		return err
	}
	now := f.cfg.Now().UTC().Format(time.RFC3339Nano)
	live := map[string]int{}
	for _, c := range scan.Connections {
		if c.Principal != "" && evict.ParsePrincipal(c.Principal) == nil {
			live[c.Principal]++
		}
	}
	for p, n := range live {
		old, had := f.rows[p]
		if had && old.Connections == n {
			continue
		}
		row := Row{Principal: p, Connections: n, Since: now, UpdatedAt: now, Writer: f.cfg.Writer}
		if had {
			row.Since = old.Since
		}
		b, _ := json.Marshal(row)
		if _, err := f.kv.Put(ctx, p, b); err != nil {
			return fmt.Errorf("put %s: %w", p, err)
		}
		f.rows[p] = row
	}
	if scan.Complete {
		for p := range f.rows {
			if _, ok := live[p]; ok {
				continue
			}
			if err := f.kv.Delete(ctx, p); err != nil {
				return fmt.Errorf("delete %s: %w", p, err)
			}
			delete(f.rows, p)
		}
	}
	hb, _ := json.Marshal(Heartbeat{UpdatedAt: now, Complete: scan.Complete, Live: len(live), Writer: f.cfg.Writer})
	if _, err := f.kv.Put(ctx, space.MembershipFeedKey, hb); err != nil {
		return fmt.Errorf("put %s: %w", space.MembershipFeedKey, err)
	}
	return nil
}

// Close stops the feed and closes its connections; the rows stay (a successor re-reads them).
func (f *Feed) Close() {
	if f == nil {
		return
	}
	if f.cancel != nil {
		f.cancel()
	}
	f.close()
	f.wg.Wait()
}

func (f *Feed) close() {
	if f.obs != nil {
		f.obs.Close()
	}
	if f.rw != nil {
		f.rw.Close()
	}
	if f.rail != nil {
		f.rail.Close()
	}
}
