package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxLeaseFieldBytes bounds a manager lease row's holder, runtime and root.
const MaxLeaseFieldBytes = 1024

// ManagerLease is the value of one manager instance's lease key lease.<instanceId> in the space's
// manager bucket (cotal_manager_<t>), upstream's ManagerLeaseInfo with its instanceId
// (packages/core/src/lease.ts): the JSON field names and the epoch-millisecond since are
// upstream's, so either implementation can read the other's row. managerd writes it (create-only,
// renewed by compare-and-set, expired by the bucket's max_age); authd only reads it, to admit a
// register-manager request from the lease's holder alone.
//
// ProcessEpoch and RegistrationRevision are ours: managerd rewrites its row with the endpoint
// gate's coordinates once authd registered this start. Both are absent from a row written before
// the registration (or by upstream), and a row carries both or neither: RegistrationRevision is
// a spec's KV revision, at least 1, so its zero value means "not registered" while ProcessEpoch 0
// is the first registration's epoch.
type ManagerLease struct {
	// Holder is the manager's endpoint principal, <owner>.<actor>.
	Holder string
	// InstanceID is the logical manager instance; it is also the key's last token.
	InstanceID string
	// Runtime is how the manager runs its agents ("pty").
	Runtime string
	// Root is the resolved (absolute, clean) workspace root the manager serves from.
	Root string
	// PID is the holder's OS process id on the host that owns Root.
	PID int
	// Since is when the row was created, in Unix milliseconds.
	Since int64
	// ProcessEpoch is the epoch authd committed for this start (meaningful only when
	// RegistrationRevision is not 0).
	ProcessEpoch uint64
	// RegistrationRevision is the registration revision authd committed for this start; 0 means
	// the row records no registration.
	RegistrationRevision uint64
}

// Registered reports whether the row records a registration.
func (r ManagerLease) Registered() bool { return r.RegistrationRevision != 0 }

// leaseWire is the row's JSON, upstream's field order, then the optional registration pair.
type leaseWire struct {
	Holder               string  `json:"holder"`
	InstanceID           string  `json:"instanceId"`
	Runtime              string  `json:"runtime"`
	Root                 string  `json:"root"`
	PID                  int     `json:"pid"`
	Since                int64   `json:"since"`
	ProcessEpoch         *uint64 `json:"processEpoch,omitempty"`
	RegistrationRevision *uint64 `json:"registrationRevision,omitempty"`
}

// LeaseKey is a manager instance's lease key in the manager bucket: lease.<instanceId>.
func LeaseKey(instanceID string) (string, error) {
	k, err := space.ManagerLeaseKey(instanceID)
	if err != nil {
		return "", fmt.Errorf("lifecycle: lease key: %w", err)
	}
	return k, nil
}

// Validate refuses a row a live manager could not have written: an empty or oversized holder or
// runtime, a root that is not a clean absolute path, a pid that is not positive, a negative
// since, an instance id outside the uid grammar, an epoch without a revision, and integers above
// MaxSafeInteger.
func (r ManagerLease) Validate() error {
	switch {
	case r.Holder == "" || len(r.Holder) > MaxLeaseFieldBytes:
		return fmt.Errorf("lease row: holder is empty or over %d bytes", MaxLeaseFieldBytes)
	case r.Runtime == "" || len(r.Runtime) > MaxLeaseFieldBytes:
		return fmt.Errorf("lease row: runtime is empty or over %d bytes", MaxLeaseFieldBytes)
	case len(r.Root) > MaxLeaseFieldBytes || !filepath.IsAbs(r.Root) || filepath.Clean(r.Root) != r.Root:
		return fmt.Errorf("lease row: root %q is not a clean absolute path of at most %d bytes", clip(r.Root), MaxLeaseFieldBytes)
	case r.PID <= 0:
		return fmt.Errorf("lease row: pid %d is not positive", r.PID)
	case r.Since < 0:
		return fmt.Errorf("lease row: since %d is negative", r.Since)
	case r.RegistrationRevision == 0 && r.ProcessEpoch != 0:
		return errors.New("lease row: a processEpoch without a registrationRevision")
	case r.RegistrationRevision > MaxSafeInteger || r.ProcessEpoch > MaxSafeInteger:
		return errors.New("lease row: processEpoch or registrationRevision above 2^53-1")
	}
	if err := space.ValidateUID(r.InstanceID); err != nil {
		return fmt.Errorf("lease row: instanceId: %w", err)
	}
	return nil
}

// EncodeManagerLease validates r and returns its JSON: upstream's fields in upstream's order,
// then processEpoch and registrationRevision when the row records a registration.
func EncodeManagerLease(r ManagerLease) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("lifecycle: encode %w", err)
	}
	b, err := r.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("lifecycle: encode lease row: %w", err)
	}
	return b, nil
}

// MarshalJSON writes the row's JSON as EncodeManagerLease does, without validating it, so a
// ManagerLease marshals as the row it is.
func (r ManagerLease) MarshalJSON() ([]byte, error) {
	w := leaseWire{Holder: r.Holder, InstanceID: r.InstanceID, Runtime: r.Runtime, Root: r.Root, PID: r.PID, Since: r.Since}
	if r.Registered() {
		w.ProcessEpoch, w.RegistrationRevision = &r.ProcessEpoch, &r.RegistrationRevision
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a row as DecodeManagerLease does (strictly, refusing an invalid row).
func (r *ManagerLease) UnmarshalJSON(b []byte) error {
	v, err := DecodeManagerLease(b)
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// DecodeManagerLease reads a lease row strictly: at most MaxRowBytes, one JSON object, no unknown
// field, no trailing data, processEpoch and registrationRevision both present or both absent
// (a present registrationRevision at least 1), and every field valid (Validate). Unlike the
// authority rows it does not demand the canonical bytes: upstream writes this row too. A value
// that is not a row is an error wrapping ErrCorrupt, never trusted and never taken for a holder.
// The caller checks that InstanceID is its key's.
func DecodeManagerLease(b []byte) (ManagerLease, error) {
	if len(b) > MaxRowBytes {
		return ManagerLease{}, fmt.Errorf("%w: lease row of %d bytes (at most %d)", ErrCorrupt, len(b), MaxRowBytes)
	}
	var w leaseWire
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return ManagerLease{}, fmt.Errorf("%w: lease row: %v", ErrCorrupt, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ManagerLease{}, fmt.Errorf("%w: lease row: trailing data after the object", ErrCorrupt)
	}
	r := ManagerLease{Holder: w.Holder, InstanceID: w.InstanceID, Runtime: w.Runtime, Root: w.Root, PID: w.PID, Since: w.Since}
	switch {
	case (w.ProcessEpoch == nil) != (w.RegistrationRevision == nil):
		return ManagerLease{}, fmt.Errorf("%w: lease row: processEpoch and registrationRevision come together", ErrCorrupt)
	case w.RegistrationRevision != nil:
		if *w.RegistrationRevision == 0 {
			return ManagerLease{}, fmt.Errorf("%w: lease row: registrationRevision is 0", ErrCorrupt)
		}
		r.ProcessEpoch, r.RegistrationRevision = *w.ProcessEpoch, *w.RegistrationRevision
	}
	if err := r.Validate(); err != nil {
		return ManagerLease{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return r, nil
}
