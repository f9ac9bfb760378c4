package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cotalgo/cotal/pkg/creds"
)

// FileVersion is the ver field of the discovery and refusal files.
const FileVersion = 1

// Discovery is the readiness file a daemon writes once it serves (auth-service.json for authd)
// and removes when it stops. State is the daemon's State while the file exists: StateReady, or
// StateUnavailable while it is alive but may not serve; the daemon rewrites the file atomically
// at each change, and a file without it (an older daemon's) means ready. Cap is the capability a
// local caller presents to the daemon; it is why the file is 0600 and why Ready never returns it.
// PublicURL is the https URL of authd's public face, when it has one (auth.md §5 publicUrl).
type Discovery struct {
	Ver       int    `json:"ver"`
	URL       string `json:"url"`
	PID       int    `json:"pid"`
	Cap       string `json:"cap,omitempty"`
	State     State  `json:"state,omitempty"`
	PublicURL string `json:"publicUrl,omitempty"`
}

// Refusal is the file a daemon writes when it refuses to start (auth-service-refusal.json): a
// stable code, a sentence for the operator, and details (the holder of a claim, say). It holds
// no secret.
type Refusal struct {
	Ver     int               `json:"ver"`
	PID     int               `json:"pid"`
	Code    string            `json:"code"`
	Reason  string            `json:"reason"`
	Details map[string]string `json:"details,omitempty"`
}

// DiscoveryPath is the discovery file of the daemon called name in dir: dir/name.json.
func DiscoveryPath(dir, name string) string { return filepath.Join(dir, name+".json") }

// RefusalPath is the refusal file of the daemon called name in dir: dir/name-refusal.json.
func RefusalPath(dir, name string) string { return filepath.Join(dir, name+"-refusal.json") }

// maxFileBytes bounds what Ready reads from either file.
const maxFileBytes = 64 << 10

func checkName(name string) error {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return fmt.Errorf("daemon: file name %q must be one path element", name)
	}
	return nil
}

// WriteDiscovery writes d as dir/name.json, 0600 and atomically (a reader sees the old file or
// the new one, never a mix), creating dir with mode 0700 if missing, and removes a stale refusal
// file of the same name. It refuses a dir looser than 0700 or owned by another uid (pkg/creds), a
// d without a URL or pid, a State other than ready, unavailable or none, and a name that is not
// one path element.
func WriteDiscovery(dir, name string, d Discovery) error {
	if err := checkName(name); err != nil {
		return err
	}
	if d.URL == "" || d.PID <= 0 {
		return errors.New("daemon: a discovery file needs a url and a pid")
	}
	switch d.State {
	case "", StateReady, StateUnavailable:
	default:
		return fmt.Errorf("daemon: a discovery file's state is ready or unavailable, not %q", d.State)
	}
	d.Ver = FileVersion
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if err := creds.WriteFileAtomic(DiscoveryPath(dir, name), b); err != nil {
		return fmt.Errorf("daemon: write discovery file: %w", err)
	}
	return removeIfExists(RefusalPath(dir, name))
}

// WriteRefusal writes r as dir/name-refusal.json, 0600 and atomically (a 0700 dir is made if
// missing), and removes a discovery file that names r.PID, which a refused start must not leave
// behind; another process's discovery file (the instance whose claim refused this one) stays.
// It refuses an r without a code or pid.
func WriteRefusal(dir, name string, r Refusal) error {
	if err := checkName(name); err != nil {
		return err
	}
	if r.Code == "" || r.PID <= 0 {
		return errors.New("daemon: a refusal file needs a code and a pid")
	}
	r.Ver = FileVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := creds.WriteFileAtomic(RefusalPath(dir, name), b); err != nil {
		return fmt.Errorf("daemon: write refusal file: %w", err)
	}
	return RemoveDiscovery(dir, name, r.PID)
}

// RemoveDiscovery removes dir/name.json if it exists and still names pid, so a stopping daemon
// never removes a successor's file. It is what a daemon does when it stops serving. The file
// may be a discovery file or a state file (StateFile): only its pid is read.
func RemoveDiscovery(dir, name string, pid int) error {
	p := DiscoveryPath(dir, name)
	var d struct {
		PID int `json:"pid"`
	}
	data, err := readBounded(p, maxFileBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || json.Unmarshal(data, &d) != nil {
		return removeIfExists(p) // unreadable: not a successor's valid file either
	}
	if d.PID != pid {
		return nil
	}
	return removeIfExists(p)
}

// ClearFiles removes both files of name in dir (a daemon scrubs them at start).
func ClearFiles(dir, name string) error {
	return errors.Join(removeIfExists(DiscoveryPath(dir, name)), removeIfExists(RefusalPath(dir, name)))
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// readJSON reads a bounded JSON file strictly (unknown fields refused).
func readJSON(path string, v any) error {
	data, err := readBounded(path, maxFileBytes)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytesReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
