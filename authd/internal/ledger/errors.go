package ledger

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error the ledger returns for a decision is a *Error wrapping exactly one
// of them, so a caller tests it with errors.Is and refuses with the sentinel's own sentence
// (which names no path, owner or secret) while logging the *Error in full.
var (
	// ErrNoRow: the principal has no row (never granted, or revoked). A missing row denies.
	ErrNoRow = errors.New("actor is not (or no longer) granted for this owner")
	// ErrBothSpaces: the principal has a row in both row spaces. The writers refuse this, so only
	// tampering or a crash between a write and its compensation produces it; it denies.
	ErrBothSpaces = errors.New("actor is granted in both the interactive and the managed row space; a broken ledger denies")
	// ErrOtherSpace: a Put into one row space for a principal the other space already holds.
	ErrOtherSpace = errors.New("actor is already granted in the other row space")
	// ErrManagedActor: an IdP exchange for a principal that exists only as a managed agent.
	ErrManagedActor = errors.New("actor is a managed agent; it authenticates with its own spawn-time secret")
	// ErrScopeWidened: the bearer's scope names a capability the row no longer grants.
	ErrScopeWidened = errors.New("bearer scope exceeds the actor's current grant")
	// ErrLifecycleMismatch: the bearer names no lifecycle UID, or not the row's current one (the
	// actor was re-granted or respawned since the bearer was minted).
	ErrLifecycleMismatch = errors.New("bearer lifecycle is not the actor's current incarnation")
	// ErrSpawnerChain: a link of the row's parent chain is missing, crosses owners, loops, or
	// grants less than the row below it.
	ErrSpawnerChain = errors.New("actor exceeds or has lost its spawner's grant")
	// ErrAgentExchange: every refusal of an agent (actor-secret) exchange before the secret has
	// matched: one sentence, so a prober learns nothing about which rows exist.
	ErrAgentExchange = errors.New("agent exchange refused: unknown agent or wrong secret")
	// ErrInvalidRow: a row on disk, or a row given to Put, that breaks the row grammar; also an
	// owner or actor outside its grammar. A broken row denies its actor and fails List.
	ErrInvalidRow = errors.New("invalid actor row")
)

// Error is a ledger refusal: Err is one of the sentinels, the rest is for the log.
type Error struct {
	Err       error
	Principal string // <owner>.<actor>, when known
	Path      string // the row file involved, when there is one
	Detail    string
}

func (e *Error) Error() string {
	s := "ledger"
	if e.Principal != "" {
		s += " " + e.Principal
	}
	s += ": " + e.Err.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Path != "" {
		s += " (" + e.Path + ")"
	}
	return s
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// invalid is an ErrInvalidRow with a detail; the caller adds path and principal.
func invalid(format string, args ...any) *Error {
	return &Error{Err: ErrInvalidRow, Detail: fmt.Sprintf(format, args...)}
}

// at fills in the path and principal of a *Error that lacks them; other errors are wrapped as
// ErrInvalidRow, since every failure to read a row denies like a broken one.
func at(err error, path, principal string) error {
	var e *Error
	if !errors.As(err, &e) {
		return &Error{Err: ErrInvalidRow, Principal: principal, Path: path, Detail: err.Error()}
	}
	if e.Path == "" {
		e.Path = path
	}
	if e.Principal == "" {
		e.Principal = principal
	}
	return e
}
