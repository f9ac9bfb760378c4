package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/deliveryd/service"
	"github.com/cotalgo/cotal/deliveryd/service/servicetest"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
)

// TestHelp: every command answers --help on stdout with exit 0; unknown commands and flags are
// usage errors (2); serve without --config refuses.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"ok/top-help", []string{"--help"}, 0, "deliveryd serve --config FILE"},
		{"ok/help-word", []string{"help"}, 0, "deliveryd serve --config FILE"},
		{"ok/serve-help", []string{"serve", "--help"}, 0, "-config"},
		{"fail/no-args", nil, 2, ""},
		{"fail/unknown-command", []string{"srve"}, 2, ""},
		{"fail/unknown-flag", []string{"serve", "--cfg", "x"}, 2, ""},
		{"fail/positional", []string{"serve", "--config", "x", "extra"}, 2, ""},
		{"fail/serve-without-config", []string{"serve"}, 2, ""},
		{"fail/missing-config-file", []string{"serve", "--config", "/nonexistent/deliveryd.yaml"}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Fatalf("stdout %q lacks %q", out.String(), tc.out)
			}
		})
	}
}

// TestRefusedStartStderr (issue 20 item 8): a refused `deliveryd serve` (a second one for a space
// whose lease is held) says why on stderr: a "deliveryd start refused" log line with its code and
// cause, no "reconnecting" line without an error for a connection it closed itself, and a last
// line that names the daemon once.
func TestRefusedStartStderr(t *testing.T) {
	e := plane3test.New(t)
	first, err := service.Start(plane3test.Ctx(t), service.Inputs{Config: servicetest.Config(t, e, "deliveryd-first")},
		service.RuntimeOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close(context.Background()) })
	path := filepath.Join(t.TempDir(), "deliveryd.yaml")
	if err := os.WriteFile(path, []byte(servicetest.YAML(servicetest.Config(t, e, "deliveryd-second"))), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--config", path}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	refused := false
	for _, l := range lines[:len(lines)-1] {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("stderr line %q is not a JSON log line", l)
		}
		if strings.Contains(l, "reconnecting") || strings.Contains(l, `"err":null`) {
			t.Errorf("misleading line for a refused start: %s", l)
		}
		if rec["msg"] == "deliveryd start refused" && rec["code"] == service.CodeLeaseHeld && strings.Contains(fmt.Sprint(rec["err"]), "deliveryd-first") {
			refused = true
		}
	}
	if !refused {
		t.Errorf("no 'deliveryd start refused' line with code %s naming the holder:\n%s", service.CodeLeaseHeld, errb.String())
	}
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "deliveryd: ") || strings.HasPrefix(last, "deliveryd: deliveryd:") || !strings.Contains(last, "deliveryd-first") {
		t.Errorf("last stderr line %q; want the refusal, naming the daemon once and the holder", last)
	}
}
