package service

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

// maxStoreIdentity bounds Hosted.StoreIdentity (deliveryd's bound).
const maxStoreIdentity = 256

// check refuses a hosted assignment whose Account is not an account public key (A...), whose
// LifecycleUID is not a lifecycle UID (space.ValidateUID: 26 to 32 characters of [a-z0-9]), or
// whose StoreIdentity is not one line of 1 to maxStoreIdentity bytes of printable UTF-8. A nil h
// (the CLI path) passes.
func (h *Hosted) check() error {
	if h == nil {
		return nil
	}
	if !nkeys.IsValidPublicAccountKey(h.Account) {
		return fmt.Errorf("hosted account %s is not an account public key (A...)", quoteInput(h.Account))
	}
	if err := space.ValidateUID(h.LifecycleUID); err != nil {
		return fmt.Errorf("hosted lifecycle uid: %w", err)
	}
	if h.StoreIdentity == "" || len(h.StoreIdentity) > maxStoreIdentity {
		return fmt.Errorf("hosted store identity: %d bytes, want 1 to %d", len(h.StoreIdentity), maxStoreIdentity)
	}
	if !utf8.ValidString(h.StoreIdentity) {
		return fmt.Errorf("hosted store identity %s: not UTF-8", quoteInput(h.StoreIdentity))
	}
	for _, r := range h.StoreIdentity {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("hosted store identity %s: not one printable line", quoteInput(h.StoreIdentity))
		}
	}
	return nil
}

// quoteInput quotes a host's input for an error, at most 80 bytes of it.
func quoteInput(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
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
