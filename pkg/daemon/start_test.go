package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func TestRefuseStart(t *testing.T) {
	cause := errors.New("broker said no")
	for _, tc := range []struct {
		name       string
		err        error
		dir        bool
		wantCode   string
		wantReason string // "" means no file
		wantError  string
	}{
		{"ok/cause in the reason", &StartError{Code: "BROKER", Reason: "connection refused", Err: cause}, true,
			"BROKER", "connection refused: broker said no", "svcd: connection refused: broker said no"},
		{"ok/details say the rest", &StartError{Code: "HELD", Reason: "x holds it", Err: cause, Details: map[string]string{"holder": "x"}}, true,
			"HELD", "x holds it", "svcd: x holds it: broker said no"},
		{"ok/a plain error is a config refusal", cause, true, CodeConfig, "start failed: broker said no", "svcd: start failed: broker said no"},
		{"ok/no cause", &StartError{Code: CodeConfig, Reason: "no space"}, true, CodeConfig, "no space", "svcd: no space"},
		{"ok/canceled writes nothing", &StartError{Code: CodeCanceled, Reason: "start canceled", Err: cause}, true, CodeCanceled, "", "svcd: start canceled: broker said no"},
		{"ok/no state dir writes nothing", &StartError{Code: "BROKER", Reason: "connection refused"}, false, "BROKER", "", "svcd: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.dir {
				dir = filepath.Join(t.TempDir(), "state")
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			var logged bytes.Buffer
			se := RefuseStart(slog.New(slog.NewJSONHandler(&logged, nil)), dir, "svc", "svcd", 42, tc.err)
			if se.Code != tc.wantCode || se.Error() != tc.wantError || errors.Is(se, cause) != errors.Is(tc.err, cause) {
				t.Fatalf("RefuseStart = %q (code %s), want %q (code %s), wrapping the cause", se.Error(), se.Code, tc.wantError, tc.wantCode)
			}
			// One error line says why, with or without a state dir; a canceled start logs nothing.
			if tc.wantCode == CodeCanceled {
				if logged.Len() != 0 {
					t.Fatalf("a canceled start logged %q", logged.String())
				}
			} else {
				var rec map[string]any
				if err := json.Unmarshal(logged.Bytes(), &rec); err != nil || rec["msg"] != "svcd start refused" ||
					rec["level"] != "ERROR" || rec["code"] != tc.wantCode || rec["reason"] != se.Reason {
					t.Fatalf("log %q (%v); want one svcd start refused error line with code %s", logged.String(), err, tc.wantCode)
				}
			}
			if dir == "" {
				return
			}
			var r Refusal
			err := readJSON(RefusalPath(dir, "svc"), &r)
			if tc.wantReason == "" {
				if !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("refusal file: %v, want none", err)
				}
				return
			}
			if err != nil || r.PID != 42 || r.Code != tc.wantCode || r.Reason != tc.wantReason || len(r.Details) != len(se.Details) {
				t.Fatalf("refusal file %+v, %v; want pid 42, code %s, reason %q", r, err, tc.wantCode, tc.wantReason)
			}
		})
	}
}
