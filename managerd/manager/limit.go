package manager

import (
	"context"
	"os"
	"syscall"

	"github.com/cotalgo/cotal/managerd/internal/launcher"
)

// limited keeps managerd's launcher calls under the launcher's own bound (launcher.MaxConcurrent,
// past which it refuses), so twenty concurrent spawns queue here instead of failing there. Two
// slots stay free for another client of the launcher (a second managerd starting, say).
type limited struct {
	l   Launcher
	sem chan struct{}
}

func newLimited(l Launcher) *limited {
	return &limited{l: l, sem: make(chan struct{}, launcher.MaxConcurrent-2)}
}

func (c *limited) acquire(ctx context.Context) error {
	select {
	case c.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *limited) release() { <-c.sem }

func (c *limited) Launch(ctx context.Context, req launcher.Request) (launcher.Child, *os.File, error) {
	if err := c.acquire(ctx); err != nil {
		return launcher.Child{}, nil, err
	}
	defer c.release()
	return c.l.Launch(ctx, req)
}

func (c *limited) Signal(ctx context.Context, child launcher.Child, sig syscall.Signal) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	return c.l.Signal(ctx, child, sig)
}

func (c *limited) ReplaceMaterial(ctx context.Context, child launcher.Child, material []byte) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	return c.l.ReplaceMaterial(ctx, child, material)
}
