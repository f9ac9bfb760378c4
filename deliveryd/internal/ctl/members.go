package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
)

// Membership states (upstream MembershipRecord.state), plane3's: an open durable membership, and
// a tombstone whose leaveCursor closes the backstop.
const (
	StateActive    = plane3.StateActive
	StateTombstone = plane3.StateTombstone
)

// casAttempts is how often a write re-reads after losing a revision race (upstream's 5).
const casAttempts = 5

// ErrStale matches a membership write refused because the row has moved to another generation
// (upstream StaleMembershipWrite): a newer join or leave already won.
var ErrStale = errors.New("stale membership write")

// ErrQuiesced stops a handler whose fence went down: it writes, publishes and replies no more.
var ErrQuiesced = errors.New("ctl: quiesced")

// row is a membership row with its KV revision.
type row struct {
	m   plane3.Member
	rev uint64
}

// store writes membership rows with upstream's two guards: a generation check (a write never
// regresses the generation) and a revision CAS (a concurrent write makes it re-read). Every write
// is fenced.
type store struct {
	kv     jetstream.KeyValue
	mayAct func() bool
	now    func() int64
}

// read returns the row under key, or nil when there is none (never written, deleted or purged).
// A row that does not decode (or names another key) is an error: it is never overwritten blind.
func (s *store) read(ctx context.Context, key string) (*row, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read member row %s: %w", key, err)
	}
	m, _, err := plane3.DecodeMember(key, e.Value())
	if err != nil {
		return nil, fmt.Errorf("member row %s does not decode; refusing to overwrite it", key)
	}
	return &row{m, e.Revision()}, nil
}

func (s *store) put(ctx context.Context, key string, m plane3.Member, rev uint64, create bool) error {
	if !s.mayAct() {
		return ErrQuiesced
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if create {
		_, err = s.kv.Create(ctx, key, b)
	} else {
		_, err = s.kv.Update(ctx, key, b, rev)
	}
	return err
}

func lostRace(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// commit writes next (upstream commitMember): create when there is no row, else update at the
// read revision unless next's generation is older than the stored one (ErrStale). A lost race
// re-reads and re-checks.
func (s *store) commit(ctx context.Context, key string, next plane3.Member) error {
	for range casAttempts {
		cur, err := s.read(ctx, key)
		if err != nil {
			return err
		}
		if cur != nil && next.Generation < cur.m.Generation {
			return fmt.Errorf("%w for %s: generation %d < current %d", ErrStale, key, next.Generation, cur.m.Generation)
		}
		var rev uint64
		if cur != nil {
			rev = cur.rev
		}
		next.UpdatedAt = s.now()
		err = s.put(ctx, key, next, rev, cur == nil)
		if err == nil || !lostRace(err) {
			return err
		}
	}
	return fmt.Errorf("members CAS exhausted retries for %s", key)
}

// tombstone closes a membership at leaveCursor (upstream tombstoneMember): it keeps the row and
// its generation, sets leaveCursor and the tombstone state. No row: (nil, nil). A row of another
// generation than expected: ErrStale (a leave must not close a rejoin). A row already closed at
// or before leaveCursor is left as it is.
func (s *store) tombstone(ctx context.Context, key string, leaveCursor, expected uint64, writer string) (*plane3.Member, error) {
	cur, err := s.read(ctx, key)
	if err != nil || cur == nil {
		return nil, err
	}
	if cur.m.Generation != expected {
		return nil, fmt.Errorf("%w for %s: generation %d, current %d", ErrStale, key, expected, cur.m.Generation)
	}
	if cur.m.LeaveCursor != nil && *cur.m.LeaveCursor <= leaveCursor {
		return &cur.m, nil
	}
	next := cur.m
	next.State, next.LeaveCursor, next.WriterIdentity = StateTombstone, &leaveCursor, writer
	if err := s.commit(ctx, key, next); err != nil {
		return nil, err
	}
	return &next, nil
}

// activate flips the pending join (generation, joinCursor, open, not activated) to activated
// (upstream activateMember), by revision CAS only: a concurrent leave of the same generation or a
// rejoin supersedes it, and it reports false. An already activated open row of that join is true.
func (s *store) activate(ctx context.Context, key string, generation, joinCursor uint64) (bool, error) {
	for range casAttempts {
		cur, err := s.read(ctx, key)
		if err != nil || cur == nil {
			return false, err
		}
		r := cur.m
		if r.Generation != generation || r.JoinCursor != joinCursor || r.LeaveCursor != nil {
			return false, nil
		}
		if r.Activated {
			return true, nil
		}
		r.Activated, r.UpdatedAt = true, s.now()
		err = s.put(ctx, key, r, cur.rev, false)
		if err == nil {
			return true, nil
		}
		if !lostRace(err) {
			return false, err
		}
	}
	return false, nil
}

// Membership is one entry of listMemberships.
type Membership struct {
	Channel    string `json:"channel"`
	Generation uint64 `json:"generation"`
	Activated  bool   `json:"activated"`
}
