package deploy_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// The five units, by file name, and the user each runs as.
var unitUsers = map[string]string{
	"cotal-signerd.service":    "cotal-signer",
	"cotal-authd@.service":     "cotal-auth",
	"cotal-deliveryd@.service": "cotal-delivery",
	"cotal-managerd@.service":  "cotal-manager",
	"cotal-launcher@.service":  "root",
}

// launcherCaps is exactly what `managerd launcher --help` says the launcher needs.
var launcherCaps = []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL"}

// unit is a parsed unit file: section → key → every assignment, in order.
type unit map[string]map[string][]string

// parseUnit reads a systemd unit file: [Section] headers, Key=Value lines, '#' and ';' comments,
// and a trailing backslash continuing a line.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	var cont strings.Builder
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		if cont.Len() > 0 {
			line = cont.String() + line
			cont.Reset()
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not Key=Value in a section: %q", path, n+1, line)
			}
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

// one returns the single assignment of key in [Service] (or the given section), failing if
// there is not exactly one.
func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s: want exactly one assignment, got %q", section, key, vs)
	}
	return vs[0]
}

// words is every space-separated word of every assignment of key.
func (u unit) words(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

func units(t *testing.T) map[string]unit {
	t.Helper()
	files, err := filepath.Glob("systemd/*.service")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]unit{}
	for _, f := range files {
		got[filepath.Base(f)] = parseUnit(t, f)
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	var want []string
	for n := range unitUsers {
		want = append(want, n)
	}
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Fatalf("deploy/systemd holds %v, want exactly %v", names, want)
	}
	return got
}

// TestUnitHardening asserts, per unit, the user, Type=notify and every hardening directive of
// STYLE.md "deploy/" and docs/deploying.md's "The units", and what the launcher alone is allowed.
func TestUnitHardening(t *testing.T) {
	common := map[string]string{
		"Type": "notify", "Restart": "on-failure", "UMask": "0077", "NoNewPrivileges": "yes",
		"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateMounts": "yes",
		"PrivateIPC": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
		"ProtectKernelLogs": "yes", "ProtectHostname": "yes",
		"RestrictNamespaces": "yes", "RestrictRealtime": "yes", "LockPersonality": "yes",
		"SystemCallArchitectures": "native", "SystemCallErrorNumber": "EPERM",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "LimitCORE": "0",
		"AmbientCapabilities": "",
	}
	daemonOnly := map[string]string{
		"CapabilityBoundingSet": "", "PrivateDevices": "yes", "DevicePolicy": "closed",
		"ProtectClock": "yes", "RestrictSUIDSGID": "yes", "MemoryDenyWriteExecute": "yes",
		"ProcSubset": "pid", "StateDirectoryMode": "0700", "ProtectControlGroups": "yes",
	}
	for name, u := range units(t) {
		t.Run("ok/"+name, func(t *testing.T) {
			svc := "Service"
			if got := u.one(t, svc, "User"); got != unitUsers[name] {
				t.Errorf("User=%s, want %s", got, unitUsers[name])
			}
			if got := u.one(t, svc, "Group"); got != unitUsers[name] {
				t.Errorf("Group=%s, want %s", got, unitUsers[name])
			}
			for k, want := range common {
				if got := u.one(t, svc, k); got != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			if got := u[svc]["SystemCallFilter"]; len(got) == 0 || got[0] != "@system-service" {
				t.Errorf("SystemCallFilter=%q, want @system-service first", got)
			}
			// No secret or setting through the environment; seeds come as credentials.
			for _, k := range []string{"Environment", "EnvironmentFile", "PassEnvironment", "SetCredential", "DynamicUser"} {
				if v, ok := u[svc][k]; ok {
					t.Errorf("%s=%q: not allowed", k, v)
				}
			}
			if !strings.HasPrefix(u.one(t, svc, "ExecStart"), "/usr/local/bin/") {
				t.Errorf("ExecStart=%q: want an absolute /usr/local/bin path", u.one(t, svc, "ExecStart"))
			}
			if name == "cotal-launcher@.service" {
				if got := u.words(svc, "CapabilityBoundingSet"); !sameSet(got, launcherCaps) {
					t.Errorf("CapabilityBoundingSet=%v, want exactly %v", got, launcherCaps)
				}
				for _, k := range []string{"PrivateDevices", "RestrictSUIDSGID", "MemoryDenyWriteExecute", "ProtectClock", "DevicePolicy", "DeviceAllow"} {
					if v, ok := u[svc][k]; ok {
						t.Errorf("%s=%q: the launcher's PTYs and agents need it unset", k, v)
					}
				}
				want := []string{"/run/cotal/launcher", "/run/cotal/managerd", "/var/lib/cotal/agents"}
				if got := u.words(svc, "ReadWritePaths"); !sameSet(got, want) {
					t.Errorf("ReadWritePaths=%v, want exactly %v", got, want)
				}
				if got := u.one(t, svc, "ExecStart"); got != "/usr/local/bin/managerd launcher --config /etc/cotal/launcher/%i.yaml" {
					t.Errorf("ExecStart=%q", got)
				}
				if got := u.words("Unit", "Before"); !slices.Contains(got, "cotal-managerd@%i.service") {
					t.Errorf("Before=%v: want cotal-managerd@%%i.service", got)
				}
				// A cgroup per agent below the unit's (Delegate=, a writable /sys/fs/cgroup);
				// its /proc shows it only itself and its agents only their own uid's
				// processes; agents reach loopback (the broker, authd's exchange) and nothing else.
				for k, want := range map[string]string{"Delegate": "yes", "ProtectProc": "invisible", "ProcSubset": "pid",
					"IPAddressDeny": "any", "IPAddressAllow": "localhost"} {
					if got := u.one(t, svc, k); got != want {
						t.Errorf("%s=%q, want %q", k, got, want)
					}
				}
				if v, ok := u[svc]["ProtectControlGroups"]; ok {
					t.Errorf("ProtectControlGroups=%q: the launcher makes its agents' cgroups", v)
				}
				return
			}
			for k, want := range daemonOnly {
				if got := u.one(t, svc, k); got != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			if got := u[svc]["SystemCallFilter"]; len(got) != 2 || got[1] != "~@privileged @resources" {
				t.Errorf("SystemCallFilter=%q, want @system-service then ~@privileged @resources", got)
			}
			// Writable: only the state directory (and managerd's socket directory).
			if v, ok := u[svc]["ReadWritePaths"]; ok {
				t.Errorf("ReadWritePaths=%q: a daemon writes only its StateDirectory=", v)
			}
			daemon := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "cotal-"), ".service"), "@")
			state := "cotal/" + daemon
			if daemon != "signerd" {
				state += "/%i/state"
			}
			if got := u.one(t, svc, "StateDirectory"); got != state {
				t.Errorf("StateDirectory=%q, want %q", got, state)
			}
			if rt, ok := u[svc]["RuntimeDirectory"]; ok && (daemon != "managerd" || !slices.Equal(rt, []string{"cotal/manager/%i"})) {
				t.Errorf("RuntimeDirectory=%q: only managerd's socket directory", rt)
			}
			wantExec := "/usr/local/bin/" + daemon + " serve --config /etc/cotal/" + daemon + "/%i.yaml"
			if daemon == "signerd" {
				wantExec = "/usr/local/bin/signerd serve --config /etc/cotal/signerd/signerd.yaml"
			}
			if got := u.one(t, svc, "ExecStart"); got != wantExec {
				t.Errorf("ExecStart=%q, want %q", got, wantExec)
			}
			// ProtectProc=invisible would hide the agents' /proc entries from managerd.
			if daemon == "managerd" {
				if v, ok := u[svc]["ProtectProc"]; ok {
					t.Errorf("ProtectProc=%q: managerd reads its agents' /proc/<pid>/stat", v)
				}
			} else if got := u.one(t, svc, "ProtectProc"); got != "invisible" {
				t.Errorf("ProtectProc=%q, want invisible", got)
			}
			// Every key file arrives as a credential, and the source is hidden from the service.
			creds := u[svc]["LoadCredential"]
			if len(creds) == 0 {
				t.Errorf("no LoadCredential=")
			}
			for _, c := range creds {
				id, src, _ := strings.Cut(c, ":")
				if !slices.ContainsFunc(u.words(svc, "InaccessiblePaths"), func(p string) bool {
					p = strings.TrimPrefix(p, "-")
					return src == p || strings.HasPrefix(src, p+"/")
				}) {
					t.Errorf("LoadCredential %s from %s: the source is not in InaccessiblePaths=", id, src)
				}
			}
		})
	}
}

// TestUnitSignerd: what signerd alone has on top of the daemons' hardening.
func TestUnitSignerd(t *testing.T) {
	u := units(t)["cotal-signerd.service"]
	if got := u.one(t, "Service", "LoadCredential"); got != "signerd.key:/var/lib/cotal/signerd/tls/signerd.key" {
		t.Errorf("LoadCredential=%q", got)
	}
	for _, p := range []string{"-/var/lib/cotal/signerd/operator", "-/var/lib/cotal/signerd/signer", "-/var/lib/cotal/signerd/tls"} {
		if !slices.Contains(u.words("Service", "InaccessiblePaths"), p) {
			t.Errorf("InaccessiblePaths= lacks %s", p)
		}
	}
}

// TestUnitOrdering: signerd → authd → deliveryd → managerd, the launcher before managerd,
// RestartSec above each lease's TTL, and a watchdog on each daemon that holds a lease.
func TestUnitOrdering(t *testing.T) {
	us := units(t)
	for _, tc := range []struct {
		unit    string
		needs   []string
		restart int // seconds, strictly more than the lease TTL
		ttl     int
	}{
		{"cotal-authd@.service", []string{"cotal-signerd.service"}, 35, 30},
		{"cotal-deliveryd@.service", []string{"cotal-signerd.service", "cotal-authd@%i.service"}, 35, 30},
		{"cotal-managerd@.service", []string{"cotal-signerd.service", "cotal-authd@%i.service", "cotal-deliveryd@%i.service", "cotal-launcher@%i.service"}, 15, 10},
	} {
		t.Run("ok/"+tc.unit, func(t *testing.T) {
			u := us[tc.unit]
			for _, n := range tc.needs {
				if !slices.Contains(u.words("Unit", "After"), n) || !slices.Contains(u.words("Unit", "Requires"), n) {
					t.Errorf("%s: want After= and Requires= %s; After=%v Requires=%v", tc.unit, n, u.words("Unit", "After"), u.words("Unit", "Requires"))
				}
			}
			rs := u.one(t, "Service", "RestartSec")
			secs, err := strconv.Atoi(strings.TrimSuffix(rs, "s"))
			if err != nil || secs != tc.restart || secs <= tc.ttl {
				t.Errorf("RestartSec=%s, want %ds (above the %ds lease)", rs, tc.restart, tc.ttl)
			}
			// The daemon pings the watchdog only while its lease or claim is being written
			// (daemon.Watchdog with its Healthy); WatchdogSec= outlasts its own tolerated outage
			// (deliveryd's broker-gone backstop of 60 s by default, several lease periods).
			if ws := u.one(t, "Service", "WatchdogSec"); ws != "90s" {
				t.Errorf("WatchdogSec=%s, want 90s", ws)
			}
		})
	}
}

// credRE finds a credential path in a configuration template.
var credRE = regexp.MustCompile(`/run/credentials/([^/\s]+)/([A-Za-z0-9._-]+)`)

// TestConfigsUseCredentials: every key a config template names under /run/credentials/<unit>/
// is a LoadCredential= id of that unit, read from the source the layout table lists, and every
// credential of the unit is used by the config.
func TestConfigsUseCredentials(t *testing.T) {
	us := units(t)
	for _, tc := range []struct{ tmpl, unit, sourceDir string }{
		{"etc/signerd/signerd.yaml", "cotal-signerd.service", "/var/lib/cotal/signerd/tls/"},
		{"etc/authd/space.yaml", "cotal-authd@.service", "/var/lib/cotal/authd/%i/"},
		{"etc/deliveryd/space.yaml", "cotal-deliveryd@.service", "/var/lib/cotal/deliveryd/%i/"},
		{"etc/managerd/space.yaml", "cotal-managerd@.service", "/var/lib/cotal/managerd/%i/"},
	} {
		t.Run("ok/"+tc.unit, func(t *testing.T) {
			data, err := os.ReadFile(tc.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			loaded := map[string]string{}
			for _, c := range us[tc.unit]["Service"]["LoadCredential"] {
				id, src, _ := strings.Cut(c, ":")
				loaded[id] = src
			}
			used := map[string]bool{}
			for _, m := range credRE.FindAllStringSubmatch(string(data), -1) {
				wantUnit := strings.Replace(tc.unit, "@.", "@@TOKEN@.", 1)
				if m[1] != wantUnit {
					t.Errorf("%s names credentials of %s, want %s", tc.tmpl, m[1], wantUnit)
				}
				src, ok := loaded[m[2]]
				if !ok {
					t.Errorf("%s reads credential %q, which %s does not load", tc.tmpl, m[2], tc.unit)
				} else if src != tc.sourceDir+m[2] {
					t.Errorf("credential %s comes from %s, want %s", m[2], src, tc.sourceDir+m[2])
				}
				used[m[2]] = true
			}
			for id := range loaded {
				if !used[id] {
					t.Errorf("%s loads %q, which %s never names", tc.unit, id, tc.tmpl)
				}
			}
		})
	}
}

// TestSysusersAndTmpfiles: the five users, and the fixed directories every unit writes to.
func TestSysusersAndTmpfiles(t *testing.T) {
	data, err := os.ReadFile("sysusers.d/cotal.conf")
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] != "u" {
			t.Errorf("sysusers line %q: only u lines", l)
			continue
		}
		users = append(users, f[1])
	}
	if want := []string{"cotal-signer", "cotal-auth", "cotal-delivery", "cotal-manager"}; !slices.Equal(users, want) {
		t.Errorf("sysusers: %v, want %v", users, want)
	}
	dirs := tmpfilesDirs(t)
	for _, p := range units(t)["cotal-launcher@.service"]["Service"]["ReadWritePaths"] {
		for _, d := range strings.Fields(p) {
			if _, ok := dirs[d]; !ok {
				t.Errorf("ReadWritePaths %s is not made by tmpfiles.d (ProtectSystem=strict needs it to exist)", d)
			}
		}
	}
	if got := dirs["/var/lib/cotal/signerd"]; got != [3]string{"0700", "cotal-signer", "cotal-signer"} {
		t.Errorf("/var/lib/cotal/signerd: %v", got)
	}
}

// tmpfilesDirs maps each d line's path to its mode, user and group.
func tmpfilesDirs(t *testing.T) map[string][3]string {
	t.Helper()
	data, err := os.ReadFile("tmpfiles.d/cotal.conf")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][3]string{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] != "d" || len(f) != 6 {
			t.Fatalf("tmpfiles line %q: want d PATH MODE USER GROUP -", l)
		}
		out[f[1]] = [3]string{f[2], f[3], f[4]}
	}
	return out
}

// verifyDir copies the units into a temporary directory with ExecStart pointing at stand-in
// executables (systemd-analyze checks the binary exists), plus one instance of each template.
func verifyDir(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"signerd", "authd", "deliveryd", "managerd"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for name := range unitUsers {
		data, err := os.ReadFile(filepath.Join("systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte("/usr/local/bin/"), []byte(bin+"/"))
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
		if strings.HasSuffix(name, "@.service") {
			inst := strings.Replace(name, "@.", "@demo.", 1)
			if err := os.Symlink(name, filepath.Join(dir, inst)); err != nil {
				t.Fatal(err)
			}
			names = append(names, inst)
		}
	}
	sort.Strings(names)
	return dir, names
}

// TestSystemdAnalyzeVerify runs `systemd-analyze verify` on every unit and an instance of each
// template; any output (an unknown key is only a warning, exit 0) fails.
func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (.ci/run installs it)")
	}
	dir, names := verifyDir(t)
	cmd := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, names...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

// TestSecurityExposure measures each unit with `systemd-analyze security --offline=true` and
// fails if any is worse than the figure docs/deploying.md records.
func TestSecurityExposure(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (.ci/run installs it)")
	}
	recorded := readmeExposure(t)
	dir, _ := verifyDir(t)
	for name := range unitUsers {
		cmd := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", name)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		m := exposureRE.FindSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no exposure level (%v):\n%s", name, err, out)
		}
		got, _ := strconv.ParseFloat(string(m[1]), 64)
		want, ok := recorded[name]
		if !ok {
			t.Errorf("%s: docs/deploying.md records no exposure", name)
		} else if got > want {
			t.Errorf("%s: exposure %.1f, worse than docs/deploying.md's %.1f", name, got, want)
		}
	}
}

func readmeSection(t *testing.T, marker string) string {
	t.Helper()
	data, err := os.ReadFile("../docs/deploying.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "<!-- "+marker+":begin -->")
	body, _, ok2 := strings.Cut(rest, "<!-- "+marker+":end -->")
	if !ok || !ok2 {
		t.Fatalf("docs/deploying.md has no %s:begin/end markers", marker)
	}
	return body
}

// tableRows returns the cells of each data row of a Markdown table (header and rule skipped).
func tableRows(body string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(body, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		rows = append(rows, cells)
	}
	if len(rows) > 0 {
		rows = rows[1:] // header
	}
	return rows
}

func readmeExposure(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, r := range tableRows(readmeSection(t, "exposure")) {
		v, err := strconv.ParseFloat(r[1], 64)
		if err != nil {
			t.Fatalf("docs/deploying.md exposure row %v: %v", r, err)
		}
		out[r[0]] = v
	}
	return out
}

// signerdBinary is the real signerd, built once per test binary.
var signerdBinary = testkit.Binaries{Prefix: "cotal-deploy-bin-", Pkgs: []string{"github.com/cotalgo/cotal/signerd"}}

func TestMain(m *testing.M) {
	code := m.Run()
	signerdBinary.Remove()
	stack.Remove()
	os.Exit(code)
}

// buildSignerd returns the path of the real signerd.
func buildSignerd(t *testing.T) string {
	t.Helper()
	return filepath.Join(signerdBinary.Dir(t), "signerd")
}

// TestPolicyCheck: the example policy install.sh installs passes `signerd policy check`.
func TestPolicyCheck(t *testing.T) {
	out, err := exec.Command(buildSignerd(t), "policy", "check", "etc/signerd/policy.yaml").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(": ok, 3 callers")) {
		t.Fatalf("signerd policy check: %v\n%s", err, out)
	}
}

// TestInstallRefusesNonRoot: install.sh stops before touching anything when not root.
func TestInstallRefusesNonRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("setpriv"); err != nil {
			t.Skip("as root, this needs setpriv to drop to another uid")
		}
	}
	dest := filepath.Join(t.TempDir(), "dest")
	args := []string{"bash", "install.sh", "--destdir", dest, "--space", "demo"}
	if os.Geteuid() == 0 {
		args = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !bytes.Contains(out, []byte("must run as root")) {
		t.Fatalf("install.sh as non-root: %v\n%s", err, out)
	}
	if _, err := os.Stat(dest); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("install.sh as non-root made %s (%v)", dest, err)
	}
}

// TestInstallHeaderMatchesDocs: install.sh's header comment carries the same layout table as
// docs/deploying.md (path, owner:group and mode of every row, in order), so the two cannot drift.
func TestInstallHeaderMatchesDocs(t *testing.T) {
	data, err := os.ReadFile("install.sh")
	if err != nil {
		t.Fatal(err)
	}
	var header [][3]string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(l, "#"))
		if strings.HasPrefix(l, "# /") && len(f) >= 3 && strings.Contains(f[1], ":") {
			header = append(header, [3]string{f[0], f[1], f[2]})
		}
	}
	var readme [][3]string
	for _, r := range tableRows(readmeSection(t, "layout")) {
		readme = append(readme, [3]string{r[0], r[1], r[2]})
	}
	if !slices.Equal(header, readme) {
		t.Fatalf("install.sh's layout header differs from docs/deploying.md's table:\nheader: %v\ndocs: %v", header, readme)
	}
}

// layoutRow is one row of docs/deploying.md's layout table, expanded for the test's spaces.
type layoutRow struct {
	pattern     string // absolute, may hold '*'
	owner, grp  string
	mode        fs.FileMode
	placeholder bool
}

func layoutRows(t *testing.T, toks, segs []string) []layoutRow {
	t.Helper()
	var rows []layoutRow
	for _, r := range tableRows(readmeSection(t, "layout")) {
		og := strings.SplitN(r[1], ":", 2)
		m, err := strconv.ParseUint(r[2], 8, 32)
		if len(og) != 2 || err != nil || !strings.HasPrefix(r[0], "/") {
			t.Fatalf("docs/deploying.md layout row %q: want `path` | owner:group | 0NNN", r)
		}
		paths := []string{r[0]}
		switch {
		case strings.Contains(r[0], "<tok>"):
			paths = nil
			for _, tok := range toks {
				paths = append(paths, strings.ReplaceAll(r[0], "<tok>", tok))
			}
		case strings.Contains(r[0], "<seg>"):
			paths = nil
			for _, seg := range segs {
				paths = append(paths, strings.ReplaceAll(r[0], "<seg>", seg))
			}
		}
		for _, p := range paths {
			rows = append(rows, layoutRow{pattern: p, owner: og[0], grp: og[1], mode: fs.FileMode(m), placeholder: p != r[0]})
		}
	}
	return rows
}

// ids reads name → id from an /etc/passwd or /etc/group file.
func ids(t *testing.T, path string) map[string]uint32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]uint32{"root": 0}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), ":")
		if len(cols) < 3 {
			continue
		}
		id, err := strconv.ParseUint(cols[2], 10, 32)
		if err == nil {
			out[cols[0]] = uint32(id)
		}
	}
	return out
}

// snapshot records every path under root: type and mode, owner, size, and for files the mtime
// and a content hash.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := fmt.Sprintf("%v %d:%d", fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s += fmt.Sprintf(" %d %d %x", fi.Size(), fi.ModTime().UnixNano(), sha256.Sum256(data))
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInstall (root only) runs install.sh into a temporary root with the real signerd (the other
// binaries are stand-ins: only their installation is under test), then checks every path of the
// docs/deploying.md's layout table (owner, group and mode exact; nothing undocumented under the Cotal
// directories), that no operator, account or curve seed lies outside signerd's directory, the
// launcher's uids, signerd's credential drop-in and the installed policy; then runs it again
// with the same arguments and requires that nothing changed.
func TestInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("install.sh needs root (CI runs as root)")
	}
	for _, tool := range []string{"setpriv", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	signerd := buildSignerd(t)
	bins := t.TempDir()
	for _, b := range []string{"authd", "deliveryd", "managerd"} {
		if err := os.WriteFile(filepath.Join(bins, b), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(signerd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bins, "signerd"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	// signerd init runs as cotal-signer: the staging root must be reachable by that uid.
	top := t.TempDir()
	for _, d := range []string{top, filepath.Dir(top)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dest := filepath.Join(top, "root")
	install := func(extra ...string) string {
		t.Helper()
		cmd := exec.Command("bash", append([]string{"install.sh", "--destdir", dest, "--bin-dir", bins}, extra...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh %v: %v\n%s", extra, err, out)
		}
		return string(out)
	}
	// The second name holds every character a template could mishandle: quotes, a backslash, '&'.
	spaces := []string{"demo", `it's "a" & b\c`}
	var toks, segs []string
	for _, n := range spaces {
		toks = append(toks, space.Token(n))
		segs = append(segs, space.Segment(n))
	}
	out := install("--space", spaces[0], "--space", spaces[1])
	if !strings.Contains(out, "systemctl enable --now cotal-signerd.service") || !strings.Contains(out, "cotal-managerd@"+toks[1]+".service") {
		t.Errorf("install.sh printed no next steps:\n%s", out)
	}

	users, groups := ids(t, filepath.Join(dest, "etc/passwd")), ids(t, filepath.Join(dest, "etc/group"))
	for _, u := range []string{"cotal-signer", "cotal-auth", "cotal-delivery", "cotal-manager"} {
		if _, ok := users[u]; !ok {
			t.Fatalf("user %s not in %s/etc/passwd", u, dest)
		}
		if _, ok := groups[u]; !ok {
			t.Fatalf("group %s not in %s/etc/group", u, dest)
		}
	}

	rows := layoutRows(t, toks, segs)
	t.Run("ok/layout-table", func(t *testing.T) {
		for _, r := range rows {
			matches, err := filepath.Glob(dest + r.pattern)
			if err != nil || len(matches) == 0 {
				t.Errorf("%s: missing (%v)", r.pattern, err)
				continue
			}
			for _, p := range matches {
				fi, err := os.Lstat(p)
				if err != nil {
					t.Error(err)
					continue
				}
				st := fi.Sys().(*syscall.Stat_t)
				rel := strings.TrimPrefix(p, dest)
				if st.Uid != users[r.owner] || st.Gid != groups[r.grp] {
					t.Errorf("%s: owner %d:%d, want %s:%s (%d:%d)", rel, st.Uid, st.Gid, r.owner, r.grp, users[r.owner], groups[r.grp])
				}
				if fi.Mode().Perm() != r.mode || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
					t.Errorf("%s: mode %v, want %#o", rel, fi.Mode(), r.mode)
				}
			}
		}
	})
	t.Run("ok/nothing-undocumented", func(t *testing.T) {
		for _, root := range []string{"/etc/cotal", "/var/lib/cotal", "/run/cotal", "/etc/systemd", "/usr/local/bin"} {
			err := filepath.WalkDir(dest+root, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel := strings.TrimPrefix(p, dest)
				if rel == "/etc/systemd" || rel == "/etc/systemd/system" {
					return nil
				}
				for _, r := range rows {
					if ok, _ := filepath.Match(r.pattern, rel); ok {
						return nil
					}
				}
				t.Errorf("%s is not in docs/deploying.md's layout table", rel)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("ok/seeds-only-in-signerd", func(t *testing.T) {
		var outside []string
		for _, p := range []string{"/etc", "/run", "/usr", "/var/lib/cotal/authd", "/var/lib/cotal/deliveryd",
			"/var/lib/cotal/managerd", "/var/lib/cotal/agents", "/var/lib/cotal/pki"} {
			outside = append(outside, dest+p)
		}
		if err := daemon.ScanSecrets(outside...); err != nil {
			t.Errorf("signing material outside signerd's directory: %v", err)
		}
		// Positive control: the scan does find the seeds where they belong.
		var se *daemon.SecretError
		if err := daemon.ScanSecrets(dest + "/var/lib/cotal/signerd/signer"); !errors.As(err, &se) {
			t.Errorf("scan of signerd's key directory = %v, want a *daemon.SecretError", err)
		}
		// authd's callout seed is a user seed (SU…), checked without printing it.
		for _, tok := range toks {
			data, err := os.ReadFile(dest + "/var/lib/cotal/authd/" + tok + "/callout.nk")
			if err != nil || !bytes.HasPrefix(data, []byte("SU")) {
				t.Errorf("authd/%s/callout.nk: not a user seed (%v)", tok, err)
			}
			clear(data)
		}
		if _, err := os.Stat(dest + "/var/lib/cotal/signerd/authd"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("signerd init's authd/ was left in signerd's directory (%v)", err)
		}
	})
	t.Run("ok/configs", func(t *testing.T) {
		l, err := os.ReadFile(dest + "/etc/cotal/launcher/demo.yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			fmt.Sprintf("manager: {uid: %d, gid: %d}", users["cotal-manager"], groups["cotal-manager"]),
			"agents: {uid_first: 70000, uid_count: 1000}",
			"agent_root: /var/lib/cotal/agents/demo ",
		} {
			if !bytes.Contains(l, []byte(want)) {
				t.Errorf("launcher/demo.yaml lacks %q", want)
			}
		}
		// The second space's launcher has a block of agent uids of its own.
		l2, err := os.ReadFile(dest + "/etc/cotal/launcher/" + toks[1] + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(l2, []byte("agents: {uid_first: 71000, uid_count: 1000}")) {
			t.Errorf("launcher/%s.yaml: want the agents range 71000+1000:\n%s", toks[1], l2)
		}
		for _, d := range []string{"authd", "deliveryd", "managerd"} {
			a, err := os.ReadFile(dest + "/etc/cotal/" + d + "/" + toks[1] + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			var cfg struct {
				Space       string `yaml:"space"`
				CalloutSeed string `yaml:"callout_seed"`
				Signer      struct {
					Key string `yaml:"key"`
				} `yaml:"signer"`
			}
			if err := yaml.Unmarshal(a, &cfg); err != nil {
				t.Fatalf("%s/%s.yaml: %v", d, toks[1], err)
			}
			creds := "/run/credentials/cotal-" + d + "@" + toks[1] + ".service/"
			if cfg.Space != spaces[1] || cfg.Signer.Key != creds+"client.key" {
				t.Errorf("%s/%s.yaml: space %q, signer.key %q; want %q, %q", d, toks[1], cfg.Space, cfg.Signer.Key, spaces[1], creds+"client.key")
			}
			if d == "authd" && cfg.CalloutSeed != creds+"callout.nk" {
				t.Errorf("authd callout_seed %q, want %q", cfg.CalloutSeed, creds+"callout.nk")
			}
		}
		m, err := os.ReadFile(dest + "/etc/cotal/managerd/demo.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^instance_id: [a-z0-9]{26}$`).Match(m) {
			t.Errorf("managerd/demo.yaml: no generated instance_id")
		}
		for _, f := range []string{"managerd/demo.yaml", "authd/demo.yaml", "deliveryd/demo.yaml", "launcher/" + toks[1] + ".yaml", "managerd/" + toks[1] + ".provision.yaml"} {
			data, err := os.ReadFile(dest + "/etc/cotal/" + f)
			if err != nil {
				t.Fatal(err)
			}
			if regexp.MustCompile(`@[A-Z_]+@`).Match(data) {
				t.Errorf("%s: a placeholder was left", f)
			}
		}
		creds, err := os.ReadFile(dest + "/etc/systemd/system/cotal-signerd.service.d/credentials.conf")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, seg := range segs {
			for _, f := range []string{"data-signing.nk", "auth-signing.nk", "xkey.nk", "issuer.key", "owner-secret", "mac.key"} {
				line := "LoadCredential=" + seg + "." + f + ":/var/lib/cotal/signerd/signer/" + seg + "/" + f + "\n"
				if !bytes.Contains(creds, []byte(line)) {
					t.Errorf("credentials.conf lacks %q", line)
				}
				n++
			}
		}
		if line := "LoadCredential=system-signing.nk:/var/lib/cotal/signerd/signer/system-signing.nk\n"; !bytes.Contains(creds, []byte(line)) {
			t.Errorf("credentials.conf lacks %q", line)
		}
		n++
		if got := bytes.Count(creds, []byte("LoadCredential=")); got != n {
			t.Errorf("credentials.conf has %d LoadCredential= lines, want %d", got, n)
		}
		pol, err := exec.Command(signerd, "policy", "check", dest+"/etc/cotal/signerd/policy.yaml").CombinedOutput()
		if err != nil {
			t.Errorf("installed policy: %v\n%s", err, pol)
		}
	})
	t.Run("ok/second-run-changes-nothing", func(t *testing.T) {
		before := snapshot(t, dest)
		install("--space", spaces[0], "--space", spaces[1])
		after := snapshot(t, dest)
		for p, b := range before {
			if a, ok := after[p]; !ok {
				t.Errorf("%s: removed by a second run", p)
			} else if a != b {
				t.Errorf("%s: changed by a second run: %s -> %s", p, b, a)
			}
		}
		for p := range after {
			if _, ok := before[p]; !ok {
				t.Errorf("%s: made by a second run", p)
			}
		}
	})
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}
