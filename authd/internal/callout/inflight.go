package callout

import (
	"context"
	"sync"
)

// inflight tracks the requests being served, so the retirement barrier can wait out every
// callout that began before it froze a lifecycle's gate (WaitIdle). A request is tracked from
// the moment dispatch hands it a slot until its reply is published (or dropped); the lifecycle
// gate read happens inside that span, so a request that begins after the freeze reads the frozen
// gate and one that began before it is waited for.
type inflight struct {
	mu      sync.Mutex
	next    uint64
	active  map[uint64]struct{}
	changed chan struct{} // closed and replaced whenever a request ends
}

// begin tracks one request and returns its ticket.
func (f *inflight) begin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active == nil {
		f.active = map[uint64]struct{}{}
		f.changed = make(chan struct{})
	}
	f.next++
	f.active[f.next] = struct{}{}
	return f.next
}

// end stops tracking ticket t.
func (f *inflight) end(t uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.active, t)
	close(f.changed)
	f.changed = make(chan struct{})
}

// mark is the last ticket issued so far.
func (f *inflight) mark() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// waitIdle returns once every request begun before the call has ended, or ctx's error.
func (f *inflight) waitIdle(ctx context.Context) error { return f.waitUpTo(ctx, f.mark()) }

// waitUpTo returns once no ticket up to before is still tracked, or ctx's error.
func (f *inflight) waitUpTo(ctx context.Context, before uint64) error {
	for {
		f.mu.Lock()
		busy := false
		for t := range f.active {
			if t <= before {
				busy = true
				break
			}
		}
		ch := f.changed
		f.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitIdle returns once every request this responder began serving before the call has been
// answered or dropped, or with ctx's error. Requests that begin after the call are not waited
// for: the retirement barrier calls it after its gate freeze is stored, and those requests read
// the frozen gate. A responder not started has nothing in flight.
func (r *Responder) WaitIdle(ctx context.Context) error { return r.flight.waitIdle(ctx) }
