package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cotalgo/cotal/managerd/internal/launcher"
	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/space"
)

// Custody records: one file per agent this manager started, agents/<name>.json in the state
// directory (0600 in 0700, written atomically), holding what a successor needs to reap it: the
// lifecycle (to deprovision exactly its durables and ACL row) and the process identity (pid and
// start time, so only that process is ever signalled). A record is written once the agent runs
// and removed once it is stopped and deprovisioned. A manager that dies (kill -9) or shuts down
// sparing its agents leaves its records; the next manager on this state directory reaps them at
// start: a process still alive with the recorded start time is terminated through the launcher,
// then the lifecycle is deprovisioned and the record removed. A process it cannot prove gone keeps
// its record (and its durables) for the next start.
type custody struct {
	Name         string `json:"name"`
	Owner        string `json:"owner"`
	Actor        string `json:"actor"`
	LifecycleUID string `json:"lifecycle_uid"`
	Pid          int    `json:"pid"`
	StartTime    uint64 `json:"start_time"`
	Dir          string `json:"dir"`
	InstanceID   string `json:"instance_id"`
}

const custodyDir = "agents"

// maxCustodyBytes bounds one record.
const maxCustodyBytes = 4 << 10

func (m *Manager) custodyPath(name string) string {
	return filepath.Join(m.cfg.StateDir, custodyDir, name+".json")
}

// record writes a's custody record.
func (m *Manager) record(a *agent) error {
	b, err := json.Marshal(custody{
		Name: a.name, Owner: m.cfg.AgentOwner, Actor: a.actor, LifecycleUID: a.uid,
		Pid: a.child.Pid, StartTime: a.child.StartTime, Dir: a.child.Dir, InstanceID: m.cfg.InstanceID,
	})
	if err != nil {
		return err
	}
	return creds.WriteFileAtomic(m.custodyPath(a.name), b)
}

// unrecord removes a's custody record.
func (m *Manager) unrecord(a *agent) {
	if err := os.Remove(m.custodyPath(a.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Error("custody record not removed", "agent", a.name, "err", err)
		m.tr.Warn(CodeCustody, fmt.Sprintf("the custody record of %s could not be removed", a.name), err)
	}
}

// decodeCustody reads one record strictly.
func decodeCustody(b []byte) (custody, error) {
	if len(b) > maxCustodyBytes {
		return custody{}, fmt.Errorf("%d bytes, over %d", len(b), maxCustodyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c custody
	if err := dec.Decode(&c); err != nil {
		return custody{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return custody{}, errors.New("data after the record")
	}
	if !nameRE.MatchString(c.Name) || len(c.Name) > MaxNameLen {
		return custody{}, fmt.Errorf("name %q", c.Name)
	}
	if _, err := space.ACLKey(c.Owner, c.Actor, c.LifecycleUID); err != nil {
		return custody{}, err
	}
	if c.Pid <= 1 || c.StartTime == 0 {
		return custody{}, fmt.Errorf("process %d start %d", c.Pid, c.StartTime)
	}
	return c, nil
}

// MsgRetainedNotAdopted is logged when a remote managerd finds a predecessor's agent still
// running at start: it does not adopt it (retained-agent adoption fails closed) but stops it and
// retires its lifecycle.
const MsgRetainedNotAdopted = "a retained agent is not adopted: a remote managerd adopts no predecessor's agent; it is stopped and its lifecycle retired"

// reap deals with the records a predecessor on this state directory left (see custody). It runs
// at start, once the instance lease is held, so no live manager still owns them.
func (m *Manager) reap(ctx context.Context) {
	dir := filepath.Join(m.cfg.StateDir, custodyDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		m.log.Error("custody records unreadable; nothing reaped", "dir", dir, "err", err)
		m.tr.Warn(CodeCustody, "the custody records are unreadable; no predecessor's agent was reaped", err)
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := creds.ReadSecretFile(path)
		if err != nil {
			m.log.Error("custody record unreadable; left for the operator", "path", path, "err", err)
			m.tr.Warn(CodeCustody, "a custody record is unreadable; it is left for the operator: "+path, err)
			continue
		}
		c, err := decodeCustody(b)
		if err != nil || e.Name() != c.Name+".json" {
			m.log.Error("custody record malformed; left for the operator", "path", path, "err", err)
			m.tr.Warn(CodeCustody, "a custody record is malformed; it is left for the operator: "+path, err)
			continue
		}
		child := launcher.Child{Pid: c.Pid, StartTime: c.StartTime, Dir: c.Dir}
		if gone, err := child.Gone(); err != nil || !gone {
			if m.cfg.Remote() {
				// A retained managed agent (seed 001 "Retained managed agents"): a
				// predecessor's agent still running. A remote managerd adopts none; the
				// seed's validateRetainedAgent fails closed here: there is nothing it could
				// validate that managerd could use (the custody record holds no actor token or
				// sentinel, and the agent's terminal died with its manager), so no hook is
				// asked and the agent is stopped and retired like any other.
				m.log.Info(MsgRetainedNotAdopted, "agent", c.Name, "uid", c.LifecycleUID, "pid", c.Pid)
			}
			tctx, cancel := context.WithTimeout(ctx, m.cfg.StopGrace.D()+10*time.Second)
			_, terr := launcher.Terminate(tctx, child, m.cfg.StopGrace.D(), m.lnch.Signal)
			cancel()
			if gone, _ := child.Gone(); !gone {
				m.log.Error("a predecessor's agent is still running and could not be stopped; its record and durables stay", "agent", c.Name, "pid", c.Pid, "err", terr)
				m.tr.Warn(CodeLauncher, fmt.Sprintf("a predecessor's agent %s (pid %d) is still running and could not be stopped; its record and durables stay", c.Name, c.Pid), terr)
				continue
			}
		}
		if m.cfg.Remote() {
			// A remote managerd's predecessor agent is retired, not deprovisioned: its
			// retirement becomes pending (resumeRetirements retries it) before the custody
			// record goes.
			if err := m.pendFromCustody(c); err != nil {
				m.log.Error("a predecessor's agent's retirement could not be recorded; its custody record stays", "agent", c.Name, "uid", c.LifecycleUID, "err", err)
				m.tr.Warn(CodeCustody, fmt.Sprintf("a predecessor's agent %s (lifecycle %s): its retirement could not be recorded", c.Name, c.LifecycleUID), err)
				continue
			}
			if err := os.Remove(path); err != nil {
				m.log.Error("custody record not removed", "path", path, "err", err)
			}
			m.log.Info("reaped a predecessor's agent; its retirement is pending", "agent", c.Name, "uid", c.LifecycleUID, "pid", c.Pid)
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// The record names no channels: the predecessor's membership rows are left to
		// deliveryd's fan-out writer, which closes a departed lifecycle's rows.
		res, err := m.prov.Deprovision(dctx, c.Owner, c.Actor, c.LifecycleUID, nil)
		cancel()
		if err != nil {
			m.log.Error("a predecessor's agent could not be deprovisioned; its record stays for the next start", "agent", c.Name, "uid", c.LifecycleUID, "err", err)
			m.tr.Warn(CodeDeprovision, fmt.Sprintf("a predecessor's agent %s (lifecycle %s) could not be deprovisioned; its record stays for the next start", c.Name, c.LifecycleUID), err)
			continue
		}
		if err := os.Remove(path); err != nil {
			m.log.Error("custody record not removed", "path", path, "err", err)
			m.tr.Warn(CodeCustody, "a reaped agent's custody record could not be removed: "+path, err)
		}
		m.log.Info("reaped a predecessor's agent", "agent", c.Name, "uid", c.LifecycleUID, "pid", c.Pid, "instance", c.InstanceID, "deprovisioned", res.Removed, "result", res.String())
	}
}
