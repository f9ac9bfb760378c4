package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/pkg/daemon"
)

// fixture is a valid configuration's files: a 0600 callout seed and a 0700 state dir.
type fixture struct{ dir, seed, state string }

func newFixture(t *testing.T) fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "authd")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	s, _ := kp.Seed()
	f := fixture{dir: dir, seed: filepath.Join(dir, "callout.nk"), state: filepath.Join(dir, "state")}
	if err := os.WriteFile(f.seed, s, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.state, 0o700); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f fixture) yaml(extra string) string {
	return `space: alpha
brokers: [nats://127.0.0.1:4222]
signer: {address: 127.0.0.1:7443, ca: /x/ca.pem, cert: /x/authd.pem, key: /x/authd.key}
callout_seed: ` + f.seed + `
state_dir: ` + f.state + `
` + extra
}

func (f fixture) load(t *testing.T, content string) (*Config, string, error) {
	t.Helper()
	p := filepath.Join(f.dir, "authd.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	return c, p, err
}

func TestLoad(t *testing.T) {
	t.Run("ok/defaults", func(t *testing.T) {
		f := newFixture(t)
		c, _, err := f.load(t, f.yaml(""))
		if err != nil {
			t.Fatal(err)
		}
		if c.Listen != DefaultListen || c.MaxInFlight != DefaultMaxInFlight || c.PlaneTTL.D() != DefaultPlaneTTL || c.ShutdownTimeout.D() != DefaultShutdownTimeout || c.ServiceEndpoints {
			t.Fatalf("defaults: %+v", c)
		}
		if c.CalloutOpens.Callout() != callout.DefaultOpenRate || c.CalloutRefusals.Callout() != callout.DefaultRefusalRate {
			t.Fatalf("callout budgets %+v %+v, want the defaults", c.CalloutOpens, c.CalloutRefusals)
		}
	})
	t.Run("ok/everything", func(t *testing.T) {
		f := newFixture(t)
		kp, _ := nkeys.CreateServer()
		id, _ := kp.PublicKey()
		c, _, err := f.load(t, f.yaml("listen: '[::1]:8088'\nallowed_servers: ["+id+"]\nmax_in_flight: 8\nplane_ttl: 10s\nshutdown_timeout: 3s\nlog_level: debug\ninstance_id: 0123456789abcdef0123456789abcdef\nservice_endpoints: true\n"+
			"callout_opens: {per_second: 50.5, burst: 60}\ncallout_refusals: {per_second: 5, burst: 10}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Listen != "[::1]:8088" || len(c.AllowedServers) != 1 || c.MaxInFlight != 8 || c.PlaneTTL.D() != 10*time.Second || c.InstanceID != "0123456789abcdef0123456789abcdef" || !c.ServiceEndpoints {
			t.Fatalf("%+v", c)
		}
		if c.CalloutOpens != (Rate{PerSecond: 50.5, Burst: 60}) || c.CalloutRefusals != (Rate{PerSecond: 5, Burst: 10}) {
			t.Fatalf("callout budgets %+v %+v", c.CalloutOpens, c.CalloutRefusals)
		}
	})
	t.Run("ok/public-face", func(t *testing.T) {
		f := newFixture(t)
		c, _, err := f.load(t, f.yaml("public_listen: 127.0.0.1:8443\npublic_url: https://auth.example/tenant-a/\n"))
		if err != nil {
			t.Fatal(err)
		}
		// The tenant path stays, the trailing slash goes, the server defaults to the first broker.
		if c.PublicListen != "127.0.0.1:8443" || c.PublicURL != "https://auth.example/tenant-a" || c.PublicServer != "nats://127.0.0.1:4222" || c.PublicTrustForwardedFor {
			t.Fatalf("public face %q %q %q %v", c.PublicListen, c.PublicURL, c.PublicServer, c.PublicTrustForwardedFor)
		}
		c, _, err = f.load(t, f.yaml("public_listen: '[::1]:0'\npublic_url: https://auth.example\npublic_server: wss://mesh.example/ws\npublic_trust_forwarded_for: true\n"))
		if err != nil {
			t.Fatal(err)
		}
		if c.PublicURL != "https://auth.example" || c.PublicServer != "wss://mesh.example/ws" || !c.PublicTrustForwardedFor {
			t.Fatalf("public face %q %q %v", c.PublicURL, c.PublicServer, c.PublicTrustForwardedFor)
		}
	})
	t.Run("ok/no-public-face", func(t *testing.T) {
		f := newFixture(t)
		c, _, err := f.load(t, f.yaml(""))
		if err != nil {
			t.Fatal(err)
		}
		if c.PublicListen != "" || c.PublicURL != "" || c.PublicServer != "" {
			t.Fatalf("public face %q %q %q, want none", c.PublicListen, c.PublicURL, c.PublicServer)
		}
	})
	acct, _ := nkeys.CreateAccount()
	acctSeed, _ := acct.Seed()
	for _, tc := range []struct {
		name, extra, want string
		edit              func(f fixture, content string) string
	}{
		{name: "fail/unknown-key", extra: "listn: 127.0.0.1:1\n", want: "listn"},
		{name: "fail/non-loopback-listener", extra: "listen: 0.0.0.0:8088\n", want: "not a loopback"},
		{name: "fail/listener-without-port", extra: "listen: 127.0.0.1\n", want: "listen"},
		{name: "fail/bad-server-id", extra: "allowed_servers: [nope]\n", want: "allowed_servers"},
		{name: "fail/plane-ttl-too-short", extra: "plane_ttl: 1s\n", want: "plane_ttl"},
		{name: "fail/instance-id-not-hex", extra: "instance_id: 0123456789ABCDEF0123456789ABCDEF\n", want: "instance_id"},
		{name: "fail/instance-id-short", extra: "instance_id: abcd\n", want: "instance_id"},
		{name: "fail/max-in-flight", extra: "max_in_flight: -1\n", want: "max_in_flight"},
		{name: "fail/log-level", extra: "log_level: loud\n", want: "log_level"},
		{name: "fail/callout-opens-no-burst", extra: "callout_opens: {per_second: 10}\n", want: "callout_opens.burst"},
		{name: "fail/callout-refusals-zero-rate", extra: "callout_refusals: {burst: 10}\n", want: "callout_refusals.per_second"},
		{name: "fail/callout-refusals-negative", extra: "callout_refusals: {per_second: -1, burst: 10}\n", want: "callout_refusals.per_second"},
		{name: "fail/callout-opens-too-fast", extra: "callout_opens: {per_second: 1e9, burst: 10}\n", want: "callout_opens.per_second"},
		{name: "fail/callout-budget-unknown-key", extra: "callout_opens: {per_second: 1, burst: 1, per_minute: 3}\n", want: "per_minute"},
		{name: "fail/public-listen-not-loopback", extra: "public_listen: 0.0.0.0:8443\npublic_url: https://auth.example\n", want: "public_listen"},
		{name: "fail/public-listen-lan", extra: "public_listen: 192.168.1.2:8443\npublic_url: https://auth.example\n", want: "public_listen"},
		{name: "fail/public-url-missing", extra: "public_listen: 127.0.0.1:8443\n", want: "public_url: required with public_listen"},
		{name: "fail/public-url-http", extra: "public_listen: 127.0.0.1:8443\npublic_url: http://auth.example\n", want: "public_url"},
		{name: "fail/public-url-query", extra: "public_listen: 127.0.0.1:8443\npublic_url: https://auth.example/?t=1\n", want: "public_url"},
		{name: "fail/public-url-user", extra: "public_listen: 127.0.0.1:8443\npublic_url: https://u:p@auth.example\n", want: "public_url"},
		{name: "fail/public-url-without-listen", extra: "public_url: https://auth.example\n", want: "public_url: set without public_listen"},
		{name: "fail/public-server-without-listen", extra: "public_server: wss://mesh.example\n", want: "public_server: set without public_listen"},
		{name: "fail/public-xff-without-listen", extra: "public_trust_forwarded_for: true\n", want: "public_trust_forwarded_for"},
		{name: "fail/public-server-https", extra: "public_listen: 127.0.0.1:8443\npublic_url: https://auth.example\npublic_server: https://mesh.example\n", want: "public_server"},
		{name: "fail/account-seed-in-config", extra: "# " + string(acctSeed) + "\n", want: "holds an account seed"},
		{name: "fail/private-jwk-in-config", extra: "note: {kty: OKP, d: AA}\n", want: "private JWK"},
		{name: "fail/missing-keys", want: "missing required keys: space, signer.address",
			edit: func(_ fixture, _ string) string { return "brokers: [nats://127.0.0.1:4222]\n" }},
		{name: "fail/bad-space", want: "space",
			edit: func(_ fixture, c string) string {
				return strings.Replace(c, "space: alpha", "space: \"a b\\u0000\"", 1)
			}},
		{name: "fail/broker-with-credentials", want: "brokers",
			edit: func(_ fixture, c string) string {
				return strings.Replace(c, "nats://127.0.0.1", "nats://u:p@127.0.0.1", 1)
			}},
		{name: "fail/http-broker", want: "brokers",
			edit: func(_ fixture, c string) string { return strings.Replace(c, "nats://127.0.0.1", "http://127.0.0.1", 1) }},
		{name: "fail/loose-callout-seed", want: "callout.nk",
			edit: func(f fixture, c string) string { _ = os.Chmod(f.seed, 0o640); return c }},
		{name: "fail/loose-callout-seed-dir", want: "mode",
			edit: func(f fixture, c string) string { _ = os.Chmod(f.dir, 0o755); return c }},
		{name: "fail/loose-state-dir", want: "state",
			edit: func(f fixture, c string) string { _ = os.Chmod(f.state, 0o750); return c }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			content := f.yaml(tc.extra)
			if tc.edit != nil {
				content = tc.edit(f, content)
			}
			_, p, err := f.load(t, content)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("Load = %v; want an error naming %s and %q", err, p, tc.want)
			}
			if strings.Contains(err.Error(), string(acctSeed)) {
				t.Fatal("the error quotes the seed")
			}
		})
	}
	t.Run("fail/seed-in-state-dir", func(t *testing.T) {
		f := newFixture(t)
		bad := filepath.Join(f.state, "managed-actors", "x.json")
		if err := os.MkdirAll(filepath.Dir(bad), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bad, []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA","d":"AA"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := f.load(t, f.yaml(""))
		var se *daemon.SecretError
		if !errors.As(err, &se) || se.Path != bad {
			t.Fatalf("Load = %v; want a SecretError naming %s", err, bad)
		}
	})
}
