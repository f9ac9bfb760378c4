package authclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

const (
	recordVersion = 1
	// maxRecordBytes bounds a stored record (ids, coordinates and one renewal proof).
	maxRecordBytes = 64 << 10
)

// RenewalStore keeps a renewal source's record, one per witness. Load answers (nil, nil) when
// the witness has none; Save replaces the record whole (atomically, for a store that can fail
// halfway). The record holds a renewal proof: a store keeps it private.
type RenewalStore interface {
	Load(witness string) (*RenewalRecord, error)
	Save(rec *RenewalRecord) error
}

var _ RenewalStore = (*FileStore)(nil)

// RenewalRecord is what a renewal source persists per witness: the coordinates of the instance,
// the activate and renew requestIds it replays for ever, and the current renewal proof with its
// exp (a secret; LogValue redacts it).
type RenewalRecord struct {
	V                 int                  `json:"v"`
	Account           string               `json:"account"`
	Space             string               `json:"space"`
	Endpoint          string               `json:"endpoint"`
	Instance          string               `json:"instance"`
	Witness           string               `json:"witness"`
	ActivateRequestID string               `json:"activateRequestId"`
	RenewRequestID    string               `json:"renewRequestId"`
	Renewal           *serviceaccess.Token `json:"renewal,omitempty"`
}

// check validates a record's shape (not whose it is). Its errors hold no token.
func (r *RenewalRecord) check() error {
	switch {
	case r.V != recordVersion:
		return errors.New("authclient: renewal record: unknown version")
	case !serviceaccess.ValidWitness(r.Witness):
		return errors.New("authclient: renewal record: witness is not a witness")
	case !serviceaccess.ValidRequestID(r.ActivateRequestID) || !serviceaccess.ValidRequestID(r.RenewRequestID):
		return errors.New("authclient: renewal record: a requestId is not a requestId")
	case r.ActivateRequestID == r.RenewRequestID:
		return errors.New("authclient: renewal record: the activate and renew requestIds are one")
	case r.Renewal != nil && (r.Renewal.Token == "" || len(r.Renewal.Token) > serviceaccess.MaxTokenBytes || r.Renewal.Exp <= 0):
		return errors.New("authclient: renewal record: the renewal proof is malformed")
	}
	return nil
}

// FileStore is the stock RenewalStore: one file <dir>/<witness>.json per witness, mode 0600 in a
// directory of mode 0700, replaced atomically (a temporary file in the same directory, synced,
// renamed over the record, the directory synced). It refuses a directory or record file
// readable or writable by group or others, a record that is not a regular file, and a record
// that does not parse closed, naming the path.
type FileStore struct {
	dir string
}

// NewFileStore returns the file store in dir, creating dir with mode 0700 when it does not
// exist, and refusing one that is not a directory or whose mode is looser than 0700.
func NewFileStore(dir string) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("authclient: renewal store: directory is empty")
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("authclient: renewal store: %w", err)
	}
	s := &FileStore{dir: dir}
	if err := s.checkDir(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the store's directory.
func (s *FileStore) Dir() string { return s.dir }

func (s *FileStore) checkDir() error {
	fi, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("authclient: renewal store: %s is not a directory", s.dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("authclient: renewal store: directory %s has mode %04o; it must be 0700 or tighter", s.dir, fi.Mode().Perm())
	}
	return nil
}

func (s *FileStore) path(witness string) (string, error) {
	if !serviceaccess.ValidWitness(witness) {
		return "", errors.New("authclient: renewal store: not a witness")
	}
	return filepath.Join(s.dir, witness+".json"), nil
}

// Load reads the witness's record; (nil, nil) when there is none.
func (s *FileStore) Load(witness string) (*RenewalRecord, error) {
	p, err := s.path(witness)
	if err != nil {
		return nil, err
	}
	if err := s.checkDir(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("authclient: renewal store: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("authclient: renewal store: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("authclient: renewal store: %s is not a regular file", p)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("authclient: renewal store: %s has mode %04o; it must be 0600 or tighter", p, fi.Mode().Perm())
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
	if err != nil {
		return nil, fmt.Errorf("authclient: renewal store: %w", err)
	}
	if len(raw) > maxRecordBytes {
		return nil, fmt.Errorf("authclient: renewal store: %s is larger than %d bytes", p, maxRecordBytes)
	}
	rec, err := decodeRecord(raw)
	if err != nil {
		return nil, fmt.Errorf("authclient: renewal store: %s: %w", p, err)
	}
	if rec.Witness != witness {
		return nil, fmt.Errorf("authclient: renewal store: %s holds another witness's record", p)
	}
	return rec, nil
}

// decodeRecord parses a record closed: no unknown key, no trailing data. Its errors hold no
// token (a type error names the field, and the token field is a string).
func decodeRecord(raw []byte) (*RenewalRecord, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var rec RenewalRecord
	if err := dec.Decode(&rec); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("record does not parse at offset %d", se.Offset)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("record field %s has the wrong type", te.Field)
		}
		return nil, errors.New("record does not parse")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("record has trailing data")
	}
	if err := rec.check(); err != nil {
		return nil, err
	}
	return &rec, nil
}

// Save writes rec atomically as its witness's record.
func (s *FileStore) Save(rec *RenewalRecord) error {
	if rec == nil {
		return errors.New("authclient: renewal store: nil record")
	}
	if err := rec.check(); err != nil {
		return err
	}
	p, err := s.path(rec.Witness)
	if err != nil {
		return err
	}
	if err := s.checkDir(); err != nil {
		return err
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, "."+rec.Witness+".*.tmp")
	if err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	name := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			_ = tmp.Close()
			_ = os.Remove(name)
		}
	}()
	// CreateTemp makes the file 0600; say so regardless of the umask's history.
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	if _, err := tmp.Write(raw); err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	if err := os.Rename(name, p); err != nil {
		return fmt.Errorf("authclient: renewal store: %w", err)
	}
	ok = true
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
