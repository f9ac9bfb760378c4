// Package dlvclient is the agent side of durable delivery: it binds the lifecycle's
// dlv_<owner>-<actor>-<uid> durable on DLV_<t> (which managerd's provisioner created; an agent may
// bind it but never create it), takes each message the trusted reader published there, and hands
// the frame to the caller once.
//
// It refuses, by terminating the message so it is never redelivered: a message without the
// Cotal-Delivery-Frame: 1 header (upstream's pumpDlv rule: only the trusted reader sets it), a
// body that is not a delivery frame (DecodeFrame) and a gap marker (GapHeader) that DecodeGap
// refuses. A gap marker it accepts goes to Config.OnGap, in order with the frames. It acks a message whose id it has already
// handled without handing it over again (the stream's dedup window collapses copies within 2 h;
// this catches redeliveries and the fan-out/catch-up race within a session), naks one the handler
// failed so the broker redelivers it, and acks the rest after the handler returns. Dedup is in
// memory and bounded, as upstream's connector cache: it is not a guarantee across restarts.
package dlvclient

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/space"
)

// Defaults.
const (
	// DefaultDedupSize is how many handled message ids the client remembers.
	DefaultDedupSize = 4096
	// DefaultNakDelay is the wait before a message the handler failed is redelivered.
	DefaultNakDelay = 2 * time.Second
)

// Delivery is one framed message handed to the handler.
type Delivery struct {
	// Channel is the channel the message was posted on (its authenticated channel).
	Channel string
	// ID is the message's id; empty when it carries none (such messages are never deduplicated).
	ID string
	// Msg is the chat message as JSON.
	Msg json.RawMessage
	// Seq is the message's sequence in DLV_<t>.
	Seq uint64
}

// Handler handles one delivery. An error makes the client nak the message for redelivery.
type Handler func(ctx context.Context, d Delivery) error

// Config is what New needs. Space, Owner, Actor and LifecycleUID are required.
type Config struct {
	Space, Owner, Actor, LifecycleUID string
	// DedupSize is how many handled ids to remember; zero means DefaultDedupSize.
	DedupSize int
	// NakDelay is the redelivery delay after a handler error; zero means DefaultNakDelay.
	NakDelay time.Duration
	// Logger receives refusals (never a message body); nil discards.
	Logger *slog.Logger
	// OnGap is handed each gap marker (see GapHeader), in order between the frames before and
	// after it; nil logs a warning with the count and acks the marker.
	OnGap GapHandler
}

// Client consumes one lifecycle's dlv_ durable.
type Client struct {
	cfg      Config
	log      *slog.Logger
	consumer jetstream.Consumer
	name     string
	seen     *idSet
	dups     atomic.Uint64
}

// Duplicates counts the messages Run acked without handing them over because their id was
// already handled (redeliveries, a fan-out/catch-up race, a copy written twice): what dedup hid.
func (c *Client) Duplicates() uint64 { return c.dups.Load() }

// New binds the lifecycle's dlv_ durable. It refuses invalid names (pkg/space grammars) and a
// durable that does not exist, naming it: the agent cannot create it, managerd provisions it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Client, error) {
	n, err := space.NewNames(cfg.Space)
	if err != nil {
		return nil, fmt.Errorf("dlvclient: %w", err)
	}
	name, err := n.DlvConsumer(cfg.Owner, cfg.Actor, cfg.LifecycleUID)
	if err != nil {
		return nil, fmt.Errorf("dlvclient: %w", err)
	}
	if cfg.DedupSize < 0 || cfg.NakDelay < 0 {
		return nil, fmt.Errorf("dlvclient: negative DedupSize %d or NakDelay %v", cfg.DedupSize, cfg.NakDelay)
	}
	if cfg.DedupSize == 0 {
		cfg.DedupSize = DefaultDedupSize
	}
	if cfg.NakDelay == 0 {
		cfg.NakDelay = DefaultNakDelay
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := js.Consumer(ctx, n.DLVStream(), name)
	if err != nil {
		return nil, fmt.Errorf("dlvclient: bind %s on %s (managerd provisions it; an agent cannot create it): %w", name, n.DLVStream(), err)
	}
	return &Client{cfg: cfg, log: log.With("consumer", name), consumer: c, name: name, seen: newIDSet(cfg.DedupSize)}, nil
}

// Run takes messages until ctx is done, handing each new frame to h; it returns nil on
// cancellation and the consumer's error otherwise. Messages are handled one at a time, in order.
func (c *Client) Run(ctx context.Context, h Handler) error {
	it, err := c.consumer.Messages()
	if err != nil {
		return fmt.Errorf("dlvclient: %s: %w", c.name, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("dlvclient: %s: %w", c.name, err)
		}
		if err := c.handle(ctx, m, h); err != nil {
			return err
		}
	}
}

// handle settles one message. It returns an error only when an ack cannot be sent.
func (c *Client) handle(ctx context.Context, m jetstream.Msg, h Handler) error {
	if m.Headers().Get(FrameHeader) != FrameHeaderValue {
		c.log.Warn("terminated a DLV message without the delivery-frame header", "subject", m.Subject())
		return c.settle(m.Term())
	}
	if gh := m.Headers().Values(GapHeader); len(gh) > 0 {
		return c.gap(ctx, m, gh)
	}
	f, id, err := DecodeFrame(m.Data())
	if err != nil {
		c.log.Warn("terminated a DLV message that is not a delivery frame", "subject", m.Subject(), "err", err)
		return c.settle(m.Term())
	}
	if id != "" && c.seen.has(id) {
		c.dups.Add(1)
		return c.settle(m.Ack())
	}
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	if err := h(ctx, Delivery{Channel: f.Channel, ID: id, Msg: f.Msg, Seq: seq}); err != nil {
		if ctx.Err() != nil {
			return nil // stopping: the unacked message is redelivered after ack_wait
		}
		c.log.Warn("handler failed; redelivering", "seq", seq, "err", err)
		return c.settle(m.NakWithDelay(c.cfg.NakDelay))
	}
	if id != "" {
		c.seen.add(id)
	}
	return c.settle(m.Ack())
}

// gap settles a gap marker: one header value that DecodeGap accepts with the body, handed to
// OnGap (nil: a warning), or terminated.
func (c *Client) gap(ctx context.Context, m jetstream.Msg, header []string) error {
	var missing uint64
	err := fmt.Errorf("%w: %d %s headers", ErrBadGap, len(header), GapHeader)
	if len(header) == 1 {
		missing, err = DecodeGap(header[0], m.Data())
	}
	if err != nil {
		c.log.Warn("terminated a DLV message that is not a gap marker", "subject", m.Subject(), "err", err)
		return c.settle(m.Term())
	}
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	if c.cfg.OnGap == nil {
		c.log.Warn("copies were dropped before this point: the durable was full", "missing", missing, "seq", seq)
		return c.settle(m.Ack())
	}
	if err := c.cfg.OnGap(ctx, Gap{Missing: missing, Seq: seq}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("gap handler failed; redelivering", "seq", seq, "err", err)
		return c.settle(m.NakWithDelay(c.cfg.NakDelay))
	}
	return c.settle(m.Ack())
}

func (c *Client) settle(err error) error {
	if err != nil {
		return fmt.Errorf("dlvclient: %s: ack: %w", c.name, err)
	}
	return nil
}

// idSet is a bounded set of ids, evicting the oldest. Only Run's goroutine uses it.
type idSet struct {
	max   int
	order *list.List
	index map[string]*list.Element
}

func newIDSet(max int) *idSet {
	return &idSet{max: max, order: list.New(), index: make(map[string]*list.Element, max)}
}

func (s *idSet) has(id string) bool { _, ok := s.index[id]; return ok }

func (s *idSet) add(id string) {
	if s.has(id) {
		return
	}
	s.index[id] = s.order.PushBack(id)
	if s.order.Len() > s.max {
		oldest := s.order.Front()
		s.order.Remove(oldest)
		delete(s.index, oldest.Value.(string))
	}
}
