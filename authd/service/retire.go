package service

// The retirement side of the lifecycle authority's wiring (issue 23 items 5-7): boot resume of
// owed retirements on the plane connection after the authority is built, before the rails
// (startRails serves retire-lifecycle) and the callout subscribe; the retire door beside the
// activate door; and the callout responder handed to the barrier's containment once it exists.

import (
	"context"
	"net/http"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/callout"
)

var _ authority.Idler = (*callout.Responder)(nil)

// retirement is the service's part of retirement.
type retirement struct {
	// plane is the run context: retirement flights run on it, never on a start's or a door
	// caller's context, and end with the service.
	plane context.Context
	// idle is authority.Config.Callouts: the callout responder, set once it exists (boot resume
	// runs before it does, when no callout is in flight).
	idle authority.LateIdler
}

// startRetirement resumes the retirements owed (upstream resumeOpenOperations: a flight is
// registered for each before it returns, and finishes in the background on the run context).
// An intent that does not decode, or a store that cannot list or read the intents, refuses the
// start (CodeStore).
func (s *Service) startRetirement(ctx context.Context) error {
	owed, err := s.authority.Resume(ctx)
	if err != nil {
		return &StartError{Code: CodeStore, Reason: "the lifecycle authority's retirement intents could not be resumed", Err: err}
	}
	if len(owed) > 0 {
		s.log.Warn("resuming retirements a previous authd left unfinished; their gates stay frozen until they finish", "ops", owed)
	}
	return nil
}

// retireDoor is POST /managed-lifecycle/retire on the loopback face.
func (s *Service) retireDoor(capHex string) http.Handler {
	return s.authority.RetireDoor([]byte("Bearer " + capHex))
}
