package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// docYAML returns the one ```yaml block of the Markdown file at path, failing unless there is
// exactly one.
func docYAML(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case !in && strings.TrimSpace(l) == "```yaml":
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, l)
		}
	}
	if len(blocks) != 1 {
		t.Fatalf("%s: %d yaml blocks, want 1", path, len(blocks))
	}
	return blocks[0]
}

// TestDocExample: the configuration example in docs/authd.md is accepted by the strict loader
// (every key known, every value valid), and the values it marks as defaults are the defaults.
// The example names paths under /etc and /var/lib; Validate checks the callout seed file and
// the state directory, so those two are replaced by a fixture's after decoding.
func TestDocExample(t *testing.T) {
	f := newFixture(t)
	p := filepath.Join(f.dir, "authd.yaml")
	if err := os.WriteFile(p, []byte(docYAML(t, filepath.Join("..", "..", "..", "docs", "authd.md"))), 0o600); err != nil {
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
		c.ShutdownTimeout.D() != DefaultShutdownTimeout || c.LogLevel != "info" || len(c.AllowedServers) != 0 {
		t.Errorf("docs/authd.md example: a value marked default is not the default: %+v", c)
	}
	if c.CalloutOpens.Callout() != callout.DefaultOpenRate || c.CalloutRefusals.Callout() != callout.DefaultRefusalRate {
		t.Errorf("docs/authd.md example: callout budgets %+v %+v, want the defaults %+v %+v",
			c.CalloutOpens, c.CalloutRefusals, callout.DefaultOpenRate, callout.DefaultRefusalRate)
	}
	if c.Signer.ServerName != signerclient.DefaultServerName {
		t.Errorf("docs/authd.md example: signer.server_name %q, documented as the default %q", c.Signer.ServerName, signerclient.DefaultServerName)
	}
}
