package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ProcStat is what StartTime reads from /proc/<pid>/stat.
type ProcStat struct {
	// State is field 3 (R, S, D, Z, X, ...).
	State byte
	// StartTime is field 22, clock ticks after boot.
	StartTime uint64
}

// ErrNoProcess: /proc/<pid>/stat does not exist; no process has that pid.
var ErrNoProcess = errors.New("no such process")

// ReadProcStat reads the state and start time of pid from /proc/<pid>/stat. A missing process is
// ErrNoProcess.
func ReadProcStat(pid int) (ProcStat, error) {
	if pid <= 0 {
		return ProcStat{}, fmt.Errorf("pid %d", pid)
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return ProcStat{}, ErrNoProcess
		}
		return ProcStat{}, err
	}
	return parseProcStat(data)
}

// parseProcStat parses a /proc/<pid>/stat line. The command (field 2) is in parentheses and may
// itself hold spaces and parentheses, so the fields are counted after the last ')'.
func parseProcStat(data []byte) (ProcStat, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return ProcStat{}, errors.New("malformed /proc stat")
	}
	f := bytes.Fields(data[i+1:]) // f[0] is field 3
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, errors.New("malformed /proc stat")
	}
	st, err := strconv.ParseUint(string(f[19]), 10, 64) // field 22
	if err != nil {
		return ProcStat{}, fmt.Errorf("malformed /proc stat start time: %w", err)
	}
	return ProcStat{State: f[0][0], StartTime: st}, nil
}

// Gone reports whether the child is proven gone without waitpid: no process has its pid, the
// process with its pid started at another time (the pid was reused), or it is a zombie (it has
// exited and runs no code; only its parent's wait remains). An error means it could not tell.
func (c Child) Gone() (bool, error) {
	st, err := ReadProcStat(c.Pid)
	if errors.Is(err, ErrNoProcess) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return st.StartTime != c.StartTime || st.State == 'Z' || st.State == 'X', nil
}

// SignalFunc sends sig to a child's process group. Client.Signal is one (the launcher signals
// its own children, so managerd needs no CAP_KILL over the agent uid); KillGroup is another, for
// a caller allowed to signal the agent uid itself.
type SignalFunc func(ctx context.Context, c Child, sig syscall.Signal) error

// KillGroup signals the child's process group (its pid: the launcher starts each agent in a new
// session) directly, after checking the pid still names the child.
func KillGroup(_ context.Context, c Child, sig syscall.Signal) error {
	if gone, err := c.Gone(); err != nil || gone {
		return err
	}
	if err := unix.Kill(-c.Pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// PollInterval is how often Terminate looks at /proc while it waits.
const PollInterval = 10 * time.Millisecond

// Terminate ends a child: SIGTERM to its process group, then SIGKILL once grace has passed, and
// returns nil only once the child is proven gone. send is how signals are sent: nil is KillGroup,
// and the proof is Child.Gone; a launcher's Client.Signal sends SIGKILL to the child's whole
// cgroup, and the proof is Child.Gone and then the launcher's answer to a probe (signal 0),
// CHILD_UNKNOWN, which it gives only once every process of the child's cgroup, a descendant that
// called setsid or double-forked included, is gone. It returns killed=true when SIGKILL was
// needed. When ctx ends first it returns ctx's error: the child was not proven gone.
func Terminate(ctx context.Context, c Child, grace time.Duration, send SignalFunc) (killed bool, err error) {
	probe := send != nil
	if send == nil {
		send = KillGroup
	}
	proven := func() (bool, error) {
		gone, err := c.Gone()
		if err != nil || !gone || !probe {
			return gone, err
		}
		err = send(ctx, c, 0)
		var re *RefusedError
		switch {
		case err == nil: // the launcher still holds it: its cgroup is being emptied
			return false, nil
		case errors.As(err, &re) && re.Reason == ReasonChildUnknown:
			return true, nil
		}
		return false, err
	}
	if gone, err := proven(); err != nil || gone {
		return false, err
	}
	if err := send(ctx, c, syscall.SIGTERM); err != nil {
		if gone, gerr := proven(); gerr == nil && gone { // it exited between the check and the signal
			return false, nil
		}
		return false, fmt.Errorf("SIGTERM to %d: %w", c.Pid, err)
	}
	deadline := time.Now().Add(grace)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		gone, err := proven()
		if err != nil {
			return killed, err
		}
		if gone {
			return killed, nil
		}
		if !killed && !time.Now().Before(deadline) {
			if err := send(ctx, c, syscall.SIGKILL); err != nil {
				if gone, gerr := proven(); gerr == nil && gone {
					return false, nil
				}
				return false, fmt.Errorf("SIGKILL to %d: %w", c.Pid, err)
			}
			killed = true
		}
		select {
		case <-ctx.Done():
			return killed, fmt.Errorf("child %d not proven gone: %w", c.Pid, ctx.Err())
		case <-tick.C:
		}
	}
}
