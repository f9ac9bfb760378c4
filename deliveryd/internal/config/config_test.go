package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/daemon"
)

func write(t *testing.T, dir, content string) string {
	t.Helper()
	p := filepath.Join(dir, "deliveryd.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func base(state string) string {
	return `space: alpha
brokers: [nats://127.0.0.1:4222]
signer: {address: 127.0.0.1:7443, ca: /x/ca.pem, cert: /x/d.pem, key: /x/d.key}
state_dir: ` + state + `
`
}

func TestLoad(t *testing.T) {
	t.Run("ok/defaults", func(t *testing.T) {
		dir := t.TempDir()
		c, err := Load(write(t, dir, base(filepath.Join(dir, "state"))))
		if err != nil {
			t.Fatal(err)
		}
		if c.BrokerGone.D() != DefaultBrokerGone || c.BrokerGoneBackstop != 0 || c.ShutdownTimeout.D() != DefaultShutdownTimeout || c.Holder != "" {
			t.Fatalf("defaults: %+v", c)
		}
	})
	t.Run("ok/everything", func(t *testing.T) {
		dir := t.TempDir()
		c, err := Load(write(t, dir, base(filepath.Join(dir, "s"))+"holder: deliveryd-a\ncredential_ttl: 1h\nbroker_gone: 2s\nbroker_gone_backstop: 9s\nshutdown_timeout: 3s\nlog_level: debug\n"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Holder != "deliveryd-a" || c.CredentialTTL.D() != time.Hour || c.BrokerGone.D() != 2*time.Second || c.BrokerGoneBackstop.D() != 9*time.Second {
			t.Fatalf("%+v", c)
		}
	})
	acct, _ := nkeys.CreateAccount()
	acctSeed, _ := acct.Seed()
	for _, tc := range []struct{ name, yaml, want string }{
		{"fail/unknown-key", "lease_ttl: 3s\n", "lease_ttl"},
		{"fail/bad-broker", "brokers: [http://x]\n", "brokers"},
		{"fail/broker-credentials", "brokers: ['nats://u:p@x:4222']\n", "without credentials"},
		{"fail/window-too-short", "broker_gone: 1ms\n", "broker_gone"},
		{"fail/backstop-below-window", "broker_gone: 5s\nbroker_gone_backstop: 1s\n", "broker_gone_backstop"},
		{"fail/log-level", "log_level: loud\n", "log_level"},
		{"fail/metrics-listen", "metrics_listen: nowhere\n", "metrics_listen"},
		{"fail/holder-newline", "holder: \"a\\nb\"\n", "holder"},
		{"fail/seed-in-config", "# " + string(acctSeed) + "\n", "seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			y := base(filepath.Join(dir, "s"))
			if strings.HasPrefix(tc.yaml, "brokers:") {
				y = strings.Replace(y, "brokers: [nats://127.0.0.1:4222]\n", "", 1)
			}
			_, err := Load(write(t, dir, y+tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error naming %q", err, tc.want)
			}
		})
	}
	t.Run("fail/missing-keys-named", func(t *testing.T) {
		dir := t.TempDir()
		_, err := Load(write(t, dir, "space: alpha\n"))
		var ce *daemon.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "brokers, signer.address, signer.ca, signer.cert, signer.key, state_dir") {
			t.Fatalf("Load = %v", err)
		}
	})
	t.Run("fail/loose-state-dir", func(t *testing.T) {
		dir := t.TempDir()
		state := filepath.Join(dir, "state")
		if err := os.Mkdir(state, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(write(t, dir, base(state))); err == nil || !strings.Contains(err.Error(), "state_dir") {
			t.Fatalf("Load = %v", err)
		}
	})
	t.Run("fail/seed-in-state-dir", func(t *testing.T) {
		dir := t.TempDir()
		state := filepath.Join(dir, "state")
		if err := os.Mkdir(state, 0o700); err != nil {
			t.Fatal(err)
		}
		leak := filepath.Join(state, "leak.nk")
		if err := os.WriteFile(leak, acctSeed, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(write(t, dir, base(state))); err == nil || !strings.Contains(err.Error(), leak) {
			t.Fatalf("Load = %v; want it to name %s", err, leak)
		}
	})
}
