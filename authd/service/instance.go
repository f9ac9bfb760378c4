package service

// Instance identity (issue 22 row 6; upstream's authInstanceKey).
//
// authd keeps a stable instance id in instance.json in its state directory: {ver, instance_id,
// space, created}, 0600 in the 0700 directory, made at random on the first start and written
// atomically and exclusively (a temporary file linked into place, so two first starts on one
// directory agree on the one that landed). Every start reads it back with its mode, owner and
// content checked, and refuses, naming the path, a looser mode, another owner, a symlink or a
// content that is not exactly such a record; it never writes over a record it refused.
//
// Upstream's instance identity is a private serve seed kept in the hosted store
// (authInstanceKey(space)). authd holds no seed (signerd holds every key and mints authd's
// credentials), so its identity is an id, not a key, and instance.json holds nothing secret:
// it is kept 0600 like the rest of the state directory, and the plane row shows it to anyone
// who may read the row.
//
// Divergence. Upstream refuses when the store and the file disagree and leaves both records as
// they are. authd's two records of the identity are instance.json and the configuration's
// optional instance_id (the pin a host gives to the instance it assigned): when both exist and
// differ the start is refused with CodeIdentity and both are left intact; a pin with no
// instance.json yet becomes the record. instance.json made for another space is refused the
// same way: one state directory serves one space. The plane row (lease.Row.Instance) carries the
// id, so a row held under this instance's own id by a live connection is a second process on
// the same identity (a state directory copied or shared), and is refused like any live holder;
// a row this instance left behind in a crash is reclaimed after the sweep (reclaim.go).

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cotalgo/cotal/authd/internal/config"
	"github.com/cotalgo/cotal/pkg/creds"
)

// InstanceFileName is the instance identity's file in the state directory.
const InstanceFileName = "instance.json"

// CodeIdentity: instance.json is refused (mode, owner, content) or diverges from the
// configuration's instance_id or space. Both records are left as they are.
const CodeIdentity = "IDENTITY"

// instanceVersion is the ver of the instance.json this package writes and reads.
const instanceVersion = 1

// maxInstanceFileBytes bounds instance.json; a real one is about 150 bytes.
const maxInstanceFileBytes = 1024

// instanceRecord is instance.json.
type instanceRecord struct {
	Ver        int       `json:"ver"`
	InstanceID string    `json:"instance_id"`
	Space      string    `json:"space"`
	Created    time.Time `json:"created"`
}

// IdentityError is a refused instance identity: Path names the file, Err says why. Start
// returns it inside a *StartError with CodeIdentity.
type IdentityError struct {
	Path string
	Err  error
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("authd: instance identity %s: %v", e.Path, e.Err)
}

func (e *IdentityError) Unwrap() error { return e.Err }

// loadInstance returns the instance id kept in stateDir for space, making the record on the
// first start (with pinned as its id when set). It refuses as the file comment says.
func loadInstance(stateDir, space, pinned string, now func() time.Time) (string, error) {
	path := filepath.Join(stateDir, InstanceFileName)
	id, err := readInstance(path, space, pinned)
	if !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	if id = pinned; id == "" {
		raw := make([]byte, config.InstanceIDLen/2)
		if _, err := rand.Read(raw); err != nil {
			return "", &IdentityError{Path: path, Err: err}
		}
		id = hex.EncodeToString(raw)
	}
	rec := instanceRecord{Ver: instanceVersion, InstanceID: id, Space: space, Created: now().UTC().Truncate(time.Second)}
	data, _ := json.Marshal(rec)
	switch err := createExclusive(path, append(data, '\n')); {
	case err == nil:
		return id, nil
	case errors.Is(err, fs.ErrExist):
		// Another first start on this directory landed first: its record is the identity.
		return readInstance(path, space, pinned)
	default:
		return "", &IdentityError{Path: path, Err: fmt.Errorf("not written: %w", err)}
	}
}

// readInstance reads and checks instance.json at path. A missing file is an error for which
// errors.Is(err, fs.ErrNotExist) holds.
func readInstance(path, space, pinned string) (string, error) {
	refuse := func(err error) error { return &IdentityError{Path: path, Err: err} }
	b, err := creds.ReadSecretFile(path)
	if err != nil {
		return "", refuse(err)
	}
	if len(b) > maxInstanceFileBytes {
		return "", refuse(fmt.Errorf("larger than %d bytes", maxInstanceFileBytes))
	}
	var rec instanceRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return "", refuse(fmt.Errorf("malformed: %w", err))
	}
	if dec.More() {
		return "", refuse(errors.New("malformed: data after the record"))
	}
	switch {
	case rec.Ver != instanceVersion:
		return "", refuse(fmt.Errorf("malformed: ver %d is not %d", rec.Ver, instanceVersion))
	case config.CheckInstanceID(rec.InstanceID) != nil:
		return "", refuse(fmt.Errorf("malformed: instance_id %v", config.CheckInstanceID(rec.InstanceID)))
	case rec.Created.IsZero():
		return "", refuse(errors.New("malformed: no created time"))
	case rec.Space != space:
		return "", refuse(fmt.Errorf("divergent: it is the identity of space %.80q, and this configuration serves %q; a state directory serves one space (both left as they are)", rec.Space, space))
	case pinned != "" && rec.InstanceID != pinned:
		return "", refuse(fmt.Errorf("divergent: it holds instance %s, and the configuration's instance_id is %s; refusing both (both left as they are)", rec.InstanceID, pinned))
	}
	return rec.InstanceID, nil
}

// createExclusive writes data to path with mode 0600 so that a reader sees no file or the whole
// file, and fails with fs.ErrExist when path exists: the bytes go to a temporary file in the same
// directory, fsynced, which is then hard-linked to path (link never replaces) and removed; the
// directory is fsynced last. The directory must pass creds.CheckSecretDir.
func createExclusive(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := creds.CheckSecretDir(dir); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }()
	if err := f.Chmod(creds.FileMode); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// InstanceID is this authd's stable instance identity (instance.json), which its plane row
// carries.
func (s *Service) InstanceID() string { return s.instance }
