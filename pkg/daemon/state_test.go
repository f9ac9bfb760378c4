package daemon

import (
	"errors"
	"testing"
)

func TestTracker(t *testing.T) {
	var got []Event
	tr := NewTracker("deliveryd", func(e Event) { got = append(got, e) }, nil)
	if s := tr.State(); s != StateStarting {
		t.Fatalf("initial state %q, want starting", s)
	}
	ch := tr.Changed()
	if !tr.Set(StateReady, "", "serving", nil) {
		t.Fatal("starting -> ready not reported as a change")
	}
	select {
	case <-ch:
	default:
		t.Fatal("Changed channel not closed on a state change")
	}
	if tr.Set(StateReady, "", "again", nil) {
		t.Fatal("ready -> ready reported as a change")
	}
	tr.Warn("RENEWAL", "renewal failed, retrying", errors.New("boom"))
	tr.Set(StateUnavailable, "BROKER", "broker gone", nil)
	tr.Set(StateStopped, "", "closed", nil)
	if tr.Set(StateReady, "", "after stop", nil) {
		t.Fatal("a stopped tracker moved out of stopped")
	}
	want := []struct {
		kind  EventKind
		state State
		code  string
	}{{EventState, StateReady, ""}, {EventWarning, StateReady, "RENEWAL"}, {EventState, StateUnavailable, "BROKER"}, {EventState, StateStopped, ""}}
	if len(got) != len(want) {
		t.Fatalf("got %d events %v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].Kind != w.kind || got[i].State != w.state || got[i].Code != w.code || got[i].Daemon != "deliveryd" || got[i].Time.IsZero() {
			t.Errorf("event %d = %+v, want kind %s state %s code %q", i, got[i], w.kind, w.state, w.code)
		}
	}
	if s := got[1].String(); s != "deliveryd warning ready RENEWAL: renewal failed, retrying: boom" {
		t.Errorf("String() = %q", s)
	}
}
