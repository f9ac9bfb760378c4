package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// Kind is a row space. The kind is the directory a row lives in, never a field of the row, so no
// partial write or edit of a file can move a row from one space to the other.
type Kind string

// The two disjoint row spaces.
const (
	// Interactive rows are written by `authd actor grant` and exchanged with an IdP token.
	Interactive Kind = "actors"
	// Managed rows are written by the spawn path, carry the hash of the agent's exchange
	// secret and are exchanged only with that secret.
	Managed Kind = "managed-actors"
)

// Version is the only row version this package reads or writes.
const Version = 1

// Bounds on a row. The channel cap is the profile package's and the capability cap is the bearer's,
// so every row the ledger accepts can be exchanged and minted; the others keep a row file small
// enough to read on every connect.
const (
	MaxRowBytes = 64 << 10
	// MaxScope caps a row's scope entries of both kinds (capability words and role:<r>).
	MaxScope = 64
	// MaxCapabilities caps a row's capability words: the scope words one bearer may carry.
	MaxCapabilities = space.MaxScopeWords
	MaxLabelLen     = 128
	maxChainLength  = 64
)

// RolePrefix starts a row's delegation token role:<r>: the holder may spawn agents serving role r
// (the spawner-chain rule). It is read from the ledger only and never rides a bearer.
const RolePrefix = "role:"

// Row is one granted (owner, actor): everything the exchange and the callout mint from. The
// JSON field names are upstream's (ledger.ts); GrantedAt is unix milliseconds.
type Row struct {
	Ver            int      `json:"ver"`
	Owner          string   `json:"owner"`
	Actor          string   `json:"actor"`
	Scope          []string `json:"scope"`
	AllowSubscribe []string `json:"allowSubscribe"`
	AllowPublish   []string `json:"allowPublish"`
	Role           string   `json:"role,omitempty"`
	Parent         string   `json:"parent,omitempty"`
	Label          string   `json:"label,omitempty"`
	TokenHash      string   `json:"tokenHash,omitempty"`
	LifecycleUID   string   `json:"lifecycleUid"`
	GrantedAt      int64    `json:"grantedAt"`
}

// Principal is the row's dot-form principal, <owner>.<actor>.
func (r Row) Principal() string { return r.Owner + "." + r.Actor }

// BearerScope is the scope a bearer minted from r carries: r's capability words
// (space.IsScopeWord: spawn, admin, supervise, ...) in row order. r's delegation tokens
// (role:<r>) stay in the ledger, where the spawner-chain rule reads them; the bearer grammar
// signerd signs and authd verifies has no room for them, and nothing downstream of the bearer
// reads them. Every scope entry of a valid row is one or the other (ValidateScopeToken), and a
// valid row holds at most MaxCapabilities words, so every granted row yields a bearer. Since the
// result is a subset of r.Scope, AuthorizeConnect's "bearer scope within the row's" holds for it.
func (r Row) BearerScope() []string {
	out := make([]string, 0, len(r.Scope))
	for _, s := range r.Scope {
		if space.IsScopeWord(s) {
			out = append(out, s)
		}
	}
	return out
}

// wireRow is Row as read from disk: pointers, so that a missing or null required field is told
// apart from an empty one.
type wireRow struct {
	Ver            *int      `json:"ver"`
	Owner          *string   `json:"owner"`
	Actor          *string   `json:"actor"`
	Scope          *[]string `json:"scope"`
	AllowSubscribe *[]string `json:"allowSubscribe"`
	AllowPublish   *[]string `json:"allowPublish"`
	Role           *string   `json:"role"`
	Parent         *string   `json:"parent"`
	Label          *string   `json:"label"`
	TokenHash      *string   `json:"tokenHash"`
	LifecycleUID   *string   `json:"lifecycleUid"`
	GrantedAt      *int64    `json:"grantedAt"`
}

// decodeRow parses one row file of space kind. It refuses, with a *Error wrapping ErrInvalidRow:
// more than MaxRowBytes, anything but one JSON object, an unknown or duplicated-by-case field
// (encoding/json matches keys case-insensitively, so "Owner" is refused rather than read as
// "owner"), a missing or null required field, an optional field present but empty (the writer
// omits it), and every field check of validate.
func decodeRow(kind Kind, data []byte) (Row, error) {
	if len(data) > MaxRowBytes {
		return Row{}, invalid("row is %d bytes, more than %d", len(data), MaxRowBytes)
	}
	if err := exactKeys(data); err != nil {
		return Row{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w wireRow
	if err := dec.Decode(&w); err != nil {
		return Row{}, invalid("not a row: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Row{}, invalid("trailing data after the row")
	}
	switch {
	case w.Ver == nil:
		return Row{}, invalid("missing ver")
	case w.Owner == nil || w.Actor == nil:
		return Row{}, invalid("missing owner or actor")
	case w.Scope == nil || w.AllowSubscribe == nil || w.AllowPublish == nil:
		return Row{}, invalid("missing an explicit scope, allowSubscribe or allowPublish list")
	case w.LifecycleUID == nil:
		return Row{}, invalid("missing lifecycleUid")
	case w.GrantedAt == nil:
		return Row{}, invalid("missing grantedAt")
	}
	for name, p := range map[string]*string{"role": w.Role, "parent": w.Parent, "label": w.Label, "tokenHash": w.TokenHash} {
		if p != nil && *p == "" {
			return Row{}, invalid("%s is present but empty", name)
		}
	}
	r := Row{
		Ver: *w.Ver, Owner: *w.Owner, Actor: *w.Actor,
		Scope: *w.Scope, AllowSubscribe: *w.AllowSubscribe, AllowPublish: *w.AllowPublish,
		Role: deref(w.Role), Parent: deref(w.Parent), Label: deref(w.Label), TokenHash: deref(w.TokenHash),
		LifecycleUID: *w.LifecycleUID, GrantedAt: *w.GrantedAt,
	}
	if err := validate(kind, r); err != nil {
		return Row{}, err
	}
	return r, nil
}

// exactKeys refuses an object whose keys are not spelled exactly as Row's tags, or that repeats
// a key: encoding/json would otherwise fold "OWNER" onto owner, or let a second "scope" replace
// the first, so the file would not say what a reader of it sees.
func exactKeys(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return invalid("not a JSON object: %v", err)
	}
	for k := range m {
		if !rowKeys[k] {
			return invalid("unknown field %.64q", k)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // '{'
		return invalid("not a JSON object: %v", err)
	}
	seen := make(map[string]bool, len(m))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalid("not a JSON object: %v", err)
		}
		k, _ := tok.(string)
		if seen[k] {
			return invalid("field %.64q appears twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return invalid("not a JSON object: %v", err)
		}
	}
	return nil
}

var rowKeys = map[string]bool{
	"ver": true, "owner": true, "actor": true, "scope": true, "allowSubscribe": true, "allowPublish": true,
	"role": true, "parent": true, "label": true, "tokenHash": true, "lifecycleUid": true, "grantedAt": true,
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// validate checks every field of r for a row of space kind. It refuses, with a *Error wrapping
// ErrInvalidRow: an unknown kind; a version other than Version; an owner that is not a derived
// owner (u_ + 26 base32) or an actor outside the owner/actor grammar; a scope entry that is
// neither a capability word nor role:<role> (ValidateScopeToken); more than MaxCapabilities
// capability words; an allowSubscribe or allowPublish entry that is not a channel pattern
// (space.ValidateChannelPattern: a concrete channel, or one with whole-token wildcards such as
// "team.>" or "team.*", as the agent profile's channel params take them); more channels than
// profiles.MaxChannels or scope entries than MaxScope; a duplicate in any list; a role outside the role grammar; a parent that is not one
// <u_...>.<actor> principal or is the row itself; a label that is not short printable UTF-8; a
// token hash in an interactive row, or a managed row without a lower-case SHA-256 hex one; a
// lifecycle UID outside its grammar (it is required: the callout mints lifecycle-keyed grants
// from it); a grantedAt that is not positive.
func validate(kind Kind, r Row) error {
	if kind != Interactive && kind != Managed {
		return invalid("unknown row space %.64q", string(kind))
	}
	if r.Ver != Version {
		return invalid("version %d, want %d", r.Ver, Version)
	}
	if err := space.ValidateDerivedOwner(r.Owner); err != nil {
		return invalid("%v", err)
	}
	if err := space.ValidateActor(r.Actor); err != nil {
		return invalid("%v", err)
	}
	if len(r.Scope) > MaxScope {
		return invalid("%d scope entries, more than %d", len(r.Scope), MaxScope)
	}
	for _, s := range r.Scope {
		if err := ValidateScopeToken(s); err != nil {
			return invalid("%v", err)
		}
	}
	if err := noDuplicates("scope", r.Scope); err != nil {
		return err
	}
	if n := len(r.BearerScope()); n > MaxCapabilities {
		return invalid("%d capability words in scope, more than the %d a bearer carries", n, MaxCapabilities)
	}
	for name, list := range map[string][]string{"allowSubscribe": r.AllowSubscribe, "allowPublish": r.AllowPublish} {
		if len(list) > profiles.MaxChannels {
			return invalid("%d %s channels, more than %d", len(list), name, profiles.MaxChannels)
		}
		for _, ch := range list {
			// Both lists become the agent profile's channel params (the callout passes
			// allowSubscribe as Subscribe and AllowSubscribe, allowPublish as AllowPublish),
			// which take patterns; signerd grants a pattern only where authd's policy covers
			// its broker reach.
			if err := space.ValidateChannelPattern(ch); err != nil {
				return invalid("%s: %v", name, err)
			}
		}
		if err := noDuplicates(name, list); err != nil {
			return err
		}
	}
	if r.Role != "" {
		if err := space.ValidateRole(r.Role); err != nil {
			return invalid("%v", err)
		}
	}
	if r.Parent != "" {
		po, pa, err := SplitPrincipal(r.Parent)
		if err != nil {
			return invalid("parent: %v", err)
		}
		if po == r.Owner && pa == r.Actor {
			return invalid("parent %.64q is the row itself", r.Parent)
		}
	}
	if err := validateLabel(r.Label); err != nil {
		return err
	}
	switch {
	case kind == Interactive && r.TokenHash != "":
		return invalid("an interactive row carries no token hash (managed rows are written by the spawn path only)")
	case kind == Managed && !isSHA256Hex(r.TokenHash):
		return invalid("a managed row needs tokenHash, the lower-case hex SHA-256 of the agent's exchange secret")
	}
	if err := space.ValidateUID(r.LifecycleUID); err != nil {
		return invalid("%v", err)
	}
	if r.GrantedAt <= 0 {
		return invalid("grantedAt %d is not a positive unix-millisecond time", r.GrantedAt)
	}
	return nil
}

// ValidateScopeToken checks one entry of a row's scope. An entry is one of two kinds:
//   - a capability word, space.IsScopeWord ([a-z][a-z0-9_-]{0,31}: spawn, admin, supervise, ...),
//     the grammar signerd signs and authd's bearer package verifies; it rides the bearer
//     (Row.BearerScope) and gates views and agent capabilities;
//   - a delegation token role:<r> with r in the role grammar (space.ValidateRole); it stays in the
//     ledger and lets the row's holder spawn agents serving role r (the spawner-chain rule).
//
// Anything else is refused with a sentence naming both forms: a row the ledger accepts must
// always exchange to a bearer, so a token signerd would refuse to sign is refused here, at grant
// time, rather than as a 502 at the first exchange.
func ValidateScopeToken(s string) error {
	if space.IsScopeWord(s) {
		return nil
	}
	if role, ok := strings.CutPrefix(s, RolePrefix); ok {
		if err := space.ValidateRole(role); err != nil {
			return fmt.Errorf("scope entry %.80q is not role:<role>: %v", s, err)
		}
		return nil
	}
	return fmt.Errorf("scope entry %.80q is neither a capability word ([a-z][a-z0-9_-]{0,%d}, carried in the bearer) nor role:<role> (a delegation token kept in the ledger)",
		s, space.MaxScopeWordLen-1)
}

// SplitPrincipal splits a dot-form principal <owner>.<actor> whose owner is a derived owner. It
// refuses anything else, so a parent link can never name a subject wildcard or a second dot.
func SplitPrincipal(p string) (owner, actor string, err error) {
	owner, actor, ok := strings.Cut(p, ".")
	if !ok || strings.Contains(actor, ".") {
		return "", "", fmt.Errorf("%.64q is not one <owner>.<actor> principal", p)
	}
	if err := space.ValidateDerivedOwner(owner); err != nil {
		return "", "", err
	}
	if err := space.ValidateActor(actor); err != nil {
		return "", "", err
	}
	return owner, actor, nil
}

func validateLabel(s string) error {
	if len(s) > MaxLabelLen {
		return invalid("label is longer than %d bytes", MaxLabelLen)
	}
	if !utf8.ValidString(s) {
		return invalid("label is not valid UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return invalid("label contains the non-printable %U", r)
		}
	}
	return nil
}

func noDuplicates(name string, list []string) error {
	seen := make(map[string]bool, len(list))
	for _, s := range list {
		if seen[s] {
			return invalid("%s lists %.64q twice", name, s)
		}
		seen[s] = true
	}
	return nil
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// encodeRow is the file content for r: indented JSON, so an operator reading the file sees one
// field a line.
func encodeRow(r Row) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
