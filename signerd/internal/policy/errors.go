package policy

import (
	"fmt"
	"strings"
)

// Error is a policy that cannot be loaded: a file that is unsafe to trust, bytes that are not
// YAML, an unknown key, or a value that fails validation. It names where the problem is so an
// operator can fix the file without guessing; signerd refuses to start (or keeps the previous
// policy on reload) while any Error is reported.
type Error struct {
	// Path is the policy file, when the policy was read from one.
	Path string
	// Line is the 1-based line of the offending key or value; 0 when unknown.
	Line int
	// Caller is the index of the offending entry under callers; -1 when the problem is not
	// about one caller.
	Caller int
	// ID is that caller's id as written in the file, when known.
	ID string
	// Field is the offending key, as a path below the caller (for example
	// "profiles.agent.ttl_max" or "channels[2]"), or a top-level key.
	Field string
	// Reason says what is wrong, quoting the offending value.
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("policy")
	if e.Path != "" {
		fmt.Fprintf(&b, " %s", e.Path)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ": line %d", e.Line)
	}
	if e.Caller >= 0 {
		fmt.Fprintf(&b, ": callers[%d]", e.Caller)
		if e.ID != "" {
			fmt.Fprintf(&b, " (%s)", e.ID)
		}
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": %s", e.Field)
	}
	fmt.Fprintf(&b, ": %s", e.Reason)
	return b.String()
}
