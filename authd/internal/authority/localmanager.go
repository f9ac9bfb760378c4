package authority

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// ManagerIdentityFile is the file a managerd writes in its state_dir once it holds its lease:
// {"v":1,"space":...,"instanceId":...}, mode 0600.
const ManagerIdentityFile = "manager-identity.json"

// maxIdentityBytes bounds manager-identity.json; a real one is under 100 bytes.
const maxIdentityBytes = 1024

// ManagerIdentity is the local managerd's persisted identity.
type ManagerIdentity struct {
	Space      string
	InstanceID string
}

// LocalManager reads the local managerd's identity afresh on every call. An error wrapping
// fs.ErrNotExist means there is no local manager; any other error, an unreadable one.
type LocalManager func() (ManagerIdentity, error)

// LocalManagerFile is the LocalManager that reads path (a managerd's ManagerIdentityFile) on
// every call, through DecodeManagerIdentity.
func LocalManagerFile(path string) LocalManager {
	return func() (ManagerIdentity, error) {
		f, err := os.Open(path)
		if err != nil {
			return ManagerIdentity{}, err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxIdentityBytes+1))
		if err != nil {
			return ManagerIdentity{}, err
		}
		return DecodeManagerIdentity(b)
	}
}

// DecodeManagerIdentity decodes a manager-identity.json strictly: one JSON object of at most
// 1 KiB with exactly v (1), space (a space name) and instanceId (the uid grammar), nothing else
// and nothing after it.
func DecodeManagerIdentity(b []byte) (ManagerIdentity, error) {
	if len(b) > maxIdentityBytes {
		return ManagerIdentity{}, fmt.Errorf("manager identity: %d bytes (at most %d)", len(b), maxIdentityBytes)
	}
	var w struct {
		V          *int    `json:"v"`
		Space      *string `json:"space"`
		InstanceID *string `json:"instanceId"`
	}
	if err := strictDecode(b, &w); err != nil {
		return ManagerIdentity{}, fmt.Errorf("manager identity: %w", err)
	}
	switch {
	case w.V == nil || *w.V != 1:
		return ManagerIdentity{}, errors.New("manager identity: v is not 1")
	case w.Space == nil || space.ValidateName(*w.Space) != nil:
		return ManagerIdentity{}, errors.New("manager identity: space is not a space name")
	case w.InstanceID == nil || space.ValidateUID(*w.InstanceID) != nil:
		return ManagerIdentity{}, errors.New("manager identity: instanceId is not an instance id")
	}
	return ManagerIdentity{Space: *w.Space, InstanceID: *w.InstanceID}, nil
}

// decodeLeaseFacts decodes a manager lease row (managerd's instlease.Row, with the optional
// processEpoch and registrationRevision a registering managerd adds) strictly: at most
// lifecycle.MaxRowBytes, one object of only the row's fields, instanceId equal to iid, holder an
// <owner>.<actor> principal, the registration integers within 2^53-1.
func decodeLeaseFacts(iid string, b []byte) (leaseFacts, error) {
	if len(b) > lifecycle.MaxRowBytes {
		return leaseFacts{}, fmt.Errorf("lease row of %d bytes", len(b))
	}
	var w struct {
		Holder               *string `json:"holder"`
		InstanceID           *string `json:"instanceId"`
		Runtime              string  `json:"runtime"`
		Root                 string  `json:"root"`
		PID                  int64   `json:"pid"`
		Since                int64   `json:"since"`
		ProcessEpoch         *uint64 `json:"processEpoch"`
		RegistrationRevision *uint64 `json:"registrationRevision"`
	}
	if err := strictDecode(b, &w); err != nil {
		return leaseFacts{}, fmt.Errorf("lease row: %w", err)
	}
	if w.InstanceID == nil || *w.InstanceID != iid {
		return leaseFacts{}, errors.New("lease row: instanceId is not the key's")
	}
	if w.Holder == nil {
		return leaseFacts{}, errors.New("lease row: no holder")
	}
	o, a, ok := strings.Cut(*w.Holder, ".")
	if _, err := space.PrincipalKey(o, a); !ok || err != nil {
		return leaseFacts{}, errors.New("lease row: holder is not <owner>.<actor>")
	}
	for _, n := range []*uint64{w.ProcessEpoch, w.RegistrationRevision} {
		if n != nil && *n > lifecycle.MaxSafeInteger {
			return leaseFacts{}, errors.New("lease row: an integer is above 2^53-1")
		}
	}
	return leaseFacts{Holder: *w.Holder, ProcessEpoch: w.ProcessEpoch, RegistrationRevision: w.RegistrationRevision}, nil
}

// strictDecode decodes one JSON object into v, refusing unknown fields, a null for the whole
// value and trailing data.
func strictDecode(b []byte, v any) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return errors.New("null")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data")
	}
	return nil
}
