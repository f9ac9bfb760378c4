package daemon

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"unicode/utf8"
)

// Rejection handling (seed 001, "Rejection handling"; lifecycle-hosted.md §2.10). A store,
// runtime, extension or host callback a daemon calls may reject with any value: in Go, return an
// error, or panic with any value at all, nil included. The daemon logs or refuses with that
// value's text and keeps serving; a value it cannot read reports as UnreadableRejection.

// UnreadableRejection is RejectionText's answer for a value whose text cannot be read.
const UnreadableRejection = "an unreadable rejection"

// RejectionText is the text of a rejection value v, upstream's rejectionText: "nil" for nil, an
// error's Error(), a fmt.Stringer's String(), a string as it is, anything else as fmt.Sprint
// prints it (a fmt.Formatter's Format under %v). If reading it panics (a nil pointer whose
// Error() dereferences it, a String() that panics), it is UnreadableRejection. It never panics.
func RejectionText(v any) (text string) {
	defer func() {
		if recover() != nil {
			text = UnreadableRejection
		}
	}()
	switch x := v.(type) {
	case nil:
		return "nil"
	case error:
		return x.Error()
	case fmt.Stringer:
		return x.String()
	case string:
		return x
	case fmt.Formatter:
		// fmt would catch a panicking Format and print its own "%!v(PANIC=...)": call it here, so
		// that a panic is unreadable, as for Error and String.
		var s formatState
		x.Format(&s, 'v')
		return string(s.buf)
	}
	return fmt.Sprint(v)
}

// formatState is the fmt.State a Formatter is handed for a plain %v.
type formatState struct{ buf []byte }

func (s *formatState) Write(p []byte) (int, error) { s.buf = append(s.buf, p...); return len(p), nil }
func (*formatState) Width() (int, bool)            { return 0, false }
func (*formatState) Precision() (int, bool)        { return 0, false }
func (*formatState) Flag(int) bool                 { return false }

// Rejection is a host-supplied call that panicked, or returned an error that cannot be read (its
// Error, or a walk of its chain, panicked), as an error a daemon can log and refuse with. Hook
// names the call ("launcher Launch", "Events", ...); Text is RejectionText of the value.
type Rejection struct {
	Hook string
	Text string
	// Panicked: the call panicked (with a value whose text is Text); otherwise it returned an
	// error that could not be read whole.
	Panicked bool
}

func (r *Rejection) Error() string {
	if r.Panicked {
		return r.Hook + " panicked: " + quoteText(r.Text)
	}
	return r.Hook + " rejected: " + quoteText(r.Text)
}

// quoteText keeps a rejection's text on one line and valid UTF-8 (it reaches logs and RPC
// answers): text with a control character or invalid UTF-8 is quoted.
func quoteText(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return strconv.Quote(s)
		}
	}
	return s
}

// Recovered is a *Rejection for a panic value recovered from the hook: call it as
// `if v := recover(); v != nil { err = daemon.Recovered(hook, v) }` in a deferred function. A
// panic(nil), which recover returns as a *runtime.PanicNilError, is the value nil: "nil", as
// upstream's rejection with null is "null".
func Recovered(hook string, v any) *Rejection {
	if _, ok := v.(*runtime.PanicNilError); ok {
		v = nil
	}
	return &Rejection{Hook: hook, Text: RejectionText(v), Panicked: true}
}

// Guard calls f, a call into host-supplied code named hook, and returns its error (through
// Readable), or a *Rejection when it panicked. It never panics itself (but for runtime.Goexit).
func Guard(hook string, f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = Recovered(hook, v)
		}
	}()
	return Readable(hook, f())
}

// probe is a target no host error can match: errors.Is and errors.As with it walk the whole
// chain of an error, calling each Unwrap, Is and As method there is.
type probe struct{}

func (*probe) Error() string { return "probe" }

var errProbe = &probe{}

// Readable returns err when it can be read: its Error() and a walk of its chain (Unwrap, Is and
// As methods) do not panic. Otherwise it returns a *Rejection with its text (Error's, or
// UnreadableRejection), so that logging it, refusing with it or asking errors.Is about it cannot
// take the daemon down. nil stays nil; a typed nil pointer in the interface is not nil, and is
// read like any other error.
func Readable(hook string, err error) error {
	if err == nil {
		return nil
	}
	text := RejectionText(err)
	if text == UnreadableRejection {
		return &Rejection{Hook: hook, Text: text}
	}
	walked := func() (ok bool) {
		defer func() {
			if recover() != nil {
				ok = false
			}
		}()
		var p *probe
		return !errors.Is(err, errProbe) && !errors.As(err, &p)
	}()
	if !walked {
		return &Rejection{Hook: hook, Text: text}
	}
	return err
}
