package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// RefusedError is a daemon's refusal, read from its refusal file: Ready returns it as soon as
// the file appears with the awaited pid.
type RefusedError struct{ Refusal Refusal }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("daemon %d refused to start: %s: %s", e.Refusal.PID, e.Refusal.Code, e.Refusal.Reason)
}

// ExitedError: the awaited process exited before it was ready.
type ExitedError struct{ PID int }

func (e *ExitedError) Error() string {
	return fmt.Sprintf("daemon %d exited before it was ready", e.PID)
}

// NotReadyError: ctx ended first; Last says what was still missing.
type NotReadyError struct {
	Last string
	Err  error
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("daemon not ready (%s): %v", e.Last, e.Err)
}

// Unwrap returns the context's error.
func (e *NotReadyError) Unwrap() error { return e.Err }

// ReadyInfo is what Ready learns from a discovery file; the capability stays in the file.
type ReadyInfo struct {
	URL string
	PID int
}

// Ready polling and probe bounds.
const (
	readyPoll    = 100 * time.Millisecond
	healthBudget = 2 * time.Second
)

// Ready waits until the daemon called name, running as pid, is ready: dir/name.json exists,
// names pid and says state ready (or says no state: an older daemon's file), pid is proven
// alive, and GET <url>/health answers 2xx within two seconds. A file saying unavailable is
// waited on like a missing one. It
// returns at once with a *RefusedError when dir/name-refusal.json appears naming pid, with an
// *ExitedError as soon as pid is no longer alive, and with a *NotReadyError (saying what was
// missing) when ctx ends; the caller bounds the wait with ctx. A file naming another pid is a
// predecessor's and is ignored. The URL must be http on a loopback address; anything else is
// refused, because the file could otherwise aim the probe elsewhere.
func Ready(ctx context.Context, dir, name string, pid int) (ReadyInfo, error) {
	if err := checkName(name); err != nil {
		return ReadyInfo{}, err
	}
	if pid <= 0 {
		return ReadyInfo{}, fmt.Errorf("daemon: Ready needs the daemon's pid, got %d", pid)
	}
	hc := &http.Client{Timeout: healthBudget, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	last := "no discovery file yet"
	for {
		var r Refusal
		if err := readJSON(RefusalPath(dir, name), &r); err == nil && r.PID == pid {
			return ReadyInfo{}, &RefusedError{Refusal: r}
		}
		alive, err := processAlive(pid)
		if err == nil && !alive {
			return ReadyInfo{}, &ExitedError{PID: pid}
		}
		if err != nil {
			last = "liveness of pid " + strconv.Itoa(pid) + " unknown: " + err.Error()
		} else {
			var d Discovery
			switch err := readJSON(DiscoveryPath(dir, name), &d); {
			case errors.Is(err, fs.ErrNotExist):
				last = "no discovery file yet"
			case err != nil:
				last = "discovery file unreadable: " + err.Error()
			case d.PID != pid:
				last = fmt.Sprintf("discovery file names pid %d", d.PID)
			case d.State != "" && d.State != StateReady:
				last = fmt.Sprintf("discovery file says %.32q", string(d.State))
			default:
				u, err := loopbackURL(d.URL)
				if err != nil {
					return ReadyInfo{}, fmt.Errorf("daemon: discovery file %s: %w", DiscoveryPath(dir, name), err)
				}
				if err := probeHealth(ctx, hc, u); err != nil {
					if ctx.Err() == nil { // a probe cut short by ctx says nothing new
						last = "health: " + err.Error()
					}
				} else {
					return ReadyInfo{URL: d.URL, PID: pid}, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ReadyInfo{}, &NotReadyError{Last: last, Err: ctx.Err()}
		case <-t.C:
		}
	}
}

// loopbackURL accepts http://<loopback ip or localhost>:<port> and nothing else.
func loopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	if u.Scheme != "http" || u.User != nil || u.Port() == "" {
		return nil, fmt.Errorf("url %q: want http://<loopback>:<port>", raw)
	}
	h := u.Hostname()
	if ip := net.ParseIP(h); (ip == nil || !ip.IsLoopback()) && h != "localhost" {
		return nil, fmt.Errorf("url %q is not on a loopback address", raw)
	}
	return u, nil
}

func probeHealth(ctx context.Context, hc *http.Client, u *url.URL) error {
	ctx, cancel := context.WithTimeout(ctx, healthBudget)
	defer cancel()
	h := *u
	h.Path = strings.TrimSuffix(h.Path, "/") + "/health"
	h.RawQuery = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.String(), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// processAlive proves pid alive: kill(pid, 0) succeeds (or is refused for permission, which
// means it exists), and on Linux its /proc state is not zombie or dead, so an exited child not
// yet reaped counts as gone. An answer it cannot give is an error, never "alive".
func processAlive(pid int) (bool, error) {
	err := syscall.Kill(pid, 0)
	switch {
	case errors.Is(err, syscall.ESRCH):
		return false, nil
	case err != nil && !errors.Is(err, syscall.EPERM):
		return false, err
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat("/proc/self/stat"); serr == nil {
			return false, nil // /proc works, the process is gone
		}
		return true, nil // no /proc on this system: kill(0) is the proof
	}
	if err != nil {
		return false, err
	}
	// stat is "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, errors.New("unparseable /proc stat")
	}
	switch b[i+2] {
	case 'Z', 'X', 'x':
		return false, nil
	}
	return true, nil
}
