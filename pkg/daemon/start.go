package daemon

import (
	"errors"
	"fmt"
	"log/slog"
)

// Start-refusal codes every daemon uses; each adds its own (a held claim, a broker refusal, ...).
const (
	CodeConfig   = "CONFIG"   // the configuration or state directory is refused
	CodeCanceled = "CANCELED" // ctx ended before the service was ready
)

// StartError is a refused start: a stable code, a sentence, details (such as the holder of a
// claim) and the cause. The code, the sentence and the details are what the refusal file says.
type StartError struct {
	// Daemon names the daemon in Error ("authd: ..."); RefuseStart sets it.
	Daemon  string
	Code    string
	Reason  string
	Details map[string]string
	Err     error
}

func (e *StartError) Error() string {
	prefix := ""
	if e.Daemon != "" {
		prefix = e.Daemon + ": "
	}
	if e.Err == nil {
		return prefix + e.Reason
	}
	return fmt.Sprintf("%s%s: %v", prefix, e.Reason, e.Err)
}

// Unwrap returns the cause.
func (e *StartError) Unwrap() error { return e.Err }

// RefuseStart turns the error a start of daemon failed with into a *StartError (one that is
// not becomes CodeConfig "start failed") and writes it to name's refusal file in dir
// (WriteRefusal), for a launcher waiting in Ready, after logging one "<daemon> start refused"
// error line with its code, reason and cause. The file's reason carries the cause, except when
// the refusal has details: those (a holder) say the rest, and the reason already names them. A
// canceled start logs and writes nothing; one before the state directory is known (dir empty)
// writes no file; a file that cannot be written is logged.
func RefuseStart(log *slog.Logger, dir, name, daemon string, pid int, err error) *StartError {
	var se *StartError
	if !errors.As(err, &se) {
		se = &StartError{Code: CodeConfig, Reason: "start failed", Err: err}
	}
	if se.Daemon == "" {
		se.Daemon = daemon
	}
	if se.Code == CodeCanceled {
		return se
	}
	// One line says why, whether or not a file can: the log is where an operator looks first.
	attrs := []any{"code", se.Code, "reason", se.Reason}
	if se.Err != nil {
		attrs = append(attrs, "err", se.Err.Error())
	}
	log.Error(se.Daemon+" start refused", attrs...)
	if dir == "" {
		return se
	}
	reason := se.Reason
	if se.Err != nil && se.Details == nil {
		reason += ": " + se.Err.Error()
	}
	if werr := WriteRefusal(dir, name, Refusal{PID: pid, Code: se.Code, Reason: reason, Details: se.Details}); werr != nil {
		log.Warn("refusal file not written", "err", werr)
	}
	return se
}
