package daemon

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

// Hosted is what a hosting platform assigned one embedded auth or delivery instance (seed 000,
// "Hosted delivery context" and "Hosted auth context"). authd and deliveryd take the same value
// (service.Hosted is this type in both), and with it set they write no discovery, state or
// refusal file, do not notify systemd, and refuse to start unless the first credential signerd
// mints them belongs to Account. Every field is required: a hosted context is named in full.
type Hosted struct {
	// Account is the assigned data account's public key (A…).
	Account string
	// LifecycleUID is the instance's lifecycle uid (space.ValidateUID: 26 to 32 of [a-z0-9]).
	LifecycleUID string
	// StoreIdentity is the stable identity of the store the platform renews credentials
	// through (upstream's storeIdentity): deliveryd's reloadStoreIdentity answers it. One line of
	// 1 to MaxStoreIdentity bytes of printable UTF-8.
	StoreIdentity string
}

// MaxStoreIdentity bounds Hosted.StoreIdentity.
const MaxStoreIdentity = 256

// Validate refuses a hosted assignment whose Account is not an account public key, whose
// LifecycleUID is not a lifecycle uid, or whose StoreIdentity is not one printable line of 1 to
// MaxStoreIdentity bytes. Its errors quote the refused value, at most 80 bytes of it.
func (h Hosted) Validate() error {
	if !nkeys.IsValidPublicAccountKey(h.Account) {
		return fmt.Errorf("hosted account %s is not an account public key (A…)", QuoteInput(h.Account))
	}
	if err := space.ValidateUID(h.LifecycleUID); err != nil {
		return fmt.Errorf("hosted lifecycle uid: %w", err)
	}
	if h.StoreIdentity == "" || len(h.StoreIdentity) > MaxStoreIdentity {
		return fmt.Errorf("hosted store identity: %d bytes, want 1 to %d", len(h.StoreIdentity), MaxStoreIdentity)
	}
	if !utf8.ValidString(h.StoreIdentity) {
		return fmt.Errorf("hosted store identity %s: not UTF-8", QuoteInput(h.StoreIdentity))
	}
	for _, r := range h.StoreIdentity {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("hosted store identity %s: not one printable line", QuoteInput(h.StoreIdentity))
		}
	}
	return nil
}

// QuoteInput quotes a host's input (or any outside value) for an error, at most 80 bytes of it.
func QuoteInput(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}
