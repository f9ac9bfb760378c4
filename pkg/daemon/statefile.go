package daemon

import (
	"encoding/json"
	"fmt"

	"github.com/cotalgo/cotal/pkg/creds"
)

// StateFile is the state file of a daemon that serves no URL (deliveryd's delivery-service.json,
// at DiscoveryPath): the process and its State, rewritten at every change of state. Unlike a
// discovery file its existence is not the signal: a reader routes on State, and trusts it only
// while PID is alive (a killed daemon leaves its last state behind). It holds no secret.
type StateFile struct {
	Ver   int   `json:"ver"`
	PID   int   `json:"pid"`
	State State `json:"state"`
}

func validState(s State) bool {
	switch s {
	case StateStarting, StateReady, StateUnavailable, StateStopped:
		return true
	}
	return false
}

// WriteState writes {ver, pid, state} as dir/name.json, 0600 and atomically (a 0700 dir is made
// if missing; a looser or foreign dir is refused, pkg/creds). It refuses a pid that is not
// positive, a state that is not one of the four, and a name that is not one path element.
func WriteState(dir, name string, pid int, s State) error {
	if err := checkName(name); err != nil {
		return err
	}
	if pid <= 0 || !validState(s) {
		return fmt.Errorf("daemon: a state file needs a pid and a state, got %d %q", pid, s)
	}
	b, err := json.Marshal(StateFile{Ver: FileVersion, PID: pid, State: s})
	if err != nil {
		return err
	}
	if err := creds.WriteFileAtomic(DiscoveryPath(dir, name), b); err != nil {
		return fmt.Errorf("daemon: write state file: %w", err)
	}
	return nil
}

// ReadState reads dir/name.json as a StateFile, strictly (bounded, unknown fields refused, a
// state that is not one of the four refused).
func ReadState(dir, name string) (StateFile, error) {
	if err := checkName(name); err != nil {
		return StateFile{}, err
	}
	var f StateFile
	if err := readJSON(DiscoveryPath(dir, name), &f); err != nil {
		return StateFile{}, err
	}
	if !validState(f.State) || f.PID <= 0 {
		return StateFile{}, fmt.Errorf("daemon: state file %s: pid %d state %q", DiscoveryPath(dir, name), f.PID, f.State)
	}
	return f, nil
}

// ClearRefusal removes dir/name-refusal.json if it exists: what a daemon that writes a state
// file does at start, leaving the state file to the instance that holds the claim.
func ClearRefusal(dir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	return removeIfExists(RefusalPath(dir, name))
}
