// Package views is the closed set of bearer views: the elevated per-connection profiles a Cotal
// bearer may ask for in act.view instead of the agent profile (upstream token.ts
// USER_TOKEN_VIEWS and VIEW_REQUIRED_SCOPE). An unknown view fails closed everywhere, never
// falling back to a profile, and there is deliberately no view=<profile> passthrough: most
// profiles are daemon surfaces that must never become requestable by a user.
//
// Only admin maps to a profile today. Every other view upstream has (purger, channel-purger,
// channel-writer, transfer-writer, deployer, manager-service, manager-caller, session-caller) has
// no profile in pkg/profiles, because their rows hang off upstream features this project has not
// built yet (endpoint rails, manager and session authority, channel-registry writes, transcript
// transfer) or were not in the upstream version the matrix follows. Profile reports ok=false for
// them, so the exchange refuses to issue such a bearer and the callout refuses to admit one
// (signerd would sign the bearer, but nothing could be minted from it). The one exception is
// manager-caller: the exchange issues it, bound to one manager instance (act.managerInstanceId,
// issue 23), and the callout still refuses it until its profile exists. Admitting one would need
// a profile row proved on the broker first, then one line here.
package views

import (
	"slices"
	"time"

	"github.com/cotalgo/cotal/pkg/profiles"
)

// The views upstream defines. A bearer naming any other string is refused.
const (
	Admin          = "admin"
	Purger         = "purger"
	ChannelPurger  = "channel-purger"
	ChannelWriter  = "channel-writer"
	TransferWriter = "transfer-writer"
	Deployer       = "deployer"
	ManagerService = "manager-service"
	ManagerCaller  = "manager-caller"
	SessionCaller  = "session-caller"
)

// Bearer lifetime caps (upstream MAX_TOKEN_TTL_SEC and the transfer-writer profile's five
// minutes); signerd's SignBearer applies the same caps.
const (
	MaxBearerTTL         = 900 * time.Second
	TransferWriterMaxTTL = 300 * time.Second
)

// requiredScope is upstream's VIEW_REQUIRED_SCOPE: the ledger capability each view needs ("" for
// none).
var requiredScope = map[string]string{
	Admin:          "admin",
	Purger:         "admin",
	ChannelPurger:  "admin",
	ChannelWriter:  "admin",
	TransferWriter: "admin",
	Deployer:       "spawn",
	ManagerService: "supervise",
	ManagerCaller:  "",
	SessionCaller:  "",
}

// mintable maps the views a callout can mint to their profile. Keep it to views whose profile
// exists and is proved on the broker.
var mintable = map[string]profiles.Name{
	Admin: profiles.Admin,
}

// All lists every known view, sorted.
func All() []string {
	out := make([]string, 0, len(requiredScope))
	for v := range requiredScope {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// Known reports whether view is in the closed enum (whether or not it can be minted).
func Known(view string) bool {
	_, ok := requiredScope[view]
	return ok
}

// RequiredScope is the ledger capability a known view needs ("" for manager-caller and
// session-caller); ok is false for an unknown view.
func RequiredScope(view string) (scope string, ok bool) {
	scope, ok = requiredScope[view]
	return scope, ok
}

// Profile is the profile a callout mints for a bearer with this view and the capability the
// bearer's scope must carry for it. ok is false for an unknown view and for every known view
// without a profile (all but admin, see the package doc): the caller refuses such a bearer.
func Profile(view string) (p profiles.Name, requiredScope string, ok bool) {
	p, ok = mintable[view]
	if !ok {
		return "", "", false
	}
	return p, RequiredScopeOf(view), true
}

// RequiredScopeOf is RequiredScope without the ok flag ("" for an unknown view).
func RequiredScopeOf(view string) string { return requiredScope[view] }

// MaxTTL is the longest a bearer with this view may live: 300 s for transfer-writer, 900 s for
// every other view and for no view ("").
func MaxTTL(view string) time.Duration {
	if view == TransferWriter {
		return TransferWriterMaxTTL
	}
	return MaxBearerTTL
}
