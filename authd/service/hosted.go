package service

import (
	"fmt"
)

// checkHosted validates a hosted assignment; nil (the CLI path) passes.
func checkHosted(h *Hosted) error {
	if h == nil {
		return nil
	}
	return h.Validate()
}

// checkAccount refuses a hosted start whose auth-plane credential (the first credential authd
// gets from signerd) is not of the assigned account. It runs before any broker connection or
// claim exists, so a refusal leaves nothing behind.
func (s *Service) checkAccount() error {
	if s.hosted == nil {
		return nil
	}
	if got := s.planeRail.Account(); got != s.hosted.Account {
		return &StartError{Code: CodeAccount, Reason: fmt.Sprintf("the auth-plane credential signerd minted belongs to account %s, not the assigned account %s", got, s.hosted.Account)}
	}
	return nil
}
