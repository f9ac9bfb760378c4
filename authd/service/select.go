package service

import (
	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/pkg/space"
)

// selection is the interactive manager selection Start was given, checked before any effect.
type selection struct {
	policy string
	local  LocalManager
}

// newSelection checks RuntimeOptions.InteractiveManagerSelection against Inputs.LocalManager.
func newSelection(in Inputs, opts RuntimeOptions) (selection, error) {
	if err := authority.CheckSelectionPolicy(opts.InteractiveManagerSelection, in.LocalManager); err != nil {
		return selection{}, err
	}
	return selection{policy: opts.InteractiveManagerSelection, local: in.LocalManager}, nil
}

// selector is the exchange's manager selector, reading the lifecycle rows over the plane
// connection (leader-served, authority.Store).
func (sel selection) selector(nc *nats.Conn, n space.Names) (*authority.Selector, error) {
	store, err := authority.NewStore(nc, n, 0)
	if err != nil {
		return nil, err
	}
	return authority.NewSelector(authority.SelectorConfig{Store: store, Policy: sel.policy, Local: sel.local})
}
