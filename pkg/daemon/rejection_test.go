package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// nilDeref is an error type whose Error dereferences its receiver: a typed nil pointer of it in
// an error interface is not nil, and reading it panics.
type nilDeref struct{ msg string }

func (e *nilDeref) Error() string { return e.msg }

type stringer struct{}

func (stringer) String() string { return "a stringer" }

type panickyStringer struct{}

func (panickyStringer) String() string { panic("String blew up") }

type formatter struct{ panics bool }

func (f formatter) Format(s fmt.State, verb rune) {
	if f.panics {
		panic("Format blew up")
	}
	fmt.Fprintf(s, "formatted %c", verb)
}

type point struct{ X, Y int }

// unwrapPanics reads fine but panics when its chain is walked.
type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "readable text" }
func (unwrapPanics) Unwrap() error { panic("Unwrap blew up") }

// TestRejectionText: upstream's rejectionText cases (lifecycle-hosted.md §2.10 item 18).
func TestRejectionText(t *testing.T) {
	var typedNil *nilDeref
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"ok/nil", nil, "nil"},
		{"ok/an error", errors.New("disk full"), "disk full"},
		{"ok/a wrapped error", fmt.Errorf("store: %w", errors.New("disk full")), "store: disk full"},
		{"ok/a string", "plain words", "plain words"},
		{"ok/an empty string", "", ""},
		{"ok/a Stringer", stringer{}, "a stringer"},
		{"ok/an int", 42, "42"},
		{"ok/a struct", point{1, 2}, "{1 2}"},
		{"ok/a pointer to a struct", &point{3, 4}, "&{3 4}"},
		{"ok/a Formatter", formatter{}, "formatted v"},
		{"ok/a time", time.Duration(1500) * time.Millisecond, "1.5s"},
		{"fail/a typed nil error pointer whose Error panics", error(typedNil), UnreadableRejection},
		{"fail/a typed nil pointer, not in an error interface", typedNil, UnreadableRejection},
		{"fail/a Stringer that panics", panickyStringer{}, UnreadableRejection},
		{"fail/a Formatter that panics", formatter{panics: true}, UnreadableRejection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RejectionText(tc.v); got != tc.want {
				t.Fatalf("RejectionText(%T) = %q, want %q", tc.v, got, tc.want)
			}
		})
	}
}

// TestGuard: a panic, with any value, becomes a *Rejection naming the hook; an unreadable error
// becomes one too; a readable error passes through unchanged.
func TestGuard(t *testing.T) {
	var typedNil *nilDeref
	for _, tc := range []struct {
		name         string
		f            func() error
		wantText     string
		wantPanicked bool
	}{
		{"fail/panic with a string", func() error { panic("boom") }, "boom", true},
		{"fail/panic with nil", func() error { panic(nil) }, "nil", true},
		{"fail/panic with an int", func() error { panic(7) }, "7", true},
		{"fail/panic with an error", func() error { panic(errors.New("an error value")) }, "an error value", true},
		{"fail/panic with a typed nil error", func() error { panic(typedNil) }, UnreadableRejection, true},
		{"fail/nil dereference", func() error { var p *point; return fmt.Errorf("%d", p.X) }, "runtime error: invalid memory address or nil pointer dereference", true},
		{"fail/returns a typed nil error", func() error { return typedNil }, UnreadableRejection, false},
		{"fail/returns an error whose chain panics", func() error { return fmt.Errorf("outer: %w", unwrapPanics{}) }, "outer: readable text", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Guard("the test hook", tc.f)
			var rj *Rejection
			if !errors.As(err, &rj) {
				t.Fatalf("Guard: %v (%T), want a *Rejection", err, err)
			}
			if rj.Hook != "the test hook" || rj.Text != tc.wantText || rj.Panicked != tc.wantPanicked {
				t.Fatalf("rejection %+v, want text %q panicked %v", rj, tc.wantText, tc.wantPanicked)
			}
			verb := " rejected: "
			if tc.wantPanicked {
				verb = " panicked: "
			}
			if got, want := rj.Error(), "the test hook"+verb+tc.wantText; got != want {
				t.Fatalf("Error() = %q, want %q", got, want)
			}
		})
	}
	t.Run("ok/a readable error passes through", func(t *testing.T) {
		want := fmt.Errorf("wrapped: %w", errors.ErrUnsupported)
		if err := Guard("h", func() error { return want }); err != want || !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Guard = %v, want the same error", err)
		}
	})
	t.Run("ok/nil passes through", func(t *testing.T) {
		if err := Guard("h", func() error { return nil }); err != nil {
			t.Fatalf("Guard = %v, want nil", err)
		}
	})
	t.Run("ok/text with a newline is quoted", func(t *testing.T) {
		err := Guard("h", func() error { panic("line one\nline two") })
		if got := err.Error(); got != `h panicked: "line one\nline two"` || strings.Contains(got, "\n") {
			t.Fatalf("Error() = %q", got)
		}
	})
}

// TestTrackerRejection: an events callback or clock that panics drops (or restamps) that event,
// is reported to OnRejection after the lock is released, and the tracker goes on.
func TestTrackerRejection(t *testing.T) {
	var got []Event
	calls := 0
	tr := NewTracker("managerd", func(e Event) {
		calls++
		if e.Code == "BAD" {
			panic(fmt.Errorf("sink refused %s", e.Code))
		}
		got = append(got, e)
	}, nil)
	var rejected []*Rejection
	tr.OnRejection(func(rj *Rejection) {
		// Called without the lock held: the tracker answers.
		_ = tr.State()
		rejected = append(rejected, rj)
	})
	tr.Warn("BAD", "first", nil)
	if !tr.Set(StateReady, "", "ready", nil) {
		t.Fatal("Set after a panicking callback: no change")
	}
	tr.Warn("GOOD", "second", nil)
	if calls != 3 || len(got) != 2 || got[0].State != StateReady || got[1].Code != "GOOD" {
		t.Fatalf("calls %d, events %v", calls, got)
	}
	if len(rejected) != 1 || rejected[0].Hook != "the events callback" || rejected[0].Text != "sink refused BAD" || !rejected[0].Panicked {
		t.Fatalf("rejections %+v", rejected)
	}

	t.Run("fail/a panicking clock stamps time.Now", func(t *testing.T) {
		var ev []Event
		var rj []*Rejection
		tr := NewTracker("authd", func(e Event) { ev = append(ev, e) }, func() time.Time { panic("no clock") })
		tr.OnRejection(func(r *Rejection) { rj = append(rj, r) })
		tr.Warn("X", "m", nil)
		if len(ev) != 1 || ev[0].Time.IsZero() || ev[0].Daemon != "authd" {
			t.Fatalf("events %v", ev)
		}
		if len(rj) != 1 || rj[0].Hook != "the clock (Now)" || rj[0].Text != "no clock" {
			t.Fatalf("rejections %+v", rj)
		}
	})
}
