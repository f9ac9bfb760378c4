package config

import (
	"github.com/cotalgo/cotal/pkg/testkit"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// TestDocExample: the configuration example in docs/authd.md is accepted by the strict loader
// (every key known, every value valid), and the values it marks as defaults are the defaults.
// The example names paths under /etc and /var/lib; Validate checks the callout seed file and
// the state directory, so those two are replaced by a fixture's after decoding. The public face's
// keys, commented out in the example, are loaded and validated uncommented in a subtest.
func TestDocExample(t *testing.T) {
	f := newFixture(t)
	p := filepath.Join(f.dir, "authd.yaml")
	block := testkit.DocBlock(t, filepath.Join("..", "..", "..", "docs", "authd.md"), "yaml")
	if err := os.WriteFile(p, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Decode(p)
	if err != nil {
		t.Fatalf("docs/authd.md example: %v", err)
	}
	if c.CalloutSeed == "" || c.StateDir == "" {
		t.Fatalf("docs/authd.md example: callout_seed %q, state_dir %q: want both", c.CalloutSeed, c.StateDir)
	}
	c.CalloutSeed, c.StateDir = f.seed, f.state
	if err := c.Validate(); err != nil {
		t.Fatalf("docs/authd.md example: %v", err)
	}
	if c.Listen != DefaultListen || c.MaxInFlight != DefaultMaxInFlight || c.PlaneTTL.D() != DefaultPlaneTTL ||
		c.ShutdownTimeout.D() != DefaultShutdownTimeout || c.LogLevel != "info" || len(c.AllowedServers) != 0 ||
		c.ServiceEndpoints || c.PublicListen != "" || c.PublicTrustForwardedFor {
		t.Errorf("docs/authd.md example: a value marked default is not the default: %+v", c)
	}
	if c.CalloutOpens.Callout() != callout.DefaultOpenRate || c.CalloutRefusals.Callout() != callout.DefaultRefusalRate {
		t.Errorf("docs/authd.md example: callout budgets %+v %+v, want the defaults %+v %+v",
			c.CalloutOpens, c.CalloutRefusals, callout.DefaultOpenRate, callout.DefaultRefusalRate)
	}
	if c.Signer.ServerName != signerclient.DefaultServerName {
		t.Errorf("docs/authd.md example: signer.server_name %q, documented as the default %q", c.Signer.ServerName, signerclient.DefaultServerName)
	}
	// The public face's keys are shown commented out (the face is optional): uncommented, they
	// are keys the loader knows, with values Validate accepts.
	t.Run("ok/public-face-keys", func(t *testing.T) {
		public := regexp.MustCompile(`(?m)^# (public_[a-z_]+:)`)
		if n := len(public.FindAllString(block, -1)); n != 4 {
			t.Fatalf("docs/authd.md example: %d commented public_ keys, want 4", n)
		}
		p := filepath.Join(f.dir, "authd-public.yaml")
		if err := os.WriteFile(p, []byte(public.ReplaceAllString(block, "$1")), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Decode(p)
		if err != nil {
			t.Fatalf("docs/authd.md example, public keys uncommented: %v", err)
		}
		c.CalloutSeed, c.StateDir = f.seed, f.state
		if err := c.Validate(); err != nil {
			t.Fatalf("docs/authd.md example, public keys uncommented: %v", err)
		}
		if c.PublicListen != "127.0.0.1:8443" || c.PublicURL != "https://auth.example.com/tenant-a" ||
			c.PublicServer != "tls://nats.example.com:4222" || c.PublicTrustForwardedFor {
			t.Errorf("docs/authd.md example, public keys uncommented: %q %q %q %v", c.PublicListen, c.PublicURL, c.PublicServer, c.PublicTrustForwardedFor)
		}
	})
}
