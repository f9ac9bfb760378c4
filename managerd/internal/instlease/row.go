package instlease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/cotalgo/cotal/pkg/space"
)

// Row is the value of one instance's lease key, upstream's ManagerLeaseInfo with its instanceId
// (packages/core/src/lease.ts): the JSON field names and the epoch-millisecond since are upstream's,
// so either implementation can read the other's row.
type Row struct {
	// Holder is the manager's endpoint principal, <owner>.<actor>.
	Holder string `json:"holder"`
	// InstanceID is the logical manager instance; it is also the key's last token.
	InstanceID string `json:"instanceId"`
	// Runtime is how the manager runs its agents ("pty").
	Runtime string `json:"runtime"`
	// Root is the resolved (absolute, clean) workspace root the manager serves from.
	Root string `json:"root"`
	// PID is the holder's OS process id on the host that owns Root.
	PID int `json:"pid"`
	// Since is when the row was created, in Unix milliseconds.
	Since int64 `json:"since"`
}

// maxRowBytes bounds a row read from the broker; a real row is a few hundred bytes.
const maxRowBytes = 4096

// maxFieldBytes bounds holder, runtime and root.
const maxFieldBytes = 1024

// decodeRow reads a row strictly: at most maxRowBytes, one JSON object, no unknown field, no
// trailing data, and every field valid (see Row.validate). A value that is not a row is an
// error, never trusted and never taken for a holder.
func decodeRow(b []byte) (Row, error) {
	var r Row
	if len(b) > maxRowBytes {
		return Row{}, fmt.Errorf("row of %d bytes (at most %d)", len(b), maxRowBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Row{}, fmt.Errorf("row: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Row{}, errors.New("row: trailing data after the object")
	}
	if err := r.validate(); err != nil {
		return Row{}, err
	}
	return r, nil
}

// validate refuses a row a live manager could not have written.
func (r Row) validate() error {
	switch {
	case r.Holder == "" || len(r.Holder) > maxFieldBytes:
		return fmt.Errorf("row: holder is empty or over %d bytes", maxFieldBytes)
	case r.Runtime == "" || len(r.Runtime) > maxFieldBytes:
		return fmt.Errorf("row: runtime is empty or over %d bytes", maxFieldBytes)
	case len(r.Root) > maxFieldBytes || !filepath.IsAbs(r.Root) || filepath.Clean(r.Root) != r.Root:
		return fmt.Errorf("row: root %q is not a clean absolute path of at most %d bytes", r.Root, maxFieldBytes)
	case r.PID <= 0:
		return fmt.Errorf("row: pid %d is not positive", r.PID)
	case r.Since < 0:
		return fmt.Errorf("row: since %d is negative", r.Since)
	}
	if err := space.ValidateUID(r.InstanceID); err != nil {
		return fmt.Errorf("row: instanceId: %w", err)
	}
	return nil
}

// encodeRow is the row's JSON, upstream's field order.
func encodeRow(r Row) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("instlease: encode row: %w", err)
	}
	return b, nil
}

// DecodeRow decodes and validates a lease row as Acquire reads it (for managerd's own tests and
// tools that read the bucket).
func DecodeRow(b []byte) (Row, error) { return decodeRow(b) }
