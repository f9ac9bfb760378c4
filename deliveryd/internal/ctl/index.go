package ctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
)

// index is the open memberships of every lifecycle, kept from one watch of the members bucket
// for as long as the responders run, so listMemberships reads memory instead of replaying the
// whole bucket through a new watch consumer per request (which let any agent make deliveryd
// stream every membership row of the space, as often as it asked).
//
// A read is as fresh as a direct read of the bucket: it first asks the bucket's stream for its
// last sequence (one API request, no consumer) and waits until the watch has applied that
// revision. Rows that do not decode and tombstones are not listed; keys (lifecycleMemberships'
// inventory) lists every present key by its name alone, whatever its row holds.
type index struct {
	mu sync.Mutex
	// open is lifecycle -> key -> membership, for the rows that are open; byKey names the
	// lifecycle of each indexed key, so an update of that key can remove it. mu guards both.
	open  map[plane3.Lifecycle]map[string]Membership
	byKey map[string]plane3.Lifecycle
	// keys is lifecycle -> key -> channel for every present key whose name parses as a member
	// key (<channel>/<owner>.<actor>.<uid>): open rows, tombstones and rows that do not decode
	// alike, since each is part of the lifecycle's footprint. mu guards it.
	keys map[plane3.Lifecycle]map[string]string
	// applied is the highest revision applied; moved is closed and replaced when it grows.
	applied uint64
	moved   chan struct{}
	// err is why the watch ended, once it has.
	err error
}

func newIndex() *index {
	return &index{open: map[plane3.Lifecycle]map[string]Membership{}, byKey: map[string]plane3.Lifecycle{},
		keys: map[plane3.Lifecycle]map[string]string{}, moved: make(chan struct{})}
}

// run applies the watch's updates until its channel closes (Stop), recording why it ended.
func (x *index) run(w jetstream.KeyWatcher) {
	for e := range w.Updates() {
		if e != nil {
			x.apply(e)
		}
	}
	x.mu.Lock()
	x.err = errors.New("members index: watch stopped")
	close(x.moved)
	x.moved = make(chan struct{})
	x.mu.Unlock()
}

// apply records one update: a put of an open row indexes it; a tombstone, a delete, a purge or
// a row that does not decode removes whatever the key held.
func (x *index) apply(e jetstream.KeyValueEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	key := e.Key()
	if lc, ok := x.byKey[key]; ok {
		delete(x.byKey, key)
		delete(x.open[lc], key)
		if len(x.open[lc]) == 0 {
			delete(x.open, lc)
		}
	}
	if channel, lc, ok := plane3.ParseMemberKey(key); ok {
		if e.Operation() == jetstream.KeyValuePut {
			if x.keys[lc] == nil {
				x.keys[lc] = map[string]string{}
			}
			x.keys[lc][key] = channel
		} else if x.keys[lc] != nil {
			delete(x.keys[lc], key)
			if len(x.keys[lc]) == 0 {
				delete(x.keys, lc)
			}
		}
	}
	if e.Operation() == jetstream.KeyValuePut {
		if m, lc, err := plane3.DecodeMember(key, e.Value()); err == nil && m.LeaveCursor == nil {
			if x.open[lc] == nil {
				x.open[lc] = map[string]Membership{}
			}
			x.open[lc][key] = Membership{m.Channel, m.Generation, m.Activated}
			x.byKey[key] = lc
		}
	}
	if rev := e.Revision(); rev > x.applied {
		x.applied = rev
		close(x.moved)
		x.moved = make(chan struct{})
	}
}

// list returns lc's open memberships by channel once the index holds revision last.
func (x *index) list(ctx context.Context, lc plane3.Lifecycle, last uint64) ([]Membership, error) {
	if err := x.wait(ctx, last); err != nil {
		return nil, err
	}
	x.mu.Lock()
	out := make([]Membership, 0, len(x.open[lc]))
	for _, m := range x.open[lc] {
		out = append(out, m)
	}
	x.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Channel < out[j].Channel })
	return out, nil
}

// channels returns the channels of every key lc holds in the bucket, sorted, once the index
// holds revision last. When it cannot get there (the watch ended, ctx ended first) it returns
// what the index holds now and the reason: a listing that may miss a row.
func (x *index) channels(ctx context.Context, lc plane3.Lifecycle, last uint64) ([]string, error) {
	err := x.wait(ctx, last)
	x.mu.Lock()
	out := make([]string, 0, len(x.keys[lc]))
	for _, ch := range x.keys[lc] {
		out = append(out, ch)
	}
	x.mu.Unlock()
	sort.Strings(out)
	return out, err
}

// wait returns once the index has applied revision last, or why it cannot.
func (x *index) wait(ctx context.Context, last uint64) error {
	for {
		x.mu.Lock()
		if x.err != nil {
			err := x.err
			x.mu.Unlock()
			return err
		}
		if x.applied >= last {
			x.mu.Unlock()
			return nil
		}
		moved := x.moved
		x.mu.Unlock()
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("members index: at revision %d, waiting for %d: %w", x.appliedNow(), last, ctx.Err())
		}
	}
}

func (x *index) appliedNow() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.applied
}
