package space

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
)

// A callout client chooses its connection name, and the broker grants it the reply inbox
// _INBOX_<name>.>. Upstream accepts any name the inbox-nonce grammar allows, so a client with a
// valid bearer could name another connection's inbox: a minted credential's _INBOX_<user nkey>
// (user keys are public: audit lines, Inspect, logs) or another callout client's nonce (seen in
// the reply subject of every request it sends). Bound nonces make those name spaces disjoint by
// construction:
//
//   - A bound nonce is <tag>-<suffix>: tag is InboxTagLen characters of lower-case base32
//     ([a-z2-7]) of SHA-256 over the principal (owner, actor), suffix 8 or more characters of
//     [A-Za-z0-9_-] the client picks at random. It holds a '-' (and lower case), which a user
//     nkey (56 characters of [A-Z2-7]) never does, so no bound nonce is a minted credential's
//     inbox token.
//   - The callout (authd and signerd both) grants a name only when its tag is the tag of the
//     bearer's principal. Another principal's nonce carries another tag (a collision needs a
//     second preimage of 130 bits), so it is refused: reading a nonce off a reply subject does
//     not let anyone else connect with it.
//
// Two connections of one principal share a tag and differ by their random suffix; one principal
// is one authority, as it is for every other row its credential grants.

// InboxTagLen is the length of a bound nonce's tag (130 bits of SHA-256).
const InboxTagLen = 26

// MinInboxSuffixLen is the shortest random suffix a bound nonce may carry.
const MinInboxSuffixLen = 8

var inboxTagEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// InboxTag is the tag of principal owner.actor's bound inbox nonces. It refuses an owner or actor
// outside their grammars.
func InboxTag(owner, actor string) (string, error) {
	if err := ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ValidateActor(actor); err != nil {
		return "", err
	}
	// Owner and actor are NUL-free by their grammars, so the encoding is unambiguous.
	sum := sha256.Sum256([]byte("cotal inbox nonce v1\x00" + owner + "\x00" + actor))
	return inboxTagEncoding.EncodeToString(sum[:])[:InboxTagLen], nil
}

// BoundInboxNonce is the nonce <InboxTag(owner, actor)>-<suffix>. It refuses a suffix shorter
// than MinInboxSuffixLen or outside [A-Za-z0-9_-], and a result outside ValidateInboxNonce.
func BoundInboxNonce(owner, actor, suffix string) (string, error) {
	tag, err := InboxTag(owner, actor)
	if err != nil {
		return "", err
	}
	n := tag + "-" + suffix
	if err := checkInboxSuffix(n, suffix); err != nil {
		return "", err
	}
	return n, nil
}

// ValidateBoundInboxNonce checks that nonce is a bound nonce of principal owner.actor: an inbox
// nonce (ValidateInboxNonce) made of that principal's tag, '-', and a suffix of at least
// MinInboxSuffixLen characters. Any other name, a user nkey or another principal's nonce among
// them, is refused.
func ValidateBoundInboxNonce(nonce, owner, actor string) error {
	if err := ValidateInboxNonce(nonce); err != nil {
		return err
	}
	tag, err := InboxTag(owner, actor)
	if err != nil {
		return err
	}
	suffix, ok := strings.CutPrefix(nonce, tag+"-")
	if !ok {
		return nameErr(KindInboxNonce, nonce, fmt.Sprintf("is not bound to principal %s.%s (it must start with %s-)", clip(owner), clip(actor), tag))
	}
	return checkInboxSuffix(nonce, suffix)
}

func checkInboxSuffix(nonce, suffix string) error {
	if len(suffix) < MinInboxSuffixLen {
		return nameErr(KindInboxNonce, nonce, fmt.Sprintf("its suffix after the principal tag is shorter than %d characters", MinInboxSuffixLen))
	}
	return ValidateInboxNonce(nonce)
}
