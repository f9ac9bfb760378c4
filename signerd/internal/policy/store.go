package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Store holds the policy in force and swaps it atomically on reload. Readers call Current once
// per request and use that snapshot throughout, so a request is never judged by half of one
// policy and half of another.
type Store struct {
	cur atomic.Pointer[Policy]
	// mu serialises reloads so two concurrent reloads cannot publish out of order.
	mu sync.Mutex
}

// NewStore returns a Store holding p. A nil p is stored as the empty policy, which denies
// everything: a store never holds "no policy".
func NewStore(p *Policy) *Store {
	if p == nil {
		p = &Policy{}
	}
	s := &Store{}
	s.cur.Store(p)
	return s
}

// Current returns the policy in force; never nil.
func (s *Store) Current() *Policy { return s.cur.Load() }

// ReloadFile loads path and, if it is valid, makes it the policy in force. An invalid or
// unsafe file leaves the current policy in force and returns the error (an *Error naming path).
func (s *Store) ReloadFile(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := Load(path)
	if err != nil {
		return err
	}
	s.cur.Store(p)
	return nil
}

// reloadBytes parses data read from path and swaps it in unless it already is the current
// policy. It reports whether a reload was attempted.
func (s *Store) reloadBytes(data []byte, path string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) == s.cur.Load().Digest() {
		return false, nil
	}
	p, err := parse(data, path)
	if err != nil {
		return true, err
	}
	s.cur.Store(p)
	return true, nil
}

// DefaultWatchInterval is the polling interval Watch uses when given none.
const DefaultWatchInterval = 2 * time.Second

// Watch polls path every interval (DefaultWatchInterval if interval <= 0) until ctx is done.
// When the file's identity, mtime or size changes it reads the file and, if the content's hash
// differs from the policy in force, reloads it as ReloadFile does. onReload (if not nil) is
// called with nil after a successful swap and with the error when the file is missing,
// unreadable, unsafe or invalid, in which case the previous policy stays in force. Each change
// is reported once, not on every tick. The first check runs immediately. The server handles
// SIGHUP itself by calling ReloadFile; Watch is for deployments that prefer polling.
func (s *Store) Watch(ctx context.Context, path string, interval time.Duration, onReload func(error)) {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	report := func(err error) {
		if onReload != nil {
			onReload(err)
		}
	}
	var (
		last    os.FileInfo
		lastErr string // the last stat or read failure reported, so each is reported once
	)
	fail := func(err error) {
		// A refused read is retried on every tick: what made it unsafe may be a parent
		// directory or a symlink target, whose repair does not change the file's own stat.
		last = nil
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			report(err)
		}
	}
	check := func() {
		fi, err := os.Stat(path)
		if err != nil {
			fail(&Error{Path: path, Caller: -1, Reason: err.Error()})
			return
		}
		if last != nil && unchanged(last, fi) {
			return
		}
		data, err := readFile(path)
		if err != nil {
			fail(err)
			return
		}
		last, lastErr = fi, ""
		if tried, err := s.reloadBytes(data, path); tried {
			report(err)
		}
	}

	check()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

// unchanged reports whether two stats of the policy path describe the same file content as far
// as metadata can tell. The mode is included because chmod (fixing an unsafe file) changes
// neither mtime nor size; the hash comparison in reloadBytes catches the rest.
func unchanged(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size() && a.Mode() == b.Mode()
}
