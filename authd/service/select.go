package service

import (
	"github.com/cotalgo/cotal/authd/internal/authority"
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

// selector is the exchange's manager selector, reading the lifecycle rows with the authority's
// store (leader-served, over the plane connection).
func (sel selection) selector(store *authority.Store) (*authority.Selector, error) {
	return authority.NewSelector(authority.SelectorConfig{Store: store, Policy: sel.policy, Local: sel.local})
}
