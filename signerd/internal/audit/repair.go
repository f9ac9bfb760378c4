package audit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Repaired says what Repair (or New) did to a file.
type Repaired struct {
	// Lines is the number of whole lines the file holds.
	Lines int
	// Line is the number of the torn line that was cut; 0 when none was.
	Line int
	// Bytes is how many bytes were cut.
	Bytes int64
	// SavedTo is the file the cut bytes were saved to ("" when none).
	SavedTo string
}

// Repair cuts a torn final line from the audit file at path: a final line
// without a newline is what a write interrupted by a full disk or a crash
// leaves, and its bytes were never acknowledged to anyone, so cutting them
// loses no decision. The cut bytes are saved aside, 0600, in
// path + ".torn.<unix time>" before the file is truncated. New does the same
// at start. Repair refuses a file another Log holds (signerd running), a file
// or directory with loose modes, and a file broken anywhere else (a terminated
// line that does not verify), naming the file and the line: that needs a
// person, not a tool. A file with nothing torn is left as it is.
func Repair(path string) (Repaired, error) {
	f, err := openFile(path, 0)
	if err != nil {
		return Repaired{}, err
	}
	defer func() { _ = f.Close() }()
	res, _, err := repairOpen(f, path, time.Now)
	return res, err
}

// repairOpen verifies the locked file f and cuts a torn final line. The
// summary covers the file as it is afterwards.
func repairOpen(f *os.File, path string, now func() time.Time) (Repaired, Summary, error) {
	fi, err := f.Stat()
	if err != nil {
		return Repaired{}, Summary{}, fmt.Errorf("audit: %w", err)
	}
	sum, err := Verify(io.NewSectionReader(f, 0, fi.Size()))
	var be *BreakError
	switch {
	case err == nil:
		return Repaired{Lines: sum.Lines}, sum, nil
	case !errors.As(err, &be) || !be.Torn:
		return Repaired{}, Summary{}, fmt.Errorf("audit: %s: refusing to append to a broken chain: %w", path, err)
	}
	res := Repaired{Lines: sum.Lines, Line: be.Line, Bytes: fi.Size() - sum.Bytes}
	torn := make([]byte, res.Bytes)
	if _, err := f.ReadAt(torn, sum.Bytes); err != nil {
		return Repaired{}, Summary{}, fmt.Errorf("audit: %s: read torn line %d: %w", path, be.Line, err)
	}
	if res.SavedTo, err = saveAside(path, torn, now()); err != nil {
		return Repaired{}, Summary{}, err
	}
	if err := f.Truncate(sum.Bytes); err != nil {
		return Repaired{}, Summary{}, fmt.Errorf("audit: %s: cut torn line %d: %w", path, be.Line, err)
	}
	if err := f.Sync(); err != nil {
		return Repaired{}, Summary{}, fmt.Errorf("audit: %s: cut torn line %d: %w", path, be.Line, err)
	}
	return res, sum, nil
}

// saveAside writes data to a new 0600 file path.torn.<unix>[.<k>] next to
// path, durably (file and directory fsynced), and returns its name.
func saveAside(path string, data []byte, now time.Time) (string, error) {
	base := fmt.Sprintf("%s.torn.%d", path, now.Unix())
	for k := 0; k < 100; k++ {
		name := base
		if k > 0 {
			name = fmt.Sprintf("%s.%d", base, k)
		}
		out, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("audit: save torn line: %w", err)
		}
		_, err = out.Write(data)
		if err == nil {
			err = out.Sync()
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = syncDir(filepath.Dir(path))
		}
		if err != nil {
			return "", fmt.Errorf("audit: save torn line to %s: %w", name, err)
		}
		return name, nil
	}
	return "", fmt.Errorf("audit: save torn line: %s and 99 more names exist", base)
}
