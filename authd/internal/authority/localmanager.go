package authority

import (
	"errors"
	"fmt"
	"io"
	"os"

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
	if err := lifecycle.DecodeObject(b, &w); err != nil {
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
