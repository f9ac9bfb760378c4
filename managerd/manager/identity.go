package manager

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/space"
)

// RemoteIdentityFile is the file in Config.StateDir holding a remote managerd's identity: its
// instance id, its manager lifecycle uid and the seeds of the five user nkeys of its actors
// (supervisor, executor, serve, goalWriter, sessionLedger). It is a secret (0600, in the 0700
// state directory, written atomically) and is reused at every start, so a restart is the same
// instance and lifecycle and the authority commits its next epoch.
const RemoteIdentityFile = "remote-identity.json"

// remoteIdentity is RemoteIdentityFile's content.
type remoteIdentity struct {
	V            int       `json:"v"`
	Space        string    `json:"space"`
	InstanceID   string    `json:"instanceId"`
	LifecycleUID string    `json:"lifecycleUid"`
	Seeds        [5]string `json:"seeds"`

	pubs [5]string
}

// Identities are the five public nkeys in the wire's form.
func (r *remoteIdentity) Identities() managerauthority.Identities {
	p := r.pubs
	return managerauthority.Identities{Supervisor: managerauthority.Identity{ID: p[0]}, Executor: managerauthority.Identity{ID: p[1]},
		Serve: managerauthority.Identity{ID: p[2]}, GoalWriter: managerauthority.Identity{ID: p[3]}, SessionLedger: managerauthority.Identity{ID: p[4]}}
}

// supervisorSeed is the supervisor nkey's seed for the rail (the caller wipes it).
func (r *remoteIdentity) supervisorSeed() *creds.Seed { return creds.NewSeed([]byte(r.Seeds[0])) }

// wipe drops the seeds from memory as far as Go strings allow (they are not reused).
func (r *remoteIdentity) wipe() { r.Seeds = [5]string{} }

// check decodes every seed and checks the coordinates: the space, the uid grammars, five distinct
// user seeds.
func (r *remoteIdentity) check(spaceName string) error {
	if r.V != 1 {
		return fmt.Errorf("v %d: want 1", r.V)
	}
	if r.Space != spaceName {
		return fmt.Errorf("it is space %s's, not %s's", r.Space, spaceName)
	}
	if err := space.ValidateUID(r.InstanceID); err != nil {
		return fmt.Errorf("instanceId: %w", err)
	}
	if err := space.ValidateUID(r.LifecycleUID); err != nil {
		return fmt.Errorf("lifecycleUid: %w", err)
	}
	seen := map[string]bool{}
	for i, s := range r.Seeds {
		kp, err := nkeys.FromSeed([]byte(s))
		if err != nil {
			return fmt.Errorf("seed %d is not an nkey seed", i)
		}
		pub, err := kp.PublicKey()
		kp.Wipe()
		if err != nil || !nkeys.IsValidPublicUserKey(pub) {
			return fmt.Errorf("seed %d is not a user seed", i)
		}
		if seen[pub] {
			return fmt.Errorf("seed %d repeats another", i)
		}
		seen[pub], r.pubs[i] = true, pub
	}
	return nil
}

// loadRemoteIdentity reads dir's RemoteIdentityFile, or makes and writes a fresh one (instanceID
// when set, else a new uid) when there is none. A stored identity of another space, or of
// another instance than a configured instanceID, is refused, naming both.
func loadRemoteIdentity(dir, spaceName, instanceID string) (*remoteIdentity, error) {
	path := filepath.Join(dir, RemoteIdentityFile)
	raw, err := creds.ReadSecretFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return newRemoteIdentity(path, spaceName, instanceID)
	case err != nil:
		return nil, err
	}
	defer clear(raw)
	var id remoteIdentity
	if err := lifecycle.DecodeObject(raw, &id); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := id.check(spaceName); err != nil {
		id.wipe()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if instanceID != "" && id.InstanceID != instanceID {
		id.wipe()
		return nil, fmt.Errorf("%s is instance %s's, but instance_id is %s: remove one of them", path, id.InstanceID, instanceID)
	}
	return &id, nil
}

func newRemoteIdentity(path, spaceName, instanceID string) (*remoteIdentity, error) {
	id := &remoteIdentity{V: 1, Space: spaceName, InstanceID: instanceID}
	var err error
	if id.InstanceID == "" {
		if id.InstanceID, err = newUID(); err != nil {
			return nil, err
		}
	}
	if id.LifecycleUID, err = newUID(); err != nil {
		return nil, err
	}
	for i := range id.Seeds {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			kp.Wipe()
			return nil, err
		}
		id.Seeds[i] = string(seed) // a copy: Wipe overwrites the key pair's own seed
		kp.Wipe()
	}
	if err := id.check(spaceName); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(id); err != nil {
		return nil, err
	}
	defer clear(buf.Bytes())
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := creds.WriteFileAtomic(path, buf.Bytes()); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}
