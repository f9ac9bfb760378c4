package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/managerauthority"
)

// The remote managerd's parts that need no authd: its configuration, its identity state, the
// stock client's bounds against a misbehaving server, and the rejection guard around every hook.
// The start path against authd's real service is authd/service's TestRemoteManagerd.

// remoteConfig is a valid remote configuration with its IdP token file (0600 in a 0700 dir).
func remoteConfig(t *testing.T) *Config {
	t.Helper()
	dir := t.TempDir()
	sec := filepath.Join(dir, "secrets")
	if err := os.Mkdir(sec, 0o700); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(sec, "idp.token")
	if err := os.WriteFile(tok, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Config{
		Authority: AuthorityRemote, AuthorityURL: "https://auth.example/t", IdPTokenFile: tok,
		Space: "alpha", Brokers: []string{"nats://127.0.0.1:1"}, StateDir: filepath.Join(dir, "state"), Root: filepath.Join(dir, "root"),
		Owner: "u_owner", Actor: "cli",
		Launcher:   LauncherConfig{Socket: filepath.Join(dir, "l", "launcher.sock"), TokenFile: filepath.Join(dir, "t", "token")},
		API:        APIConfig{Socket: filepath.Join(dir, "api", "m.sock"), AllowUIDs: []uint32{uint32(os.Getuid())}},
		Connectors: []string{"echo"},
	}
}

func TestRemoteConfig(t *testing.T) {
	t.Run("ok/remote without signer section or instance id", func(t *testing.T) {
		c := remoteConfig(t)
		if err := c.Validate(); err != nil || !c.Remote() || c.InstanceID != "" {
			t.Fatalf("Validate = %v remote %v instance %q", err, c.Remote(), c.InstanceID)
		}
	})
	t.Run("ok/default authority is signer", func(t *testing.T) {
		c := remoteConfig(t)
		c.Authority, c.AuthorityURL, c.IdPTokenFile, c.InstanceID = "", "", "", instanceA
		c.Signer.Address, c.Signer.CA, c.Signer.Cert, c.Signer.Key = "127.0.0.1:1", "/ca", "/c", "/k"
		if err := c.Validate(); err != nil || c.Authority != AuthoritySigner || c.Remote() {
			t.Fatalf("Validate = %v authority %q", err, c.Authority)
		}
	})
	for _, u := range []string{"https://auth.example", "http://127.0.0.1:8443/t", "http://[::1]:1", "http://localhost:9"} {
		t.Run("ok/authority_url "+u, func(t *testing.T) {
			c := remoteConfig(t)
			c.AuthorityURL = u
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate = %v", err)
			}
		})
	}
	for _, tc := range []struct {
		name, want string
		mod        func(*Config)
	}{
		{"signer section with remote", "remove the signer section", func(c *Config) { c.Signer.Address = "127.0.0.1:7443" }},
		{"missing authority_url", "missing required keys: authority_url", func(c *Config) { c.AuthorityURL = "" }},
		{"missing idp_token_file", "missing required keys: idp_token_file", func(c *Config) { c.IdPTokenFile = "" }},
		{"relative idp_token_file", "want an absolute path", func(c *Config) { c.IdPTokenFile = "idp.token" }},
		{"missing idp_token_file file", "no such file", func(c *Config) { c.IdPTokenFile += ".gone" }},
		{"loose idp_token_file", "is looser than", func(c *Config) { must0(t, os.Chmod(c.IdPTokenFile, 0o644)) }},
		{"loose idp_token_file directory", "want its directory this uid's, mode 0700", func(c *Config) { must0(t, os.Chmod(filepath.Dir(c.IdPTokenFile), 0o755)) }},
		{"http to a remote host", "http is only for a loopback host", func(c *Config) { c.AuthorityURL = "http://auth.example" }},
		{"another scheme", "want https", func(c *Config) { c.AuthorityURL = "ftp://auth.example" }},
		{"user info", "no user info", func(c *Config) { c.AuthorityURL = "https://u:p@auth.example" }},
		{"query", "no user info, query or fragment", func(c *Config) { c.AuthorityURL = "https://auth.example/?a=1" }},
		{"credential_ttl", "the authority decides", func(c *Config) { c.CredentialTTL = 60e9 }},
		{"unknown authority", `authority "remote2"`, func(c *Config) { c.Authority = "remote2" }},
		{"authority_url in signer mode", "a signer-mode managerd takes neither", func(c *Config) { c.Authority = AuthoritySigner }},
		{"bad instance id", "instance_id", func(c *Config) { c.InstanceID = "BAD" }},
	} {
		t.Run("fail/"+tc.name, func(t *testing.T) {
			c := remoteConfig(t)
			tc.mod(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("fail/a YAML file with authority: remote and a signer section", func(t *testing.T) {
		c := remoteConfig(t)
		path := filepath.Join(t.TempDir(), "m.yaml")
		y := fmt.Sprintf("authority: remote\nauthority_url: %s\nidp_token_file: %s\nsigner: {address: 127.0.0.1:7443}\n"+
			"space: alpha\nbrokers: [nats://127.0.0.1:1]\nstate_dir: %s\nroot: %s\nowner: u_owner\nactor: cli\n"+
			"launcher: {socket: %s, token_file: %s}\napi: {socket: %s, allow_uids: [%d]}\nconnectors: [echo]\n",
			c.AuthorityURL, c.IdPTokenFile, c.StateDir, c.Root, c.Launcher.Socket, c.Launcher.TokenFile, c.API.Socket, os.Getuid())
		must0(t, os.WriteFile(path, []byte(y), 0o600))
		_, err := LoadConfig(path)
		var ce *daemon.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "remove the signer section") {
			t.Fatalf("LoadConfig = %v, want a ConfigError refusing the signer section", err)
		}
	})
}

func must0(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRemoteIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var first *remoteIdentity
	t.Run("ok/made at the first start, 0600 in 0700", func(t *testing.T) {
		id, err := loadRemoteIdentity(dir, "alpha", "")
		if err != nil {
			t.Fatal(err)
		}
		first = id
		fi, err := os.Stat(filepath.Join(dir, RemoteIdentityFile))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("file %v err %v", fi, err)
		}
		di, err := os.Stat(dir)
		if err != nil || di.Mode().Perm() != 0o700 {
			t.Fatalf("dir %v err %v", di, err)
		}
		ids := id.Identities()
		if id.InstanceID == "" || id.LifecycleUID == "" || ids.Supervisor.ID == ids.Serve.ID || ids.SessionLedger.ID == "" {
			t.Fatalf("identity %s %s %+v", id.InstanceID, id.LifecycleUID, ids)
		}
	})
	t.Run("ok/reused", func(t *testing.T) {
		id, err := loadRemoteIdentity(dir, "alpha", first.InstanceID)
		if err != nil || id.InstanceID != first.InstanceID || id.LifecycleUID != first.LifecycleUID || id.Identities() != first.Identities() {
			t.Fatalf("second load %+v err %v", id, err)
		}
	})
	t.Run("ok/a configured instance id seeds a fresh identity", func(t *testing.T) {
		id, err := loadRemoteIdentity(filepath.Join(t.TempDir(), "s"), "alpha", instanceA)
		if err != nil || id.InstanceID != instanceA {
			t.Fatalf("identity %+v err %v", id, err)
		}
	})
	t.Run("fail/another configured instance", func(t *testing.T) {
		if _, err := loadRemoteIdentity(dir, "alpha", instanceA); err == nil || !strings.Contains(err.Error(), "but instance_id is "+instanceA) {
			t.Fatalf("load = %v", err)
		}
	})
	t.Run("fail/another space", func(t *testing.T) {
		if _, err := loadRemoteIdentity(dir, "beta", ""); err == nil || !strings.Contains(err.Error(), "not beta's") {
			t.Fatalf("load = %v", err)
		}
	})
	t.Run("fail/loose file", func(t *testing.T) {
		must0(t, os.Chmod(filepath.Join(dir, RemoteIdentityFile), 0o640))
		defer func() { must0(t, os.Chmod(filepath.Join(dir, RemoteIdentityFile), 0o600)) }()
		if _, err := loadRemoteIdentity(dir, "alpha", ""); err == nil || !strings.Contains(err.Error(), "looser") {
			t.Fatalf("load = %v", err)
		}
	})
	t.Run("fail/a corrupt seed", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "s")
		id, err := loadRemoteIdentity(d, "alpha", "")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(filepath.Join(d, RemoteIdentityFile))
		_ = id
		bad := strings.Replace(string(raw), `"seeds":["SU`, `"seeds":["SX`, 1)
		must0(t, os.WriteFile(filepath.Join(d, RemoteIdentityFile), []byte(bad), 0o600))
		if _, err := loadRemoteIdentity(d, "alpha", ""); err == nil || !strings.Contains(err.Error(), "seed 0") || strings.Contains(err.Error(), "SX") {
			t.Fatalf("load = %v, want a refusal naming seed 0 and not its text", err)
		}
	})
}

// TestHTTPAuthorityBounds: the stock client against a server that misbehaves in ways authd's door
// never does (so it is an httptest server, not authd): it re-reads the IdP token at every call,
// follows no redirect, refuses an oversized or open answer, and decodes a refusal.
func TestHTTPAuthorityBounds(t *testing.T) {
	c := remoteConfig(t)
	var mu sync.Mutex
	var tokens []string
	answer := func(w http.ResponseWriter, r *http.Request) {}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		env, err := managerauthority.DecodeEnvelope(b)
		if err != nil || r.URL.Path != "/t"+managerauthority.Path || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad", http.StatusTeapot)
			return
		}
		mu.Lock()
		tokens = append(tokens, env.IdPToken)
		mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	h, err := NewHTTPAuthority(srv.URL+"/t", c.IdPTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	req := &managerauthority.Request{V: 1, Kind: managerauthority.KindAuthority, Operation: managerauthority.OpPrepare}
	t.Run("ok/a refusal decodes and the token is re-read per call", func(t *testing.T) {
		answer = func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":"no supervise row","code":"permission-denied"}`))
		}
		_, err := h.PrepareManager(context.Background(), req)
		var rf *managerauthority.Refusal
		if !errors.As(err, &rf) || rf.Status != 403 || rf.Code != "permission-denied" {
			t.Fatalf("err %v, want the refusal", err)
		}
		must0(t, os.WriteFile(c.IdPTokenFile, []byte("token-2"), 0o600))
		_, _ = h.RenewExecutor(context.Background(), req)
		mu.Lock()
		defer mu.Unlock()
		if len(tokens) != 2 || tokens[0] != "token-1" || tokens[1] != "token-2" {
			t.Fatalf("tokens sent %q, want token-1 then token-2", tokens)
		}
	})
	for _, tc := range []struct {
		name, want string
		answer     func(http.ResponseWriter, *http.Request)
	}{
		{"redirect", "redirects are not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://elsewhere.example/", http.StatusTemporaryRedirect)
		}},
		{"oversized answer", "at most", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"v":1,"kind":"` + strings.Repeat("x", managerauthority.MaxAnswerBytes) + `"}`))
		}},
		{"open answer", "unknown field", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"v":1,"kind":"manager-service-authority","operation":"prepare","extra":true}`))
		}},
		{"unreadable refusal", "unreadable refusal", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(`<html>proxy</html>`))
		}},
	} {
		t.Run("fail/"+tc.name, func(t *testing.T) {
			answer = tc.answer
			if _, err := h.ActivateManager(context.Background(), req); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("fail/a loose token file is not read", func(t *testing.T) {
		must0(t, os.Chmod(c.IdPTokenFile, 0o644))
		if _, err := h.MintRetirementRequester(context.Background(), req); err == nil || !strings.Contains(err.Error(), "read the IdP token") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("fail/a URL that is neither https nor loopback", func(t *testing.T) {
		if _, err := NewHTTPAuthority("http://auth.example", c.IdPTokenFile); err == nil {
			t.Fatal("accepted")
		}
	})
}

// hookAuthority is a host's RemoteAuthority whose PrepareManager does what prepare says.
type hookAuthority struct {
	prepare func(*managerauthority.Request) (*managerauthority.Material, error)
}

func (h hookAuthority) PrepareManager(_ context.Context, r *managerauthority.Request) (*managerauthority.Material, error) {
	return h.prepare(r)
}
func (hookAuthority) ActivateManager(context.Context, *managerauthority.Request) (*managerauthority.Material, error) {
	return nil, errors.New("not used")
}
func (hookAuthority) RenewExecutor(context.Context, *managerauthority.Request) (*managerauthority.Material, error) {
	return nil, errors.New("not used")
}
func (hookAuthority) MintRetirementRequester(context.Context, *managerauthority.Request) (*managerauthority.Material, error) {
	return nil, errors.New("not used")
}

// TestRemoteHookGuard: a host RemoteAuthority that panics (with nil, say), answers nothing, or
// answers what does not bind to the request refuses the start (AUTHORITY) with its text and
// leaves nothing running; a panic is a HOOK warning, not a crash. A RemoteAuthority given to a
// signer-mode manager is refused.
func TestRemoteHookGuard(t *testing.T) {
	echo := func(r *managerauthority.Request, owner string) *managerauthority.Material {
		actors, _ := managerauthority.ActorsOf(r.InstanceID)
		return &managerauthority.Material{V: 1, Kind: r.Kind, Operation: r.Operation, Space: r.Space, Owner: owner, Actor: r.Actor,
			InstanceID: r.InstanceID, LifecycleUID: r.ManagerLifecycleUID, RequestID: r.RequestID, Actors: actors, Identities: r.Identities,
			NextRegistrationProof: "sha256:" + strings.Repeat("0", 64), Credentials: managerauthority.Credentials{Supervisor: &managerauthority.Credential{JWT: "j", Exp: 1}}}
	}
	for _, tc := range []struct {
		name, want string
		prepare    func(*managerauthority.Request) (*managerauthority.Material, error)
		hook       bool
	}{
		{"a nil panic", "PrepareManager panicked: nil", func(*managerauthority.Request) (*managerauthority.Material, error) { panic(nil) }, true},
		{"a panic", "boom", func(*managerauthority.Request) (*managerauthority.Material, error) { panic("boom") }, true},
		{"no answer", "answered nothing", func(*managerauthority.Request) (*managerauthority.Material, error) { return nil, nil }, false},
		{"another owner", "derived owner u_other", func(r *managerauthority.Request) (*managerauthority.Material, error) {
			return echo(r, "u_other"), nil
		}, false},
		{"another activation proof", "another activation proof", func(r *managerauthority.Request) (*managerauthority.Material, error) {
			return echo(r, "u_owner"), nil
		}, false},
		{"another request id", "request id", func(r *managerauthority.Request) (*managerauthority.Material, error) {
			m := echo(r, "u_owner")
			m.RequestID = "other"
			return m, nil
		}, false},
	} {
		t.Run("fail/"+tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var hooks int
			_, err := Start(context.Background(), Inputs{Config: remoteConfig(t), RemoteAuthority: hookAuthority{prepare: tc.prepare}},
				RuntimeOptions{Events: func(e Event) {
					if e.Code == CodeHook {
						mu.Lock()
						hooks++
						mu.Unlock()
					}
				}})
			var se *StartError
			if !errors.As(err, &se) || se.Code != CodeAuthority || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want an AUTHORITY refusal naming %q", err, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if (hooks > 0) != tc.hook {
				t.Fatalf("HOOK warnings %d, want any: %v", hooks, tc.hook)
			}
		})
	}
	t.Run("fail/a RemoteAuthority in signer mode", func(t *testing.T) {
		c := remoteConfig(t)
		c.Authority, c.AuthorityURL, c.IdPTokenFile, c.InstanceID = AuthoritySigner, "", "", instanceA
		c.Signer.Address, c.Signer.CA, c.Signer.Cert, c.Signer.Key = "127.0.0.1:1", "/ca", "/c", "/k"
		_, err := Start(context.Background(), Inputs{Config: c, RemoteAuthority: hookAuthority{}}, RuntimeOptions{})
		if err == nil || !strings.Contains(err.Error(), "authority is signer") {
			t.Fatalf("Start = %v", err)
		}
	})
}
