package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// testJWT is shaped like a NATS user JWT (JOSE header, payload, signature);
// testSeed is a user nkey seed that decodes, checksum included.
const (
	testJWT  = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJYIn0.sig"
	testSeed = "SUAKYRHVIOREXV7EUZTBHUHL7NUMHPMAS7QMDU3GTIUWEI5LDNOXD43IZY"
)

// base is the fixed start of test clocks.
var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// stepClock returns a clock that advances one millisecond per call.
func stepClock() func() time.Time {
	var mu sync.Mutex
	t := base
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Millisecond)
		return t
	}
}

func noSync(*os.File) error { return nil }

// logPath returns a path in a fresh 0700 directory that does not exist yet.
func logPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "audit", "signerd.log")
}

// open is New with the fsync replaced, so tests can observe and fail it.
func open(cfg Config, syncFn func(*os.File) error) (*Log, error) {
	cfg.IO.Sync = syncFn
	return New(cfg)
}

// openLog opens a Log on path with the given fsync and closes it at cleanup.
func openLog(t *testing.T, cfg Config, syncFn func(*os.File) error) *Log {
	t.Helper()
	if cfg.Replica == "" {
		cfg.Replica = "r1"
	}
	if cfg.Now == nil {
		cfg.Now = stepClock()
	}
	l, err := open(cfg, syncFn)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.Path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// sample is a plausible granted Mint decision number i.
func sample(i int) Record {
	return Record{
		Caller:  "spiffe://cotal.local/authd/space-a",
		RPC:     "Mint",
		Space:   "space-a",
		Profile: "agent",
		Subject: "UCXH2TZ5VZBBXKJ3MLLAPZ6BHYQXZW4X6HJ6UMBHWNEDTF3ZTHH4WQBT",
		JTI:     fmt.Sprintf("JTI%049d", i),
		Expiry:  base.Add(time.Hour),
		Decision: func() Decision {
			if i%5 == 4 {
				return Denied
			}
			return Granted
		}(),
		Reason: func() string {
			if i%5 == 4 {
				return "profile_not_allowed"
			}
			return ""
		}(),
	}
}

// writeChain writes n sample records for replica to a new file (without
// fsync, for speed) and returns the file's lines, newline included.
func writeChain(t *testing.T, replica string, n int) [][]byte {
	t.Helper()
	path := logPath(t)
	l := openLog(t, Config{Path: path, Replica: replica}, noSync)
	for i := range n {
		if err := l.Append(context.Background(), sample(i)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return readLines(t, path)
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(data, []byte("\n"))[:bytes.Count(data, []byte("\n"))]
}

func join(lines [][]byte) []byte { return bytes.Join(lines, nil) }

// wantBreak asserts err is a *BreakError at line.
func wantBreak(t *testing.T, err error, line int) *BreakError {
	t.Helper()
	var be *BreakError
	if !errors.As(err, &be) {
		t.Fatalf("error %v is not a *BreakError", err)
	}
	if be.Line != line {
		t.Fatalf("break at line %d (%s), want line %d", be.Line, be.Reason, line)
	}
	return be
}

// eventually polls cond until it holds or five seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// unsynced reports how many lines are written and wait for an fsync to take them.
func unsynced(l *Log) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.written)
}

// seqs returns the seq of every line, in file order.
func seqs(t *testing.T, lines [][]byte) []uint64 {
	t.Helper()
	out := make([]uint64, 0, len(lines))
	for _, ln := range lines {
		r := decodeLine(t, ln)
		out = append(out, r.Seq)
	}
	return out
}

// recv receives from ch or fails after five seconds, so a lost wake-up fails
// the test instead of hanging it.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for a result")
	}
	var zero T
	return zero
}
