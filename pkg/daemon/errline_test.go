package daemon

import (
	"errors"
	"testing"
)

// TestErrLine: Serve's stderr line names the daemon once, whether or not the error already does.
func TestErrLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"ok/prefixed-once", errors.New("lease lost"), "deliveryd: lease lost"},
		{"ok/start-error-names-its-daemon", &StartError{Daemon: "deliveryd", Code: "LEASE_HELD", Reason: "held"}, "deliveryd: held"},
		{"ok/stop-cause-names-its-daemon", errors.New("deliveryd: the delivery lease was taken"), "deliveryd: the delivery lease was taken"},
		{"ok/another-name-is-not-ours", errors.New("deliveryd2: x"), "deliveryd: deliveryd2: x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errLine("deliveryd", tc.err); got != tc.want {
				t.Fatalf("errLine = %q, want %q", got, tc.want)
			}
		})
	}
}
