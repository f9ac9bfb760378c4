package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

// NotifyContext returns a context that ends on SIGINT or SIGTERM (or when parent ends), and
// its stop function, which restores default signal handling. A daemon's serve passes it to
// Start and closes the service when it ends.
func NotifyContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
}

// Notify sends state (e.g. "READY=1", "STOPPING=1") to systemd's notification socket. With
// NOTIFY_SOCKET unset it does nothing and reports false: a daemon not run by systemd (or run
// with Type=simple) is not asked. It refuses a socket path that is neither absolute nor
// abstract ("@…").
func Notify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	switch {
	case path[0] == '@':
		path = "\x00" + path[1:]
	case path[0] != '/':
		return false, fmt.Errorf("daemon: NOTIFY_SOCKET %q is neither absolute nor abstract", path)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("daemon: sd_notify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("daemon: sd_notify: %w", err)
	}
	return true, nil
}

// ErrStopped is Done's cause for a service closed by its owner.
var ErrStopped = errors.New("daemon: stopped")
