package provision

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxACLBytes bounds an ACL row DecodeACL reads (upstream rows are a few hundred bytes).
const MaxACLBytes = 1 << 20

// ACL is a lifecycle's read-ACL row in cotal_acl_<t> under space.ACLKey (upstream AclRecord):
// the channels (or channel patterns) the lifecycle may read, a revision bumped by every write
// (the first write is 1) and the write time in Unix milliseconds. managerd writes it when it
// provisions an agent (ProvisionAgent); deliveryd reads it to re-authorize every durable entry.
// A present row with an empty AllowSubscribe is a known "reads nothing" policy; an absent row is
// an unknown lifecycle.
type ACL struct {
	AllowSubscribe []string `json:"allowSubscribe"`
	Revision       uint64   `json:"revision"`
	UpdatedAt      int64    `json:"updatedAt"`
}

// Encode is the row's JSON, {"allowSubscribe":[...],"revision":n,"updatedAt":ms}. An empty
// AllowSubscribe is written as [] (never null), since a row without the array reads as no row.
// It refuses an entry that is not a channel pattern (space.ValidateChannelPattern).
func (a ACL) Encode() ([]byte, error) {
	for _, ch := range a.AllowSubscribe {
		if err := space.ValidateChannelPattern(ch); err != nil {
			return nil, fmt.Errorf("provision: ACL allowSubscribe: %w", err)
		}
	}
	if a.AllowSubscribe == nil {
		a.AllowSubscribe = []string{}
	}
	// As JSON.stringify writes it: no HTML escaping of '>' in a subtree grant.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(a); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// DecodeACL reads an ACL row. A row that does not decode or lacks the allowSubscribe array is
// reported as not a row (upstream readAcl treats it as unknown, so the reader defers, never drops).
func DecodeACL(b []byte) (ACL, bool) {
	var raw struct {
		AllowSubscribe *[]string `json:"allowSubscribe"`
		Revision       uint64    `json:"revision"`
		UpdatedAt      int64     `json:"updatedAt"`
	}
	if len(b) > MaxACLBytes || json.Unmarshal(b, &raw) != nil || raw.AllowSubscribe == nil {
		return ACL{}, false
	}
	return ACL{AllowSubscribe: *raw.AllowSubscribe, Revision: raw.Revision, UpdatedAt: raw.UpdatedAt}, true
}

// Allows reports whether channel is inside AllowSubscribe. A pattern matches token by token as a
// NATS subject does ('*' one token, a final '>' one or more; space.PatternCovers), so an upstream
// subtree grant ("team.>") keeps its meaning; a concrete entry matches only itself, and a
// malformed entry matches nothing.
func (a ACL) Allows(channel string) bool {
	for _, p := range a.AllowSubscribe {
		if space.PatternCovers(p, channel) {
			return true
		}
	}
	return false
}

// sameGrant reports whether a and b grant the same list, in the same order.
func (a ACL) sameGrant(allow []string) bool {
	return slices.Equal(a.AllowSubscribe, allow) || (len(a.AllowSubscribe) == 0 && len(allow) == 0)
}
