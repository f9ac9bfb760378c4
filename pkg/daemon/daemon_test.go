package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
)

func seedOf(t *testing.T, mk func() (nkeys.KeyPair, error)) string {
	t.Helper()
	kp, err := mk()
	if err != nil {
		t.Fatal(err)
	}
	s, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return string(s)
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type cfg struct {
	Space  string `yaml:"space"`
	Broker struct {
		URLs []string `yaml:"urls"`
	} `yaml:"broker"`
}

func TestLoadConfig(t *testing.T) {
	acct := seedOf(t, nkeys.CreateAccount)
	for _, tc := range []struct {
		name, src, want string
	}{
		{"fail/unknown-key", "space: a\nsapce: b\n", "sapce"},
		{"fail/unknown-nested", "broker: {urls: [x], url: y}\n", "url"},
		{"fail/alias", "space: &s a\n", "anchor"},
		{"fail/account-seed", "space: a\n# " + acct + "\n", "holds an account seed"},
		{"fail/too-large", "space: a\n" + strings.Repeat("#", MaxConfigBytes), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, filepath.Join(t.TempDir(), "c.yaml"), tc.src)
			var c cfg
			err := LoadConfig(p, &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("LoadConfig = %v; want an error naming %s and %q", err, p, tc.want)
			}
			if strings.Contains(err.Error(), acct) {
				t.Fatal("the error quotes the seed")
			}
		})
	}
	t.Run("fail/missing", func(t *testing.T) {
		var c cfg
		if err := LoadConfig(filepath.Join(t.TempDir(), "none.yaml"), &c); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("LoadConfig = %v, want not-exist", err)
		}
	})
	t.Run("fail/directory", func(t *testing.T) {
		var c cfg
		if err := LoadConfig(t.TempDir(), &c); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("LoadConfig = %v", err)
		}
	})
	t.Run("ok/plain", func(t *testing.T) {
		p := write(t, filepath.Join(t.TempDir(), "c.yaml"), "space: a\nbroker:\n  urls: [nats://127.0.0.1:4222]\n")
		var c cfg
		if err := LoadConfig(p, &c); err != nil || c.Space != "a" || len(c.Broker.URLs) != 1 {
			t.Fatalf("LoadConfig = %v, %+v", err, c)
		}
	})
}

func TestScanSecrets(t *testing.T) {
	op := seedOf(t, nkeys.CreateOperator)
	acct := seedOf(t, nkeys.CreateAccount)
	curve := seedOf(t, nkeys.CreateCurveKeys)
	user := seedOf(t, nkeys.CreateUser)
	// A seed with one character changed fails its CRC (a 5-bit burst): not a seed, not refused.
	bad := []byte(acct)
	if bad[30] == 'A' {
		bad[30] = 'B'
	} else {
		bad[30] = 'A'
	}
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"fail/operator-seed", "operator.nk", op + "\n", "an operator seed"},
		{"fail/account-seed-nested", "deep/er/a.nk", acct, "an account seed"},
		{"fail/curve-seed-in-json", "x.json", `{"xkey":"` + curve + `"}`, "a curve seed"},
		{"fail/private-okp-jwk", "issuer.json", `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA","d":"AA"}]}`, "a private JWK"},
		{"fail/private-ec-jwk-yaml", "k.yaml", "key:\n  kty: EC\n  d: AA\n", "a private JWK"},
		{"fail/private-rsa-jwk", "r.json", `{"kty":"RSA","n":"AA","e":"AQAB","d":"AA"}`, "a private JWK"},
		{"ok/user-seed", "callout.nk", user + "\n", ""},
		{"ok/public-jwk", "jwks.json", `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA"}]}`, ""},
		{"ok/corrupt-seed", "c.nk", string(bad), ""},
		{"ok/seed-inside-longer-token", "t.txt", "X" + acct, ""},
		{"ok/empty", "e", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := write(t, filepath.Join(dir, tc.file), tc.content)
			err := ScanSecrets(dir)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ScanSecrets = %v, want nil", err)
				}
				return
			}
			var se *SecretError
			if !errors.As(err, &se) || se.Path != p || se.What != tc.want {
				t.Fatalf("ScanSecrets = %v; want %q in %s", err, tc.want, p)
			}
			for _, s := range []string{op, acct, curve} {
				if strings.Contains(err.Error(), s) {
					t.Fatal("the error quotes the seed")
				}
			}
		})
	}
	t.Run("fail/seed-across-chunk-boundary", func(t *testing.T) {
		dir := t.TempDir()
		content := strings.Repeat("x", scanChunk-20) + "\n" + acct + "\n"
		p := write(t, filepath.Join(dir, "big.log"), content)
		var se *SecretError
		if err := ScanSecrets(dir); !errors.As(err, &se) || se.Path != p {
			t.Fatalf("ScanSecrets = %v, want the seed found in %s", err, p)
		}
	})
	t.Run("fail/symlinked-file", func(t *testing.T) {
		outside := write(t, filepath.Join(t.TempDir(), "a.nk"), acct)
		dir := t.TempDir()
		if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
			t.Fatal(err)
		}
		var se *SecretError
		if err := ScanSecrets(dir); !errors.As(err, &se) || se.Path != filepath.Join(dir, "link") {
			t.Fatalf("ScanSecrets = %v", err)
		}
	})
	t.Run("ok/missing-dir", func(t *testing.T) {
		if err := ScanSecrets(filepath.Join(t.TempDir(), "not-yet")); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzScanBytes(f *testing.F) {
	f.Add([]byte(`{"kty":"OKP","d":"x"}`))
	f.Add([]byte("SAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = scanBytes("f", b)
	})
}

func healthServer(t *testing.T, code int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func fileMode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestDiscoveryAndReady(t *testing.T) {
	pid := os.Getpid()
	ctx := func(t *testing.T, d time.Duration) context.Context {
		c, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return c
	}
	t.Run("ok/ready-after-file-and-health", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		url := healthServer(t, http.StatusOK)
		done := make(chan error, 1)
		var info ReadyInfo
		go func() {
			var err error
			info, err = Ready(ctx(t, 10*time.Second), dir, "svc", pid)
			done <- err
		}()
		if err := WriteDiscovery(dir, "svc", Discovery{URL: url, PID: pid, Cap: "secret-cap"}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil || info.URL != url || info.PID != pid {
			t.Fatalf("Ready = %+v, %v", info, err)
		}
		if m := fileMode(t, DiscoveryPath(dir, "svc")); m != 0o600 {
			t.Fatalf("discovery file mode %v", m)
		}
		if m := fileMode(t, dir); m != 0o700 {
			t.Fatalf("discovery dir mode %v", m)
		}
		if err := RemoveDiscovery(dir, "svc", pid+1); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(DiscoveryPath(dir, "svc")); err != nil {
			t.Fatalf("RemoveDiscovery removed another pid's file: %v", err)
		}
		if err := RemoveDiscovery(dir, "svc", pid); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(DiscoveryPath(dir, "svc")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("discovery file still there: %v", err)
		}
	})
	t.Run("fail/health-not-2xx", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		if err := WriteDiscovery(dir, "svc", Discovery{URL: healthServer(t, 503), PID: pid}); err != nil {
			t.Fatal(err)
		}
		var nr *NotReadyError
		if _, err := Ready(ctx(t, 500*time.Millisecond), dir, "svc", pid); !errors.As(err, &nr) || !strings.Contains(nr.Last, "503") {
			t.Fatalf("Ready = %v, want not ready with status 503", err)
		}
	})
	t.Run("ok/unavailable-waited-on-until-ready", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		url := healthServer(t, 200)
		if err := WriteDiscovery(dir, "svc", Discovery{URL: url, PID: pid, State: StateUnavailable}); err != nil {
			t.Fatal(err)
		}
		var nr *NotReadyError
		if _, err := Ready(ctx(t, 300*time.Millisecond), dir, "svc", pid); !errors.As(err, &nr) || !strings.Contains(nr.Last, "unavailable") {
			t.Fatalf("Ready = %v, want not ready naming the unavailable state", err)
		}
		if err := WriteDiscovery(dir, "svc", Discovery{URL: url, PID: pid, State: StateReady}); err != nil {
			t.Fatal(err)
		}
		if info, err := Ready(ctx(t, 10*time.Second), dir, "svc", pid); err != nil || info.URL != url {
			t.Fatalf("Ready = %+v, %v after the state went ready", info, err)
		}
	})
	t.Run("fail/state-not-a-file-state", func(t *testing.T) {
		for _, st := range []State{StateStarting, StateStopped, "serving"} {
			if err := WriteDiscovery(t.TempDir(), "svc", Discovery{URL: "http://127.0.0.1:1", PID: pid, State: st}); err == nil {
				t.Fatalf("WriteDiscovery accepted state %q", st)
			}
		}
	})
	t.Run("fail/other-pid-file-ignored", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		if err := WriteDiscovery(dir, "svc", Discovery{URL: healthServer(t, 200), PID: pid + 1}); err != nil {
			t.Fatal(err)
		}
		var nr *NotReadyError
		if _, err := Ready(ctx(t, 300*time.Millisecond), dir, "svc", pid); !errors.As(err, &nr) {
			t.Fatalf("Ready = %v, want not ready", err)
		}
	})
	t.Run("fail/non-loopback-url", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		if err := WriteDiscovery(dir, "svc", Discovery{URL: "http://192.0.2.1:80", PID: pid}); err != nil {
			t.Fatal(err)
		}
		if _, err := Ready(ctx(t, 2*time.Second), dir, "svc", pid); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Fatalf("Ready = %v, want a loopback refusal", err)
		}
	})
	t.Run("fail/refusal-returned-at-once", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		r := Refusal{PID: pid, Code: "PLANE_HELD", Reason: "another authd holds the plane", Details: map[string]string{"holder": "h1"}}
		if err := WriteRefusal(dir, "svc", r); err != nil {
			t.Fatal(err)
		}
		if m := fileMode(t, RefusalPath(dir, "svc")); m != 0o600 {
			t.Fatalf("refusal file mode %v", m)
		}
		var re *RefusedError
		_, err := Ready(ctx(t, 10*time.Second), dir, "svc", pid)
		if !errors.As(err, &re) || re.Refusal.Code != "PLANE_HELD" || re.Refusal.Details["holder"] != "h1" || re.Refusal.Ver != FileVersion {
			t.Fatalf("Ready = %v, want the refusal", err)
		}
	})
	t.Run("ok/refusal-keeps-the-serving-instance-file", func(t *testing.T) {
		// A second instance refused by the first's claim must not withdraw the first's readiness.
		dir := filepath.Join(t.TempDir(), "run")
		if err := WriteDiscovery(dir, "svc", Discovery{URL: healthServer(t, 200), PID: pid}); err != nil {
			t.Fatal(err)
		}
		if err := WriteRefusal(dir, "svc", Refusal{PID: pid + 1, Code: "PLANE_HELD"}); err != nil {
			t.Fatal(err)
		}
		if _, err := Ready(ctx(t, 10*time.Second), dir, "svc", pid); err != nil {
			t.Fatalf("Ready(first) after the second's refusal = %v", err)
		}
	})
	t.Run("fail/pid-exits", func(t *testing.T) {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		done := make(chan error, 1)
		go func() {
			_, err := Ready(ctx(t, 30*time.Second), t.TempDir(), "svc", cmd.Process.Pid)
			done <- err
		}()
		if err := cmd.Process.Kill(); err != nil { // not reaped yet: a zombie counts as gone
			t.Fatal(err)
		}
		var ee *ExitedError
		select {
		case err := <-done:
			if !errors.As(err, &ee) || ee.PID != cmd.Process.Pid {
				t.Fatalf("Ready = %v, want exited", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Ready did not end when the pid exited")
		}
	})
	t.Run("fail/bad-name", func(t *testing.T) {
		if err := WriteDiscovery(t.TempDir(), "../x", Discovery{URL: "http://127.0.0.1:1", PID: 1}); err == nil {
			t.Fatal("WriteDiscovery accepted a path as a name")
		}
	})
	t.Run("fail/loose-dir", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := WriteDiscovery(dir, "svc", Discovery{URL: "http://127.0.0.1:1", PID: pid}); err == nil || !strings.Contains(err.Error(), dir) {
			t.Fatalf("WriteDiscovery in a 0755 dir = %v", err)
		}
	})
}

func TestNotify(t *testing.T) {
	t.Run("ok/unset-does-nothing", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", "")
		if sent, err := Notify("READY=1"); sent || err != nil {
			t.Fatalf("Notify = %v, %v", sent, err)
		}
	})
	t.Run("ok/sends-ready", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "notify.sock")
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		t.Setenv("NOTIFY_SOCKET", p)
		if sent, err := Notify("READY=1"); !sent || err != nil {
			t.Fatalf("Notify = %v, %v", sent, err)
		}
		buf := make([]byte, 64)
		_ = l.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := l.Read(buf)
		if err != nil || string(buf[:n]) != "READY=1" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
	})
	t.Run("fail/relative-socket", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", "rel.sock")
		if _, err := Notify("READY=1"); err == nil {
			t.Fatal("Notify accepted a relative socket path")
		}
	})
}

func TestCheckBrokers(t *testing.T) {
	for _, tc := range []struct {
		name string
		urls []string
		ok   bool
	}{
		{"ok/cluster list", []string{"nats://10.0.0.1:4222", "tls://n2.example:4222", "nats://[::1]:4222"}, true},
		{"fail/comma-joined entry", []string{"nats://a:4222,nats://b:4222"}, false},
		{"fail/credentials", []string{"nats://u:p@a:4222"}, false},
		{"fail/scheme", []string{"http://a:4222"}, false},
		{"fail/no host", []string{"nats://"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckBrokers(tc.urls); (err == nil) != tc.ok {
				t.Fatalf("CheckBrokers(%v) = %v, want ok %v", tc.urls, err, tc.ok)
			}
		})
	}
}
