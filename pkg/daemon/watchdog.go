package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// WatchdogInterval reads systemd's watchdog settings: the interval at which a unit with
// WatchdogSec= must send WATCHDOG=1 (half of WATCHDOG_USEC, as sd_watchdog_enabled advises), and
// false when the unit has no watchdog or WATCHDOG_PID names another process.
func WatchdogInterval() (time.Duration, bool, error) {
	usec := os.Getenv("WATCHDOG_USEC")
	if usec == "" {
		return 0, false, nil
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || n == 0 {
		return 0, false, fmt.Errorf("daemon: WATCHDOG_USEC %q is not a positive number of microseconds", usec)
	}
	return time.Duration(n) * time.Microsecond / 2, true, nil
}

// Watchdog pings systemd's watchdog (WATCHDOG=1) every WatchdogInterval while healthy returns
// nil, until ctx ends. A ping proves more than a live Go runtime: healthy is the daemon's own
// proof (its lease or claim held, its audit log writable), so a daemon that is running but no
// longer serving stops pinging and systemd restarts it. Without a watchdog it returns at once.
func Watchdog(ctx context.Context, healthy func() error, log *slog.Logger) {
	every, on, err := WatchdogInterval()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err != nil {
		log.Error("watchdog disabled", "err", err)
		return
	}
	if !on {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		if err := healthy(); err != nil {
			if !failing {
				log.Error("watchdog: not healthy, no longer pinging systemd", "err", err)
			}
			failing = true
		} else {
			if failing {
				log.Info("watchdog: healthy again")
			}
			failing = false
			if _, err := Notify("WATCHDOG=1"); err != nil {
				log.Warn("watchdog ping failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
