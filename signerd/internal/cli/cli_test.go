package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/signerd/internal/audit"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"ok/help", []string{"--help"}, 0, "Usage:"},
		{"ok/version", []string{"--version"}, 0, "signerd "},
		{"ok/init-help", []string{"init", "--help"}, 0, "--space"},
		{"ok/serve-help", []string{"serve", "--help"}, 0, "--config"},
		{"ok/rotate-help", []string{"rotate", "--help"}, 0, "--retire"},
		{"fail/rotate-without-space", []string{"rotate", "--dir", "x"}, 2, "--dir and --space are required"},
		{"fail/rotate-extra-arg", []string{"rotate", "--dir", "x", "--space", "a", "b"}, 2, `unexpected argument "b"`},
		{"fail/no-args", nil, 2, "Usage:"},
		{"fail/unknown-command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"fail/serve-without-config", []string{"serve"}, 2, "--config is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errs)
			}
			if !strings.Contains(out+errs, tc.want) {
				t.Fatalf("output %q lacks %q", out+errs, tc.want)
			}
		})
	}
}

// seedText matches an encoded nkey seed of any kind.
var seedText = regexp.MustCompile(`S[OAUX][A-Z2-7]{56}`)

func TestInitAndPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cotal")
	code, out, errs := run(t, "init", "--dir", dir, "--space", "alpha")
	if code != 0 {
		t.Fatalf("init: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "callout.nk") || seedText.MatchString(out+errs) {
		t.Fatalf("init output unexpected (or holds a seed): %s", out)
	}
	code, _, errs = run(t, "init", "--dir", dir, "--space", "alpha")
	if code != 1 || !strings.Contains(errs, filepath.Join(dir, "operator", "operator.nk")) {
		t.Fatalf("re-init: exit %d, stderr %q; want 1 naming operator.nk", code, errs)
	}
	code, out, errs = run(t, "init", "--dir", dir, "--space", "beta", "--add-space")
	if code != 0 || !strings.Contains(out, `space "beta"`) {
		t.Fatalf("add-space: exit %d: %s %s", code, out, errs)
	}
	code, out, errs = run(t, "pki", "init", "--dir", filepath.Join(dir, "pki"), "--space", "alpha")
	if code != 0 || !strings.Contains(out, "spiffe://cotal.local/managerd/alpha") {
		t.Fatalf("pki init: exit %d: %s %s", code, out, errs)
	}
	code, _, errs = run(t, "pki", "init", "--dir", filepath.Join(dir, "pki"), "--space", "alpha")
	if code != 1 || !strings.Contains(errs, "ca.pem") && !strings.Contains(errs, "ca.key") {
		t.Fatalf("pki re-init: exit %d, stderr %q; want a refusal naming the file", code, errs)
	}
}

const testPolicy = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 10, burst: 10}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["general"]}
`

func writePolicy(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyCheck(t *testing.T) {
	code, out, _ := run(t, "policy", "check", writePolicy(t, testPolicy))
	if code != 0 || !strings.Contains(out, "ok, 1 callers") {
		t.Fatalf("check good: exit %d, %q", code, out)
	}
	code, _, errs := run(t, "policy", "check", writePolicy(t, testPolicy+"    surprise: true\n"))
	if code != 1 || !strings.Contains(errs, "surprise") {
		t.Fatalf("check bad: exit %d, stderr %q; want 1 naming the unknown key", code, errs)
	}
}

func TestPolicyExplain(t *testing.T) {
	p := writePolicy(t, testPolicy)
	base := []string{"policy", "explain", "--policy", p, "--caller", "spiffe://cotal.local/managerd/alpha", "--rpc", "Mint", "--space", "alpha", "--profile", "agent",
		"--owner", "alice", "--actor", "bot", "--uid", "abcdefghijklmnopqrstuvwxyz"}
	for _, tc := range []struct {
		name  string
		extra []string
		code  int
		want  []string
	}{
		{"ok/allowed-with-claims", []string{"--allow-publish", "general", "--ttl", "2h"}, 0,
			[]string{"decision: allowed", "ttl:      1h0m0s", `"cotal.alpha.chat.alice.bot.general"`, "callers[0]"}},
		{"fail/channel-not-allowed", []string{"--allow-publish", "secret"}, 1, []string{"decision: denied", "channel-not-allowed"}},
		{"fail/wildcard-channel-wider-than-policy", []string{"--allow-publish", "team.*"}, 1, []string{"decision: denied", "channel-not-allowed"}},
		{"fail/malformed-channel", []string{"--allow-publish", "team.a*"}, 1, []string{"decision: denied", "invalid-argument"}},
		{"fail/other-space", []string{"--space", "beta"}, 1, []string{"decision: denied", "space-not-allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(t, append(append([]string{}, base...), tc.extra...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Fatalf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "eyJ") {
				t.Fatal("explain printed something that looks like a JWT")
			}
		})
	}
}

func TestAuditVerify(t *testing.T) {
	path := writeAudit(t, 5)
	code, out, errs := run(t, "audit", "verify", path)
	if code != 0 || !strings.Contains(out, "ok, 5 lines") {
		t.Fatalf("verify intact: exit %d: %s %s", code, out, errs)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[2] = strings.Replace(lines[2], `"granted"`, `"denied"`, 1)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = run(t, "audit", "verify", path)
	if code != 1 || !strings.Contains(errs, "line 3") {
		t.Fatalf("verify tampered: exit %d, stderr %q; want 1 reporting line 3", code, errs)
	}
}

// TestAuditRepair (finding 5): a torn final line that blocked every restart is cut and saved
// aside by `signerd audit repair`; a corrupt terminated line is refused, naming file and line.
func TestAuditRepair(t *testing.T) {
	path := writeAudit(t, 3)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	torn := []byte(`{"time":"2026-`)
	if err := os.WriteFile(path, append(data, torn...), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run(t, "audit", "verify", path); code != 1 || !strings.Contains(errs, "line 4") {
		t.Fatalf("verify torn: exit %d, %s", code, errs)
	}
	code, out, errs := run(t, "audit", "repair", path)
	if code != 0 || !strings.Contains(out, "cut torn line 4") || !strings.Contains(out, path+".torn.") {
		t.Fatalf("repair: exit %d: %s %s", code, out, errs)
	}
	saved, err := filepath.Glob(path + ".torn.*")
	if err != nil || len(saved) != 1 {
		t.Fatalf("saved torn files %v (%v), want one", saved, err)
	}
	if got, err := os.ReadFile(saved[0]); err != nil || !bytes.Equal(got, torn) {
		t.Fatalf("saved %q (%v), want %q", got, err, torn)
	}
	if code, out, errs := run(t, "audit", "verify", path); code != 0 || !strings.Contains(out, "ok, 3 lines") {
		t.Fatalf("verify after repair: exit %d: %s %s", code, out, errs)
	}
	if code, out, _ := run(t, "audit", "repair", path); code != 0 || !strings.Contains(out, "nothing torn") {
		t.Fatalf("second repair: exit %d: %s", code, out)
	}

	lines := strings.SplitAfter(string(data), "\n")
	lines[1] = strings.Replace(lines[1], `"granted"`, `"denied"`, 1)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = run(t, "audit", "repair", path)
	if code != 1 || !strings.Contains(errs, "line 2") || !strings.Contains(errs, path) {
		t.Fatalf("repair corrupt: exit %d, stderr %q; want 1 naming %s and line 2", code, errs, path)
	}
}

// writeAudit writes n granted lines to a new audit file and returns its path.
func writeAudit(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit", "signerd.audit")
	l, err := audit.New(audit.Config{Path: path, Replica: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		rec := audit.Record{Caller: "spiffe://cotal.local/managerd/alpha", RPC: "Mint", Space: "alpha", Profile: "agent",
			Decision: audit.Granted, JTI: "JTI" + string(rune('A'+i)), Expiry: time.Now().Add(time.Hour)}
		if err := l.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAuditVerifyFiles (issue 7 deliverable 5): `signerd audit verify` over rotated files in
// order passes, and names a gap, a reordering and a missing file.
func TestAuditVerifyFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit", "signerd.audit")
	l, err := audit.New(audit.Config{Path: path, Replica: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		rec := audit.Record{Caller: "spiffe://cotal.local/managerd/alpha", RPC: "Mint", Space: "alpha", Profile: "agent",
			Decision: audit.Granted, JTI: "JTI" + string(rune('A'+i))}
		if err := l.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if i%3 == 2 && i < 11 {
			if err := l.Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rotated, err := audit.Rotated(path)
	if err != nil || len(rotated) != 3 {
		t.Fatalf("rotated %v (%v), want 3 files", rotated, err)
	}
	f := append(rotated, path) // seqs 1-3 | 4-7 | 8-11 | 12-15

	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in stdout for 0, stderr otherwise
	}{
		{"ok/rotated", []string{"--rotated", path}, 0, []string{"ok, 15 lines in 4 files", `"Seq":15`}},
		{"ok/in-order", f, 0, []string{"ok, 15 lines in 4 files"}},
		{"ok/partial", append([]string{"--partial"}, f[2:]...), 0, []string{"ok, 8 lines in 2 files", `chain start {"Replica":"r1","Seq":7`}},
		{"fail/gap", []string{f[0], f[2], f[3]}, 1, []string{f[2], "gap after " + f[0], "lines 4..7 are missing"}},
		{"fail/reordered", []string{f[0], f[2], f[1], f[3]}, 1, []string{f[2], "out of order", f[1]}},
		{"fail/missing-first-file", f[1:], 1, []string{f[1], "seq 1..3 are missing"}},
		{"fail/current-alone", []string{path}, 1, []string{"seq 1..11 are missing", "--rotated"}},
		{"fail/rotated-takes-one-file", []string{"--rotated", f[0], path}, 2, []string{"usage"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(t, append([]string{"audit", "verify"}, tc.args...)...)
			got := errs
			if tc.code == 0 {
				got = out
			}
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s %s", code, tc.code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output %q lacks %q", got, w)
				}
			}
		})
	}
}

// TestRotate runs the two steps through the command line: each names the changed files and the
// public keys, never a seed; a second start and a retire without a start are refused.
func TestRotate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cotal")
	if code, _, errs := run(t, "init", "--dir", dir, "--space", "alpha"); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errs)
	}
	pub := filepath.Join(dir, "public", "space.616c706861.json")
	conf := filepath.Join(dir, "broker", "nats.conf")
	seed := filepath.Join(dir, "signer", "space.616c706861", "data-signing.nk")
	steps := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"fail/retire-first", []string{"--retire"}, 1, []string{"no rotation of the data account"}},
		{"ok/start", nil, 0, []string{"new signing key A", pub, conf, seed, seed + ".old", "rotate --retire"}},
		{"fail/start-again", nil, 1, []string{"in progress"}},
		{"ok/retire", []string{"--retire"}, 0, []string{"retired A", pub, conf, seed + ".old"}},
	}
	for _, st := range steps {
		code, out, errs := run(t, append([]string{"rotate", "--dir", dir, "--space", "alpha"}, st.args...)...)
		if code != st.code {
			t.Fatalf("%s: exit %d, want %d (stderr %q)", st.name, code, st.code, errs)
		}
		for _, w := range st.want {
			if !strings.Contains(out+errs, w) {
				t.Fatalf("%s: output %q lacks %q", st.name, out+errs, w)
			}
		}
		if seedText.MatchString(out + errs) {
			t.Fatalf("%s: output holds a seed", st.name)
		}
	}
	if _, err := os.Lstat(seed + ".old"); !os.IsNotExist(err) {
		t.Fatalf("%s.old after retire: %v", seed, err)
	}
}
