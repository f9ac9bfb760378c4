package idp_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
)

func TestNewPin(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		want      idp.Pin
		err       string
	}{
		{name: "ok/https", url: "https://id.example.com/auth/", want: idp.Pin{Ver: 1, URL: "https://id.example.com/auth", Issuer: "https://id.example.com", Audience: "https://id.example.com", JWKSURI: "https://id.example.com/auth/jwks"}},
		{name: "ok/https-port", url: "https://id.example.com:8443", want: idp.Pin{Ver: 1, URL: "https://id.example.com:8443", Issuer: "https://id.example.com:8443", Audience: "https://id.example.com:8443", JWKSURI: "https://id.example.com:8443/jwks"}},
		{name: "ok/http-loopback-v4", url: "http://127.0.0.1:9000/api/auth", want: idp.Pin{Ver: 1, URL: "http://127.0.0.1:9000/api/auth", Issuer: "http://127.0.0.1:9000", Audience: "http://127.0.0.1:9000", JWKSURI: "http://127.0.0.1:9000/api/auth/jwks"}},
		{name: "ok/http-loopback-v6", url: "http://[::1]:9000", want: idp.Pin{Ver: 1, URL: "http://[::1]:9000", Issuer: "http://[::1]:9000", Audience: "http://[::1]:9000", JWKSURI: "http://[::1]:9000/jwks"}},
		{name: "ok/http-localhost", url: "http://localhost:9000", want: idp.Pin{Ver: 1, URL: "http://localhost:9000", Issuer: "http://localhost:9000", Audience: "http://localhost:9000", JWKSURI: "http://localhost:9000/jwks"}},
		{name: "fail/http-remote", url: "http://id.example.com", err: "loopback"},
		{name: "fail/http-private-ip", url: "http://10.0.0.1", err: "loopback"},
		{name: "fail/scheme", url: "ftp://id.example.com", err: "scheme"},
		{name: "fail/relative", url: "/auth", err: "scheme"},
		{name: "fail/no-host", url: "https:///auth", err: "host"},
		{name: "fail/userinfo", url: "https://u:p@id.example.com", err: "user info"},
		{name: "fail/query", url: "https://id.example.com/?a=b", err: "query"},
		{name: "fail/fragment", url: "https://id.example.com/#x", err: "fragment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idp.NewPin(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewPin(%q) = %+v, %v; want error containing %q", tc.url, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NewPin(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
			}
		})
	}
}

func TestPinURL(t *testing.T) {
	ctx := context.Background()
	fake := idptest.Start(t)

	t.Run("ok/probes-then-writes-0600", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		before := fake.Fetches.Load()
		p, err := idp.PinURL(ctx, dir, fake.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fake.Fetches.Load() != before+1 {
			t.Fatalf("JWKS fetches = %d, want one probe", fake.Fetches.Load()-before)
		}
		fi, err := os.Stat(filepath.Join(dir, idp.FileName))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("idp.json: %v, %v; want mode 0600", fi, err)
		}
		got, err := idp.Load(dir)
		if err != nil || got != p || got.Issuer != fake.URL || got.JWKSURI != fake.URL+"/jwks" {
			t.Fatalf("Load = %+v, %v; want %+v", got, err, p)
		}
		// Pinning the same URL again is a no-op.
		if again, err := idp.PinURL(ctx, dir, fake.URL+"/", nil); err != nil || again != p {
			t.Fatalf("same pin again = %+v, %v", again, err)
		}
	})
	t.Run("fail/repin", func(t *testing.T) {
		dir := stateDir(t)
		if _, err := idp.PinURL(ctx, dir, fake.URL, nil); err != nil {
			t.Fatal(err)
		}
		other := idptest.Start(t)
		_, err := idp.PinURL(ctx, dir, other.URL, nil)
		if !errors.Is(err, idp.ErrRepin) {
			t.Fatalf("re-pin = %v, want ErrRepin", err)
		}
		if got, _ := idp.Load(dir); got.URL != fake.URL {
			t.Fatalf("pin after refused re-pin = %+v", got)
		}
	})
	t.Run("fail/probe-down-writes-nothing", func(t *testing.T) {
		dir := stateDir(t)
		down := idptest.Start(t)
		down.SetDown(true)
		if _, err := idp.PinURL(ctx, dir, down.URL, nil); err == nil || !strings.Contains(err.Error(), "status 503") {
			t.Fatalf("pin with JWKS down = %v", err)
		}
		if _, err := idp.Load(dir); !errors.Is(err, idp.ErrNotPinned) {
			t.Fatalf("Load after failed probe = %v, want ErrNotPinned", err)
		}
	})
	t.Run("fail/probe-404", func(t *testing.T) {
		dir := stateDir(t)
		// A URL whose /jwks is 404: the probe refuses.
		if _, err := idp.PinURL(ctx, dir, fake.URL+"/nope", nil); err == nil || !strings.Contains(err.Error(), "status 404") {
			t.Fatalf("pin with no JWKS = %v", err)
		}
	})
	t.Run("fail/http-remote", func(t *testing.T) {
		if _, err := idp.PinURL(ctx, stateDir(t), "http://id.example.com", nil); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Fatalf("pin http remote = %v", err)
		}
	})
}

func TestLoad(t *testing.T) {
	write := func(t *testing.T, body string, mode os.FileMode) string {
		dir := stateDir(t)
		if err := os.WriteFile(filepath.Join(dir, idp.FileName), []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	good := `{"ver":1,"url":"https://id.example.com","issuer":"https://id.example.com","audience":"https://id.example.com","jwksUri":"https://id.example.com/jwks"}`
	for _, tc := range []struct {
		name, body string
		mode       os.FileMode
		err        string
	}{
		{name: "ok/valid", body: good, mode: 0o600},
		{name: "fail/mode-0644", body: good, mode: 0o644, err: "idp.json"},
		{name: "fail/issuer-elsewhere", body: strings.Replace(good, `"issuer":"https://id.example.com"`, `"issuer":"https://evil.example.com"`, 1), mode: 0o600, err: "do not follow"},
		{name: "fail/jwks-elsewhere", body: strings.Replace(good, `"jwksUri":"https://id.example.com/jwks"`, `"jwksUri":"https://evil.example.com/jwks"`, 1), mode: 0o600, err: "do not follow"},
		{name: "fail/unknown-key", body: strings.Replace(good, `{`, `{"extra":1,`, 1), mode: 0o600, err: "unknown field"},
		{name: "fail/ver", body: strings.Replace(good, `"ver":1`, `"ver":2`, 1), mode: 0o600, err: "ver 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t, tc.body, tc.mode)
			_, err := idp.Load(dir)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Load = %v, want error containing %q", err, tc.err)
			}
		})
	}
	t.Run("fail/not-pinned", func(t *testing.T) {
		if _, err := idp.Load(stateDir(t)); !errors.Is(err, idp.ErrNotPinned) {
			t.Fatalf("Load = %v, want ErrNotPinned", err)
		}
	})
}

// stateDir returns a fresh 0700 directory (t.TempDir is 0755 here, which the pin refuses).
func stateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadRefusesLooseStateDir(t *testing.T) {
	dir := stateDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := idp.Load(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Load in a 0755 dir = %v, want an error naming it", err)
	}
}
