package service

import (
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
)

// maxHostedID bounds LifecycleUID and StoreIdentity.
const maxHostedID = 128

// check refuses a hosted assignment whose Account is not an account public key (A...), or whose
// LifecycleUID or StoreIdentity is not 1 to maxHostedID printable ASCII bytes without spaces.
// A nil h (the CLI path) passes.
func (h *Hosted) check() error {
	if h == nil {
		return nil
	}
	if !nkeys.IsValidPublicAccountKey(h.Account) {
		return fmt.Errorf("hosted account %.64q is not an account public key (A...)", h.Account)
	}
	for _, f := range []struct{ name, v string }{{"lifecycle uid", h.LifecycleUID}, {"store identity", h.StoreIdentity}} {
		if err := checkHostedID(f.v); err != nil {
			return fmt.Errorf("hosted %s: %w", f.name, err)
		}
	}
	return nil
}

func checkHostedID(v string) error {
	if v == "" || len(v) > maxHostedID {
		return fmt.Errorf("%d bytes; want 1 to %d", len(v), maxHostedID)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c > '~' {
			return errors.New("want printable ASCII without spaces")
		}
	}
	return nil
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
