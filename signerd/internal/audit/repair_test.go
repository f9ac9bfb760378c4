package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestRepair (finding 5): Repair cuts only an unterminated final line, saves
// it aside 0600 and leaves a chain New continues; anything else it refuses.
func TestRepair(t *testing.T) {
	// chain writes three lines to a fresh log and returns its path and lines.
	chain := func(t *testing.T) (string, [][]byte) {
		t.Helper()
		path := logPath(t)
		l := openLog(t, Config{Path: path}, noSync)
		for i := range 3 {
			if err := l.Append(context.Background(), sample(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return path, readLines(t, path)
	}
	write := func(t *testing.T, path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("ok/torn-line-cut-and-saved", func(t *testing.T) {
		path, lines := chain(t)
		torn := lines[1][:len(lines[1])-1] // all of a line but its newline
		write(t, path, append(join(lines), torn...))
		res, err := Repair(path)
		if err != nil {
			t.Fatalf("Repair: %v", err)
		}
		if res.Lines != 3 || res.Line != 4 || res.Bytes != int64(len(torn)) {
			t.Fatalf("Repair = %+v, want 3 lines kept and line 4 (%d bytes) cut", res, len(torn))
		}
		wantPrivate(t, res.SavedTo, torn)
		if got := readLines(t, path); !bytes.Equal(join(got), join(lines)) {
			t.Fatal("the whole lines changed")
		}
		l := openLog(t, Config{Path: path}, noSync)
		if h := l.Head(); h.Seq != 3 {
			t.Fatalf("head after repair %+v, want seq 3", h)
		}
	})
	t.Run("ok/nothing-torn-left-alone", func(t *testing.T) {
		path, lines := chain(t)
		res, err := Repair(path)
		if err != nil || res != (Repaired{Lines: 3}) {
			t.Fatalf("Repair = %+v, %v; want 3 lines and nothing cut", res, err)
		}
		if !bytes.Equal(join(readLines(t, path)), join(lines)) || len(tornFiles(t, path)) != 0 {
			t.Fatal("an intact file was changed")
		}
	})
	t.Run("fail/corrupt-terminated-line", func(t *testing.T) {
		path, lines := chain(t)
		bad := join(replaceIn(lines, 2, func(s string) string { return strings.Replace(s, "agent", "admin", 1) }))
		write(t, path, append(bad, lines[0][:10]...))
		_, err := Repair(path)
		wantBreak(t, err, 2)
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("error %q does not name %s", err, path)
		}
		if data, _ := os.ReadFile(path); !bytes.HasSuffix(data, lines[0][:10]) || len(tornFiles(t, path)) != 0 {
			t.Fatal("a file broken before its final line was cut")
		}
	})
	t.Run("fail/in-use", func(t *testing.T) {
		path, _ := chain(t)
		_ = openLog(t, Config{Path: path}, noSync)
		if _, err := Repair(path); !errors.Is(err, ErrInUse) {
			t.Fatalf("Repair of a file a Log holds = %v, want ErrInUse", err)
		}
	})
	t.Run("fail/missing-file-not-created", func(t *testing.T) {
		path := logPath(t)
		if _, err := Repair(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Repair of a missing file = %v, want not-exist", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("Repair created the file")
		}
	})
}
