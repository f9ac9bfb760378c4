package idp

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// notPinnedRetry is how often Pinned looks for idp.json again while there is none.
const notPinnedRetry = time.Second

// Pinned verifies IdP tokens against the pin in a state dir, read when first needed, so authd
// can start before `authd idp pin` runs and pick the pin up without a restart. Once read, the pin
// is kept: re-pinning is refused, so it cannot change under a running authd. While there is no
// pin, Verify returns ErrNotPinned (looking again at most once a second); a pin file that fails
// its checks is an error naming it, and is read again on the next call.
type Pinned struct {
	dir  string
	opts Options

	mu     sync.Mutex
	v      *Verifier
	missAt time.Time // when idp.json was last found missing
}

// NewPinned returns a Pinned for stateDir. It reads nothing yet.
func NewPinned(stateDir string, opts Options) *Pinned {
	return &Pinned{dir: stateDir, opts: opts}
}

// Verify checks token against the pinned IdP (see Verifier.Verify).
func (p *Pinned) Verify(ctx context.Context, token string) (Claims, error) {
	v, err := p.verifier()
	if err != nil {
		return Claims{}, err
	}
	return v.Verify(ctx, token)
}

func (p *Pinned) verifier() (*Verifier, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.v != nil {
		return p.v, nil
	}
	now := time.Now()
	if !p.missAt.IsZero() && now.Sub(p.missAt) < notPinnedRetry {
		return nil, ErrNotPinned
	}
	pin, err := Load(p.dir)
	if err != nil {
		if err == ErrNotPinned {
			p.missAt = now
		}
		return nil, err
	}
	v, err := NewVerifier(pin, p.opts)
	if err != nil {
		return nil, fmt.Errorf("idp: %w", err)
	}
	p.v = v
	return v, nil
}
